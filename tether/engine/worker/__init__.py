"""The runner's services, one job each: the claim loop (``loop``), claiming (``claiming``),
completing steps with group commit (``completion``), lease renewal (``heartbeat``), timers
(``housekeeping``), take-over recovery (``recovery``), cancels (``cancelling``) and the drive
loop over a run's nodes (``drive``). ``tether.engine.runner.Runner`` assembles them."""
