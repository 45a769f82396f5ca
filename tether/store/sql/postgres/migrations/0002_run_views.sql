-- The viewer's row of a run, as one view so that reads by id, by session and by page each
-- keep to their own index.
CREATE VIEW run_views AS
SELECT r.run_id, d.workflow_name, r.workflow_ref, r.status AS run_status, r.paused,
       r.definition_digest, q.status, b.origin_session_id, b.execution_mode, r.parent_run_id,
       r.root_run_id, r.lineage_kind, r.restart_number, r.parent_run_revision, q.error_code,
       convert_from(error.content, 'UTF8') AS error_message, q.created_at, q.updated_at, q.started_at,
       q.finished_at, source.source_type, source.source_ref, source.source_revision
FROM runs r JOIN workflow_definitions d ON d.definition_digest = r.definition_digest
JOIN run_queue q ON q.run_id = r.run_id
JOIN run_bindings b ON b.run_id = r.run_id
JOIN run_sources source ON source.run_id = r.run_id AND source.mount_path = ''
LEFT JOIN blobs error ON error.blob_hash = q.error_hash;
