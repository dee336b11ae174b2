-- The audit log: one row per bulk action applied to the systems a filter
-- matched (bulk::apply writes it in the action's own transaction): who, when
-- (RFC 3339, UTC), the action, the filter as written, how many systems it
-- changed and what it set. Listed newest first by id.
CREATE TABLE audit_log (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at VARCHAR(32) NOT NULL,
    who VARCHAR(255) NOT NULL,
    action VARCHAR(64) NOT NULL,
    filter_text TEXT NOT NULL,
    affected BIGINT NOT NULL,
    detail TEXT NOT NULL
);
