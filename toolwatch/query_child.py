"""Analysts' SQL in a sacrificial child process: an OS memory cap and a hard kill.

Why a child: DuckDB's ``memory_limit`` covers its buffer manager, not list and string
values (``SELECT len(range(250000000))`` took a dashboard process to 10.7 GB), and some
operators never check for interrupts (``lpad('', 2000000000, 'y')``, a 100,000-term
``OR``), so an in-process timeout could only abandon a thread that ran on. Here every
forensic query — ``toolwatch query`` and the dashboard's Forensics page — runs in a
process of its own:

* started from a ``forkserver`` whose server has already imported DuckDB, pyarrow and
  the store (one fork per query, not an interpreter start-up; see :func:`warm`);
* the child builds the locked-down connection (:func:`toolwatch.query.query_connection`),
  notes its address-space size, then sets ``RLIMIT_AS`` to that size plus
  ``query.memory_limit_mib``: an allocation past the cap fails inside the child (DuckDB
  reports ``bad allocation``), or at worst the child dies;
* the guard (:func:`toolwatch.query_guard.check_query`) and the query run in the child, so
  a parse that never ends is bounded too;
* the parent waits at most ``query.timeout_seconds`` from the fork, then ``SIGKILL``s;
* the result comes back as Arrow IPC stream bytes over a pipe, capped in rows
  (``query.max_rows``), bytes (``query.max_result_mib``) and columns
  (``query.max_columns``).

A runaway costs one child, never the caller. The errors say which bound was hit:
:class:`QueryTimeoutError`, :class:`QueryMemoryError`, :class:`QueryCrashedError`.
"""

from __future__ import annotations

import contextlib
import io
import multiprocessing
import multiprocessing.connection
import os
import resource
import signal
import time
from dataclasses import dataclass
from multiprocessing import context, forkserver, popen_forkserver, reduction, spawn, util
from pathlib import Path
from typing import Any

import orjson

from toolwatch import query_guard
from toolwatch.config import QueryConfig
from toolwatch.errors import QueryError, QueryRefusedError

# Imported here, not in the child's function: the fork server preloads this module, so
# every child starts with DuckDB, pyarrow and the store already imported.
from toolwatch.query import VIEWS, query_connection, renderable
from toolwatch.store import Store

#: Bytes per pipe message of the result (the parent reads whole messages).
_CHUNK = 1 << 20
#: Characters of a DuckDB error kept (all of its lines, hints included, up to this).
_MAX_MESSAGE = 4000

_CTX = multiprocessing.get_context("forkserver")
# The server imports this module (and so DuckDB, pyarrow, the store) once; each query is
# then a fork of an interpreter that has them loaded.
_CTX.set_forkserver_preload(["toolwatch.query_child"])


class _Popen(popen_forkserver.Popen):
    """The forkserver's Popen without re-importing the caller's ``__main__`` in the child.

    multiprocessing hands a child the parent's main module to import (``spawn.prepare``):
    in the CLI that is the ``toolwatch`` script, under pytest or streamlit their own. The
    child needs none of it (its target is this module's function), and importing it costs
    start-up time and runs foreign top-level code. Same as the stdlib's ``_launch`` but for
    the two ``init_main_*`` keys.
    """

    def _launch(self, process_obj: Any) -> None:  # pragma: no cover - stdlib shape
        prep_data = spawn.get_preparation_data(process_obj._name)
        prep_data.pop("init_main_from_name", None)
        prep_data.pop("init_main_from_path", None)
        buf = io.BytesIO()
        context.set_spawning_popen(self)
        try:
            reduction.dump(prep_data, buf)
            reduction.dump(process_obj, buf)
        finally:
            context.set_spawning_popen(None)
        self.sentinel, w = forkserver.connect_to_new_process(self._fds)
        _parent_w = os.dup(w)
        self.finalizer = util.Finalize(self, util.close_fds, (_parent_w, self.sentinel))
        with open(w, "wb", closefd=True) as f:
            f.write(buf.getbuffer())
        self.pid = forkserver.read_signed(self.sentinel)


class _Process(_CTX.Process):  # type: ignore[name-defined,misc]
    @staticmethod
    def _Popen(process_obj: Any) -> _Popen:
        return _Popen(process_obj)


_FORK = multiprocessing.get_context("fork")


def _os_threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1 << 30


#: OS threads once DuckDB and pyarrow are imported: pyarrow starts jemalloc's background
#: thread and one more of its own at import, both fork-aware (pthread_atfork handlers).
_IMPORT_THREADS = _os_threads()


def _fork_is_safe() -> bool:
    """Whether a plain fork of this process copies no lock another thread may hold: no
    Python thread but this one, and no OS thread beyond those of the imports (a DuckDB
    connection's workers, Streamlit's threads, a live pipeline's would all show). The
    CLI: yes; the dashboard: no."""
    import threading

    return threading.active_count() == 1 and _os_threads() <= _IMPORT_THREADS


class QueryTimeoutError(QueryError):
    """The query's child was killed at the timeout."""


class QueryMemoryError(QueryError):
    """The query needed more memory than its cap."""


class QueryCrashedError(QueryError):
    """The query's child process died without an answer (a signal or an abort)."""


@dataclass
class ChildResult:
    """What a child hands back."""

    #: The rows, decoded from Arrow IPC.
    table: Any
    #: Why the result was cut: ``""`` (it was not), ``"rows"`` or ``"bytes"``.
    cut: str
    #: Wall-clock seconds from the fork to the decoded result.
    seconds: float


def warm() -> None:
    """Start the fork server now (it imports DuckDB and the store: ~1 s once per process),
    so the first query pays only a fork. Safe to call repeatedly."""
    forkserver.ensure_running()


def run(
    root: Path,
    files: dict[str, list[str]],
    sql: str,
    params: dict[str, Any] | list[Any] | None,
    limits: QueryConfig,
    *,
    incident_config: Any = None,
    mode: str = "query",
    start_method: str | None = None,
) -> ChildResult:
    """Run ``sql`` in a child process with the bounds of ``limits``.

    Parameters
    ----------
    root
        The store's folder (the child reads its triage state for ``incidents``).
    files
        Data files per dataset, as the parent listed and validated them.
    sql, params
        The analyst's SQL and its parameters (bound by DuckDB, never pasted in).
    limits
        ``[query]`` bounds: memory cap, DuckDB memory and threads, timeout, rows, bytes,
        columns.
    incident_config
        The store's incident settings (for the ``incidents`` view).
    mode
        ``"query"``, or ``"schema"``: ``sql`` is ignored and the result lists every view
        through the guard (view, column, type).
    start_method
        ``"fork"`` or ``"forkserver"``; by default a plain fork when no other thread
        could hold a lock (:func:`_fork_is_safe`; the CLI: no second interpreter to
        start), else a fork of the fork server (threads and fork do not mix).

    Raises
    ------
    QueryRefusedError
        The guard refused the SQL, or it returns too many columns.
    QueryTimeoutError, QueryMemoryError, QueryCrashedError, QueryError
        The query was killed at the timeout, hit its memory cap, its process died, or it
        failed.
    """
    import pyarrow as pa

    started = time.monotonic()
    spec = {
        "root": str(root),
        "files": files,
        "sql": sql,
        "params": params,
        "limits": limits,
        "incident_config": incident_config,
        "mode": mode,
        # The guard's snapshot of DuckDB's built-ins, taken once per parent (~0.2 s) rather
        # than once per child.
        "catalog": query_guard.catalog(),
    }
    reader, writer = _CTX.Pipe(duplex=False)
    if start_method is None:
        start_method = "fork" if _fork_is_safe() else "forkserver"
    cls = _FORK.Process if start_method == "fork" else _Process
    proc = cls(target=_child_main, args=(writer, spec), daemon=True, name="toolwatch-query")
    try:
        proc.start()
        writer.close()
        deadline = started + limits.timeout_seconds
        header, body = _receive(reader, proc, deadline, limits)
    finally:
        # Whatever happened (a result, an error, Ctrl-C in the caller): the child is gone.
        if proc.pid is not None and proc.is_alive():
            proc.kill()
        proc.join(5)
        reader.close()
        with contextlib.suppress(Exception):
            writer.close()
        with contextlib.suppress(Exception):
            proc.close()
    if not header.get("ok"):
        _raise(header, limits)
    table = pa.ipc.open_stream(body).read_all()
    return ChildResult(table, str(header.get("cut", "")), time.monotonic() - started)


def _receive(
    reader: multiprocessing.connection.Connection,
    proc: Any,
    deadline: float,
    limits: QueryConfig,
) -> tuple[dict[str, Any], bytes]:
    """The child's header and result bytes; kills it at ``deadline``."""
    header: dict[str, Any] | None = None
    parts: list[bytes] = []
    cap = _byte_cap(limits) + _CHUNK  # the child cuts first; this is a backstop
    got = 0
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            proc.kill()
            raise QueryTimeoutError(
                f"query interrupted: killed at the {limits.timeout_seconds:g} s timeout "
                "(query.timeout_seconds / --timeout)"
            )
        ready = multiprocessing.connection.wait([reader, proc.sentinel], timeout=min(left, 0.5))
        if reader in ready:
            try:
                msg = reader.recv_bytes()
            except (EOFError, OSError):
                msg = None
            if msg is not None:
                if header is None:
                    header = orjson.loads(msg)
                    if not header.get("ok"):
                        return header, b""
                elif msg == b"":
                    return header, b"".join(parts)
                else:
                    got += len(msg)
                    if got > cap:
                        proc.kill()
                        raise QueryError("query result larger than query.max_result_mib")
                    parts.append(msg)
                continue
        if proc.sentinel in ready or not proc.is_alive():
            # Messages written just before the exit are still in the pipe.
            if reader.poll(0):
                continue
            proc.join(1)
            raise _died(proc.exitcode, limits)


def _died(code: int | None, limits: QueryConfig) -> QueryError:
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
    else:
        name = f"exit status {code}"
    if code == -signal.SIGKILL:
        return QueryMemoryError(
            f"the query's process was killed ({name}), most likely by the system for "
            "memory; query.memory_limit_mib bounds what one query may use"
        )
    return QueryCrashedError(
        f"the query's process died ({name}) without an answer: DuckDB crashed on it, or it "
        f"exceeded the {limits.memory_limit_mib:,} MiB memory cap (query.memory_limit_mib)"
    )


def _raise(header: dict[str, Any], limits: QueryConfig) -> None:
    kind, msg = header.get("kind"), str(header.get("message", "query failed"))
    if kind == "refused":
        raise QueryRefusedError(msg)
    if kind == "memory" and header.get("duckdb_limit"):
        raise QueryMemoryError(
            f"query ran out of memory: DuckDB's limit is {_duck_mib(limits):,} MiB "
            f"(query.memory_limit_mb, at most 3/4 of query.memory_limit_mib): {msg}"
        )
    if kind == "memory":
        raise QueryMemoryError(
            f"query exceeded the {limits.memory_limit_mib:,} MiB memory cap "
            f"(query.memory_limit_mib): {msg}"
        )
    err = QueryError(msg)
    err.missing_files = bool(header.get("missing_files"))  # type: ignore[attr-defined]
    raise err


def _duck_mib(limits: QueryConfig) -> int:
    """DuckDB's own memory limit: inside the OS cap, so its clean error comes first."""
    return max(16, min(limits.memory_limit_mb, limits.memory_limit_mib * 3 // 4))


def _byte_cap(limits: QueryConfig) -> int:
    return max(1, limits.max_result_mib) << 20


# --------------------------------------------------------------------------- the child


def _child_main(conn: multiprocessing.connection.Connection, spec: dict[str, Any]) -> None:
    """Entry point of the child: never raises, always answers (or dies trying)."""
    # No core file for a child that aborts (a crash must not write into the cwd).
    with contextlib.suppress(Exception):
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    # Ctrl-C goes to the whole foreground group: the parent decides, the child is killed.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _watchdog(spec["limits"].timeout_seconds + 5.0)
    try:
        header, body = _child_work(spec)
    except BaseException as exc:
        header, body = _error_header(exc, spec), b""
    try:
        conn.send_bytes(orjson.dumps(header, default=str))
        if header.get("ok"):
            view = memoryview(body)
            for i in range(0, len(view), _CHUNK):
                conn.send_bytes(view[i : i + _CHUNK])
            conn.send_bytes(b"")
    except (BrokenPipeError, OSError):
        pass  # the parent is gone or gave up
    finally:
        conn.close()


def _watchdog(seconds: float) -> None:
    """Kill this child when its parent goes away, or ``seconds`` after it started.

    The parent kills the child at the timeout; this covers a parent that cannot (killed
    itself with SIGKILL, or the dashboard process gone): no query outlives its caller.
    """
    import threading

    parent = multiprocessing.parent_process()
    sentinel = parent.sentinel if parent is not None else None

    def watch() -> None:
        if sentinel is not None:
            multiprocessing.connection.wait([sentinel], timeout=seconds)
        else:
            time.sleep(seconds)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="toolwatch-query-watchdog", daemon=True).start()


def _child_work(spec: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
    import pyarrow as pa

    from toolwatch.query_guard import check_query

    query_guard.prime_catalog(spec["catalog"])
    limits: QueryConfig = spec["limits"]
    files: dict[str, list[str]] = spec["files"]
    sql: str = spec["sql"]
    schema_mode = spec["mode"] == "schema"

    class _Listed(Store):
        """The store with the parent's file lists (validated there, cached per process)."""

        def files(self, dataset: str) -> list[str]:
            return list(files.get(dataset, []))

    store = _Listed(spec["root"])
    store.incident_config = spec["incident_config"]
    lim = QueryConfig(
        memory_limit_mb=_duck_mib(limits),
        threads=limits.threads,
        timeout_seconds=limits.timeout_seconds,
        max_rows=limits.max_rows,
    )
    wants_incidents = schema_mode or "incidents" in sql.lower()
    con, _ = query_connection(store, lim, incidents=wants_incidents)
    _cap_memory(limits.memory_limit_mib)
    if schema_mode:
        return {"ok": True, "cut": ""}, _ipc(_schema_table(con, VIEWS))
    check_query(sql, VIEWS, con=con)
    params = spec["params"]
    rel = con.sql(sql, params=params) if params is not None else con.sql(sql)
    ncols = len(rel.columns)
    if ncols > limits.max_columns > 0:
        raise QueryRefusedError(
            f"query refused: it returns {ncols:,} columns; at most {limits.max_columns:,} "
            "are allowed (query.max_columns)"
        )
    rel = renderable(rel)
    max_rows = limits.max_rows if limits.max_rows > 0 else None
    batch = 65_536 if max_rows is None else max(1, min(max_rows + 1, 65_536))
    reader = rel.to_arrow_reader(batch)
    sink = pa.BufferOutputStream()
    cap = _byte_cap(limits)
    cut = ""
    n = 0
    with pa.ipc.new_stream(sink, reader.schema) as w:
        for b in reader:
            if max_rows is not None and n + b.num_rows > max_rows:
                b = b.slice(0, max_rows - n)
                cut = "rows"
            if b.num_rows and sink.tell() + b.nbytes > cap:
                b = _fit(b, cap - sink.tell())
                cut = "bytes"
            if b.num_rows:
                w.write_batch(b)
                n += b.num_rows
            if cut:
                break
    return {"ok": True, "cut": cut}, sink.getvalue().to_pybytes()


def _fit(b: Any, room: int) -> Any:
    """The longest prefix of batch ``b`` that fits in ``room`` bytes (binary search)."""
    lo, hi = 0, b.num_rows
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if b.slice(0, mid).nbytes <= room:
            lo = mid
        else:
            hi = mid - 1
    return b.slice(0, lo)


def _schema_table(con: Any, views: tuple[str, ...]) -> Any:
    """(view, column, type) of every view, each read through the guard as an analyst's
    ``SELECT * FROM view`` would be: what is listed is what a query can reach."""
    import pyarrow as pa

    from toolwatch.query_guard import check_query

    rows: dict[str, list[str]] = {"view": [], "column": [], "type": []}
    for v in views:
        q = f"SELECT * FROM {v}"  # v is one of the store's own view names
        check_query(q, views, con=con)
        rel = con.sql(q)
        for c, t in zip(rel.columns, rel.dtypes, strict=True):
            rows["view"].append(v)
            rows["column"].append(c)
            rows["type"].append(str(t))
    return pa.table(rows)


def _ipc(tbl: Any) -> bytes:
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, tbl.schema) as w:
        w.write_table(tbl)
    return sink.getvalue().to_pybytes()


def _cap_memory(mib: int) -> None:
    """``RLIMIT_AS`` = this process's address space now + ``mib``.

    Relative, not absolute: an interpreter with DuckDB and pyarrow loaded and a connection
    with its threads maps ~0.8 GB of address space before any query (thread stacks,
    allocator reservations), most of it never touched.
    """
    with open("/proc/self/statm") as fh:
        size = int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    cap = size + max(16, mib) * (1 << 20)
    _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))


def _error_header(exc: BaseException, spec: dict[str, Any]) -> dict[str, Any]:
    import duckdb

    if isinstance(exc, QueryRefusedError):
        return {"ok": False, "kind": "refused", "message": str(exc)}
    if isinstance(exc, MemoryError | duckdb.OutOfMemoryException) or "bad allocation" in str(
        exc
    ) or "std::bad_alloc" in str(exc):
        # "bad allocation": the OS cap refused memory; else DuckDB's own limit was hit.
        text = str(exc)
        duck = isinstance(exc, duckdb.OutOfMemoryException) and "bad alloc" not in text
        return {"ok": False, "kind": "memory", "message": _message(exc, first_only=True),
                "duckdb_limit": duck}
    missing = any(
        not os.path.exists(f) for fs in spec.get("files", {}).values() for f in fs
    ) if isinstance(exc, duckdb.IOException) else False
    return {"ok": False, "kind": "error", "message": _message(exc), "missing_files": missing}


def _message(exc: BaseException, *, first_only: bool = False) -> str:
    """DuckDB's message with every line (its "Candidate bindings: …" / "Did you mean …"
    hints are on the later ones), trimmed; the first line only for memory errors, whose
    later lines advise raising a limit the analyst does not control."""
    text = str(exc).strip() or type(exc).__name__
    if first_only:
        text = text.splitlines()[0]
    lines = [ln.rstrip() for ln in text.splitlines()]
    text = "\n".join(ln for ln in lines if ln)
    return text if len(text) <= _MAX_MESSAGE else text[:_MAX_MESSAGE] + "…"
