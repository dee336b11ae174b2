-- The jobs queue: a job may be for one job server only (an image-sync of
-- a version another one published); null is for any job server running
-- its module. Claims take the oldest pending job of their modules.
ALTER TABLE jobs ADD COLUMN for_jobserver_id BIGINT REFERENCES jobservers (id) ON DELETE CASCADE;
CREATE INDEX jobs_claim ON jobs (status, module, id);

-- The files of a published image version, as the job server that built it
-- listed them in its manifest: copies are verified against these.
CREATE TABLE image_files (
    image_id BIGINT NOT NULL REFERENCES system_images (id) ON DELETE CASCADE,
    version BIGINT NOT NULL,
    name VARCHAR(255) NOT NULL,
    size BIGINT NOT NULL,
    sha256 VARCHAR(64) NOT NULL,
    PRIMARY KEY (image_id, version, name)
);
