-- The initial schema. One file per engine: ids, booleans, long text and table
-- options differ; keep the three in step.
-- SQLite: booleans are INTEGER 0/1, as sqlx's Any driver cannot read its BOOLEAN type.

CREATE TABLE inventory_revision (
    id INTEGER PRIMARY KEY,
    revision BIGINT NOT NULL
);
INSERT INTO inventory_revision (id, revision) VALUES (1, 0);

CREATE TABLE settings (
    name VARCHAR(64) PRIMARY KEY,
    value TEXT NOT NULL
);

CREATE TABLE users (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    username VARCHAR(255) NOT NULL UNIQUE,
    password VARCHAR(255) NOT NULL,
    is_admin INTEGER NOT NULL,
    created_at VARCHAR(32) NOT NULL,
    updated_at VARCHAR(32) NOT NULL
);

CREATE TABLE api_keys (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name VARCHAR(255) NOT NULL,
    prefix VARCHAR(16) NOT NULL UNIQUE,
    hash VARCHAR(64) NOT NULL,
    expires_at VARCHAR(32),
    revoked INTEGER NOT NULL,
    created_at VARCHAR(32) NOT NULL,
    updated_at VARCHAR(32) NOT NULL
);

CREATE TABLE networks (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    slug VARCHAR(255) NOT NULL UNIQUE,
    name VARCHAR(255) NOT NULL,
    net_type VARCHAR(32) NOT NULL,
    vlan INTEGER NOT NULL,
    subnet VARCHAR(15) NOT NULL,
    netmask INTEGER NOT NULL,
    gateway VARCHAR(15),
    nameserver VARCHAR(15),
    domain VARCHAR(255) NOT NULL,
    dhcp_start VARCHAR(15),
    dhcp_end VARCHAR(15),
    isdhcp INTEGER NOT NULL,
    managedns INTEGER NOT NULL,
    isbootable INTEGER NOT NULL
);

CREATE TABLE switches (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    hostname VARCHAR(253) NOT NULL UNIQUE,
    network_id BIGINT REFERENCES networks (id) ON DELETE SET NULL,
    mgmt_ip VARCHAR(15),
    mgmt_mac VARCHAR(17),
    created_at VARCHAR(32) NOT NULL,
    updated_at VARCHAR(32) NOT NULL
);

CREATE TABLE switch_ports (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    switch_id BIGINT NOT NULL REFERENCES switches (id) ON DELETE CASCADE,
    name VARCHAR(100) NOT NULL,
    network_id BIGINT REFERENCES networks (id) ON DELETE SET NULL
);

CREATE TABLE scripts (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    slug VARCHAR(255) NOT NULL UNIQUE,
    name VARCHAR(255) NOT NULL,
    script_type VARCHAR(32) NOT NULL,
    version BIGINT NOT NULL,
    content TEXT NOT NULL,
    created_at VARCHAR(32) NOT NULL,
    updated_at VARCHAR(32) NOT NULL
);

CREATE TABLE script_deps (
    script_id BIGINT NOT NULL REFERENCES scripts (id) ON DELETE CASCADE,
    dep_id BIGINT NOT NULL REFERENCES scripts (id) ON DELETE CASCADE,
    PRIMARY KEY (script_id, dep_id)
);

CREATE TABLE repos (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    slug VARCHAR(255) NOT NULL UNIQUE,
    name VARCHAR(255) NOT NULL,
    url TEXT NOT NULL,
    managed INTEGER NOT NULL,
    version BIGINT NOT NULL,
    created_at VARCHAR(32) NOT NULL,
    updated_at VARCHAR(32) NOT NULL
);

CREATE TABLE distros (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    slug VARCHAR(255) NOT NULL UNIQUE,
    name VARCHAR(255) NOT NULL,
    vendor VARCHAR(255) NOT NULL,
    version VARCHAR(255) NOT NULL,
    arch VARCHAR(16) NOT NULL,
    install_kernel_cmdline TEXT NOT NULL,
    initial_mods VARCHAR(255) NOT NULL,
    tmpfs_root_size BIGINT NOT NULL,
    prov_interface VARCHAR(255) NOT NULL,
    config_params TEXT NOT NULL,
    created_at VARCHAR(32) NOT NULL,
    updated_at VARCHAR(32) NOT NULL
);

CREATE TABLE distro_scripts (
    distro_id BIGINT NOT NULL REFERENCES distros (id) ON DELETE CASCADE,
    script_id BIGINT NOT NULL REFERENCES scripts (id) ON DELETE CASCADE,
    PRIMARY KEY (distro_id, script_id)
);

CREATE TABLE distro_repos (
    distro_id BIGINT NOT NULL REFERENCES distros (id) ON DELETE CASCADE,
    repo_id BIGINT NOT NULL REFERENCES repos (id) ON DELETE CASCADE,
    PRIMARY KEY (distro_id, repo_id)
);

CREATE TABLE jobservers (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name VARCHAR(253) NOT NULL UNIQUE,
    addresses TEXT NOT NULL,
    port INTEGER NOT NULL,
    modules TEXT NOT NULL,
    network_id BIGINT REFERENCES networks (id) ON DELETE SET NULL,
    heartbeat_at VARCHAR(32),
    load_avg REAL NOT NULL,
    created_at VARCHAR(32) NOT NULL,
    updated_at VARCHAR(32) NOT NULL
);

CREATE TABLE system_images (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    slug VARCHAR(255) NOT NULL UNIQUE,
    distro_id BIGINT REFERENCES distros (id) ON DELETE SET NULL,
    version BIGINT NOT NULL,
    needs_rebuild INTEGER NOT NULL,
    install_kernel_cmdline TEXT NOT NULL,
    initial_mods VARCHAR(255) NOT NULL,
    tmpfs_root_size BIGINT NOT NULL,
    prov_interface VARCHAR(255) NOT NULL,
    config_params TEXT NOT NULL,
    created_at VARCHAR(32) NOT NULL,
    updated_at VARCHAR(32) NOT NULL
);

CREATE TABLE image_scripts (
    image_id BIGINT NOT NULL REFERENCES system_images (id) ON DELETE CASCADE,
    script_id BIGINT NOT NULL REFERENCES scripts (id) ON DELETE CASCADE,
    PRIMARY KEY (image_id, script_id)
);

CREATE TABLE image_hosts (
    image_id BIGINT NOT NULL REFERENCES system_images (id) ON DELETE CASCADE,
    jobserver_id BIGINT NOT NULL REFERENCES jobservers (id) ON DELETE CASCADE,
    PRIMARY KEY (image_id, jobserver_id)
);

CREATE TABLE jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    module VARCHAR(64) NOT NULL,
    params TEXT,
    status VARCHAR(16) NOT NULL,
    jobserver_id BIGINT REFERENCES jobservers (id) ON DELETE SET NULL,
    started_at VARCHAR(32),
    ended_at VARCHAR(32),
    return_code BIGINT,
    output TEXT NOT NULL,
    created_at VARCHAR(32) NOT NULL,
    updated_at VARCHAR(32) NOT NULL
);
CREATE INDEX jobs_status ON jobs (status);

CREATE TABLE systems (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    hostname VARCHAR(253) NOT NULL UNIQUE,
    image_id BIGINT REFERENCES system_images (id) ON DELETE SET NULL,
    install_kernel_cmdline TEXT NOT NULL,
    initial_mods VARCHAR(255) NOT NULL,
    tmpfs_root_size BIGINT NOT NULL,
    prov_interface VARCHAR(255) NOT NULL,
    config_params TEXT NOT NULL,
    stateful INTEGER NOT NULL,
    netboot INTEGER NOT NULL,
    created_at VARCHAR(32) NOT NULL,
    updated_at VARCHAR(32) NOT NULL
);

CREATE TABLE system_scripts (
    system_id BIGINT NOT NULL REFERENCES systems (id) ON DELETE CASCADE,
    script_id BIGINT NOT NULL REFERENCES scripts (id) ON DELETE CASCADE,
    PRIMARY KEY (system_id, script_id)
);

CREATE TABLE system_groups (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    slug VARCHAR(255) NOT NULL UNIQUE,
    name VARCHAR(255) NOT NULL,
    priority BIGINT NOT NULL,
    install_kernel_cmdline TEXT NOT NULL,
    initial_mods VARCHAR(255) NOT NULL,
    tmpfs_root_size BIGINT NOT NULL,
    prov_interface VARCHAR(255) NOT NULL,
    config_params TEXT NOT NULL,
    created_at VARCHAR(32) NOT NULL,
    updated_at VARCHAR(32) NOT NULL
);

CREATE TABLE group_members (
    group_id BIGINT NOT NULL REFERENCES system_groups (id) ON DELETE CASCADE,
    system_id BIGINT NOT NULL REFERENCES systems (id) ON DELETE CASCADE,
    PRIMARY KEY (group_id, system_id)
);
CREATE INDEX group_members_system ON group_members (system_id);

CREATE TABLE group_scripts (
    group_id BIGINT NOT NULL REFERENCES system_groups (id) ON DELETE CASCADE,
    script_id BIGINT NOT NULL REFERENCES scripts (id) ON DELETE CASCADE,
    PRIMARY KEY (group_id, script_id)
);

CREATE TABLE network_interfaces (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    system_id BIGINT NOT NULL REFERENCES systems (id) ON DELETE CASCADE,
    name VARCHAR(64) NOT NULL,
    mac VARCHAR(17) UNIQUE,
    ipv4 VARCHAR(15),
    ipv6 VARCHAR(45),
    hostname VARCHAR(253),
    aliases TEXT NOT NULL,
    mtu INTEGER NOT NULL,
    bootable INTEGER NOT NULL,
    is_gateway INTEGER NOT NULL,
    network_id BIGINT REFERENCES networks (id) ON DELETE SET NULL,
    switch_port_id BIGINT UNIQUE REFERENCES switch_ports (id) ON DELETE SET NULL
);
CREATE INDEX network_interfaces_system ON network_interfaces (system_id);
CREATE INDEX network_interfaces_ipv4 ON network_interfaces (ipv4);

CREATE TABLE bmcs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    system_id BIGINT NOT NULL REFERENCES systems (id) ON DELETE CASCADE,
    ipv4 VARCHAR(15),
    mac VARCHAR(17),
    username TEXT,
    password TEXT,
    network_id BIGINT REFERENCES networks (id) ON DELETE SET NULL,
    switch_port_id BIGINT REFERENCES switch_ports (id) ON DELETE SET NULL,
    vlan INTEGER NOT NULL
);
CREATE INDEX bmcs_system ON bmcs (system_id);
