-- Admin page sessions: the cookie carries a random token, the row only its
-- SHA-256, so a copy of the database signs nobody in. A session ends after
-- SESSION_EXPIRE_SECONDS without a request (seen_at) or when signed out.
CREATE TABLE sessions (
    id VARCHAR(64) PRIMARY KEY,
    username VARCHAR(255) NOT NULL,
    role VARCHAR(16) NOT NULL,
    method VARCHAR(16) NOT NULL,
    csrf VARCHAR(64) NOT NULL,
    created_at VARCHAR(32) NOT NULL,
    seen_at VARCHAR(32) NOT NULL
);
CREATE INDEX sessions_seen ON sessions (seen_at);
