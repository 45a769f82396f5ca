"""The two SQL dialects stay in step: the same query names, the same migration numbers, the same
tables and columns (apart from the differences the PostgreSQL schema documents)."""

from __future__ import annotations

import re

from tether.store.db import load_queries, migrations, sql_statements

#: Columns only the PostgreSQL schema has: an explicit order where SQLite uses its rowid.
POSTGRES_ONLY_COLUMNS = {
    "node_attempts": {"position"},
    "interactive_submissions": {"position"},
    "workflow_messages": {"position"},
}
#: Tables only the PostgreSQL schema has.
POSTGRES_ONLY_TABLES: set[str] = set()
_TABLE = re.compile(r"CREATE TABLE (\w+) \((.*?)\n\)", re.DOTALL)
_DROP = re.compile(r"DROP TABLE (\w+)$")
_RENAME = re.compile(r"ALTER TABLE (\w+) RENAME TO (\w+)$")


def tables(backend: str) -> dict[str, list[str]]:
    """Table name -> column names, in order, from the backend's migrations (a table rebuilt under
    another name and renamed counts under its final name)."""
    found: dict[str, list[str]] = {}
    for _, sql in migrations(backend):
        for statement in sql_statements(sql):
            if created := _TABLE.match(statement + "\n"):
                # A column definition is a line indented by exactly two spaces that starts with a
                # lower-case name (constraints start upper-case, continuations are indented deeper).
                found[created[1]] = re.findall(r"^  ([a-z_]+) ", created[2], re.MULTILINE)
            elif dropped := _DROP.match(statement):
                del found[dropped[1]]
            elif renamed := _RENAME.match(statement):
                found[renamed[2]] = found.pop(renamed[1])
    return found


def test_backends__define_the_same_query_names() -> None:
    sqlite, postgres = set(load_queries("sqlite")), set(load_queries("postgres"))
    assert sorted(sqlite - postgres) == []
    assert sorted(postgres - sqlite) == []


def test_backends__have_migrations_with_the_same_numbers() -> None:
    assert [v for v, _ in migrations("sqlite")] == [v for v, _ in migrations("postgres")]


def test_backends__have_the_same_tables_and_columns() -> None:
    sqlite, postgres = tables("sqlite"), tables("postgres")
    assert set(postgres) - set(sqlite) == POSTGRES_ONLY_TABLES
    assert set(sqlite) <= set(postgres)
    for name, columns in sqlite.items():
        extra = POSTGRES_ONLY_COLUMNS.get(name, set())
        assert [c for c in postgres[name] if c not in extra] == columns, name
        assert set(postgres[name]) - set(columns) == extra, name


def test_backends__have_the_same_indexes() -> None:
    def indexes(backend: str) -> set[str]:
        return {
            n for _, sql in migrations(backend) for n in re.findall(r"CREATE (?:UNIQUE )?INDEX (\w+)", sql)
        }

    assert indexes("sqlite") == indexes("postgres")


def test_sql_statements__keep_a_dollar_quoted_function_body_whole() -> None:
    function = "CREATE FUNCTION f() RETURNS INTEGER LANGUAGE plpgsql AS $$\nBEGIN\n  RETURN 1;\nEND\n$$"
    assert sql_statements(f"-- a comment\n{function};\nSELECT 1; SELECT 2") == (
        function,
        "SELECT 1",
        "SELECT 2",
    )
