"""Times and progress in words, for people (the CLI and the console say them the same way)."""

from __future__ import annotations

from tether.store import Progress


def duration(ms: int | float | None) -> str:
    """A duration in milliseconds as ``850 ms``, ``12.5 s``, ``3 min 4 s``, ``5 h 6 min`` or ``2 d 3 h``."""
    if ms is None:
        return ""
    seconds = ms / 1000
    if seconds < 1:
        return f"{int(ms)} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min"
    return f"{hours // 24} d {hours % 24} h"


def progress_text(progress: Progress) -> str:
    """``40/100 (40%) downloading, about 12 s left``: a step's latest progress report."""
    done = f"{progress.done:g}" + ("" if progress.total is None else f"/{progress.total:g}")
    parts = [done]
    if progress.fraction is not None:
        parts.append(f"({progress.fraction:.0%})")
    if progress.message:
        parts.append(progress.message)
    text = " ".join(parts)
    left = progress.seconds_left
    return text if left is None else f"{text}, about {duration(left * 1000)} left"
