-- Runs: reservation, reads, claims and status moves. Status sources come from states.py as a
-- JSON array (:sources) so that the transition table is the single place that allows a move.

-- name: run_row
-- Everything about one run that the record and the guards need.
SELECT r.run_id, r.resource_id, r.project_id, d.workflow_name, r.workflow_ref, r.status AS run_status,
       r.paused, r.definition_digest, d.definition_hash, r.input_hash, r.launch_options_hash,
       q.status, q.available_at, q.error_code, q.error_hash, b.origin_session_id,
       b.execution_mode, r.parent_run_id, r.root_run_id, r.lineage_kind, r.restart_number,
       r.parent_run_revision, q.created_at, q.updated_at, q.started_at, q.finished_at,
       l.generation, l.owner_type, l.owner_id, l.token_hash, l.heartbeat_at, l.expires_at,
       res.revision, q.limit_key, q.limit_max, c.parent_run_id AS child_of, c.node_id AS child_of_node,
       c.waits AS child_waits
FROM runs r JOIN workflow_definitions d ON d.definition_digest = r.definition_digest
JOIN run_queue q ON q.run_id = r.run_id
LEFT JOIN run_bindings b ON b.run_id = r.run_id
JOIN leases l ON l.resource_id = r.resource_id
JOIN resources res ON res.resource_id = r.resource_id
LEFT JOIN run_children c ON c.child_run_id = r.run_id
WHERE r.run_id = :run_id

-- name: run_list
-- Runs newest first, optionally by project, queue statuses and exclusions.
SELECT r.run_id FROM runs r JOIN run_queue q ON q.run_id = r.run_id
WHERE (:project_id IS NULL OR r.project_id = :project_id)
  AND (:statuses IS NULL OR EXISTS (SELECT 1 FROM json_each(:statuses) WHERE value = q.status))
  AND (:exclude IS NULL OR NOT EXISTS (SELECT 1 FROM json_each(:exclude) WHERE value = r.run_id))
ORDER BY q.created_at DESC, r.run_id DESC LIMIT :limit

-- name: run_view_list
-- Viewer rows newest first (all projects).
SELECT * FROM run_views ORDER BY created_at DESC, run_id DESC LIMIT :limit OFFSET :offset

-- name: run_view_get
-- One run's viewer row.
SELECT * FROM run_views WHERE run_id = :run_id

-- name: run_view_session
-- The newest non-terminal interactive run of an origin session, as a viewer row.
SELECT * FROM run_views WHERE origin_session_id = :session_id AND execution_mode = 'interactive'
  AND NOT (status = 'done' OR status = 'failed' OR status = 'cancelled')
ORDER BY created_at DESC, run_id DESC LIMIT 1

-- name: run_session_reservation
-- The newest non-terminal interactive run of an origin session.
SELECT r.run_id FROM runs r JOIN run_queue q ON q.run_id = r.run_id
JOIN run_bindings b ON b.run_id = r.run_id
WHERE b.origin_session_id = :session_id AND b.execution_mode = 'interactive'
  AND NOT (q.status = 'done' OR q.status = 'failed' OR q.status = 'cancelled')
ORDER BY q.created_at DESC, r.run_id DESC LIMIT 1

-- name: run_awaiting_resume
-- Parked runs whose decisions are all answered and that wait for nothing else (a resume was
-- refused while their session's active slot was taken). Driven from the decisions, which are few.
SELECT DISTINCT q.run_id, q.updated_at FROM human_decisions d
CROSS JOIN run_queue q CROSS JOIN runs r  -- CROSS JOIN keeps SQLite's loop on the decisions
WHERE q.run_id = d.run_id AND r.run_id = q.run_id AND q.status = 'parked' AND r.status = 'waiting' AND r.paused = 0
  AND (q.error_code IS NULL OR NOT (q.error_code = 'effectAmbiguous'
      OR q.error_code = 'workflowSourceChanged' OR q.error_code = 'runnerNoProgress'))
  AND NOT EXISTS (SELECT 1 FROM human_decisions o LEFT JOIN human_decision_resolutions x
                  ON x.decision_id = o.decision_id WHERE o.run_id = q.run_id AND x.decision_id IS NULL)
  AND NOT EXISTS (SELECT 1 FROM interactive_requests i WHERE i.run_id = q.run_id AND i.status = 'pending')
  AND (:project_id IS NULL OR r.project_id = :project_id)
  AND NOT EXISTS (SELECT 1 FROM run_event_waits w WHERE w.run_id = q.run_id)  -- waits for an event
ORDER BY q.updated_at, q.run_id LIMIT 100

-- name: run_session_active
-- An interactive run that holds the session's one active slot.
SELECT run_id FROM run_queue WHERE origin_session_id = :session_id
  AND (status = 'queued' OR status = 'starting' OR status = 'running') LIMIT 1

-- name: run_list_revision
-- Count, revision sum and newest queue change: a cheap "did anything change" token.
SELECT count(*) AS count, COALESCE(sum(res.revision), 0) AS revision_sum,
       COALESCE(max(q.updated_at), 0) AS updated_at
FROM runs r JOIN run_queue q ON q.run_id = r.run_id
JOIN resources res ON res.resource_id = r.resource_id

-- name: run_project_path
-- The project a run belongs to.
SELECT p.canonical_path FROM runs r JOIN projects p ON p.project_id = r.project_id
WHERE r.run_id = :run_id

-- name: run_sources
-- A run's source identities, root first.
SELECT mount_path, source_type, source_ref, source_revision FROM run_sources
WHERE run_id = :run_id ORDER BY mount_path

-- name: definition_insert
-- First writer of a digest names it.
INSERT INTO workflow_definitions(definition_digest, workflow_name, definition_hash, created_at)
VALUES (:digest, :name, :definition_hash, :now) ON CONFLICT(definition_digest) DO NOTHING

-- name: lease_insert
-- The lease of a new run: unowned, generation 0.
INSERT INTO leases(resource_id, generation) VALUES (:resource_id, 0)

-- name: run_insert
-- The durable row of a new run.
INSERT INTO runs(run_id, resource_id, project_id, parent_run_id, root_run_id, lineage_kind,
                 restart_number, parent_run_revision, definition_digest, workflow_ref,
                 launch_options_hash, status, paused, input_hash, created_at, updated_at)
VALUES (:run_id, :resource_id, :project_id, :parent_run_id, :root_run_id, :lineage_kind,
        :restart_number, :parent_run_revision, :digest, :workflow_ref, :launch_options_hash,
        'queued', 0, :input_hash, :now, :now)

-- name: run_source_insert
-- One source identity of a run.
INSERT INTO run_sources(run_id, mount_path, source_type, source_ref, source_revision)
VALUES (:run_id, :mount_path, :source_type, :source_ref, :source_revision)

-- name: run_binding_insert
-- Which session started the run and how it runs.
INSERT INTO run_bindings(run_id, origin_session_id, execution_mode, created_at)
VALUES (:run_id, :origin_session_id, :execution_mode, :now)

-- name: run_queue_insert
-- The queue row of a new run (with the concurrency limit it counts against, if any).
INSERT INTO run_queue(run_id, project_id, status, available_at, origin_session_id,
                      consecutive_errors, created_at, updated_at, limit_key, limit_max)
VALUES (:run_id, :project_id, 'queued', :now, :origin_session_id, 0, :now, :now, :limit_key, :limit_max)

-- name: run_has_pending_request
-- Whether an interactive request of the run waits for its session.
SELECT 1 FROM interactive_requests WHERE run_id = :run_id AND status = 'pending' LIMIT 1

-- name: run_claim_next
-- The first claimable run of a project in queue order; every clause of SPEC claimNext.
-- A run that counts against a concurrency limit whose slots other runs hold (see limits.sql) is
-- left for later; its key and cap come with the candidate, for claim_next's re-count.
SELECT q.run_id, q.limit_key, q.limit_max, q.project_id FROM run_queue q INDEXED BY run_queue_claimable
JOIN runs r ON r.run_id = q.run_id JOIN leases l ON l.resource_id = r.resource_id
WHERE q.project_id = :project_id
  AND (q.status = 'queued' OR q.status = 'parked' OR q.status = 'starting' OR q.status = 'running')
  AND q.available_at <= :now
  AND (l.owner_id IS NULL OR l.expires_at <= :now OR l.owner_id = :runner_id)
  AND NOT (q.status = 'parked' AND (r.status = 'waiting' OR r.paused = 1))
  AND NOT EXISTS (SELECT 1 FROM interactive_requests i WHERE i.run_id = q.run_id AND i.status = 'pending')
  AND (q.error_code IS NULL OR q.error_code NOT IN ('workflowSourceChanged', 'runnerNoProgress'))
  AND NOT (q.status = 'parked' AND q.origin_session_id IS NOT NULL AND EXISTS (
       SELECT 1 FROM run_queue o WHERE o.origin_session_id = q.origin_session_id
         AND (o.status = 'queued' OR o.status = 'starting'
             OR o.status = 'running') AND o.run_id != q.run_id))
  AND (:exclude IS NULL OR NOT EXISTS (SELECT 1 FROM json_each(:exclude) WHERE value = q.run_id))
  AND (:digests IS NULL OR EXISTS (SELECT 1 FROM json_each(:digests) WHERE value = lower(hex(r.definition_digest))))
  AND (q.limit_key IS NULL OR (SELECT count(*) FROM run_queue o JOIN runs ro ON ro.run_id = o.run_id
       JOIN leases lo ON lo.resource_id = ro.resource_id
       WHERE o.project_id = q.project_id AND o.limit_key = q.limit_key AND o.finished_at IS NULL
         AND lo.owner_id IS NOT NULL AND lo.expires_at > :now AND o.run_id != q.run_id) < q.limit_max)
ORDER BY q.project_id, q.available_at, q.created_at, q.run_id LIMIT 1

-- name: run_claim_next_global
-- The first claimable run of any project in queue order.
SELECT q.run_id, q.limit_key, q.limit_max, q.project_id FROM run_queue q INDEXED BY run_queue_claimable_all
JOIN runs r ON r.run_id = q.run_id JOIN leases l ON l.resource_id = r.resource_id
WHERE (q.status = 'queued' OR q.status = 'parked' OR q.status = 'starting' OR q.status = 'running')
  AND q.available_at <= :now
  AND (l.owner_id IS NULL OR l.expires_at <= :now OR l.owner_id = :runner_id)
  AND NOT (q.status = 'parked' AND (r.status = 'waiting' OR r.paused = 1))
  AND NOT EXISTS (SELECT 1 FROM interactive_requests i WHERE i.run_id = q.run_id AND i.status = 'pending')
  AND (q.error_code IS NULL OR q.error_code NOT IN ('workflowSourceChanged', 'runnerNoProgress'))
  AND NOT (q.status = 'parked' AND q.origin_session_id IS NOT NULL AND EXISTS (
       SELECT 1 FROM run_queue o WHERE o.origin_session_id = q.origin_session_id
         AND (o.status = 'queued' OR o.status = 'starting'
             OR o.status = 'running') AND o.run_id != q.run_id))
  AND (:exclude IS NULL OR NOT EXISTS (SELECT 1 FROM json_each(:exclude) WHERE value = q.run_id))
  AND (:digests IS NULL OR EXISTS (SELECT 1 FROM json_each(:digests) WHERE value = lower(hex(r.definition_digest))))
  AND (q.limit_key IS NULL OR (SELECT count(*) FROM run_queue o JOIN runs ro ON ro.run_id = o.run_id
       JOIN leases lo ON lo.resource_id = ro.resource_id
       WHERE o.project_id = q.project_id AND o.limit_key = q.limit_key AND o.finished_at IS NULL
         AND lo.owner_id IS NOT NULL AND lo.expires_at > :now AND o.run_id != q.run_id) < q.limit_max)
ORDER BY q.available_at, q.created_at, q.run_id LIMIT 1

-- name: lease_take
-- Take the lease one generation up, by compare-and-set on the generation read.
UPDATE leases SET generation = :generation + 1, owner_type = :owner_type, owner_id = :owner_id,
       token_hash = :token_hash, acquired_at = :now, heartbeat_at = :now, expires_at = :expires_at
WHERE resource_id = :resource_id AND generation = :generation
  AND (:require_free = 0 OR owner_id IS NULL OR expires_at <= :now)

-- name: lease_take_next
-- claim_next's claim: lease_take that re-checks every eligibility clause of run_claim_next in the
-- statement that takes the lease (a change that committed after the candidate was chosen makes it
-- take nothing).
UPDATE leases SET generation = :generation + 1, owner_type = :owner_type, owner_id = :owner_id,
       token_hash = :token_hash, acquired_at = :now, heartbeat_at = :now, expires_at = :expires_at
WHERE resource_id = :resource_id AND generation = :generation
  AND (owner_id IS NULL OR expires_at <= :now OR owner_id = :owner_id)
  AND EXISTS (
    SELECT 1 FROM run_queue q JOIN runs r ON r.run_id = q.run_id
    WHERE r.resource_id = leases.resource_id
      AND (:project_id IS NULL OR q.project_id = :project_id)
      AND (q.status = 'queued' OR q.status = 'parked' OR q.status = 'starting'
          OR q.status = 'running')
      AND q.available_at <= :now
      AND NOT (q.status = 'parked' AND (r.status = 'waiting' OR r.paused = 1))
      AND NOT EXISTS (SELECT 1 FROM interactive_requests i WHERE i.run_id = q.run_id AND i.status = 'pending')
      AND (q.error_code IS NULL OR q.error_code NOT IN ('workflowSourceChanged', 'runnerNoProgress'))
      AND (:digests IS NULL OR EXISTS (SELECT 1 FROM json_each(:digests) WHERE value = lower(hex(r.definition_digest))))
      AND NOT (q.status = 'parked' AND q.origin_session_id IS NOT NULL AND EXISTS (
           SELECT 1 FROM run_queue o WHERE o.origin_session_id = q.origin_session_id
             AND (o.status = 'queued' OR o.status = 'starting'
                 OR o.status = 'running') AND o.run_id != q.run_id))
      AND (:exclude IS NULL
          OR NOT EXISTS (SELECT 1 FROM json_each(:exclude) WHERE value = q.run_id)))

-- name: lease_next_lapse
-- When the next live lease another runner holds on a run (of the project) lapses: the earliest
-- instant claim_next could take one over. Walks the held leases in order of expiry.
SELECT l.expires_at FROM leases l INDEXED BY leases_held
JOIN runs r ON r.resource_id = l.resource_id
WHERE l.owner_id IS NOT NULL AND l.expires_at > :now AND l.owner_id != :runner_id
  AND (:project_id IS NULL OR r.project_id = :project_id)
ORDER BY l.expires_at LIMIT 1

-- name: lease_renew
-- Extend a live lease held with this exact token and generation.
UPDATE leases SET heartbeat_at = :now, expires_at = :expires_at
WHERE resource_id = :resource_id AND owner_type = :owner_type AND owner_id = :owner_id
  AND token_hash = :token_hash AND generation = :generation AND expires_at > :now

-- name: lease_release
-- Clear the owner of a lease held with this exact token and generation (the generation stays).
UPDATE leases SET owner_type = NULL, owner_id = NULL, token_hash = NULL, acquired_at = NULL,
       heartbeat_at = NULL, expires_at = NULL
WHERE resource_id = :resource_id AND token_hash = :token_hash AND generation = :generation
  AND expires_at > :now

-- name: queue_set_status
-- Move the queue status along a legal edge; optionally clear errors, stamp start/finish.
UPDATE run_queue SET status = :status, updated_at = :now,
       error_code = CASE WHEN :clear_error THEN NULL ELSE error_code END,
       error_hash = CASE WHEN :clear_error THEN NULL ELSE error_hash END,
       started_at = CASE WHEN :stamp_start THEN COALESCE(started_at, :now) ELSE started_at END,
       finished_at = CASE WHEN (:status = 'done' OR :status = 'failed'
           OR :status = 'cancelled') THEN :now ELSE NULL END
WHERE run_id = :run_id AND EXISTS (SELECT 1 FROM json_each(:sources) WHERE value = status)

-- name: queue_park_with_error
-- Park with an error code for an operator (special parks).
UPDATE run_queue SET status = 'parked', error_code = :code, error_hash = :error_hash,
       available_at = CASE WHEN :touch_available THEN :now ELSE available_at END,
       updated_at = :now, finished_at = NULL
WHERE run_id = :run_id AND EXISTS (SELECT 1 FROM json_each(:sources) WHERE value = status)

-- name: queue_finish
-- A terminal queue move with its code and error text.
UPDATE run_queue SET status = :status, error_code = :code, error_hash = :error_hash,
       updated_at = :now, finished_at = :now
WHERE run_id = :run_id AND EXISTS (SELECT 1 FROM json_each(:sources) WHERE value = status)

-- name: queue_requeue
-- Put the run back in the queue now (resume request).
UPDATE run_queue SET status = 'queued', error_code = NULL, error_hash = NULL, available_at = :now,
       updated_at = :now, finished_at = NULL
WHERE run_id = :run_id AND EXISTS (SELECT 1 FROM json_each(:sources) WHERE value = status)

-- name: queue_delay
-- Make a parked run claimable again at a given time (durable sleeps, retry backoff).
UPDATE run_queue SET available_at = :available_at, updated_at = :now WHERE run_id = :run_id

-- name: run_set_status
-- Move the durable status along a legal edge; waiting and terminal runs carry finished_at.
UPDATE runs SET status = :status, status_detail = :detail, updated_at = :now,
       paused = CASE WHEN (:status = 'completed' OR :status = 'failed' OR :status = 'timed_out'
           OR :status = 'cancelled') THEN 0 ELSE paused END,
       error_hash = COALESCE(:error_hash, error_hash),
       finished_at = CASE WHEN (:status = 'completed' OR :status = 'failed'
           OR :status = 'timed_out' OR :status = 'cancelled') THEN :now
                          WHEN :status = 'waiting' THEN COALESCE(finished_at, :now) ELSE NULL END
WHERE run_id = :run_id AND EXISTS (SELECT 1 FROM json_each(:sources) WHERE value = status)

-- name: run_set_detail
-- Record why a non-terminal run stopped; finished_at stays set only while waiting.
UPDATE runs SET status_detail = :detail, updated_at = :now,
       finished_at = CASE WHEN status = 'waiting' THEN COALESCE(finished_at, :now) ELSE NULL END
WHERE run_id = :run_id AND NOT (status = 'completed' OR status = 'failed'
    OR status = 'timed_out' OR status = 'cancelled')

-- name: run_set_paused
-- Set or clear the pause flag when it has the expected value.
UPDATE runs SET paused = :paused, status_detail = COALESCE(:detail, status_detail), updated_at = :now
WHERE run_id = :run_id AND paused = 1 - :paused
  AND EXISTS (SELECT 1 FROM json_each(:sources) WHERE value = status)

-- name: run_delete_events
-- The journal entries of a run and of its effects (delete removes the run whole).
DELETE FROM events WHERE resource_id = :resource_id OR resource_id IN (
  SELECT resource_id FROM effects WHERE source_resource_id = :resource_id)

-- name: run_delete_effect_resources
-- The resources of a run's effects.
DELETE FROM resources WHERE resource_id IN (
  SELECT resource_id FROM effects WHERE source_resource_id = :resource_id)

-- name: run_restart_child
-- The restart of a run, if it has one (one restart per parent).
SELECT run_id FROM runs WHERE parent_run_id = :run_id AND lineage_kind = 'restart' LIMIT 1

-- name: run_delete_children_exist
-- Restart children that still point at a run.
SELECT run_id FROM runs WHERE (parent_run_id = :run_id OR root_run_id = :run_id) AND run_id != :run_id
LIMIT 1

-- name: run_delete_resource
-- Remove the run's resource; everything else cascades.
DELETE FROM resources WHERE resource_id = :resource_id

-- name: run_past_deadline
-- Unfinished runs of one definition started at or before a cutoff: their run deadline passed.
-- Walks the claimable index, which holds unfinished runs only.
SELECT q.run_id FROM run_queue q CROSS JOIN runs r
WHERE r.run_id = q.run_id AND (q.status = 'queued' OR q.status = 'parked' OR q.status = 'starting'
    OR q.status = 'running') AND q.created_at <= :started_by AND r.definition_digest = :digest
  AND (:project_id IS NULL OR q.project_id = :project_id)
ORDER BY q.created_at, q.run_id LIMIT 100
