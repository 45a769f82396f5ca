-- How many times blob_prune ran, kept on the journal lock's row: a store skips re-inserting a JSON
-- blob it knows to be stored only while this count is the one it saw when it learned so (a prune
-- may have deleted the blob since), and reading it under the journal lock keeps a prune out until
-- the transaction commits.
ALTER TABLE event_sequence ADD COLUMN blobs_pruned BIGINT NOT NULL DEFAULT 0;
