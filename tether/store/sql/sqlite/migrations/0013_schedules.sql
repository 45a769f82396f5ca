-- Schedules: cron expressions in a time zone that start runs of a workflow (tether.store.schedules).
-- One row per schedule and project; next_due_at is the instant its next tick is due, moved on by
-- compare-and-set in the transaction that starts the tick's run, so two workers racing the same
-- tick make one run. origin: 'declared' (written from the workflow's code by the workers that
-- load it) or 'added' (at run time, `tether schedule add`). input_json: the canonical JSON input
-- each run gets (kept in the row, not as a blob: retention prunes blobs no run refers to).
CREATE TABLE schedules (
  project_id TEXT NOT NULL REFERENCES projects(project_id),
  name TEXT NOT NULL,
  workflow_name TEXT NOT NULL,
  origin TEXT NOT NULL CHECK (origin = 'declared' OR origin = 'added'),
  cron TEXT NOT NULL,
  timezone TEXT NOT NULL,
  input_json TEXT NOT NULL,
  catch_up TEXT NOT NULL CHECK (catch_up = 'skip' OR catch_up = 'one'),
  paused INTEGER NOT NULL DEFAULT 0 CHECK (paused = 0 OR paused = 1),
  next_due_at INTEGER NOT NULL,
  last_tick_at INTEGER,
  last_run_id TEXT,
  created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL,
  PRIMARY KEY (project_id, name)
) STRICT, WITHOUT ROWID;
-- Workers look for the due schedules of the workflows they loaded.
CREATE INDEX schedules_due ON schedules(next_due_at) WHERE paused = 0;
