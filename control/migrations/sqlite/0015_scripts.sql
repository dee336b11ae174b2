-- Scripts run by the script-runner: each with its own timeout (null: the
-- runner's default); a system's run_request, bumped by
-- `POST /api/v1/systems/{key}/run-scripts`, tells its agent to run its
-- post-boot scripts again; and the image-gen runs job servers report.
ALTER TABLE scripts ADD COLUMN timeout_seconds BIGINT;
ALTER TABLE systems ADD COLUMN run_request BIGINT NOT NULL DEFAULT 0;

CREATE TABLE script_runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    image_id BIGINT REFERENCES system_images (id) ON DELETE CASCADE,
    image VARCHAR(255) NOT NULL,
    source VARCHAR(300) NOT NULL,
    outcome VARCHAR(16) NOT NULL,
    detail TEXT NOT NULL,
    results TEXT NOT NULL,
    at VARCHAR(32) NOT NULL
);
CREATE INDEX script_runs_image ON script_runs (image_id, id);
