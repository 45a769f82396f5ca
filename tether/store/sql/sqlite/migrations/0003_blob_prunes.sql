-- How many times blob_prune ran. A store skips re-inserting a JSON blob it knows to be stored only
-- while this count is the one it saw when it learned so (a prune may have deleted the blob since).
CREATE TABLE blob_prunes (
  id INTEGER PRIMARY KEY CHECK (id = 1),
  pruned INTEGER NOT NULL
);
INSERT INTO blob_prunes(id, pruned) VALUES (1, 0);
