-- Schedules (tether.store.schedules): cron schedules that start runs. SQLite dialect (the same
-- query names as sql/postgres/schedules.sql).

-- name: schedule_get
-- One schedule of the project, by name.
SELECT * FROM schedules WHERE project_id = :project_id AND name = :name

-- name: schedules_list
-- The project's schedules (every project's in the global view), by name.
SELECT * FROM schedules WHERE (:project_id IS NULL OR project_id = :project_id) ORDER BY name

-- name: schedules_declared
-- The schedules a workflow's code declared, as stored.
SELECT * FROM schedules
WHERE project_id = :project_id AND workflow_name = :workflow_name AND origin = 'declared'

-- name: schedule_insert
-- A new schedule; nothing when one of that name exists (the caller reads it back).
INSERT INTO schedules (project_id, name, workflow_name, origin, cron, timezone, input_json, catch_up,
  paused, next_due_at, created_at, updated_at)
VALUES (:project_id, :name, :workflow_name, :origin, :cron, :timezone, :input_json, :catch_up,
  0, :next_due_at, :now, :now)
ON CONFLICT (project_id, name) DO NOTHING

-- name: schedule_redeclare
-- A declared schedule whose code changed: its new spec, due again from the next tick.
UPDATE schedules SET cron = :cron, timezone = :timezone, input_json = :input_json,
  catch_up = :catch_up, next_due_at = :next_due_at, updated_at = :now
WHERE project_id = :project_id AND name = :name AND origin = 'declared'

-- name: schedule_set_paused
-- Pause, or resume due again at :next_due_at; nothing when it is so already.
UPDATE schedules SET paused = :paused, next_due_at = :next_due_at, updated_at = :now
WHERE project_id = :project_id AND name = :name AND paused <> :paused

-- name: schedule_delete
-- Forget a schedule (the runs it started stay).
DELETE FROM schedules WHERE project_id = :project_id AND name = :name

-- name: schedules_due
-- The schedules of the given workflows (a JSON list of names) due at :now and not paused, the
-- longest overdue first.
SELECT * FROM schedules
WHERE project_id = :project_id AND paused = 0 AND next_due_at <= :now
  AND workflow_name IN (SELECT value FROM json_each(:workflows))
ORDER BY next_due_at, name LIMIT :limit

-- name: schedules_next_due
-- When the next of the given workflows' schedules not paused is due (NULL: none).
SELECT min(next_due_at) AS next_due_at FROM schedules
WHERE project_id = :project_id AND paused = 0
  AND workflow_name IN (SELECT value FROM json_each(:workflows))

-- name: schedule_advance
-- Compare-and-set: move a schedule due at :expected on to :next_due_at, recording the tick it
-- fired (if any). 0 rows: another worker fired it, or it was paused, changed or removed.
UPDATE schedules SET next_due_at = :next_due_at, last_tick_at = coalesce(:tick, last_tick_at),
  last_run_id = coalesce(:run_id, last_run_id), updated_at = :now
WHERE project_id = :project_id AND name = :name AND next_due_at = :expected AND paused = 0
