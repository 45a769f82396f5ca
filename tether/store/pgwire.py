"""Statements sent to PostgreSQL through libpq itself (psycopg's ``pq`` layer), in pipeline mode.

A statement sent through a psycopg cursor in a pipeline costs about 100 µs of client CPU: a cursor
object, a query conversion and a wait on the socket for every statement. Tether sends a
transaction's statements in a few round trips of several statements each, so here a round trip
puts all of its statements in libpq's output buffer, marks its end with a Sync, then reads until
the Sync comes back, writing what is left as the socket takes it (a long round trip cannot
deadlock on the server's replies). Parameters are dumped and rows loaded by psycopg's own
adapters (``Transformer``), with the types psycopg would pick; a statement with parameters is
prepared on its connection the first time it runs with given parameter types, so the server
parses it once.
"""

from __future__ import annotations

import re
import select
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tether.store.db import Row

if TYPE_CHECKING:
    import psycopg
    from psycopg.pq.abc import PGresult

#: A ``:name`` parameter (not a ``::type`` cast).
PARAMETER = re.compile(r"(?<![:\w]):(\w+)")
#: Statements prepared on one connection, past which a new one is sent unnamed, planned each time
#: (the store's queries and their parameter types come to a few hundred).
PREPARED_MAX = 2048
#: A command of a round trip: the prepared statement's name, the text to prepare it from first
#: (None: prepared already), the parameters' types, values and formats.
_Command = tuple[bytes, bytes | None, tuple[int, ...], Sequence[Any], list[Any] | None]
_PIPELINE_SYNC = 10  # libpq's PGRES_PIPELINE_SYNC
_COMMAND_OK = 1
_FATAL_ERROR = 7


class Statement:
    """One SQL statement: ``sql`` with ``:name`` parameters, ``text`` as libpq takes it (``$1``,
    ``$2``, ... in the order of ``names``)."""

    __slots__ = ("names", "sql", "text")

    def __init__(self, sql: str) -> None:
        names: list[str] = []

        def number(match: re.Match[str]) -> str:
            if match.group(1) not in names:
                names.append(match.group(1))
            return f"${names.index(match.group(1)) + 1}"

        self.sql = sql
        self.text = PARAMETER.sub(number, sql).encode("utf-8")
        self.names = tuple(names)

    def __repr__(self) -> str:
        return f"Statement({self.sql!r})"


class Wire:
    """One connection's round trips. ``enter`` puts the connection in pipeline mode and ``leave``
    takes it out (a transaction stays in it from its BEGIN to its COMMIT); ``round_trip`` sends
    statements and returns each one's result. Anything that interrupts a round trip halfway (a
    lost connection, a signal) closes the connection: what was sent and what is still to be
    read are no longer known."""

    def __init__(self, connection: psycopg.Connection[Any]) -> None:
        from psycopg.adapt import PyFormat, Transformer

        self.connection = connection
        self.pgconn = connection.pgconn
        self.transformer = Transformer(connection)
        self.encoding = connection.info.encoding
        self.prepared: dict[tuple[bytes, tuple[int, ...]], bytes] = {}
        self._named = 0
        self._auto = PyFormat.AUTO
        self._poll = select.poll() if hasattr(select, "poll") else None

    def enter(self) -> None:
        self.pgconn.enter_pipeline_mode()

    def leave(self) -> None:
        self.pgconn.exit_pipeline_mode()

    def round_trip(self, calls: Sequence[tuple[Statement, Mapping[str, Any]]]) -> list[PGresult]:
        """Send every statement with its parameters, then a Sync; each statement's result, in
        order. The server runs them in order and skips the rest after an error, which is raised
        here (as psycopg raises it) once the Sync is back, so the connection stays usable.
        Parameters are all converted before anything is sent: a value the driver refuses
        (``psycopg.DataError``, ``UnicodeEncodeError``) leaves the connection as it was."""
        transformer = self.transformer
        dumped: list[tuple[bytes, tuple[int, ...], Sequence[Any], list[Any] | None]] = []
        for statement, params in calls:
            if statement.names:
                values = transformer.dump_sequence(
                    [params[name] for name in statement.names], [self._auto] * len(statement.names)
                )
                dumped.append(
                    (statement.text, transformer.types or (), values, list(transformer.formats or ()))
                )
            else:
                dumped.append((statement.text, (), (), None))
        prepared = self.prepared
        commands: list[_Command] = []
        for text, types, values, formats in dumped:
            known = prepared.get((text, types))
            if known is not None:
                commands.append((known, None, types, values, formats))
            elif types and len(prepared) < PREPARED_MAX:
                self._named += 1
                prepared[(text, types)] = b"tether_%d" % self._named
                commands.append((prepared[(text, types)], text, types, values, formats))
            else:
                # BEGIN, COMMIT, NOTIFY and the like have nothing to plan: sent as text each time,
                # they show as what they are on the wire and in the server's log.
                commands.append((b"", text, types, values, formats))
        try:
            groups = self._exchange(commands)
        except BaseException:
            self.connection.close()
            raise
        results: list[PGresult] = []
        failure: PGresult | None = None
        answers = iter(groups)
        for name, parsed, types, _, _ in commands:
            if parsed is not None:
                (prepare,) = next(answers)
                if prepare.status != _COMMAND_OK and name:
                    del prepared[(parsed, types)]  # refused, or skipped after an earlier error
                if prepare.status == _FATAL_ERROR:
                    failure = failure or prepare
            result = next(answers)[-1]
            if result.status == _FATAL_ERROR:
                failure = failure or result
            results.append(result)
        if failure is not None:
            from psycopg import errors

            raise errors.error_from_result(failure, encoding=self.encoding)
        return results

    def rows(self, result: PGresult) -> list[Row]:
        """A result's rows as dicts by column name."""
        raw = tuple(result.fname(i) or b"" for i in range(result.nfields))
        names = _column_names.get(raw)
        if names is None:
            if len(_column_names) >= _COLUMN_LISTS:
                _column_names.clear()
            names = _column_names[raw] = [name.decode("utf-8") for name in raw]
        self.transformer.set_pgresult(result)
        return self.transformer.load_rows(0, result.ntuples, _row_maker(names))

    def _exchange(self, commands: Sequence[_Command]) -> list[list[PGresult]]:
        """Queue the commands and a Sync, then write and read until the Sync comes back: the
        results of each command (a prepare or an execution), in order."""
        pgconn = self.pgconn
        for name, text, types, values, formats in commands:
            if text is not None:
                pgconn.send_prepare(name, text, types)
            pgconn.send_query_prepared(name, values, formats)
        pgconn.pipeline_sync()
        groups: list[list[PGresult]] = []
        group: list[PGresult] = []
        while True:
            self._wait(writing=pgconn.flush() != 0)
            pgconn.consume_input()
            while not pgconn.is_busy():
                result = pgconn.get_result()
                if result is None:
                    if not group:
                        break
                    groups.append(group)
                    group = []
                elif result.status == _PIPELINE_SYNC:
                    return groups
                else:
                    group.append(result)

    def _wait(self, *, writing: bool) -> None:
        """Block until the socket has something to read, or room to write while ``writing``."""
        fileno = self.pgconn.socket
        if self._poll is None:
            select.select([fileno], [fileno] if writing else [], [])
            return
        self._poll.register(fileno, select.POLLIN | select.POLLOUT if writing else select.POLLIN)
        self._poll.poll()


#: Column names by the raw names of a result's columns, decoded once per column list: the statements
#: are the store's own, so there are about as many lists as queries (``rows`` starts over past
#: ``_COLUMN_LISTS``).
_column_names: dict[tuple[bytes, ...], list[str]] = {}
_COLUMN_LISTS = 1024


def _row_maker(names: Sequence[str]) -> Callable[[Sequence[Any]], dict[str, Any]]:
    def row(values: Sequence[Any]) -> dict[str, Any]:
        return dict(zip(names, values, strict=True))

    return row
