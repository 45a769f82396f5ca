-- Journal writers in parallel. A journal entry's sequence number no longer comes from the single
-- event_sequence row (whose lock made every journal writer wait for the one before it to commit):
-- it is the writing transaction's id shifted left by 20 bits, plus the entry's place among that
-- transaction's entries. Readers take only entries below the horizon: the oldest transaction
-- still in flight anywhere on the server (tether_journal_horizon). Every entry below it is final
-- (committed, or rolled back and gone), and every later commit lands above it, so a reader that
-- follows events_after(seq) never misses an entry and never sees one twice, whatever the order
-- of commits. The numbers have gaps (they are not counts).
--
-- An entry written before this migration keeps its number; every one written after it is larger
-- (the migration refuses to run if that would not hold).

DO $$
BEGIN
  IF (SELECT COALESCE(max(event_seq), 0) FROM events) >= (pg_current_xact_id()::text::bigint << 20) THEN
    RAISE EXCEPTION 'journal sequence numbers are ahead of the transaction ids; cannot number new entries by transaction';
  END IF;
END
$$;

-- The next sequence number of the calling transaction's journal entries (2^20 per transaction;
-- one more fails the transaction: SQLSTATE TT002), for an entry of the resource given. A
-- resource's entries must rise with its revision: a transaction whose id is older than that of
-- the resource's newest entry (it got its id before another transaction wrote the resource and
-- committed) cannot number an entry after it, so it fails as a serialization failure (SQLSTATE
-- 40001, StoreBusy: retry; the retry is a newer transaction). A transaction that takes the run's
-- lock before its first write gets its id no earlier than that lock, so this does not happen to it.
CREATE FUNCTION tether_event_seq(resource TEXT) RETURNS BIGINT
LANGUAGE plpgsql AS $$
DECLARE
  base BIGINT := pg_current_xact_id()::text::bigint << 20;
  last BIGINT;
  newest BIGINT;
BEGIN
  SELECT max(event_seq) INTO last FROM events WHERE event_seq >= base AND event_seq < base + 1048576;
  SELECT event_seq INTO newest FROM events WHERE resource_id = resource
  ORDER BY resource_revision DESC LIMIT 1;
  IF newest >= base + 1048576 THEN
    RAISE EXCEPTION USING ERRCODE = '40001',
      MESSAGE = 'A newer transaction wrote this journal first; retry the call';
  END IF;
  IF last IS NULL THEN
    RETURN base;
  END IF;
  IF last + 1 >= base + 1048576 THEN
    RAISE EXCEPTION USING ERRCODE = 'TT002', MESSAGE = 'One transaction cannot append more than 1048576 journal entries';
  END IF;
  RETURN last + 1;
END
$$;

-- The first sequence number a transaction still in flight may yet commit: entries below it are
-- final in the calling statement's snapshot.
CREATE FUNCTION tether_journal_horizon() RETURNS BIGINT
LANGUAGE sql STABLE AS $$
  SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint << 20
$$;

DROP TABLE event_sequence;
