-- Child runs (tether.store.children): the link from a child run to the parent run whose node
-- started it.

-- name: child_link_insert
-- Link a child run to its parent (the child was reserved in the same transaction).
INSERT INTO run_children(child_run_id, parent_run_id, node_id, waits, created_at)
VALUES (:child_run_id, :parent_run_id, :node_id, :waits, :now)

-- name: child_link_of
-- The parent a child run was started by, if it is a child run.
SELECT parent_run_id, node_id, waits FROM run_children WHERE child_run_id = :run_id

-- name: child_links_of
-- A parent's child runs in the order they were started, with their statuses.
SELECT c.child_run_id, c.node_id, c.waits, c.created_at, q.status, r.status AS run_status,
       d.workflow_name, q.error_code
FROM run_children c JOIN runs r ON r.run_id = c.child_run_id
JOIN run_queue q ON q.run_id = c.child_run_id
JOIN workflow_definitions d ON d.definition_digest = r.definition_digest
WHERE c.parent_run_id = :run_id
ORDER BY c.created_at, c.child_run_id
