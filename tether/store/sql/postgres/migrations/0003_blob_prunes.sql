-- How many times blob_prune ran. A store skips re-inserting a JSON blob it knows to be stored only
-- while this count is the one it saw when it learned so (a prune may have deleted the blob since);
-- the count is read and bumped under the journal lock, which keeps a prune out until a
-- transaction that read it commits.
CREATE TABLE blob_prunes (
  id INTEGER PRIMARY KEY CHECK (id = 1),
  pruned BIGINT NOT NULL
);
INSERT INTO blob_prunes(id, pruned) VALUES (1, 0);
