-- Enrollment: one-time tokens for job servers, and every certificate the CA
-- issued to an agent (the allow-list that each mTLS request is checked against).

CREATE TABLE enroll_tokens (
    id BIGINT AUTO_INCREMENT PRIMARY KEY,
    name VARCHAR(255) NOT NULL,
    prefix VARCHAR(16) NOT NULL UNIQUE,
    hash VARCHAR(64) NOT NULL,
    created_at VARCHAR(32) NOT NULL,
    expires_at VARCHAR(32) NOT NULL,
    used_at VARCHAR(32),
    used_by VARCHAR(255)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE credentials (
    id BIGINT AUTO_INCREMENT PRIMARY KEY,
    serial VARCHAR(64) NOT NULL UNIQUE,
    kind VARCHAR(16) NOT NULL,
    identity VARCHAR(255) NOT NULL,
    not_after VARCHAR(32) NOT NULL,
    created_at VARCHAR(32) NOT NULL,
    revoked_at VARCHAR(32),
    revoke_reason VARCHAR(255)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
CREATE INDEX credentials_identity ON credentials (kind, identity);

-- One-time nonces /ipxe/ puts on a booting node's kernel command line.
CREATE TABLE enroll_nonces (
    id BIGINT AUTO_INCREMENT PRIMARY KEY,
    system_id BIGINT NOT NULL,
    hash VARCHAR(64) NOT NULL UNIQUE,
    created_at VARCHAR(32) NOT NULL,
    expires_at VARCHAR(32) NOT NULL,
    used_at VARCHAR(32),
    FOREIGN KEY (system_id) REFERENCES systems (id) ON DELETE CASCADE
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
