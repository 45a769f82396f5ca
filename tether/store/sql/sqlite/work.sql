-- What the engine records while a run executes: node attempts and their active time,
-- interactive requests and submissions, human decisions, effects, workflow messages.

-- name: attempt_insert
-- Start a node attempt; the attempt as attempt_get reads it (no active time yet). Read after
-- the write, not RETURNING: SQLite buffers returned rows in a temporary table.
INSERT INTO node_attempts(attempt_id, run_id, node_id, attempt_number, status, timeout_ms,
                          lease_generation, created_at, updated_at, started_at)
VALUES (:attempt_id, :run_id, :node_id,
        (SELECT COALESCE(max(attempt_number), 0) + 1 FROM node_attempts
         WHERE run_id = :run_id AND node_id = :node_id),
        'running', :timeout_ms, :generation, :now, :now, :now);
SELECT *, 0 AS elapsed_ms FROM node_attempts WHERE attempt_id = :attempt_id

-- name: attempt_insert_settled
-- Record an attempt that ran and ended in one go (a try of an item of a fan-out node, run beside
-- its node's active attempt).
INSERT INTO node_attempts(attempt_id, run_id, node_id, attempt_number, status, output_hash,
                          error_hash, lease_generation, created_at, updated_at, started_at,
                          finished_at)
VALUES (:attempt_id, :run_id, :node_id,
        (SELECT COALESCE(max(attempt_number), 0) + 1 FROM node_attempts
         WHERE run_id = :run_id AND node_id = :node_id),
        :status, :output_hash, :error_hash, :generation, :now, :now, :started_at, :now)

-- name: attempt_get
-- One attempt with its active time.
SELECT a.*, (SELECT COALESCE(sum(elapsed_ms), 0) FROM attempt_active_intervals t
             WHERE t.attempt_id = a.attempt_id) AS elapsed_ms
FROM node_attempts a WHERE a.attempt_id = :attempt_id

-- name: attempt_list
-- A run's attempts in the order they started.
SELECT a.*, (SELECT COALESCE(sum(elapsed_ms), 0) FROM attempt_active_intervals t
             WHERE t.attempt_id = a.attempt_id) AS elapsed_ms
FROM node_attempts a WHERE a.run_id = :run_id ORDER BY a.rowid

-- name: attempt_finish
-- Settle an active attempt with its output or error; the attempt as attempt_get reads it (none:
-- the attempt is not active), read after the write as in attempt_insert.
UPDATE node_attempts SET status = :status, output_hash = :output_hash, exit_name = :exit_name,
       error_hash = :error_hash, updated_at = :now, finished_at = :now
WHERE attempt_id = :attempt_id AND run_id = :run_id
  AND (status = 'pending' OR status = 'running' OR status = 'waiting');
SELECT a.*, (SELECT COALESCE(sum(elapsed_ms), 0) FROM attempt_active_intervals t
             WHERE t.attempt_id = a.attempt_id) AS elapsed_ms
FROM node_attempts a WHERE a.attempt_id = :attempt_id AND changes() = 1

-- name: attempt_set_waiting
-- An active attempt now waits (input, decision, ambiguous effect).
UPDATE node_attempts SET status = 'waiting', updated_at = :now
WHERE run_id = :run_id AND EXISTS (SELECT 1 FROM json_each(:sources) WHERE value = status)
  AND (:attempt_id IS NULL OR attempt_id = :attempt_id)

-- name: attempt_resume
-- A waiting attempt runs again.
UPDATE node_attempts SET status = 'running', updated_at = :now
WHERE attempt_id = :attempt_id AND run_id = :run_id AND status = 'waiting'

-- name: attempt_interrupt_active
-- Attempts a crashed or fenced runner left active become interrupted.
UPDATE node_attempts SET status = 'interrupted', updated_at = :now, finished_at = :now
WHERE run_id = :run_id AND status IN ('pending', 'running')

-- name: attempt_end_active
-- Settle every unfinished attempt of a run (fail and cancel).
UPDATE node_attempts SET status = :status, error_hash = COALESCE(error_hash, :error_hash),
       updated_at = :now, finished_at = COALESCE(finished_at, :now)
WHERE run_id = :run_id AND (status = 'pending' OR status = 'running' OR status = 'waiting'
    OR status = 'interrupted')

-- name: interval_open
-- Open the next active-time interval of an attempt.
INSERT INTO attempt_active_intervals(attempt_id, interval_number, started_at, observed_at, elapsed_ms)
VALUES (:attempt_id, (SELECT COALESCE(max(interval_number), 0) + 1 FROM attempt_active_intervals
                      WHERE attempt_id = :attempt_id), :now, :now, 0)
RETURNING interval_number

-- name: interval_open_count
-- Open intervals of an attempt.
SELECT count(*) AS open FROM attempt_active_intervals WHERE attempt_id = :attempt_id AND ended_at IS NULL

-- name: interval_sample
-- Record proven active time of an open interval (never less than already stored).
UPDATE attempt_active_intervals SET elapsed_ms = max(elapsed_ms, :elapsed_ms, 0), observed_at = :now
WHERE attempt_id = :attempt_id AND interval_number = :interval_number AND ended_at IS NULL

-- name: interval_close
-- Close one interval at its last sample.
UPDATE attempt_active_intervals SET ended_at = observed_at
WHERE attempt_id = :attempt_id AND interval_number = :interval_number AND ended_at IS NULL

-- name: interval_close_run
-- Close every open interval of a run's attempts without sampling.
UPDATE attempt_active_intervals SET ended_at = observed_at
WHERE ended_at IS NULL AND attempt_id IN (SELECT attempt_id FROM node_attempts WHERE run_id = :run_id)

-- name: request_insert
-- Ask the run's origin session for input.
INSERT INTO interactive_requests(request_id, run_id, attempt_id, target_session_id, kind, revision,
                                 status, payload_hash, created_at, updated_at)
VALUES (:request_id, :run_id, :attempt_id, :target_session_id, :kind, 1, 'pending',
        :payload_hash, :now, :now)

-- name: request_get
-- One interactive request.
SELECT * FROM interactive_requests WHERE request_id = :request_id

-- name: request_list
-- Requests by run and/or target session and/or status.
SELECT * FROM interactive_requests
WHERE (:run_id IS NULL OR run_id = :run_id)
  AND (:session_id IS NULL OR target_session_id = :session_id)
  AND (:status IS NULL OR status = :status)
ORDER BY created_at, request_id

-- name: request_set_status
-- Settle or cancel a pending request (its revision goes one up).
UPDATE interactive_requests SET status = :status, revision = revision + 1, updated_at = :now
WHERE request_id = :request_id AND status = 'pending'

-- name: request_cancel_pending
-- Cancel every pending request of a run.
UPDATE interactive_requests SET status = 'cancelled', revision = revision + 1, updated_at = :now
WHERE run_id = :run_id AND status = 'pending'

-- name: request_expired
-- The first expired pending request of the run for a session, by active time only.
SELECT i.request_id, i.attempt_id
FROM interactive_requests i
JOIN node_attempts a ON a.attempt_id = i.attempt_id
JOIN runs r ON r.run_id = i.run_id
WHERE i.run_id = :run_id AND i.target_session_id = :session_id
  AND i.status = 'pending' AND r.paused = 0 AND a.timeout_ms > 0
  AND (SELECT COALESCE(sum(elapsed_ms), 0) FROM attempt_active_intervals t
       WHERE t.attempt_id = a.attempt_id) >= a.timeout_ms
ORDER BY a.started_at, i.request_id LIMIT 1

-- name: submission_insert
-- A session's answer, to be validated by a runner.
INSERT INTO interactive_submissions(submission_id, request_id, outcome, payload_hash, created_at,
                                    updated_at)
VALUES (:submission_id, :request_id, 'validating', :payload_hash, :now, :now)

-- name: submission_get
-- One submission.
SELECT * FROM interactive_submissions WHERE submission_id = :submission_id

-- name: submission_list
-- A request's submissions, oldest first.
SELECT * FROM interactive_submissions WHERE request_id = :request_id ORDER BY created_at, rowid

-- name: submission_resolve
-- Accept or reject one validating submission with a receipt.
UPDATE interactive_submissions SET outcome = :outcome, receipt_hash = :receipt_hash, updated_at = :now
WHERE submission_id = :submission_id AND outcome = 'validating'

-- name: submission_reject_for_request
-- Reject the validating submissions of one request.
UPDATE interactive_submissions SET outcome = 'rejected', receipt_hash = :receipt_hash, updated_at = :now
WHERE request_id = :request_id AND outcome = 'validating'

-- name: submission_reject_for_run
-- Reject the validating submissions of every request of a run.
UPDATE interactive_submissions SET outcome = 'rejected', receipt_hash = :receipt_hash, updated_at = :now
WHERE outcome = 'validating'
  AND request_id IN (SELECT request_id FROM interactive_requests WHERE run_id = :run_id)

-- name: run_validating_submission
-- Runs with a submission waiting for validation (a runner should take those first); paused
-- runs left out, as they make no progress until resumed.
SELECT DISTINCT i.run_id FROM interactive_submissions s
JOIN interactive_requests i ON i.request_id = s.request_id
JOIN runs r ON r.run_id = i.run_id
WHERE s.outcome = 'validating' AND i.status = 'pending' AND r.paused = 0
  AND (:project_id IS NULL OR r.project_id = :project_id)

-- name: decision_insert
-- Ask a person to decide.
INSERT INTO human_decisions(decision_id, run_id, node_id, request_digest, request_hash, deadline_at,
                            created_at)
VALUES (:decision_id, :run_id, :node_id, :request_digest, :request_hash, :deadline_at, :now)

-- name: decision_select
-- Decisions with their resolutions.
SELECT d.decision_id, d.run_id, d.node_id, d.request_digest, d.request_hash, d.deadline_at,
       d.created_at, x.outcome, x.provenance, x.response_hash, x.reason, x.actor_id, x.resolved_at
FROM human_decisions d LEFT JOIN human_decision_resolutions x ON x.decision_id = d.decision_id
JOIN runs r ON r.run_id = d.run_id
WHERE (:project_id IS NULL OR r.project_id = :project_id)
  AND (:decision_id IS NULL OR d.decision_id = :decision_id)
  AND (:run_id IS NULL OR d.run_id = :run_id)
  AND (:open_only = 0 OR x.decision_id IS NULL)
  AND (:expired_by IS NULL OR (d.deadline_at IS NOT NULL AND d.deadline_at <= :expired_by))
ORDER BY d.created_at, d.decision_id

-- name: decision_resolve
-- Resolve a decision once.
INSERT INTO human_decision_resolutions(decision_id, outcome, provenance, response_hash, reason, channel,
                                       actor_id, request_digest, resolved_at)
SELECT d.decision_id, :outcome, :provenance, :response_hash, :reason, :channel, :actor_id,
       d.request_digest, :now
FROM human_decisions d WHERE d.decision_id = :decision_id
ON CONFLICT(decision_id) DO NOTHING

-- name: decision_cancel_open
-- Cancel every unresolved decision of a run.
INSERT INTO human_decision_resolutions(decision_id, outcome, provenance, response_hash, reason, channel,
                                       actor_id, request_digest, resolved_at)
SELECT d.decision_id, 'cancelled', 'explicit_cancel', NULL, 'Workflow run cancelled', NULL, :actor_id,
       d.request_digest, :now
FROM human_decisions d LEFT JOIN human_decision_resolutions x ON x.decision_id = d.decision_id
WHERE d.run_id = :run_id AND x.decision_id IS NULL

-- name: effect_insert
-- Record an effect as pending before anything is applied.
INSERT INTO effects(effect_id, resource_id, source_resource_id, effect_type, owner_scope,
                    idempotency_key, payload_hash, status, attempt_count, created_at, updated_at)
VALUES (:effect_id, :resource_id, :source_resource_id, :effect_type, :owner_scope, :idempotency_key,
        :payload_hash, 'pending', 0, :now, :now)

-- name: effect_get
-- One effect.
SELECT e.*, r.run_id FROM effects e JOIN runs r ON r.resource_id = e.source_resource_id
WHERE e.effect_id = :effect_id

-- name: effect_by_key
-- The effect recorded under an idempotency key.
SELECT e.*, r.run_id FROM effects e JOIN runs r ON r.resource_id = e.source_resource_id
WHERE e.idempotency_key = :idempotency_key

-- name: effects_of_run
-- A run's effects, oldest first.
SELECT e.*, r.run_id FROM effects e JOIN runs r ON r.resource_id = e.source_resource_id
WHERE r.run_id = :run_id
ORDER BY e.created_at, e.effect_id

-- name: effect_list
-- Effects, of one run and of one status when given, oldest first.
SELECT e.*, r.run_id FROM effects e JOIN runs r ON r.resource_id = e.source_resource_id
WHERE (:run_id IS NULL OR r.run_id = :run_id) AND (:status IS NULL OR e.status = :status)
ORDER BY e.created_at, e.effect_id

-- name: effect_set_status
-- Move one effect by compare-and-set on its status and attempt count.
UPDATE effects SET status = :status, attempt_count = :attempt_count, next_attempt_at = NULL,
       result_hash = COALESCE(:result_hash, result_hash), error_hash = :error_hash, updated_at = :now,
       settled_at = CASE WHEN (:status = 'applied' OR :status = 'rejected'
           OR :status = 'ambiguous' OR :status = 'cancelled') THEN :now
                         ELSE NULL END
WHERE effect_id = :effect_id AND status = :old_status AND attempt_count = :old_attempt_count

-- name: effect_attempt_insert
-- One try at applying an effect.
INSERT INTO effect_attempts(effect_id, attempt_number, lease_generation, started_at)
VALUES (:effect_id, :attempt_number, :generation, :now)

-- name: effect_attempt_finish
-- Close the open try of an effect.
UPDATE effect_attempts SET finished_at = :now, outcome = :outcome, error_hash = :error_hash
WHERE effect_id = :effect_id AND attempt_number = :attempt_number AND finished_at IS NULL

-- name: effect_settle_pending
-- Settle one pending effect as applied (queue-owned effects).
UPDATE effects SET status = 'applied', updated_at = :now, settled_at = :now
WHERE effect_id = :effect_id AND status = 'pending'

-- name: message_insert
-- Queue a message to the origin session.
INSERT INTO workflow_messages(workflow_message_id, run_id, target_session_id, kind, status,
                              payload_hash, created_at, updated_at)
VALUES (:message_id, :run_id, :target_session_id, :kind, 'pending', :payload_hash, :now, :now)

-- name: message_select
-- Messages by session and/or run and/or status, oldest first.
SELECT * FROM workflow_messages
WHERE (:session_id IS NULL OR target_session_id = :session_id)
  AND (:run_id IS NULL OR run_id = :run_id)
  AND (:status IS NULL OR status = :status)
ORDER BY created_at, rowid

-- name: message_mark_sent
-- The session acknowledged delivery.
UPDATE workflow_messages SET status = 'sent', updated_at = :now
WHERE workflow_message_id = :message_id AND target_session_id = :session_id AND status = 'pending'

-- name: message_cancel_pending
-- Cancel a run's pending messages of the given kinds.
UPDATE workflow_messages SET status = 'cancelled', updated_at = :now
WHERE run_id = :run_id AND status = 'pending'
  AND EXISTS (SELECT 1 FROM json_each(:kinds) WHERE value = kind)

-- name: attempt_wake
-- Waiting attempts of a run run again (the run left its wait).
UPDATE node_attempts SET status = 'running', updated_at = :now
WHERE run_id = :run_id AND status = 'waiting'

-- name: interaction_clocks
-- Pending requests with a deadline on unpaused, unclaimed, parked runs, with their open interval.
SELECT i.run_id, i.request_id, i.attempt_id, a.timeout_ms, t.interval_number, t.started_at,
       (SELECT COALESCE(sum(elapsed_ms), 0) FROM attempt_active_intervals c
        WHERE c.attempt_id = a.attempt_id AND c.ended_at IS NOT NULL) AS closed_ms
FROM interactive_requests i
JOIN node_attempts a ON a.attempt_id = i.attempt_id
JOIN runs r ON r.run_id = i.run_id
JOIN run_queue q ON q.run_id = i.run_id
JOIN leases l ON l.resource_id = r.resource_id
LEFT JOIN attempt_active_intervals t ON t.attempt_id = a.attempt_id AND t.ended_at IS NULL
WHERE i.status = 'pending' AND a.timeout_ms > 0 AND r.paused = 0 AND q.status = 'parked'
  AND (l.owner_id IS NULL OR l.expires_at <= :now) AND (:project_id IS NULL OR r.project_id = :project_id)
ORDER BY a.started_at, i.request_id

-- name: decision_expire_open
-- Close every unresolved decision of a run whose deadline passed (the run timed out).
INSERT INTO human_decision_resolutions(decision_id, outcome, provenance, response_hash, reason, channel,
                                       actor_id, request_digest, resolved_at)
SELECT d.decision_id, 'cancelled', 'expired_no_default', NULL, 'Workflow run timed out', NULL, :actor_id,
       d.request_digest, :now
FROM human_decisions d LEFT JOIN human_decision_resolutions x ON x.decision_id = d.decision_id
WHERE d.run_id = :run_id AND x.decision_id IS NULL

-- name: attempt_active_time
-- An attempt's deadline (active time) and the active time it counted by :now: its closed
-- intervals, and its open one up to :now (a paused run has none open).
SELECT a.timeout_ms,
       (SELECT COALESCE(sum(CASE WHEN c.ended_at IS NULL THEN max(0, :now - c.started_at)
                                 ELSE c.elapsed_ms END), 0)
        FROM attempt_active_intervals c WHERE c.attempt_id = a.attempt_id) AS active_ms
FROM node_attempts a WHERE a.attempt_id = :attempt_id
