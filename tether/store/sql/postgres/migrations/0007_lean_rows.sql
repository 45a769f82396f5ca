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
  last_revision BIGINT NOT NULL,
  first_revision BIGINT NOT NULL CHECK (first_revision >= 1 AND first_revision <= last_revision),
  changes TEXT NOT NULL,
  recorded_at BIGINT NOT NULL,
  PRIMARY KEY (run_id, last_revision)
);

INSERT INTO viewer_revisions(run_id, last_revision, first_revision, changes, recorded_at)
SELECT d.run_id, d.presentation_revision, d.presentation_revision,
       jsonb_build_array(jsonb_agg(jsonb_build_array(d.target_type, d.target_key,
         COALESCE((SELECT jsonb_agg(p.value ORDER BY p.n)
                   FROM jsonb_array_elements(convert_from(b.content, 'UTF8')::jsonb)
                        WITH ORDINALITY AS p(value, n)
                   WHERE p.n > CASE WHEN d.target_type = 'graph' THEN 2 ELSE 1 END), '[]'::jsonb))
         ORDER BY d.delta_index))::text,
       max(d.recorded_at)
FROM viewer_deltas d JOIN blobs b ON b.blob_hash = d.patch_hash
GROUP BY d.run_id, d.presentation_revision;

DROP TABLE viewer_deltas;

-- A journal entry's payload is stored in the entry itself (canonical JSON text) unless it is
-- large; only a large one is a blob (``payload_hash``). Entries already stored keep their blob.
ALTER TABLE events ADD COLUMN payload TEXT,
  ADD CONSTRAINT events_one_payload CHECK (payload IS NULL OR payload_hash IS NULL);
