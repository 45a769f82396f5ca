-- Forks (tether.store.forks): a restart that takes over its parent's completed node attempts
-- from before the fork's node. SQLite dialect (the same query names as sql/postgres/forks.sql).

-- name: attempt_copy
-- Copy one completed attempt of the parent into the fork, as the fork's own completed attempt of
-- that node (numbered after the fork's earlier attempts of it); the output blob is shared, the
-- parent's start and finish times are kept, no runner generation is recorded. No row when the
-- source is not a completed attempt of the parent.
INSERT INTO node_attempts(attempt_id, run_id, node_id, attempt_number, status, output_hash,
                          exit_name, error_hash, timeout_ms, lease_generation, created_at,
                          updated_at, started_at, finished_at)
SELECT :attempt_id, :run_id, p.node_id,
       (SELECT COALESCE(max(c.attempt_number), 0) + 1 FROM node_attempts c
        WHERE c.run_id = :run_id AND c.node_id = p.node_id),
       'completed', p.output_hash, p.exit_name, NULL, p.timeout_ms, NULL, :now, :now,
       p.started_at, p.finished_at
FROM node_attempts p
WHERE p.attempt_id = :source_attempt_id AND p.run_id = :parent_run_id AND p.status = 'completed'
