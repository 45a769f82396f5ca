-- Blobs, resources, events, projects and the viewer projection (PostgreSQL dialect: the same query
-- names as sql/sqlite/journal.sql).
--
-- Markers PostgresDatabase reads: a /*write: ...*/ comment is part of the query only inside a write
-- transaction; a body may hold several statements, the last one gives the result; /*journal*/
-- marks a query that reaches the journal point; @nowait becomes NOWAIT once the transaction is
-- past it (see below), and nothing before.
--
-- The journal. Entries are numbered by the transaction that writes them (tether_event_seq,
-- migrations/0008_journal_by_transaction.sql), so journal writers on different runs take no lock in
-- common and commit in parallel; readers read below the horizon (tether_journal_horizon): only
-- entries no commit can still land before. A long write transaction anywhere on the server holds
-- readers back until it ends (never reorders what they see).
--
-- The journal point. /*journal*/ still marks the first statement after which a transaction takes
-- further row locks NOWAIT (StoreBusy at once if another transaction holds one): a transaction
-- that has started writing the journal does not wait behind another run's holder, so the instant
-- it read with that statement stays its own (see PostgresDatabase).
--
-- Blobs. Content-addressed blobs are inserted ON CONFLICT DO NOTHING: reusing a stored blob takes
-- no row lock, so a popular blob (the empty payload) never makes writers take turns. Two
-- transactions inserting the same new blob meet at its key: the second waits for the first to
-- commit (and then finds it stored). blob_prune must not delete a blob that an open transaction
-- found stored and is about to refer to: every write transaction that puts a blob, or trusts
-- that one is stored (blob_prunes_get), holds the blob guard (a shared advisory lock, key
-- 8387237872774807650) to its commit, and blob_prune takes it exclusively.

-- name: project_get
-- The project row registered for a name.
SELECT project_id, canonical_path FROM projects WHERE canonical_path = :path

-- name: project_insert
-- Register a project once (first writer wins).
INSERT INTO projects(project_id, canonical_path, created_at) VALUES (:project_id, :path, :now)
ON CONFLICT DO NOTHING

-- name: blob_put
-- Store content once under its hash, under the blob guard (above). Stored already, the same bytes
-- change nothing and lock nothing, except that JSON over the same bytes stored as text promotes
-- the media type (text readers accept both). Different bytes under the hash (a collision) set
-- byte_length to -1, which blobs_check refuses: translate_error reports that refusal as the blob
-- conflict. So the caller needs no outcome, and the write can be queued.
/*journal*/
WITH guard AS (SELECT pg_advisory_xact_lock_shared(8387237872774807650)),
inserted AS (
  INSERT INTO blobs(blob_hash, media_type, byte_length, content, created_at)
  SELECT :hash, :media_type, :length, :content, :now FROM guard
  ON CONFLICT(blob_hash) DO NOTHING
  RETURNING 1
)
UPDATE blobs AS stored
SET byte_length = CASE WHEN stored.content = :content THEN stored.byte_length ELSE -1 END,
    media_type = 'application/json'
WHERE stored.blob_hash = :hash AND NOT EXISTS (SELECT 1 FROM inserted)
  AND (stored.content <> :content
       OR (CAST(:media_type AS TEXT) = 'application/json' AND stored.media_type <> 'application/json'))

-- name: blob_get
-- One blob by hash.
SELECT media_type, byte_length, content FROM blobs WHERE blob_hash = :hash

-- name: blob_prunes_get
-- How many times blob_prune ran; a write transaction reads it under the blob guard (above), so
-- no prune runs before it commits (see migrations/0003_blob_prunes.sql).
/*journal*/
/*write: SELECT pg_advisory_xact_lock_shared(8387237872774807650);*/
SELECT pruned FROM blob_prunes WHERE id = 1

-- name: blob_prunes_bump
-- Count one more blob_prune (in its transaction, holding the blob guard exclusively: it waits
-- for the open transactions that hold it shared, and new ones wait for it).
SELECT pg_advisory_xact_lock(8387237872774807650);
UPDATE blob_prunes SET pruned = pruned + 1 WHERE blob_prunes.id = 1

-- name: blob_prune
-- Delete blobs that no row refers to (holding the blob guard exclusively: no open transaction
-- holds a blob it wrote or found stored but has not committed a reference to yet). A blob a
-- transaction is referring to right now is locked by its foreign-key check and kept.
SELECT pg_advisory_xact_lock(8387237872774807650);
DELETE FROM blobs WHERE blob_hash IN (
  SELECT blob_hash FROM blobs WHERE blob_hash NOT IN (
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
  FOR UPDATE SKIP LOCKED)

-- name: resource_insert
-- A new aggregate at a given revision.
INSERT INTO resources(resource_id, resource_type, aggregate_key, revision, created_at, updated_at)
VALUES (:resource_id, :type, :key, :revision, :now, :now)

-- name: resource_bump_event
-- BUMP then EMIT in one statement (one round trip): advance the revision of an aggregate by one
-- and append one journal entry at the new revision, numbered by this transaction
-- (tether_event_seq); the entry's sequence. No row: no such aggregate.
/*journal*/
WITH bump AS (
  UPDATE resources SET revision = revision + 1, updated_at = :now
  WHERE resource_id = :resource_id
  RETURNING revision
)
INSERT INTO events(event_seq, event_id, resource_id, resource_revision, event_type, actor_type,
                   actor_id, lease_generation, payload_hash, payload, recorded_at)
SELECT tether_event_seq(:resource_id), :event_id, :resource_id, bump.revision, :type, :actor_type, :actor_id,
       :generation, :payload_hash, :payload, :now
FROM bump
RETURNING event_seq

-- name: event_insert
-- Append one journal entry, numbered by this transaction (tether_event_seq).
/*journal*/
INSERT INTO events(event_seq, event_id, resource_id, resource_revision, event_type, actor_type,
                   actor_id, lease_generation, payload_hash, payload, recorded_at)
VALUES (tether_event_seq(:resource_id), :event_id, :resource_id, :revision, :type, :actor_type, :actor_id,
        :generation, :payload_hash, :payload, :now)
RETURNING event_seq

-- name: event_list_after
-- Run journal entries after a sequence number and below the horizon (final: see above),
-- ascending: a run's own, and its effects' (an effect's entries name the run that enqueued it).
SELECT e.event_seq, e.recorded_at, r.run_id, r.workflow_ref, e.event_type, e.actor_id,
       e.payload_hash, e.payload
FROM events e LEFT JOIN effects f ON f.resource_id = e.resource_id
JOIN runs r ON r.resource_id = COALESCE(f.source_resource_id, e.resource_id)
WHERE e.event_seq > :seq AND e.event_seq < tether_journal_horizon()
  AND (CAST(:event_type AS TEXT) IS NULL OR e.event_type = :event_type)
ORDER BY e.event_seq LIMIT :limit

-- name: event_list_for_run
-- One run's journal after a sequence number, ascending: its own entries and its effects'. No
-- horizon here: every transaction that writes an entry of the run or of one of its effects holds
-- the run's lock (its first read of the run takes it) to its commit, one after another, and each
-- entry is numbered above the resource's last (tether_event_seq refuses otherwise), so the run's
-- entries become readable in sequence order.
SELECT e.event_seq, e.recorded_at, r.run_id, r.workflow_ref, e.event_type, e.actor_id,
       e.payload_hash, e.payload
FROM runs r JOIN events e ON e.resource_id = r.resource_id
     OR e.resource_id IN (SELECT f.resource_id FROM effects f WHERE f.source_resource_id = r.resource_id)
WHERE r.run_id = :run_id AND e.event_seq > :seq
  AND (CAST(:event_type AS TEXT) IS NULL OR e.event_type = :event_type)
ORDER BY e.event_seq LIMIT :limit

-- name: event_max_seq
-- The newest journal sequence number below the horizon (a reader may start after it).
SELECT COALESCE(max(event_seq), 0) AS seq FROM events WHERE event_seq < tether_journal_horizon()

-- name: viewer_insert
-- The viewer projection of a new run starts at revision 1.
INSERT INTO viewer_runs(run_id, presentation_revision, retained_from_revision, updated_at)
VALUES (:run_id, 1, 1, :now)

-- name: viewer_get
-- The viewer projection row of a run (locked, when it is about to advance).
SELECT presentation_revision, retained_from_revision FROM viewer_runs WHERE run_id = :run_id
/*write: FOR NO KEY UPDATE @nowait*/

-- name: viewer_advance
-- The presentation revision one up, the retention window of :window revisions following it; the
-- new revision and the window's first revision.
-- (The row is locked first, NOWAIT past the journal point, as viewer_get does; a
-- transaction that locked it already leaves that out.)
/*write: SELECT 1 FROM viewer_runs WHERE run_id = :run_id FOR NO KEY UPDATE @nowait;*/
UPDATE viewer_runs SET presentation_revision = presentation_revision + 1,
       retained_from_revision = GREATEST(retained_from_revision, presentation_revision + 2 - :window),
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
