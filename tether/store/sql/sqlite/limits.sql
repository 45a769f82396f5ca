-- name: limit_lock
-- A concurrency limit key's lock: SQLite serializes writers, so the claim's transaction holds it.
SELECT 1 AS locked

-- name: limit_slots_held
-- How many slots of a concurrency limit key runs other than :run_id hold: unfinished runs of the
-- key whose lease is live. (SQLite serializes writers: no other claim commits meanwhile.)
SELECT count(*) AS held FROM run_queue o JOIN runs r ON r.run_id = o.run_id
JOIN leases l ON l.resource_id = r.resource_id
WHERE o.project_id = :project_id AND o.limit_key = :limit_key AND o.finished_at IS NULL
  AND l.owner_id IS NOT NULL AND l.expires_at > :now AND o.run_id != :run_id

-- name: limit_waits
-- For each of these runs that counts against a concurrency limit: its key, its cap and how many of
-- the key's slots other runs hold now.
SELECT q.run_id, q.limit_key, q.limit_max,
       (SELECT count(*) FROM run_queue o JOIN runs r ON r.run_id = o.run_id
        JOIN leases l ON l.resource_id = r.resource_id
        WHERE o.project_id = q.project_id AND o.limit_key = q.limit_key AND o.finished_at IS NULL
          AND l.owner_id IS NOT NULL AND l.expires_at > :now AND o.run_id != q.run_id) AS held
FROM run_queue q
WHERE q.run_id IN (SELECT value FROM json_each(:run_ids)) AND q.limit_key IS NOT NULL
