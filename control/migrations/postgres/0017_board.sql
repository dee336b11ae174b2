-- The boot board. Systems get a place in a rack (its name, and the unit
-- counted as the rack's labels count). node_states holds every known node's
-- current state, written by boot::record in the transaction of each event,
-- so the board never scans boot_events; seq orders its rows' updates for the
-- board's change feed, and board_seq hands seq out: bumping its one row
-- serializes the updates, so seq order is commit order.
ALTER TABLE systems ADD COLUMN rack VARCHAR(64);
ALTER TABLE systems ADD COLUMN rack_unit BIGINT;
CREATE INDEX systems_rack ON systems (rack, rack_unit);

CREATE TABLE node_states (
    system_id BIGINT PRIMARY KEY REFERENCES systems (id) ON DELETE CASCADE,
    seq BIGINT NOT NULL,
    boot_id BIGINT NOT NULL,
    state VARCHAR(16) NOT NULL,
    phase VARCHAR(32) NOT NULL,
    percent BIGINT,
    boot_started VARCHAR(32) NOT NULL,
    state_since VARCHAR(32) NOT NULL,
    last_at VARCHAR(32) NOT NULL,
    detail TEXT NOT NULL,
    last_error TEXT NOT NULL
);
CREATE INDEX node_states_seq ON node_states (seq);

CREATE TABLE board_seq (
    id INTEGER PRIMARY KEY,
    seq BIGINT NOT NULL
);

-- The nodes that booted before this migration: their latest event, in the
-- boot it belongs to (the mapping is BootPhase::board_state's, which a test
-- holds this statement to).
INSERT INTO node_states (system_id, seq, boot_id, state, phase, percent, boot_started, state_since, last_at, detail, last_error)
    SELECT e.system_id, e.id, e.boot_id,
        CASE e.phase
        WHEN 'dhcp_offered' THEN 'dhcp'
        WHEN 'dhcp_acked' THEN 'dhcp'
        WHEN 'proxy_answered' THEN 'dhcp'
        WHEN 'boot_file_sent' THEN 'ipxe'
        WHEN 'script_served' THEN 'ipxe'
        WHEN 'kernel_fetched' THEN 'kernel'
        WHEN 'initramfs_fetched' THEN 'kernel'
        WHEN 'agent_dhcp' THEN 'kernel'
        WHEN 'enrolled' THEN 'enrolled'
        WHEN 'image_started' THEN 'image'
        WHEN 'progress' THEN 'image'
        WHEN 'verified' THEN 'image'
        WHEN 'switch_root' THEN 'image'
        WHEN 'scripts' THEN 'scripts'
        WHEN 'script' THEN 'scripts'
        WHEN 'ready' THEN 'ready'
        WHEN 'failed' THEN 'failed'
        WHEN 'checksum_mismatch' THEN 'failed'
        ELSE 'failed' END,
        e.phase, NULL,
        (SELECT MIN(b.at) FROM boot_events b WHERE b.system_id = e.system_id AND b.boot_id = e.boot_id),
        e.at, e.at, e.detail, ''
    FROM boot_events e
    WHERE e.id IN (SELECT MAX(id) FROM boot_events WHERE system_id IS NOT NULL GROUP BY system_id);
INSERT INTO board_seq (id, seq) SELECT 1, COALESCE(MAX(seq), 0) FROM node_states;
