-- Passkeys (WebAuthn credentials), a second way for a user to sign in to the
-- admin pages (src/passkeys.rs). A passkey belongs to a user row, not to a
-- name: deleting the user deletes its passkeys, so a user later made with
-- the same name cannot sign in with them. public_key is the COSE key the
-- authenticator gave (base64url), credential_id the authenticator's id for
-- it (base64url, at most 1,023 bytes before encoding; ASCII, so its unique
-- index fits InnoDB's 3,072-byte key).
CREATE TABLE passkeys (
    id BIGINT AUTO_INCREMENT PRIMARY KEY,
    user_id BIGINT NOT NULL,
    credential_id VARCHAR(1400) CHARACTER SET ascii COLLATE ascii_bin NOT NULL UNIQUE,
    public_key TEXT NOT NULL,
    sign_count BIGINT NOT NULL,
    name VARCHAR(100) NOT NULL,
    created_at VARCHAR(32) NOT NULL,
    last_used_at VARCHAR(32),
    FOREIGN KEY (user_id) REFERENCES users (id) ON DELETE CASCADE
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
CREATE INDEX passkeys_user ON passkeys (user_id);

-- The challenges handed out and not yet expired: each is used at most once
-- (used_at), for one ceremony ('create' or 'get'), and a registration's for
-- the user it was made for. Expired rows are deleted when a new one is made.
CREATE TABLE passkey_challenges (
    id BIGINT AUTO_INCREMENT PRIMARY KEY,
    challenge VARCHAR(64) NOT NULL UNIQUE,
    ceremony VARCHAR(8) NOT NULL,
    user_id BIGINT,
    expires_at VARCHAR(32) NOT NULL,
    used_at VARCHAR(32),
    FOREIGN KEY (user_id) REFERENCES users (id) ON DELETE CASCADE
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
CREATE INDEX passkey_challenges_expiry ON passkey_challenges (expires_at);
