"""How a runner paces itself."""

from __future__ import annotations

from dataclasses import dataclass

from tether.errors import InvalidInput
from tether.values import require_lease_ms


@dataclass(frozen=True)
class RunnerConfig:
    """How a runner paces itself. Times in milliseconds unless the name says otherwise."""

    lease_ms: int = 30_000
    #: Renew every active lease this often (well inside the lease).
    renew_ms: int | None = None
    #: Longest idle wait between claim attempts; the runner polls faster after finding work.
    poll_ms: int = 1000
    #: Runs executed in parallel.
    concurrency: int = 4
    #: A run whose runner died this many times while running it fails as a poison run.
    max_takeovers: int = 3
    #: An effect is applied only while the lease is provably live for at least this long.
    effect_margin_ms: int | None = None
    #: OpenTelemetry spans for the runs and steps this runner executes (tether.engine.tracing).
    tracing: bool = False

    def __post_init__(self) -> None:
        for name in ("lease_ms", "poll_ms", "concurrency", "max_takeovers"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidInput(f"RunnerConfig.{name} must be a whole number of at least 1")
        require_lease_ms(self.lease_ms)
        if self.renew_interval_ms * 2 > self.lease_ms:
            raise InvalidInput(
                "RunnerConfig.renew_ms must be at most half of lease_ms (renew well inside the lease)"
            )
        if self.effect_guard_ms < 0 or self.effect_guard_ms + self.renew_interval_ms >= self.lease_ms:
            raise InvalidInput(
                "RunnerConfig.effect_margin_ms plus the renew interval must stay below lease_ms, "
                "or no effect could ever be applied"
            )

    @property
    def renew_interval_ms(self) -> int:
        return self.renew_ms or max(1, self.lease_ms // 3)

    @property
    def effect_guard_ms(self) -> int:
        return self.effect_margin_ms if self.effect_margin_ms is not None else self.lease_ms // 3
