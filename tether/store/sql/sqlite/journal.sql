-- Blobs, resources, events, projects and the viewer projection. A body may hold several
-- statements separated by ;: they run in order and the last one gives the result (run_many
-- takes a query of one statement).

-- name: project_get
-- The project row registered for a name.
SELECT project_id, canonical_path FROM projects WHERE canonical_path = :path

-- name: project_insert
-- Register a project once (first writer wins).
INSERT INTO projects(project_id, canonical_path, created_at) VALUES (:project_id, :path, :now)
ON CONFLICT DO NOTHING

-- name: blob_put
-- Store content once under its hash. Stored already, the same bytes change nothing, except that
-- JSON over the same bytes stored as text promotes the media type (text readers accept both).
-- Different bytes under the hash (a collision) set byte_length to -1, which the CHECK on it
-- refuses: translate_error reports that refusal as the blob conflict.
INSERT INTO blobs(blob_hash, media_type, byte_length, content, created_at)
VALUES (:hash, :media_type, :length, :content, :now)
ON CONFLICT(blob_hash) DO UPDATE
SET byte_length = CASE WHEN content = excluded.content THEN byte_length ELSE -1 END,
    media_type = 'application/json'
WHERE content <> excluded.content
   OR (excluded.media_type = 'application/json' AND media_type <> 'application/json')

-- name: blob_get
-- One blob by hash.
SELECT media_type, byte_length, content FROM blobs WHERE blob_hash = :hash

-- name: blob_prunes_get
-- How many times blob_prune ran (see migrations/0003_blob_prunes.sql).
SELECT pruned FROM blob_prunes WHERE id = 1

-- name: blob_prunes_bump
-- Count one more blob_prune (in its transaction).
UPDATE blob_prunes SET pruned = pruned + 1 WHERE id = 1

-- name: blob_prune
-- Delete blobs that no row refers to.
DELETE FROM blobs WHERE blob_hash NOT IN (
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

-- name: resource_insert
-- A new aggregate at a given revision.
INSERT INTO resources(resource_id, resource_type, aggregate_key, revision, created_at, updated_at)
VALUES (:resource_id, :type, :key, :revision, :now, :now)

-- name: resource_bump_event
-- BUMP then EMIT: advance the revision of an aggregate by one and append one journal entry at the
-- new revision (the sequence from AUTOINCREMENT); the entry's sequence. No row: no such aggregate.
-- The sequence is the connection's last rowid, not RETURNING (SQLite buffers returned rows in a
-- temporary table; the insert costs about 40% less without one).
UPDATE resources SET revision = revision + 1, updated_at = :now
WHERE resource_id = :resource_id;
INSERT INTO events(event_id, resource_id, resource_revision, event_type, actor_type, actor_id,
                   lease_generation, payload_hash, payload, recorded_at)
SELECT :event_id, :resource_id, revision, :type, :actor_type, :actor_id, :generation, :payload_hash,
       :payload, :now
FROM resources WHERE resource_id = :resource_id;
SELECT last_insert_rowid() AS event_seq WHERE changes() = 1

-- name: event_insert
-- Append one journal entry; the sequence comes from AUTOINCREMENT (read as resource_bump_event
-- reads it).
INSERT INTO events(event_id, resource_id, resource_revision, event_type, actor_type, actor_id,
                   lease_generation, payload_hash, payload, recorded_at)
VALUES (:event_id, :resource_id, :revision, :type, :actor_type, :actor_id, :generation,
        :payload_hash, :payload, :now);
SELECT last_insert_rowid() AS event_seq WHERE changes() = 1

-- name: event_list_after
-- Run journal entries after a sequence number, ascending: a run's own, and its effects' (an
-- effect's entries name the run that enqueued it).
SELECT e.event_seq, e.recorded_at, r.run_id, r.workflow_ref, e.event_type, e.actor_id,
       e.payload_hash, e.payload
FROM events e LEFT JOIN effects f ON f.resource_id = e.resource_id
JOIN runs r ON r.resource_id = COALESCE(f.source_resource_id, e.resource_id)
WHERE e.event_seq > :seq AND (:event_type IS NULL OR e.event_type = :event_type)
ORDER BY e.event_seq LIMIT :limit

-- name: event_list_for_run
-- One run's journal, ascending: its own entries and its effects'.
SELECT e.event_seq, e.recorded_at, r.run_id, r.workflow_ref, e.event_type, e.actor_id,
       e.payload_hash, e.payload
FROM runs r JOIN events e ON e.resource_id = r.resource_id
     OR e.resource_id IN (SELECT f.resource_id FROM effects f WHERE f.source_resource_id = r.resource_id)
WHERE r.run_id = :run_id AND e.event_seq > :seq AND (:event_type IS NULL OR e.event_type = :event_type)
ORDER BY e.event_seq LIMIT :limit

-- name: event_max_seq
-- The newest journal sequence number.
SELECT COALESCE(max(event_seq), 0) AS seq FROM events

-- name: viewer_insert
-- The viewer projection of a new run starts at revision 1.
INSERT INTO viewer_runs(run_id, presentation_revision, retained_from_revision, updated_at)
VALUES (:run_id, 1, 1, :now)

-- name: viewer_get
-- The viewer projection row of a run.
SELECT presentation_revision, retained_from_revision FROM viewer_runs WHERE run_id = :run_id

-- name: viewer_advance
-- The presentation revision one up, the retention window of :window revisions following it; the
-- new revision and the window's first revision.
UPDATE viewer_runs SET presentation_revision = presentation_revision + 1,
       retained_from_revision = MAX(retained_from_revision, presentation_revision + 2 - :window),
       updated_at = :now
WHERE run_id = :run_id
RETURNING presentation_revision, retained_from_revision

-- name: viewer_set
-- A projection row at a revision this transaction advanced it to already (it holds the row: the
-- advances after its first are counted in the transaction and written once, with the last).
UPDATE viewer_runs SET presentation_revision = :revision, retained_from_revision = :retained,
       updated_at = :now
WHERE run_id = :run_id

-- name: viewer_revision_insert
-- The presentation revisions one transaction recorded for a run, :first to :last, and what each
-- names (a JSON list, one entry per revision).
INSERT INTO viewer_revisions(run_id, last_revision, first_revision, changes, recorded_at)
VALUES (:run_id, :last, :first, :changes, :now)

-- name: viewer_revision_prune
-- Forget the rows whose revisions all lie before the retention window.
DELETE FROM viewer_revisions WHERE run_id = :run_id AND last_revision < :retained

-- name: viewer_revisions_after
-- The retained rows holding a revision after :revision, in order.
SELECT first_revision, last_revision, changes
FROM viewer_revisions WHERE run_id = :run_id AND last_revision > :revision
ORDER BY last_revision
