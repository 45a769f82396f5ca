-- Versions: moving a run that no runner holds onto a new definition of its workflow.

-- name: run_definition_set
UPDATE runs SET definition_digest = :digest, updated_at = :now WHERE run_id = :run_id

-- name: run_sources_delete
DELETE FROM run_sources WHERE run_id = :run_id
