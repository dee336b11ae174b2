-- Enrollment: one-time tokens for job servers, and every certificate the CA
-- issued to an agent (the allow-list that each mTLS request is checked against).

CREATE TABLE enroll_tokens (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name VARCHAR(255) NOT NULL,
    prefix VARCHAR(16) NOT NULL UNIQUE,
    hash VARCHAR(64) NOT NULL,
    created_at VARCHAR(32) NOT NULL,
    expires_at VARCHAR(32) NOT NULL,
    used_at VARCHAR(32),
    used_by VARCHAR(255)
);

CREATE TABLE credentials (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    serial VARCHAR(64) NOT NULL UNIQUE,
    kind VARCHAR(16) NOT NULL,
    identity VARCHAR(255) NOT NULL,
    not_after VARCHAR(32) NOT NULL,
    created_at VARCHAR(32) NOT NULL,
    revoked_at VARCHAR(32),
    revoke_reason VARCHAR(255)
);
CREATE INDEX credentials_identity ON credentials (kind, identity);

-- One-time nonces /ipxe/ puts on a booting node's kernel command line.
CREATE TABLE enroll_nonces (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    system_id BIGINT NOT NULL REFERENCES systems (id) ON DELETE CASCADE,
    hash VARCHAR(64) NOT NULL UNIQUE,
    created_at VARCHAR(32) NOT NULL,
    expires_at VARCHAR(32) NOT NULL,
    used_at VARCHAR(32)
);
