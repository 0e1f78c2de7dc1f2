"""SQL over a sweep dataset in place, with embedded DuckDB.

Two views: ``results`` (the result files, per-point and compacted, hive partitions kernel / d /
hkv included; one row per (point_id, kernel), the newest when a point was stored twice) and
``sweeps`` (one row per sweep.json; ``grid``, ``clocks`` and ``workers`` as JSON text, for
``json_extract``).

    query("runs/h200", "SELECT kernel, median(tbps) FROM results GROUP BY kernel")  # a pyarrow.Table

Read-only unless forced, one statement per call. DuckDB's own parser
(``duckdb.extract_statements``) says what a statement is: a query (SELECT, WITH, FROM,
VALUES, DESCRIBE, SHOW, SUMMARIZE, PIVOT) runs; anything else (COPY ... TO a file, EXPORT,
ATTACH, CREATE, DROP, INSERT, SET, PRAGMA, INSTALL, EXPLAIN, which with ANALYZE runs what it
explains) runs only with ``force=True`` (``fa4trace query --force``): nothing on disk is
written or replaced unless asked. Several statements are refused: each call starts from a
fresh in-memory database holding the two views, so nothing one statement made would outlive
the call; a WITH clause chains steps inside one query.
"""

from __future__ import annotations

import json
import re

import pyarrow as pa

from ..format.errors import Fa4traceError
from .dataset import RESULT_GLOB, RESULT_SCHEMA, Dataset, find_dataset, require_folder

SWEEP_SCHEMA = pa.schema([
    ("sweep_id", pa.string()), ("gpu", pa.string()), ("worker", pa.string()), ("commit", pa.string()),
    ("command", pa.string()), ("status", pa.string()), ("points", pa.int64()), ("points_run", pa.int64()),
    ("error_rows", pa.int64()), ("started_at", pa.string()), ("finished_at", pa.string()),
    ("grid", pa.string()), ("clocks", pa.string()), ("executor", pa.string()), ("workers", pa.string()),
])
JSON_FIELDS = ("grid", "clocks", "workers")


def _sql_str(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def connect(root):
    """An in-memory DuckDB connection with the dataset's ``results`` and ``sweeps`` views."""
    import duckdb

    p = find_dataset(require_folder(root))
    if p is None:
        raise Fa4traceError(f"{root}: not a sweep dataset (no results/ or sweeps/ folder in it)")
    con = duckdb.connect(":memory:")
    if next((p / "results").glob(RESULT_GLOB), None) is not None:
        glob = (p / "results").as_posix() + "/" + RESULT_GLOB
        # union_by_name: a file without a column reads it as null
        con.execute(f"CREATE VIEW results AS SELECT * FROM read_parquet({_sql_str(glob)}, hive_partitioning=true, "
                    "hive_types={'kernel': VARCHAR, 'd': INTEGER, 'hkv': INTEGER}, union_by_name=true) "
                    "QUALIFY row_number() OVER (PARTITION BY point_id, kernel "
                    "ORDER BY finished_at DESC NULLS LAST) = 1")
    else:
        con.register("results", RESULT_SCHEMA.empty_table())
    rows = []
    for doc in Dataset(p).sweeps():
        row = {n: doc.get(n) for n in SWEEP_SCHEMA.names}
        for key in JSON_FIELDS:
            row[key] = None if doc.get(key) is None else json.dumps(doc[key])
        rows.append(row)
    con.register("_sweeps_table", pa.Table.from_pylist(rows, schema=SWEEP_SCHEMA))
    con.execute("CREATE VIEW sweeps AS SELECT * FROM _sweeps_table")
    return con


def query(root, sql: str, *, force: bool = False) -> pa.Table:
    """Run one SQL statement over the dataset at ``root`` (module docstring: read-only unless
    ``force``). Empty or bad SQL, several statements, or one that may write without ``force``
    raise a one-line Fa4traceError; a forced statement without a result (CREATE VIEW ...)
    gives an empty table.

    The statement runs as a DuckDB relation (``con.sql``), read into Arrow in one step."""
    import duckdb

    stmt = one_statement(sql)
    if not force and not reads_only(stmt):
        raise Fa4traceError(f"query is read-only: {describe(stmt)} may write files or change the database; "
                            "add --force to run it")
    con = connect(root)
    try:
        rel = con.sql(sql)
        return pa.table({}) if rel is None else rel.to_arrow_table()
    except duckdb.Error as exc:
        msg = str(exc).strip().splitlines()
        raise Fa4traceError(f"query failed: {msg[0] if msg else type(exc).__name__}") from None
    finally:
        con.close()


def one_statement(sql: str):
    """The single statement in ``sql`` (a ``duckdb.Statement``: its type and text), as DuckDB's
    parser splits it; one-line errors for empty SQL, a syntax error and several statements."""
    import duckdb

    try:
        stmts = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        msg = str(exc).strip().splitlines()
        raise Fa4traceError(f"query failed: {msg[0] if msg else type(exc).__name__}") from None
    if not stmts:
        raise Fa4traceError("the SQL is empty: give a statement, e.g. SELECT * FROM results LIMIT 5")
    if len(stmts) > 1:
        raise Fa4traceError(f"query runs one SQL statement, got {len(stmts)}: run each on its own (every query "
                            "starts afresh from the views), or chain the steps in one with WITH ... AS (...)")
    return stmts[0]


def reads_only(stmt) -> bool:
    """Whether DuckDB parses ``stmt`` as a query: a SELECT statement (SELECT, WITH, FROM, VALUES,
    DESCRIBE, SHOW, SUMMARIZE), or a statement DuckDB runs in parts (a PIVOT) that stands as a
    subquery of a SELECT, which a COPY, CREATE or INSERT built around a PIVOT does not."""
    import duckdb

    kind = stmt.type
    if kind == duckdb.StatementType.SELECT:
        return True
    if kind != getattr(duckdb.StatementType, "MULTI", None):
        return False
    body = stmt.query.strip().rstrip(";")
    try:  # newlines: a trailing -- comment stays inside the parentheses' line
        return len(duckdb.extract_statements(f"SELECT * FROM (\n{body}\n)")) == 1
    except duckdb.Error:
        return False


def describe(stmt) -> str:
    """'a COPY statement', 'an INSTALL statement': named by its own first word (DuckDB files an
    INSTALL under LOAD), else by DuckDB's type; a statement run in parts: 'this statement'."""
    import duckdb

    if stmt.type == getattr(duckdb.StatementType, "MULTI", None):
        return "this statement"
    text = re.sub(r"^(\s+|--[^\n]*(\n|$)|/\*.*?\*/)*", "", stmt.query, flags=re.S)
    word = re.match(r"[A-Za-z]+", text)
    name = word.group(0).upper() if word and word.group(0).upper() != "WITH" else stmt.type.name
    return f"{'an' if name[0] in 'AEIOU' else 'a'} {name} statement"


def _cell(x) -> str:
    if x is None:
        return "NULL"
    if isinstance(x, float):
        return "NaN" if x != x else f"{x:.6g}"
    return str(x)


def format_table(t: pa.Table, max_rows: int = 200) -> str:
    """Aligned text: a header, a rule, the rows (numbers right-aligned), and a row count."""
    names = t.column_names
    if not names:
        return "(no result)"
    data = t.slice(0, max_rows).to_pylist()
    cells = [[_cell(r[n]) for n in names] for r in data]
    widths = [max([len(n)] + [len(c[i]) for c in cells]) for i, n in enumerate(names)]
    numeric = [pa.types.is_integer(f.type) or pa.types.is_floating(f.type) or pa.types.is_decimal(f.type)
               for f in t.schema]
    def fmt(row):
        return "  ".join(c.rjust(w) if num else c.ljust(w) for c, w, num in zip(row, widths, numeric)).rstrip()
    lines = [fmt(names), "  ".join("-" * w for w in widths)] + [fmt(c) for c in cells]
    more = f" (first {max_rows} shown)" if t.num_rows > max_rows else ""
    lines.append(f"({t.num_rows} row{'s' if t.num_rows != 1 else ''}{more})")
    return "\n".join(lines)


def to_json(t: pa.Table) -> str:
    rows = t.to_pylist()
    for r in rows:
        for k, v in r.items():
            if isinstance(v, float) and v != v:
                r[k] = None
    return json.dumps(rows, indent=1, default=str)


def to_csv(t: pa.Table) -> str:
    import csv
    import io

    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(t.column_names)
    for r in t.to_pylist():
        w.writerow(["" if v is None else v for v in r.values()])
    return buf.getvalue()
