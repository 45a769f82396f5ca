-- The held leases by when they lapse: a runner with nothing to claim wakes when the next one held
-- by another runner lapses (a takeover becomes possible then) instead of at its next poll. Only
-- held leases are in it, so it is as small as the number of runs in flight.
CREATE INDEX leases_held ON leases(expires_at) WHERE owner_id IS NOT NULL;
