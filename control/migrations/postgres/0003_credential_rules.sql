-- Issue 11: a token is made for one purpose (`new`: a name with no live
-- certificate; `replace`: a new certificate for a live job server), and an
-- identity has at most one certificate that is not revoked.
ALTER TABLE enroll_tokens ADD COLUMN purpose VARCHAR(16) NOT NULL DEFAULT 'new';

UPDATE credentials
SET revoked_at = to_char(now() AT TIME ZONE 'utc', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
    revoke_reason = 'a second valid certificate of the same identity'
WHERE revoked_at IS NULL
  AND id NOT IN (
    SELECT MAX(id) FROM credentials WHERE revoked_at IS NULL GROUP BY kind, identity
  );

CREATE UNIQUE INDEX credentials_one_live ON credentials (kind, identity)
WHERE revoked_at IS NULL;
