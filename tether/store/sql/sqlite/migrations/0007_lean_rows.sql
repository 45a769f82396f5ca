-- Fewer rows per run.
--
-- One row per transaction and run for the viewer's revisions instead of one row per target of
-- each revision, with a patch blob each. A revision's patches follow from what it names (the
-- targets, their keys and the caller's ops) and its number, so ``changes`` holds only that: one
-- entry per revision from first_revision to last_revision, either a number for one of the two
-- target sets every run change names (see ``tether.store.journal``) or a list of
-- ``[target_type, target_key, ops]``. Stored deltas become one row per revision, in list form;
-- their patch blobs are left to the next blob prune.

CREATE TABLE viewer_revisions (
  run_id TEXT NOT NULL REFERENCES viewer_runs(run_id) ON DELETE CASCADE,
  last_revision INTEGER NOT NULL,
  first_revision INTEGER NOT NULL CHECK (first_revision >= 1 AND first_revision <= last_revision),
  changes TEXT NOT NULL,
  recorded_at INTEGER NOT NULL,
  PRIMARY KEY (run_id, last_revision)
) STRICT;

INSERT INTO viewer_revisions(run_id, last_revision, first_revision, changes, recorded_at)
SELECT run_id, presentation_revision, presentation_revision,
       json_array(json_group_array(json(target))), max(recorded_at)
FROM (
  SELECT d.run_id, d.presentation_revision, d.recorded_at,
         json_array(d.target_type, d.target_key,
           (SELECT json_group_array(json(p.value)) FROM json_each(CAST(b.content AS TEXT)) p
            WHERE p.key >= CASE WHEN d.target_type = 'graph' THEN 2 ELSE 1 END)) AS target
  FROM viewer_deltas d JOIN blobs b ON b.blob_hash = d.patch_hash
  ORDER BY d.run_id, d.presentation_revision, d.delta_index
)
GROUP BY run_id, presentation_revision;

DROP TABLE viewer_deltas;

-- A journal entry's payload is stored in the entry itself (canonical JSON text) unless it is
-- large; only a large one is a blob (``payload_hash``). Entries already stored keep their blob.
ALTER TABLE events ADD COLUMN payload TEXT CHECK (payload IS NULL OR payload_hash IS NULL);
