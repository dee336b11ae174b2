-- Issue 22: a job server registers itself. `host_id` is the stable id of
-- its host (kept beside its config), so a renamed host keeps its row; NULL
-- on rows an administrator made by hand until their job server registers.
-- NULLs never collide in the unique index.
ALTER TABLE jobservers ADD COLUMN host_id VARCHAR(255);
CREATE UNIQUE INDEX jobservers_host_id ON jobservers (host_id);

-- The addresses a job server registered, each with the network it serves
-- and its own heartbeat: a node is sent only to an address on its network
-- whose heartbeat is fresh.
CREATE TABLE jobserver_addresses (
    id BIGINT AUTO_INCREMENT PRIMARY KEY,
    jobserver_id BIGINT NOT NULL,
    FOREIGN KEY (jobserver_id) REFERENCES jobservers (id) ON DELETE CASCADE,
    address VARCHAR(45) NOT NULL,
    network_id BIGINT,
    FOREIGN KEY (network_id) REFERENCES networks (id) ON DELETE SET NULL,
    heartbeat_at VARCHAR(32),
    load_avg DOUBLE NOT NULL DEFAULT 0,
    streams BIGINT NOT NULL DEFAULT 0,
    UNIQUE (jobserver_id, address)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
CREATE INDEX jobserver_addresses_network ON jobserver_addresses (network_id);
