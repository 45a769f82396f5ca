-- Concurrency limits: the limit a run counts against (its workflow's name and, for a per-key limit,
-- the key's label and value, computed from the input when the run was started) and the cap. A run
-- holds one of the key's slots while a runner holds its lease.
ALTER TABLE run_queue ADD COLUMN limit_key TEXT;
ALTER TABLE run_queue ADD COLUMN limit_max INTEGER CHECK (limit_max IS NULL OR limit_max >= 1);
-- claim_next counts a key's unfinished runs whose lease is live.
CREATE INDEX IF NOT EXISTS run_queue_limit ON run_queue(project_id, limit_key)
  WHERE limit_key IS NOT NULL AND finished_at IS NULL;
