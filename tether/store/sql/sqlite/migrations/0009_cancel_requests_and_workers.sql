-- A cancel is a store operation: a run a live claim holds is marked here in the transaction that
-- requests its cancel, and every transaction that begins a node or an effect of the run reads the
-- mark and begins nothing once it is set. The holder then ends the run under its own claim.
ALTER TABLE run_queue ADD COLUMN cancel_requested_at INTEGER;
-- Requests made before this column existed were journal events that the holder polled for:
-- carried over for the runs not finished yet.
UPDATE run_queue SET cancel_requested_at = updated_at
WHERE status NOT IN ('done', 'failed', 'cancelled')
  AND run_id IN (SELECT r.run_id FROM runs r JOIN events e ON e.resource_id = r.resource_id
                 WHERE e.event_type = 'control.cancel_requested');

-- Live worker processes and the workflows (name and definition digest) each has loaded: a queued
-- run that no live worker can execute says so instead of waiting silently. One row per process,
-- renewed with its leases, removed when it stops; a row past expires_at is a worker that died.
CREATE TABLE workers (
  worker_id TEXT PRIMARY KEY,
  label TEXT NOT NULL,
  project_id TEXT,
  workflows TEXT NOT NULL,
  started_at INTEGER NOT NULL,
  seen_at INTEGER NOT NULL,
  expires_at INTEGER NOT NULL
) STRICT;
