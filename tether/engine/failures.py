"""How a failed step's story is kept: its exception's type and message, and its traceback
(bounded), recorded as the failed attempt's error; the run's own error keeps the one line."""

from __future__ import annotations

import traceback

#: The most characters of a traceback kept with a failed attempt: its end, where the exception was
#: raised, matters most.
TRACEBACK_LIMIT = 6000


def summary(error: BaseException) -> str:
    """``Type: message`` on one line (the exception's first line)."""
    text = str(error).splitlines()[0] if str(error) else ""
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def story(error: BaseException) -> str:
    """The summary, then the traceback of where it was raised (its last ``TRACEBACK_LIMIT``
    characters)."""
    trace = "".join(traceback.format_exception(type(error), error, error.__traceback__)).rstrip()
    if len(trace) > TRACEBACK_LIMIT:
        trace = "...\n" + trace[-TRACEBACK_LIMIT:]
    return f"{summary(error)}\n{trace}"
