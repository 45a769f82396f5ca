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

-- Events sent into a run (Tether.send_event, tether.store.run_events): kept until a
-- wait_for_event node of the run waiting for that name takes it (the oldest first); each is
-- taken once, by one attempt. They go with their run (ON DELETE CASCADE).
CREATE TABLE run_inbox (
  event_id TEXT PRIMARY KEY,
  run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
  name TEXT NOT NULL,
  payload_json TEXT NOT NULL,
  sent_by TEXT NOT NULL,
  sent_at INTEGER NOT NULL,
  taken_at INTEGER,
  taken_by_attempt_id TEXT
) STRICT;
CREATE INDEX run_inbox_pending ON run_inbox(run_id, name, sent_at) WHERE taken_at IS NULL;

-- A run parked at a wait_for_event node: the event name it waits for, and until when (NULL:
-- no timeout). Housekeeping puts the run back in the queue once the event came or the time is up.
CREATE TABLE run_event_waits (
  run_id TEXT PRIMARY KEY REFERENCES runs(run_id) ON DELETE CASCADE,
  attempt_id TEXT NOT NULL,
  name TEXT NOT NULL,
  deadline_at INTEGER,
  created_at INTEGER NOT NULL
) STRICT;
