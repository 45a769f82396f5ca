-- Tether store schema, version 1, PostgreSQL dialect: the same tables, columns, constraints and
-- indexes as the SQLite schema of the same version (sql/sqlite/migrations/0001_init.sql). Table and
-- column names follow the seed (docs/store.md). Times are BIGINT epoch milliseconds; hashes are
-- 32-byte SHA-256 BYTEA values.
--
-- Differences the dialect needs: event_seq is assigned from the single-row event_sequence counter
-- instead of AUTOINCREMENT (event_insert in journal.sql; that is what makes the sequence readable
-- in commit order), and the tables SQLite orders by rowid carry an explicit position column.

CREATE TABLE projects (
  project_id TEXT PRIMARY KEY,
  canonical_path TEXT NOT NULL UNIQUE,
  created_at BIGINT NOT NULL
);

CREATE TABLE blobs (
  blob_hash BYTEA PRIMARY KEY CHECK (octet_length(blob_hash) = 32),
  media_type TEXT NOT NULL CHECK (media_type IN ('application/json', 'text/plain')),
  byte_length BIGINT NOT NULL CHECK (byte_length = octet_length(content)),
  content BYTEA NOT NULL,
  created_at BIGINT NOT NULL
);

CREATE TABLE resources (
  resource_id TEXT PRIMARY KEY,
  resource_type TEXT NOT NULL,
  aggregate_key TEXT NOT NULL,
  revision BIGINT NOT NULL CHECK (revision >= 0),
  created_at BIGINT NOT NULL,
  updated_at BIGINT NOT NULL,
  UNIQUE (resource_type, aggregate_key)
);

CREATE TABLE leases (
  resource_id TEXT PRIMARY KEY REFERENCES resources(resource_id) ON DELETE CASCADE,
  generation BIGINT NOT NULL CHECK (generation >= 0),
  owner_type TEXT CHECK (owner_type IN ('session', 'host', 'controller', 'channel', 'system')),
  owner_id TEXT,
  token_hash BYTEA CHECK (token_hash IS NULL OR octet_length(token_hash) = 32),
  acquired_at BIGINT,
  heartbeat_at BIGINT,
  expires_at BIGINT,
  CHECK (
    (owner_type IS NULL AND owner_id IS NULL AND token_hash IS NULL AND acquired_at IS NULL
      AND heartbeat_at IS NULL AND expires_at IS NULL)
    OR (owner_type IS NOT NULL AND owner_id IS NOT NULL AND token_hash IS NOT NULL
      AND acquired_at IS NOT NULL AND heartbeat_at IS NOT NULL AND expires_at IS NOT NULL)
  )
);

-- One row: the last event sequence number handed out. Its row lock is the journal lock, held
-- from a transaction's first journal write (blob or event) to its commit.
CREATE TABLE event_sequence (
  id INTEGER PRIMARY KEY CHECK (id = 1),
  value BIGINT NOT NULL CHECK (value >= 0)
);
INSERT INTO event_sequence(id, value) VALUES (1, 0);

CREATE TABLE events (
  event_seq BIGINT PRIMARY KEY,
  event_id TEXT NOT NULL UNIQUE,
  resource_id TEXT NOT NULL REFERENCES resources(resource_id),
  resource_revision BIGINT NOT NULL CHECK (resource_revision > 0),
  event_type TEXT NOT NULL,
  actor_type TEXT NOT NULL CHECK (
    actor_type IN ('session', 'host', 'controller', 'channel', 'human', 'policy', 'control', 'system')),
  actor_id TEXT,
  lease_generation BIGINT CHECK (lease_generation IS NULL OR lease_generation > 0),
  payload_hash BYTEA REFERENCES blobs(blob_hash),
  recorded_at BIGINT NOT NULL,
  UNIQUE (resource_id, resource_revision)
);

CREATE TABLE workflow_definitions (
  definition_digest BYTEA PRIMARY KEY CHECK (octet_length(definition_digest) = 32),
  workflow_name TEXT NOT NULL,
  definition_hash BYTEA NOT NULL REFERENCES blobs(blob_hash),
  created_at BIGINT NOT NULL
);

CREATE TABLE runs (
  run_id TEXT PRIMARY KEY,
  resource_id TEXT NOT NULL UNIQUE REFERENCES resources(resource_id) ON DELETE CASCADE,
  project_id TEXT NOT NULL REFERENCES projects(project_id),
  parent_run_id TEXT REFERENCES runs(run_id),
  root_run_id TEXT NOT NULL,
  lineage_kind TEXT CHECK (lineage_kind IS NULL OR lineage_kind = 'restart'),
  restart_number BIGINT NOT NULL CHECK (restart_number >= 0),
  parent_run_revision BIGINT CHECK (parent_run_revision IS NULL OR parent_run_revision >= 0),
  definition_digest BYTEA NOT NULL REFERENCES workflow_definitions(definition_digest),
  workflow_ref TEXT NOT NULL,
  launch_options_hash BYTEA NOT NULL REFERENCES blobs(blob_hash),
  status TEXT NOT NULL CHECK (
    status IN ('queued', 'running', 'waiting', 'completed', 'failed', 'timed_out', 'cancelled')),
  paused INTEGER NOT NULL CHECK (paused IN (0, 1)),
  status_detail TEXT,
  input_hash BYTEA NOT NULL REFERENCES blobs(blob_hash),
  error_hash BYTEA REFERENCES blobs(blob_hash),
  created_at BIGINT NOT NULL,
  updated_at BIGINT NOT NULL,
  finished_at BIGINT,
  CHECK ((finished_at IS NOT NULL) = (status IN ('waiting', 'completed', 'failed', 'timed_out', 'cancelled')))
);
-- One restart child per parent.
CREATE UNIQUE INDEX runs_one_restart_per_parent ON runs(parent_run_id)
  WHERE lineage_kind = 'restart';
CREATE INDEX runs_root ON runs(root_run_id);
CREATE INDEX runs_project ON runs(project_id);

CREATE TABLE run_sources (
  run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
  mount_path TEXT NOT NULL,
  source_type TEXT NOT NULL CHECK (source_type IN ('builtin', 'file')),
  source_ref TEXT NOT NULL,
  source_revision TEXT NOT NULL,
  PRIMARY KEY (run_id, mount_path)
);

CREATE TABLE run_bindings (
  run_id TEXT PRIMARY KEY REFERENCES runs(run_id) ON DELETE CASCADE,
  origin_session_id TEXT NOT NULL,
  execution_mode TEXT NOT NULL CHECK (execution_mode IN ('interactive', 'headless')),
  created_at BIGINT NOT NULL
);
CREATE INDEX run_bindings_session ON run_bindings(origin_session_id);

CREATE TABLE run_queue (
  run_id TEXT PRIMARY KEY REFERENCES runs(run_id) ON DELETE CASCADE,
  project_id TEXT NOT NULL REFERENCES projects(project_id),
  status TEXT NOT NULL CHECK (
    status IN ('queued', 'starting', 'running', 'parked', 'done', 'failed', 'cancelled')),
  available_at BIGINT NOT NULL,
  affinity_runner_id TEXT,
  origin_session_id TEXT,
  consecutive_errors BIGINT NOT NULL DEFAULT 0,
  error_code TEXT,
  error_hash BYTEA REFERENCES blobs(blob_hash),
  created_at BIGINT NOT NULL,
  updated_at BIGINT NOT NULL,
  started_at BIGINT,
  finished_at BIGINT,
  CHECK ((finished_at IS NOT NULL) = (status IN ('done', 'failed', 'cancelled')))
);
-- At most one active interactive run per origin session.
CREATE UNIQUE INDEX run_queue_one_active_per_session ON run_queue(origin_session_id)
  WHERE origin_session_id IS NOT NULL AND status IN ('queued', 'starting', 'running');
-- claim_next walks this index in order; finished runs are not in it, so their number never
-- slows a claim.
CREATE INDEX run_queue_claimable ON run_queue(project_id, available_at, created_at, run_id)
  WHERE status IN ('queued', 'parked', 'starting', 'running');
CREATE INDEX run_queue_claimable_all ON run_queue(available_at, created_at, run_id)
  WHERE status IN ('queued', 'parked', 'starting', 'running');
CREATE INDEX run_queue_created ON run_queue(created_at, run_id);

CREATE TABLE node_attempts (
  attempt_id TEXT PRIMARY KEY,
  position BIGSERIAL NOT NULL UNIQUE,
  run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
  node_id TEXT NOT NULL,
  attempt_number BIGINT NOT NULL CHECK (attempt_number > 0),
  status TEXT NOT NULL CHECK (status IN (
    'pending', 'running', 'waiting', 'interrupted', 'completed', 'failed', 'timed_out', 'cancelled')),
  output_hash BYTEA REFERENCES blobs(blob_hash),
  exit_name TEXT,
  error_hash BYTEA REFERENCES blobs(blob_hash),
  timeout_ms BIGINT CHECK (timeout_ms IS NULL OR timeout_ms >= 0),
  lease_generation BIGINT,
  created_at BIGINT NOT NULL,
  updated_at BIGINT NOT NULL,
  started_at BIGINT NOT NULL,
  finished_at BIGINT
);
-- At most one active attempt per run.
CREATE UNIQUE INDEX node_attempts_one_active ON node_attempts(run_id)
  WHERE status IN ('pending', 'running', 'waiting');
CREATE INDEX node_attempts_run ON node_attempts(run_id, started_at);

CREATE TABLE attempt_active_intervals (
  attempt_id TEXT NOT NULL REFERENCES node_attempts(attempt_id) ON DELETE CASCADE,
  interval_number BIGINT NOT NULL CHECK (interval_number > 0),
  started_at BIGINT NOT NULL,
  observed_at BIGINT NOT NULL,
  ended_at BIGINT,
  elapsed_ms BIGINT NOT NULL CHECK (elapsed_ms >= 0),
  PRIMARY KEY (attempt_id, interval_number)
);
CREATE INDEX attempt_active_intervals_open ON attempt_active_intervals(attempt_id)
  WHERE ended_at IS NULL;

CREATE TABLE interactive_requests (
  request_id TEXT PRIMARY KEY,
  run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
  attempt_id TEXT NOT NULL UNIQUE REFERENCES node_attempts(attempt_id) ON DELETE CASCADE,
  target_session_id TEXT NOT NULL,
  kind TEXT NOT NULL,
  revision BIGINT NOT NULL CHECK (revision > 0),
  status TEXT NOT NULL CHECK (status IN ('pending', 'settled', 'cancelled')),
  payload_hash BYTEA NOT NULL REFERENCES blobs(blob_hash),
  created_at BIGINT NOT NULL,
  updated_at BIGINT NOT NULL
);
CREATE INDEX interactive_requests_pending ON interactive_requests(run_id) WHERE status = 'pending';
CREATE INDEX interactive_requests_session ON interactive_requests(target_session_id, status);

CREATE TABLE interactive_submissions (
  submission_id TEXT PRIMARY KEY,
  position BIGSERIAL NOT NULL UNIQUE,
  request_id TEXT NOT NULL REFERENCES interactive_requests(request_id) ON DELETE CASCADE,
  outcome TEXT NOT NULL CHECK (outcome IN ('validating', 'accepted', 'rejected', 'adopted')),
  payload_hash BYTEA NOT NULL REFERENCES blobs(blob_hash),
  receipt_hash BYTEA REFERENCES blobs(blob_hash),
  created_at BIGINT NOT NULL,
  updated_at BIGINT NOT NULL
);
CREATE INDEX interactive_submissions_request ON interactive_submissions(request_id, outcome);

CREATE TABLE human_decisions (
  decision_id TEXT PRIMARY KEY,
  run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
  node_id TEXT NOT NULL,
  request_digest BYTEA NOT NULL CHECK (octet_length(request_digest) = 32),
  request_hash BYTEA NOT NULL REFERENCES blobs(blob_hash),
  deadline_at BIGINT,
  created_at BIGINT NOT NULL
);
CREATE INDEX human_decisions_run ON human_decisions(run_id);

CREATE TABLE human_decision_resolutions (
  decision_id TEXT PRIMARY KEY REFERENCES human_decisions(decision_id) ON DELETE CASCADE,
  outcome TEXT NOT NULL CHECK (outcome IN ('accepted', 'cancelled')),
  provenance TEXT NOT NULL CHECK (
    provenance IN ('human', 'timeout_policy', 'explicit_cancel', 'expired_no_default')),
  response_hash BYTEA REFERENCES blobs(blob_hash),
  reason TEXT,
  channel TEXT,
  actor_id TEXT,
  request_digest BYTEA NOT NULL,
  resolved_at BIGINT NOT NULL,
  CHECK ((outcome = 'accepted') = (response_hash IS NOT NULL AND reason IS NULL))
);

CREATE TABLE effects (
  effect_id TEXT PRIMARY KEY,
  resource_id TEXT NOT NULL UNIQUE REFERENCES resources(resource_id) ON DELETE CASCADE,
  source_resource_id TEXT NOT NULL REFERENCES resources(resource_id) ON DELETE CASCADE,
  effect_type TEXT NOT NULL,
  owner_scope TEXT NOT NULL,
  idempotency_key TEXT NOT NULL UNIQUE,
  payload_hash BYTEA NOT NULL REFERENCES blobs(blob_hash),
  result_hash BYTEA REFERENCES blobs(blob_hash),
  status TEXT NOT NULL CHECK (
    status IN ('pending', 'applying', 'applied', 'rejected', 'ambiguous', 'cancelled')),
  attempt_count BIGINT NOT NULL DEFAULT 0 CHECK (attempt_count >= 0),
  next_attempt_at BIGINT,
  error_hash BYTEA REFERENCES blobs(blob_hash),
  created_at BIGINT NOT NULL,
  updated_at BIGINT NOT NULL,
  settled_at BIGINT
);
CREATE INDEX effects_source ON effects(source_resource_id, status);

CREATE TABLE effect_attempts (
  effect_id TEXT NOT NULL REFERENCES effects(effect_id) ON DELETE CASCADE,
  attempt_number BIGINT NOT NULL CHECK (attempt_number > 0),
  lease_generation BIGINT,
  started_at BIGINT NOT NULL,
  finished_at BIGINT,
  outcome TEXT CHECK (outcome IS NULL OR outcome IN ('applied', 'rejected', 'interrupted')),
  error_hash BYTEA REFERENCES blobs(blob_hash),
  PRIMARY KEY (effect_id, attempt_number)
);

CREATE TABLE workflow_messages (
  workflow_message_id TEXT PRIMARY KEY,
  position BIGSERIAL NOT NULL UNIQUE,
  run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
  target_session_id TEXT NOT NULL,
  kind TEXT NOT NULL CHECK (kind IN ('step', 'decision', 'notification', 'terminal', 'followUp')),
  status TEXT NOT NULL CHECK (status IN ('pending', 'sent', 'cancelled')),
  payload_hash BYTEA NOT NULL REFERENCES blobs(blob_hash),
  created_at BIGINT NOT NULL,
  updated_at BIGINT NOT NULL
);
CREATE INDEX workflow_messages_session ON workflow_messages(target_session_id, status, created_at);
CREATE INDEX workflow_messages_run ON workflow_messages(run_id, status);

CREATE TABLE viewer_runs (
  run_id TEXT PRIMARY KEY REFERENCES runs(run_id) ON DELETE CASCADE,
  presentation_revision BIGINT NOT NULL CHECK (presentation_revision >= 1),
  retained_from_revision BIGINT NOT NULL CHECK (retained_from_revision >= 1),
  updated_at BIGINT NOT NULL
);

CREATE TABLE viewer_deltas (
  run_id TEXT NOT NULL REFERENCES viewer_runs(run_id) ON DELETE CASCADE,
  presentation_revision BIGINT NOT NULL,
  delta_index BIGINT NOT NULL,
  target_type TEXT NOT NULL CHECK (
    target_type IN ('summary', 'graph', 'replay', 'timeline', 'conversation', 'inspector')),
  target_key TEXT NOT NULL DEFAULT '',
  patch_hash BYTEA NOT NULL REFERENCES blobs(blob_hash),
  recorded_at BIGINT NOT NULL,
  PRIMARY KEY (run_id, presentation_revision, delta_index)
);
