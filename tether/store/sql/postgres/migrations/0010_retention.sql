-- Retention (Store.prune) looks for finished runs by the instant they finished.
CREATE INDEX IF NOT EXISTS run_queue_finished ON run_queue(finished_at, run_id) WHERE finished_at IS NOT NULL;
