-- The initial schema. One file per engine: ids, booleans, long text and table
-- options differ; keep the three in step.
-- MariaDB: booleans are SMALLINT 0/1, as sqlx's Any driver cannot read TINYINT.

CREATE TABLE inventory_revision (
    id INTEGER PRIMARY KEY,
    revision BIGINT NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
INSERT INTO inventory_revision (id, revision) VALUES (1, 0);

CREATE TABLE settings (
    name VARCHAR(64) PRIMARY KEY,
    value TEXT NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE users (
    id BIGINT AUTO_INCREMENT PRIMARY KEY,
    username VARCHAR(255) NOT NULL UNIQUE,
    password VARCHAR(255) NOT NULL,
    is_admin SMALLINT NOT NULL,
    created_at VARCHAR(32) NOT NULL,
    updated_at VARCHAR(32) NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE api_keys (
    id BIGINT AUTO_INCREMENT PRIMARY KEY,
    name VARCHAR(255) NOT NULL,
    prefix VARCHAR(16) NOT NULL UNIQUE,
    hash VARCHAR(64) NOT NULL,
    expires_at VARCHAR(32),
    revoked SMALLINT NOT NULL,
    created_at VARCHAR(32) NOT NULL,
    updated_at VARCHAR(32) NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE networks (
    id BIGINT AUTO_INCREMENT PRIMARY KEY,
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
    isdhcp SMALLINT NOT NULL,
    managedns SMALLINT NOT NULL,
    isbootable SMALLINT NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE switches (
    id BIGINT AUTO_INCREMENT PRIMARY KEY,
    hostname VARCHAR(253) NOT NULL UNIQUE,
    network_id BIGINT,
    FOREIGN KEY (network_id) REFERENCES networks (id) ON DELETE SET NULL,
    mgmt_ip VARCHAR(15),
    mgmt_mac VARCHAR(17),
    created_at VARCHAR(32) NOT NULL,
    updated_at VARCHAR(32) NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE switch_ports (
    id BIGINT AUTO_INCREMENT PRIMARY KEY,
    switch_id BIGINT NOT NULL,
    FOREIGN KEY (switch_id) REFERENCES switches (id) ON DELETE CASCADE,
    name VARCHAR(100) NOT NULL,
    network_id BIGINT,
    FOREIGN KEY (network_id) REFERENCES networks (id) ON DELETE SET NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE scripts (
    id BIGINT AUTO_INCREMENT PRIMARY KEY,
    slug VARCHAR(255) NOT NULL UNIQUE,
    name VARCHAR(255) NOT NULL,
    script_type VARCHAR(32) NOT NULL,
    version BIGINT NOT NULL,
    content MEDIUMTEXT NOT NULL,
    created_at VARCHAR(32) NOT NULL,
    updated_at VARCHAR(32) NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE script_deps (
    script_id BIGINT NOT NULL,
    FOREIGN KEY (script_id) REFERENCES scripts (id) ON DELETE CASCADE,
    dep_id BIGINT NOT NULL,
    FOREIGN KEY (dep_id) REFERENCES scripts (id) ON DELETE CASCADE,
    PRIMARY KEY (script_id, dep_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE repos (
    id BIGINT AUTO_INCREMENT PRIMARY KEY,
    slug VARCHAR(255) NOT NULL UNIQUE,
    name VARCHAR(255) NOT NULL,
    url TEXT NOT NULL,
    managed SMALLINT NOT NULL,
    version BIGINT NOT NULL,
    created_at VARCHAR(32) NOT NULL,
    updated_at VARCHAR(32) NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE distros (
    id BIGINT AUTO_INCREMENT PRIMARY KEY,
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
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE distro_scripts (
    distro_id BIGINT NOT NULL,
    FOREIGN KEY (distro_id) REFERENCES distros (id) ON DELETE CASCADE,
    script_id BIGINT NOT NULL,
    FOREIGN KEY (script_id) REFERENCES scripts (id) ON DELETE CASCADE,
    PRIMARY KEY (distro_id, script_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE distro_repos (
    distro_id BIGINT NOT NULL,
    FOREIGN KEY (distro_id) REFERENCES distros (id) ON DELETE CASCADE,
    repo_id BIGINT NOT NULL,
    FOREIGN KEY (repo_id) REFERENCES repos (id) ON DELETE CASCADE,
    PRIMARY KEY (distro_id, repo_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE jobservers (
    id BIGINT AUTO_INCREMENT PRIMARY KEY,
    name VARCHAR(253) NOT NULL UNIQUE,
    addresses TEXT NOT NULL,
    port INTEGER NOT NULL,
    modules TEXT NOT NULL,
    network_id BIGINT,
    FOREIGN KEY (network_id) REFERENCES networks (id) ON DELETE SET NULL,
    heartbeat_at VARCHAR(32),
    load_avg DOUBLE NOT NULL,
    created_at VARCHAR(32) NOT NULL,
    updated_at VARCHAR(32) NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE system_images (
    id BIGINT AUTO_INCREMENT PRIMARY KEY,
    slug VARCHAR(255) NOT NULL UNIQUE,
    distro_id BIGINT,
    FOREIGN KEY (distro_id) REFERENCES distros (id) ON DELETE SET NULL,
    version BIGINT NOT NULL,
    needs_rebuild SMALLINT NOT NULL,
    install_kernel_cmdline TEXT NOT NULL,
    initial_mods VARCHAR(255) NOT NULL,
    tmpfs_root_size BIGINT NOT NULL,
    prov_interface VARCHAR(255) NOT NULL,
    config_params TEXT NOT NULL,
    created_at VARCHAR(32) NOT NULL,
    updated_at VARCHAR(32) NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE image_scripts (
    image_id BIGINT NOT NULL,
    FOREIGN KEY (image_id) REFERENCES system_images (id) ON DELETE CASCADE,
    script_id BIGINT NOT NULL,
    FOREIGN KEY (script_id) REFERENCES scripts (id) ON DELETE CASCADE,
    PRIMARY KEY (image_id, script_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE image_hosts (
    image_id BIGINT NOT NULL,
    FOREIGN KEY (image_id) REFERENCES system_images (id) ON DELETE CASCADE,
    jobserver_id BIGINT NOT NULL,
    FOREIGN KEY (jobserver_id) REFERENCES jobservers (id) ON DELETE CASCADE,
    PRIMARY KEY (image_id, jobserver_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE jobs (
    id BIGINT AUTO_INCREMENT PRIMARY KEY,
    module VARCHAR(64) NOT NULL,
    params TEXT,
    status VARCHAR(16) NOT NULL,
    jobserver_id BIGINT,
    FOREIGN KEY (jobserver_id) REFERENCES jobservers (id) ON DELETE SET NULL,
    started_at VARCHAR(32),
    ended_at VARCHAR(32),
    return_code BIGINT,
    output MEDIUMTEXT NOT NULL,
    created_at VARCHAR(32) NOT NULL,
    updated_at VARCHAR(32) NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
CREATE INDEX jobs_status ON jobs (status);

CREATE TABLE systems (
    id BIGINT AUTO_INCREMENT PRIMARY KEY,
    hostname VARCHAR(253) NOT NULL UNIQUE,
    image_id BIGINT,
    FOREIGN KEY (image_id) REFERENCES system_images (id) ON DELETE SET NULL,
    install_kernel_cmdline TEXT NOT NULL,
    initial_mods VARCHAR(255) NOT NULL,
    tmpfs_root_size BIGINT NOT NULL,
    prov_interface VARCHAR(255) NOT NULL,
    config_params TEXT NOT NULL,
    stateful SMALLINT NOT NULL,
    netboot SMALLINT NOT NULL,
    created_at VARCHAR(32) NOT NULL,
    updated_at VARCHAR(32) NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE system_scripts (
    system_id BIGINT NOT NULL,
    FOREIGN KEY (system_id) REFERENCES systems (id) ON DELETE CASCADE,
    script_id BIGINT NOT NULL,
    FOREIGN KEY (script_id) REFERENCES scripts (id) ON DELETE CASCADE,
    PRIMARY KEY (system_id, script_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE system_groups (
    id BIGINT AUTO_INCREMENT PRIMARY KEY,
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
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE group_members (
    group_id BIGINT NOT NULL,
    FOREIGN KEY (group_id) REFERENCES system_groups (id) ON DELETE CASCADE,
    system_id BIGINT NOT NULL,
    FOREIGN KEY (system_id) REFERENCES systems (id) ON DELETE CASCADE,
    PRIMARY KEY (group_id, system_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
CREATE INDEX group_members_system ON group_members (system_id);

CREATE TABLE group_scripts (
    group_id BIGINT NOT NULL,
    FOREIGN KEY (group_id) REFERENCES system_groups (id) ON DELETE CASCADE,
    script_id BIGINT NOT NULL,
    FOREIGN KEY (script_id) REFERENCES scripts (id) ON DELETE CASCADE,
    PRIMARY KEY (group_id, script_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE network_interfaces (
    id BIGINT AUTO_INCREMENT PRIMARY KEY,
    system_id BIGINT NOT NULL,
    FOREIGN KEY (system_id) REFERENCES systems (id) ON DELETE CASCADE,
    name VARCHAR(64) NOT NULL,
    mac VARCHAR(17) UNIQUE,
    ipv4 VARCHAR(15),
    ipv6 VARCHAR(45),
    hostname VARCHAR(253),
    aliases TEXT NOT NULL,
    mtu INTEGER NOT NULL,
    bootable SMALLINT NOT NULL,
    is_gateway SMALLINT NOT NULL,
    network_id BIGINT,
    FOREIGN KEY (network_id) REFERENCES networks (id) ON DELETE SET NULL,
    switch_port_id BIGINT UNIQUE,
    FOREIGN KEY (switch_port_id) REFERENCES switch_ports (id) ON DELETE SET NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
CREATE INDEX network_interfaces_system ON network_interfaces (system_id);
CREATE INDEX network_interfaces_ipv4 ON network_interfaces (ipv4);

CREATE TABLE bmcs (
    id BIGINT AUTO_INCREMENT PRIMARY KEY,
    system_id BIGINT NOT NULL,
    FOREIGN KEY (system_id) REFERENCES systems (id) ON DELETE CASCADE,
    ipv4 VARCHAR(15),
    mac VARCHAR(17),
    username TEXT,
    password TEXT,
    network_id BIGINT,
    FOREIGN KEY (network_id) REFERENCES networks (id) ON DELETE SET NULL,
    switch_port_id BIGINT,
    FOREIGN KEY (switch_port_id) REFERENCES switch_ports (id) ON DELETE SET NULL,
    vlan INTEGER NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
CREATE INDEX bmcs_system ON bmcs (system_id);
