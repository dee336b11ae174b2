-- Issue 11: a token is made for one purpose (`new`: a name with no live
-- certificate; `replace`: a new certificate for a live job server), and an
-- identity has at most one certificate that is not revoked. MariaDB has no
-- partial index: a generated column that is NULL once revoked carries the
-- unique index (NULLs never collide).
ALTER TABLE enroll_tokens ADD COLUMN purpose VARCHAR(16) NOT NULL DEFAULT 'new';

UPDATE credentials c
JOIN (
    SELECT kind, identity, MAX(id) AS keep_id
    FROM credentials WHERE revoked_at IS NULL GROUP BY kind, identity
) k ON c.kind = k.kind AND c.identity = k.identity
SET c.revoked_at = DATE_FORMAT(UTC_TIMESTAMP(), '%Y-%m-%dT%H:%i:%sZ'),
    c.revoke_reason = 'a second valid certificate of the same identity'
WHERE c.revoked_at IS NULL AND c.id <> k.keep_id;

ALTER TABLE credentials
    ADD COLUMN live_identity VARCHAR(300)
    AS (IF(revoked_at IS NULL, CONCAT(kind, ':', identity), NULL)) PERSISTENT;
CREATE UNIQUE INDEX credentials_one_live ON credentials (live_identity);
