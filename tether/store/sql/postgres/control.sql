-- Control: cancel requests and the live workers' loaded workflows.

-- name: run_cancel_requested
-- Whether the run's cancel was requested (read after the run's row in a transaction that begins
-- a node or an effect; on PostgreSQL that read took the run lock, so a request committed before
-- it is seen).
SELECT cancel_requested_at FROM run_queue WHERE run_id = :run_id AND cancel_requested_at IS NOT NULL

-- name: run_cancel_request
-- Mark the run's cancel requested (once).
UPDATE run_queue SET cancel_requested_at = :now WHERE run_id = :run_id AND cancel_requested_at IS NULL

-- name: runs_cancel_requested
-- Which of the runs named have a cancel requested and are not finished.
SELECT q.run_id FROM run_queue q
WHERE q.run_id IN (SELECT jsonb_array_elements_text(CAST(:run_ids AS JSONB)))
  AND q.cancel_requested_at IS NOT NULL AND q.status NOT IN ('done', 'failed', 'cancelled')

-- name: runs_due_at
-- When each of the runs named may be taken next: a queued run's start or a parked run's wake-up
-- (a retry's backoff, a durable sleep). Runs that are held, finished or waiting for a person or an
-- operator have no such time.
SELECT q.run_id, q.available_at FROM run_queue q JOIN runs r ON r.run_id = q.run_id
WHERE q.run_id IN (SELECT jsonb_array_elements_text(CAST(:run_ids AS JSONB)))
  AND (q.status = 'queued' OR q.status = 'parked')
  AND r.status != 'waiting' AND r.paused = 0 AND q.error_code IS NULL

-- name: worker_upsert
-- A worker process announces itself and what it has loaded, or renews that announcement.
INSERT INTO workers (worker_id, label, project_id, workflows, started_at, seen_at, expires_at)
VALUES (:worker_id, :label, :project_id, :workflows, :now, :now, :expires_at)
ON CONFLICT (worker_id) DO UPDATE SET workflows = excluded.workflows, seen_at = excluded.seen_at,
  expires_at = excluded.expires_at

-- name: worker_delete
DELETE FROM workers WHERE worker_id = :worker_id

-- name: workers_expired_delete
-- Workers that stopped renewing long ago (they died): forgotten.
DELETE FROM workers WHERE expires_at < :before

-- name: workers_live
-- The live workers (of the project, or all), oldest first.
SELECT worker_id, label, project_id, workflows, started_at, seen_at, expires_at FROM workers
WHERE expires_at > :now AND (CAST(:project_id AS TEXT) IS NULL OR project_id IS NULL OR project_id = :project_id)
ORDER BY started_at, worker_id

-- name: run_coming_due
-- One run of the given definitions that a runner could execute now or later without anyone's
-- help: queued or parked (a durable sleep, a retry's backoff), not waiting for a person, not
-- paused, not parked for an operator.
SELECT q.run_id FROM run_queue q JOIN runs r ON r.run_id = q.run_id
WHERE q.status IN ('queued', 'parked')
  AND (CAST(:project_id AS TEXT) IS NULL OR q.project_id = :project_id)
  AND r.status != 'waiting' AND r.paused = 0 AND q.error_code IS NULL
  AND encode(r.definition_digest, 'hex') IN (SELECT jsonb_array_elements_text(CAST(:digests AS JSONB)))
LIMIT 1
