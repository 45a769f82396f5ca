-- Tether store schema, version 1. Table and column names follow the seed (docs/store.md).
-- Times are INTEGER epoch milliseconds; hashes are 32-byte SHA-256 BLOBs.

CREATE TABLE projects (
  project_id TEXT PRIMARY KEY,
  canonical_path TEXT NOT NULL UNIQUE,
  created_at INTEGER NOT NULL
) STRICT;

CREATE TABLE blobs (
  blob_hash BLOB PRIMARY KEY CHECK (length(blob_hash) = 32),
  media_type TEXT NOT NULL CHECK (media_type IN ('application/json', 'text/plain')),
  byte_length INTEGER NOT NULL CHECK (byte_length = length(content)),
  content BLOB NOT NULL,
  created_at INTEGER NOT NULL
) STRICT;

CREATE TABLE resources (
  resource_id TEXT PRIMARY KEY,
  resource_type TEXT NOT NULL,
  aggregate_key TEXT NOT NULL,
  revision INTEGER NOT NULL CHECK (revision >= 0),
  created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL,
  UNIQUE (resource_type, aggregate_key)
) STRICT;

CREATE TABLE leases (
  resource_id TEXT PRIMARY KEY REFERENCES resources(resource_id) ON DELETE CASCADE,
  generation INTEGER NOT NULL CHECK (generation >= 0),
  owner_type TEXT CHECK (owner_type IN ('session', 'host', 'controller', 'channel', 'system')),
  owner_id TEXT,
  token_hash BLOB CHECK (token_hash IS NULL OR length(token_hash) = 32),
  acquired_at INTEGER,
  heartbeat_at INTEGER,
  expires_at INTEGER,
  CHECK (
    (owner_type IS NULL AND owner_id IS NULL AND token_hash IS NULL AND acquired_at IS NULL
      AND heartbeat_at IS NULL AND expires_at IS NULL)
    OR (owner_type IS NOT NULL AND owner_id IS NOT NULL AND token_hash IS NOT NULL
      AND acquired_at IS NOT NULL AND heartbeat_at IS NOT NULL AND expires_at IS NOT NULL)
  )
) STRICT;

CREATE TABLE events (
  event_seq INTEGER PRIMARY KEY AUTOINCREMENT,
  event_id TEXT NOT NULL UNIQUE,
  resource_id TEXT NOT NULL REFERENCES resources(resource_id),
  resource_revision INTEGER NOT NULL CHECK (resource_revision > 0),
  event_type TEXT NOT NULL,
  actor_type TEXT NOT NULL CHECK (
    actor_type IN ('session', 'host', 'controller', 'channel', 'human', 'policy', 'control', 'system')),
  actor_id TEXT,
  lease_generation INTEGER CHECK (lease_generation IS NULL OR lease_generation > 0),
  payload_hash BLOB REFERENCES blobs(blob_hash),
  recorded_at INTEGER NOT NULL,
  UNIQUE (resource_id, resource_revision)
) STRICT;

CREATE TABLE workflow_definitions (
  definition_digest BLOB PRIMARY KEY CHECK (length(definition_digest) = 32),
  workflow_name TEXT NOT NULL,
  definition_hash BLOB NOT NULL REFERENCES blobs(blob_hash),
  created_at INTEGER NOT NULL
) STRICT;

CREATE TABLE runs (
  run_id TEXT PRIMARY KEY,
  resource_id TEXT NOT NULL UNIQUE REFERENCES resources(resource_id) ON DELETE CASCADE,
  project_id TEXT NOT NULL REFERENCES projects(project_id),
  parent_run_id TEXT REFERENCES runs(run_id),
  root_run_id TEXT NOT NULL,
  lineage_kind TEXT CHECK (lineage_kind IS NULL OR lineage_kind = 'restart'),
  restart_number INTEGER NOT NULL CHECK (restart_number >= 0),
  parent_run_revision INTEGER CHECK (parent_run_revision IS NULL OR parent_run_revision >= 0),
  definition_digest BLOB NOT NULL REFERENCES workflow_definitions(definition_digest),
  workflow_ref TEXT NOT NULL,
  launch_options_hash BLOB NOT NULL REFERENCES blobs(blob_hash),
  status TEXT NOT NULL CHECK (
    status IN ('queued', 'running', 'waiting', 'completed', 'failed', 'timed_out', 'cancelled')),
  paused INTEGER NOT NULL CHECK (paused IN (0, 1)),
  status_detail TEXT,
  input_hash BLOB NOT NULL REFERENCES blobs(blob_hash),
  error_hash BLOB REFERENCES blobs(blob_hash),
  created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL,
  finished_at INTEGER,
  CHECK ((finished_at IS NOT NULL) = (status IN ('waiting', 'completed', 'failed', 'timed_out', 'cancelled')))
) STRICT;
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
) STRICT;

CREATE TABLE run_bindings (
  run_id TEXT PRIMARY KEY REFERENCES runs(run_id) ON DELETE CASCADE,
  origin_session_id TEXT NOT NULL,
  execution_mode TEXT NOT NULL CHECK (execution_mode IN ('interactive', 'headless')),
  created_at INTEGER NOT NULL
) STRICT;
CREATE INDEX run_bindings_session ON run_bindings(origin_session_id);

CREATE TABLE run_queue (
  run_id TEXT PRIMARY KEY REFERENCES runs(run_id) ON DELETE CASCADE,
  project_id TEXT NOT NULL REFERENCES projects(project_id),
  status TEXT NOT NULL CHECK (
    status IN ('queued', 'starting', 'running', 'parked', 'done', 'failed', 'cancelled')),
  available_at INTEGER NOT NULL,
  affinity_runner_id TEXT,
  origin_session_id TEXT,
  consecutive_errors INTEGER NOT NULL DEFAULT 0,
  error_code TEXT,
  error_hash BLOB REFERENCES blobs(blob_hash),
  created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL,
  started_at INTEGER,
  finished_at INTEGER,
  CHECK ((finished_at IS NOT NULL) = (status IN ('done', 'failed', 'cancelled')))
) STRICT;
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
  run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
  node_id TEXT NOT NULL,
  attempt_number INTEGER NOT NULL CHECK (attempt_number > 0),
  status TEXT NOT NULL CHECK (status IN (
    'pending', 'running', 'waiting', 'interrupted', 'completed', 'failed', 'timed_out', 'cancelled')),
  output_hash BLOB REFERENCES blobs(blob_hash),
  exit_name TEXT,
  error_hash BLOB REFERENCES blobs(blob_hash),
  timeout_ms INTEGER CHECK (timeout_ms IS NULL OR timeout_ms >= 0),
  lease_generation INTEGER,
  created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL,
  started_at INTEGER NOT NULL,
  finished_at INTEGER
) STRICT;
-- At most one active attempt per run.
CREATE UNIQUE INDEX node_attempts_one_active ON node_attempts(run_id)
  WHERE status IN ('pending', 'running', 'waiting');
CREATE INDEX node_attempts_run ON node_attempts(run_id, started_at);

CREATE TABLE attempt_active_intervals (
  attempt_id TEXT NOT NULL REFERENCES node_attempts(attempt_id) ON DELETE CASCADE,
  interval_number INTEGER NOT NULL CHECK (interval_number > 0),
  started_at INTEGER NOT NULL,
  observed_at INTEGER NOT NULL,
  ended_at INTEGER,
  elapsed_ms INTEGER NOT NULL CHECK (elapsed_ms >= 0),
  PRIMARY KEY (attempt_id, interval_number)
) STRICT;
CREATE INDEX attempt_active_intervals_open ON attempt_active_intervals(attempt_id)
  WHERE ended_at IS NULL;

CREATE TABLE interactive_requests (
  request_id TEXT PRIMARY KEY,
  run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
  attempt_id TEXT NOT NULL UNIQUE REFERENCES node_attempts(attempt_id) ON DELETE CASCADE,
  target_session_id TEXT NOT NULL,
  kind TEXT NOT NULL,
  revision INTEGER NOT NULL CHECK (revision > 0),
  status TEXT NOT NULL CHECK (status IN ('pending', 'settled', 'cancelled')),
  payload_hash BLOB NOT NULL REFERENCES blobs(blob_hash),
  created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL
) STRICT;
CREATE INDEX interactive_requests_pending ON interactive_requests(run_id) WHERE status = 'pending';
CREATE INDEX interactive_requests_session ON interactive_requests(target_session_id, status);

CREATE TABLE interactive_submissions (
  submission_id TEXT PRIMARY KEY,
  request_id TEXT NOT NULL REFERENCES interactive_requests(request_id) ON DELETE CASCADE,
  outcome TEXT NOT NULL CHECK (outcome IN ('validating', 'accepted', 'rejected', 'adopted')),
  payload_hash BLOB NOT NULL REFERENCES blobs(blob_hash),
  receipt_hash BLOB REFERENCES blobs(blob_hash),
  created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL
) STRICT;
CREATE INDEX interactive_submissions_request ON interactive_submissions(request_id, outcome);

CREATE TABLE human_decisions (
  decision_id TEXT PRIMARY KEY,
  run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
  node_id TEXT NOT NULL,
  request_digest BLOB NOT NULL CHECK (length(request_digest) = 32),
  request_hash BLOB NOT NULL REFERENCES blobs(blob_hash),
  deadline_at INTEGER,
  created_at INTEGER NOT NULL
) STRICT;
CREATE INDEX human_decisions_run ON human_decisions(run_id);

CREATE TABLE human_decision_resolutions (
  decision_id TEXT PRIMARY KEY REFERENCES human_decisions(decision_id) ON DELETE CASCADE,
  outcome TEXT NOT NULL CHECK (outcome IN ('accepted', 'cancelled')),
  provenance TEXT NOT NULL CHECK (
    provenance IN ('human', 'timeout_policy', 'explicit_cancel', 'expired_no_default')),
  response_hash BLOB REFERENCES blobs(blob_hash),
  reason TEXT,
  channel TEXT,
  actor_id TEXT,
  request_digest BLOB NOT NULL,
  resolved_at INTEGER NOT NULL,
  CHECK ((outcome = 'accepted') = (response_hash IS NOT NULL AND reason IS NULL))
) STRICT;

CREATE TABLE effects (
  effect_id TEXT PRIMARY KEY,
  resource_id TEXT NOT NULL UNIQUE REFERENCES resources(resource_id) ON DELETE CASCADE,
  source_resource_id TEXT NOT NULL REFERENCES resources(resource_id) ON DELETE CASCADE,
  effect_type TEXT NOT NULL,
  owner_scope TEXT NOT NULL,
  idempotency_key TEXT NOT NULL UNIQUE,
  payload_hash BLOB NOT NULL REFERENCES blobs(blob_hash),
  result_hash BLOB REFERENCES blobs(blob_hash),
  status TEXT NOT NULL CHECK (
    status IN ('pending', 'applying', 'applied', 'rejected', 'ambiguous', 'cancelled')),
  attempt_count INTEGER NOT NULL DEFAULT 0 CHECK (attempt_count >= 0),
  next_attempt_at INTEGER,
  error_hash BLOB REFERENCES blobs(blob_hash),
  created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL,
  settled_at INTEGER
) STRICT;
CREATE INDEX effects_source ON effects(source_resource_id, status);

CREATE TABLE effect_attempts (
  effect_id TEXT NOT NULL REFERENCES effects(effect_id) ON DELETE CASCADE,
  attempt_number INTEGER NOT NULL CHECK (attempt_number > 0),
  lease_generation INTEGER,
  started_at INTEGER NOT NULL,
  finished_at INTEGER,
  outcome TEXT CHECK (outcome IS NULL OR outcome IN ('applied', 'rejected', 'interrupted')),
  error_hash BLOB REFERENCES blobs(blob_hash),
  PRIMARY KEY (effect_id, attempt_number)
) STRICT;

CREATE TABLE workflow_messages (
  workflow_message_id TEXT PRIMARY KEY,
  run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
  target_session_id TEXT NOT NULL,
  kind TEXT NOT NULL CHECK (kind IN ('step', 'decision', 'notification', 'terminal', 'followUp')),
  status TEXT NOT NULL CHECK (status IN ('pending', 'sent', 'cancelled')),
  payload_hash BLOB NOT NULL REFERENCES blobs(blob_hash),
  created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL
) STRICT;
CREATE INDEX workflow_messages_session ON workflow_messages(target_session_id, status, created_at);
CREATE INDEX workflow_messages_run ON workflow_messages(run_id, status);

CREATE TABLE viewer_runs (
  run_id TEXT PRIMARY KEY REFERENCES runs(run_id) ON DELETE CASCADE,
  presentation_revision INTEGER NOT NULL CHECK (presentation_revision >= 1),
  retained_from_revision INTEGER NOT NULL CHECK (retained_from_revision >= 1),
  updated_at INTEGER NOT NULL
) STRICT;

CREATE TABLE viewer_deltas (
  run_id TEXT NOT NULL REFERENCES viewer_runs(run_id) ON DELETE CASCADE,
  presentation_revision INTEGER NOT NULL,
  delta_index INTEGER NOT NULL,
  target_type TEXT NOT NULL CHECK (
    target_type IN ('summary', 'graph', 'replay', 'timeline', 'conversation', 'inspector')),
  target_key TEXT NOT NULL DEFAULT '',
  patch_hash BLOB NOT NULL REFERENCES blobs(blob_hash),
  recorded_at INTEGER NOT NULL,
  PRIMARY KEY (run_id, presentation_revision, delta_index)
) STRICT;
