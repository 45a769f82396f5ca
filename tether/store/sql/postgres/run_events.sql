-- Events sent into runs (tether.store.run_events): the run inbox and the runs waiting for an
-- event. PostgreSQL dialect (the same query names as sql/sqlite/run_events.sql).

-- name: inbox_insert
-- An event sent into a run.
INSERT INTO run_inbox (event_id, run_id, name, payload_json, sent_by, sent_at)
VALUES (:event_id, :run_id, :name, :payload_json, :sent_by, :now)

-- name: inbox_next
-- The oldest event of that name the run has not taken yet.
SELECT * FROM run_inbox WHERE run_id = :run_id AND name = :name AND taken_at IS NULL
ORDER BY sent_at, event_id LIMIT 1

-- name: inbox_take
-- Mark an event taken by an attempt; 0 rows: it was taken already.
UPDATE run_inbox SET taken_at = :now, taken_by_attempt_id = :attempt_id
WHERE event_id = :event_id AND taken_at IS NULL

-- name: inbox_of_run
-- Every event sent into the run, oldest first.
SELECT * FROM run_inbox WHERE run_id = :run_id ORDER BY sent_at, event_id

-- name: event_wait_set
-- The run waits at a wait_for_event node (its attempt) for an event of that name.
INSERT INTO run_event_waits (run_id, attempt_id, name, deadline_at, created_at)
VALUES (:run_id, :attempt_id, :name, CAST(:deadline_at AS BIGINT), :now)
ON CONFLICT (run_id) DO UPDATE SET attempt_id = excluded.attempt_id, name = excluded.name,
  deadline_at = excluded.deadline_at, created_at = excluded.created_at

-- name: event_wait_get
-- What the run waits for, if it waits for an event.
SELECT * FROM run_event_waits WHERE run_id = :run_id

-- name: event_wait_delete
-- The run no longer waits for an event.
DELETE FROM run_event_waits WHERE run_id = :run_id

-- name: event_waits_ready
-- Runs parked waiting for an event that came or whose time is up, and that no claim holds.
SELECT w.run_id FROM run_event_waits w
JOIN runs r ON r.run_id = w.run_id JOIN run_queue q ON q.run_id = w.run_id
WHERE q.status = 'parked' AND r.status = 'waiting'
  AND (CAST(:project_id AS TEXT) IS NULL OR q.project_id = :project_id)
  AND ((w.deadline_at IS NOT NULL AND w.deadline_at <= :now)
       OR EXISTS (SELECT 1 FROM run_inbox i WHERE i.run_id = w.run_id AND i.name = w.name
                  AND i.taken_at IS NULL))
ORDER BY w.created_at, w.run_id LIMIT 100
