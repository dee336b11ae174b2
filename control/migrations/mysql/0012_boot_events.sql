-- The boot timeline: one row per step of a node's boot, written by job
-- servers (DHCP, TFTP, HTTP), by /ipxe/ and by the node itself. A node that
-- is not in the inventory yet is known by its MAC only.
CREATE TABLE boot_events (
    id BIGINT AUTO_INCREMENT PRIMARY KEY,
    system_id BIGINT,
    mac VARCHAR(17),
    boot_id BIGINT NOT NULL,
    phase VARCHAR(32) NOT NULL,
    at VARCHAR(32) NOT NULL,
    source VARCHAR(300) NOT NULL,
    jobserver_id BIGINT,
    ip VARCHAR(45),
    detail TEXT NOT NULL,
    FOREIGN KEY (system_id) REFERENCES systems (id) ON DELETE CASCADE
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
CREATE INDEX boot_events_system ON boot_events (system_id, id);
CREATE INDEX boot_events_mac ON boot_events (mac, id);
CREATE INDEX boot_events_at ON boot_events (at);
CREATE INDEX boot_events_ip ON boot_events (ip, id);

-- What a published image version is: the rootfs checksum and size the
-- control service recorded, which the agent verifies the stream against.
ALTER TABLE system_images ADD COLUMN rootfs_sha256 VARCHAR(64) NOT NULL DEFAULT '';
ALTER TABLE system_images ADD COLUMN rootfs_size BIGINT NOT NULL DEFAULT 0;
