-- name: limit_lock
-- Try to take a concurrency limit key's advisory lock, kept to the transaction's end (false: another
-- transaction is claiming a run of the key now). Claims of one key so count one after the other,
-- never waiting: a claim that waited could deadlock with another worker's batch of claims taking two
-- keys in the other order. (The two-int form keeps these keys apart from the blob guard's bigint.)
SELECT pg_try_advisory_xact_lock(1413829704, hashtext(:project_id || '/' || :limit_key)) AS locked

-- name: limit_slots_held
-- How many slots of a concurrency limit key runs other than :run_id hold: unfinished runs of the
-- key whose lease is live. Read under the key's lock (limit_lock): READ COMMITTED gives this
-- statement a snapshot taken after the lock was granted, in which the claim of the lock's previous
-- holder has committed.
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
WHERE q.run_id IN (SELECT jsonb_array_elements_text(CAST(:run_ids AS JSONB))) AND q.limit_key IS NOT NULL
