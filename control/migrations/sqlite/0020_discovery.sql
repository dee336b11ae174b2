-- Discovery (src/discovery.rs): a system's model and serial, which a node
-- matched to it by switch port must report (from DMI) where they are set;
-- the one-time discovery nonces /ipxe/ puts on an unknown node's kernel
-- command line (stored as a SHA-256, bound to the MAC that booted, good only
-- for POST /api/v1/discovery/report); and the discovered nodes parked for an
-- admin, one row per MAC, with the whole report (JSON) and why it waits.
-- candidate_nic_id is the NIC the report matched, if it matched one.
ALTER TABLE systems ADD COLUMN model VARCHAR(255);
ALTER TABLE systems ADD COLUMN serial VARCHAR(255);

CREATE TABLE discovery_nonces (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    mac VARCHAR(17) NOT NULL,
    hash VARCHAR(64) NOT NULL UNIQUE,
    created_at VARCHAR(32) NOT NULL,
    expires_at VARCHAR(32) NOT NULL,
    used_at VARCHAR(32)
);
CREATE INDEX discovery_nonces_mac ON discovery_nonces (mac);

CREATE TABLE discovered_nodes (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    mac VARCHAR(17) NOT NULL UNIQUE,
    report TEXT NOT NULL,
    reason TEXT NOT NULL,
    candidate_nic_id BIGINT REFERENCES network_interfaces (id) ON DELETE SET NULL,
    first_seen VARCHAR(32) NOT NULL,
    last_seen VARCHAR(32) NOT NULL
);
