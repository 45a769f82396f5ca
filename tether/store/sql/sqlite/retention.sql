-- Retention (tether.store.retention): finding finished runs and deleting everything recorded for
-- them. SQLite dialect (the same query names as sql/postgres/retention.sql).
--
-- THE PER-TABLE DELETES live in the section "what a run owns" below, and only there: a table
-- added to or changed in the schema is adapted here (the blobs a run refers to, the rows that
-- do not go with the run's resource by ON DELETE CASCADE).

-- name: prune_candidates
-- Finished runs in the given queue statuses (",done,failed," style list) that finished before
-- :before, after the (finished_at, run_id) cursor, oldest first (index run_queue_finished).
SELECT q.run_id, r.root_run_id, q.finished_at
FROM run_queue q JOIN runs r ON r.run_id = q.run_id
WHERE q.finished_at IS NOT NULL AND q.finished_at < :before
  AND (q.finished_at > :after_at OR (q.finished_at = :after_at AND q.run_id > :after_id))
  AND instr(:statuses, ',' || q.status || ',') > 0
  AND (:project_id IS NULL OR q.project_id = :project_id)
ORDER BY q.finished_at, q.run_id LIMIT :limit

-- name: prune_family
-- A restart family (its root and the chain of restarts after it: one restart per parent), in
-- chain order, with what decides whether each may go.
SELECT r.run_id, r.restart_number, q.status, q.finished_at, q.project_id
FROM runs r JOIN run_queue q ON q.run_id = r.run_id
WHERE r.root_run_id = :root_run_id
ORDER BY r.restart_number

-- name: prune_run_lock
-- The run, read again in the transaction that deletes it (on PostgreSQL its run lock is taken
-- first, as every writer of the run does).
SELECT r.resource_id, q.status, q.finished_at
FROM runs r JOIN run_queue q ON q.run_id = r.run_id
WHERE r.run_id = :run_id

-- name: prune_pointed_at
-- A run that still points at this one (a restart child, or a run of its family).
SELECT run_id FROM runs WHERE (parent_run_id = :run_id OR root_run_id = :run_id) AND run_id <> :run_id
LIMIT 1

-- ---------------------------------------------------------------------------------------------
-- What a run owns.

-- name: prune_run_counts
-- What the run's deletion removes, by kind (for the report).
SELECT
  (SELECT count(*) FROM events WHERE resource_id = :resource_id OR resource_id IN (
     SELECT resource_id FROM effects WHERE source_resource_id = :resource_id)) AS events,
  (SELECT count(*) FROM node_attempts WHERE run_id = :run_id) AS attempts,
  (SELECT count(*) FROM interactive_requests WHERE run_id = :run_id) AS requests,
  (SELECT count(*) FROM human_decisions WHERE run_id = :run_id) AS decisions,
  (SELECT count(*) FROM effects WHERE source_resource_id = :resource_id) AS effects,
  (SELECT count(*) FROM workflow_messages WHERE run_id = :run_id) AS messages,
  (SELECT count(*) FROM viewer_revisions WHERE run_id = :run_id) AS viewer_rows

-- name: prune_run_blobs
-- Every blob the run's rows refer to (candidates for deletion once the run is gone; the
-- workflow definition's blob stays: definitions are shared by runs and kept).
SELECT input_hash AS blob_hash FROM runs WHERE run_id = :run_id
UNION SELECT launch_options_hash FROM runs WHERE run_id = :run_id
UNION SELECT error_hash FROM runs WHERE run_id = :run_id AND error_hash IS NOT NULL
UNION SELECT error_hash FROM run_queue WHERE run_id = :run_id AND error_hash IS NOT NULL
UNION SELECT payload_hash FROM events WHERE payload_hash IS NOT NULL AND (resource_id = :resource_id
  OR resource_id IN (SELECT resource_id FROM effects WHERE source_resource_id = :resource_id))
UNION SELECT output_hash FROM node_attempts WHERE run_id = :run_id AND output_hash IS NOT NULL
UNION SELECT error_hash FROM node_attempts WHERE run_id = :run_id AND error_hash IS NOT NULL
UNION SELECT payload_hash FROM interactive_requests WHERE run_id = :run_id
UNION SELECT s.payload_hash FROM interactive_submissions s
  JOIN interactive_requests q ON q.request_id = s.request_id WHERE q.run_id = :run_id
UNION SELECT s.receipt_hash FROM interactive_submissions s
  JOIN interactive_requests q ON q.request_id = s.request_id
  WHERE q.run_id = :run_id AND s.receipt_hash IS NOT NULL
UNION SELECT request_hash FROM human_decisions WHERE run_id = :run_id
UNION SELECT x.response_hash FROM human_decision_resolutions x
  JOIN human_decisions d ON d.decision_id = x.decision_id
  WHERE d.run_id = :run_id AND x.response_hash IS NOT NULL
UNION SELECT payload_hash FROM effects WHERE source_resource_id = :resource_id
UNION SELECT result_hash FROM effects WHERE source_resource_id = :resource_id AND result_hash IS NOT NULL
UNION SELECT error_hash FROM effects WHERE source_resource_id = :resource_id AND error_hash IS NOT NULL
UNION SELECT a.error_hash FROM effect_attempts a JOIN effects e ON e.effect_id = a.effect_id
  WHERE e.source_resource_id = :resource_id AND a.error_hash IS NOT NULL
UNION SELECT payload_hash FROM workflow_messages WHERE run_id = :run_id

-- name: prune_delete_events
-- The journal entries of the run and of its effects (events do not cascade from resources).
DELETE FROM events WHERE resource_id = :resource_id OR resource_id IN (
  SELECT resource_id FROM effects WHERE source_resource_id = :resource_id)

-- name: prune_delete_effect_resources
-- The resources of the run's effects (their effects and effect attempts cascade).
DELETE FROM resources WHERE resource_id IN (
  SELECT resource_id FROM effects WHERE source_resource_id = :resource_id)

-- name: prune_delete_run
-- The run's resource: the run, its lease, queue row, sources, binding, attempts (and their
-- active intervals), requests and submissions, decisions and resolutions, messages and viewer
-- rows cascade.
DELETE FROM resources WHERE resource_id = :resource_id

-- name: prune_blob_guard
-- Nothing to take: the transaction holds the database.
SELECT 1 AS held

-- name: prune_blob_delete
-- One candidate blob, if no row refers to it any more.
DELETE FROM blobs WHERE blob_hash = :hash AND blob_hash NOT IN (
    SELECT definition_hash FROM workflow_definitions
    UNION SELECT input_hash FROM runs UNION SELECT launch_options_hash FROM runs
    UNION SELECT error_hash FROM runs WHERE error_hash IS NOT NULL
    UNION SELECT error_hash FROM run_queue WHERE error_hash IS NOT NULL
    UNION SELECT payload_hash FROM events WHERE payload_hash IS NOT NULL
    UNION SELECT output_hash FROM node_attempts WHERE output_hash IS NOT NULL
    UNION SELECT error_hash FROM node_attempts WHERE error_hash IS NOT NULL
    UNION SELECT payload_hash FROM interactive_requests
    UNION SELECT payload_hash FROM interactive_submissions
    UNION SELECT receipt_hash FROM interactive_submissions WHERE receipt_hash IS NOT NULL
    UNION SELECT request_hash FROM human_decisions
    UNION SELECT response_hash FROM human_decision_resolutions WHERE response_hash IS NOT NULL
    UNION SELECT payload_hash FROM effects
    UNION SELECT result_hash FROM effects WHERE result_hash IS NOT NULL
    UNION SELECT error_hash FROM effects WHERE error_hash IS NOT NULL
    UNION SELECT error_hash FROM effect_attempts WHERE error_hash IS NOT NULL
    UNION SELECT payload_hash FROM workflow_messages)
