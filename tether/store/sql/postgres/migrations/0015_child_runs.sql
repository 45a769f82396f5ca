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
