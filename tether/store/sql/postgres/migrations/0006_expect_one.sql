-- A write whose caller already knows it changes exactly one row (the run's row it holds proves
-- the move legal) is not waited for: it goes out with the transaction's next statement. It runs
-- wrapped in this check, so a write that changed no row after all fails the transaction (and so
-- its commit) instead of passing unnoticed. SQLSTATE TT001 is raised as InconsistentState.

CREATE FUNCTION tether_expect_one(changed BIGINT, failure TEXT) RETURNS INTEGER
LANGUAGE plpgsql AS $$
BEGIN
  IF changed <> 1 THEN
    RAISE EXCEPTION USING ERRCODE = 'TT001', MESSAGE = failure;
  END IF;
  RETURN 1;
END
$$;
