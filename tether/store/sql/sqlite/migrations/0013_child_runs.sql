-- Child runs: a run that a node of another run (its parent) started as a run of its own. One row
-- per child; `waits` is 1 while the parent's node waits for the child to finish (the move that
-- finishes the child puts the parent back in the queue). Deleting either run deletes the link.
CREATE TABLE run_children (
  child_run_id TEXT PRIMARY KEY REFERENCES runs(run_id) ON DELETE CASCADE,
  parent_run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
  node_id TEXT NOT NULL,
  waits INTEGER NOT NULL CHECK (waits = 0 OR waits = 1),
  created_at BIGINT NOT NULL
);
CREATE INDEX run_children_by_parent ON run_children(parent_run_id, created_at, child_run_id);

-- A viewer's row of a run names the run that started it as a child run.
DROP VIEW IF EXISTS run_views;
CREATE VIEW run_views AS
SELECT r.run_id, d.workflow_name, r.workflow_ref, r.status AS run_status, r.paused,
       r.definition_digest, q.status, b.origin_session_id, b.execution_mode, r.parent_run_id,
       r.root_run_id, r.lineage_kind, r.restart_number, r.parent_run_revision, q.error_code,
       CAST(error.content AS TEXT) AS error_message, q.created_at, q.updated_at, q.started_at,
       q.finished_at, source.source_type, source.source_ref, source.source_revision,
       c.parent_run_id AS child_of, c.node_id AS child_of_node
FROM runs r JOIN workflow_definitions d ON d.definition_digest = r.definition_digest
JOIN run_queue q ON q.run_id = r.run_id
JOIN run_bindings b ON b.run_id = r.run_id
JOIN run_sources source ON source.run_id = r.run_id AND source.mount_path = ''
LEFT JOIN blobs error ON error.blob_hash = q.error_hash
LEFT JOIN run_children c ON c.child_run_id = r.run_id;
