"""Tether's logging: the logger hierarchy and a JSON formatter for machines.

Loggers: ``tether.runner`` (claims, steps, hand-offs, takeovers), ``tether.store`` (the database
and its change notices) and ``tether.client``. At INFO the runner logs one line per claim, per step
start, finish and failure (with its duration), per hand-off and per takeover; expected refusals
(a claim another runner took first, a run released to wait) are DEBUG. A record about a run
carries structured fields as attributes (``extra=``): ``run_id``, ``workflow``, ``node``,
``attempt``, ``runner_id`` and, where it applies, ``duration_s``.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

#: The structured fields a record may carry (``logging``'s ``extra=``), in output order.
FIELDS = ("run_id", "workflow", "node", "attempt", "runner_id", "duration_s")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``time`` (UTC, ISO 8601), ``level``, ``logger``, ``message``,
    the structured fields the record carries, and ``exception`` (its traceback) when it has one."""

    def format(self, record: logging.LogRecord) -> str:
        body: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                body[name] = value
        if record.exc_info:
            body["exception"] = self.formatException(record.exc_info)
        return json.dumps(body, default=str)


def use_json(logger: logging.Logger | None = None) -> None:
    """Format every handler of ``logger`` (the root logger by default) as JSON lines."""
    for handler in (logger or logging.getLogger()).handlers:
        handler.setFormatter(JsonFormatter())
