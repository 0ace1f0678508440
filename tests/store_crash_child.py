"""Child processes of ``tests/test_store_crash.py``: a store writer to SIGKILL, a reader.

    python tests/store_crash_child.py writer STORE N SEED EXTRA
    python tests/store_crash_child.py reader STORE OUT STOP
    python tests/store_crash_child.py zygote

``writer`` appends events for lines ``0..N-1`` of stream ``fp`` (``offset`` = line
number, ``event_id`` = ``fp:<offset>``), one :meth:`Store.write_batch` per batch with
``Checkpoint("fp", "s", end)``, resuming from the store's checkpoint. ``SEED`` cuts the
batches (each run of a trial gets its own seed, so a replay is cut differently than the
run it replays) and sometimes rewinds the resume point (a source re-read from an older
position). With ``EXTRA`` = 1 the same ``write_batch`` also adds a ``summaries`` row for
every line divisible by 5 and a ``quarantine`` row for every line divisible by 11.

The writer prints one marker line per step to stdout (flushed), so the test can aim its
SIGKILL at a step and tell afterwards where the writer died::

    resume <offset>                the store is open, the checkpoint read
    batch <start> <end>            write_batch is called (the batch's rows are built)
    parquet <dataset>              a data file is about to be written
    create <table> / created       a Delta table is being created (first commit)
    commit <table> / committed     a Delta commit is being made / was made
    done <end>                     the write_batch returned

After ``created`` and ``committed`` the writer sleeps :data:`HOOK_S`: a kill aimed there
lands between two tables' commits of one ``write_batch`` (events committed, streams not),
the state a replay has to get right.

``reader`` polls the store until the file ``STOP`` exists and writes one JSON line per
answer to ``OUT``: per dataset ``[count(*), count(DISTINCT event_id), max(offset)]``, or
``{"error": ...}`` when a poll failed.

``zygote`` imports everything a writer needs once, then forks one writer per line
``writer STORE N SEED EXTRA FIFO ERR`` read from stdin (the writer's stdout is the named
pipe ``FIFO``, its stderr the file ``ERR``), answers ``pid <pid>`` and, when that writer
has ended, ``exit <code>`` (``-9``: SIGKILLed). A fresh interpreter spends ~0.7 s of CPU
on imports before its first commit; the test starts 80 writers, on 2 shared cores.

Not a test: started by one.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path

import pyarrow as pa

#: Seconds the writer sleeps after each table creation or commit (see the module doc).
HOOK_S = 0.004
#: Rows of each dataset per line: every line is an event; summaries and quarantine get
#: every 5th and 11th line (EXTRA = 1).
EVERY = {"events": 1, "summaries": 5, "quarantine": 11}
SQL = (
    "SELECT (SELECT count(*) FROM events), (SELECT count(DISTINCT event_id) FROM events), "
    '(SELECT max("offset") FROM events), '
    "(SELECT count(*) FROM summaries), (SELECT count(DISTINCT event_id) FROM summaries), "
    '(SELECT max("offset") FROM summaries), '
    "(SELECT count(*) FROM quarantine), (SELECT count(DISTINCT event_id) FROM quarantine), "
    '(SELECT max("offset") FROM quarantine)'
)


def say(*words: object) -> None:
    """One marker line, flushed before the step it announces runs."""
    sys.stdout.write(" ".join(map(str, words)) + "\n")
    sys.stdout.flush()


def install_hooks() -> None:
    """Announce every Parquet write, table creation and Delta commit on stdout."""
    from deltalake import DeltaTable

    import toolwatch.store as store_mod

    real_commit = DeltaTable.create_write_transaction
    real_create = DeltaTable.create.__func__  # type: ignore[attr-defined]
    real_write = store_mod.write_parquet

    def commit(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        table = Path(self.table_uri.removeprefix("file://")).name
        say("commit", table)
        out = real_commit(self, *args, **kwargs)
        say("committed", table)
        time.sleep(HOOK_S)
        return out

    def create(cls, uri, *args, **kwargs):  # type: ignore[no-untyped-def]
        say("create", Path(str(uri)).name)
        out = real_create(cls, uri, *args, **kwargs)
        say("created")
        time.sleep(HOOK_S)
        return out

    def write(tbl, path, *args, **kwargs):  # type: ignore[no-untyped-def]
        say("parquet", Path(path).parent.name)
        return real_write(tbl, path, *args, **kwargs)

    DeltaTable.create_write_transaction = commit  # type: ignore[method-assign]
    DeltaTable.create = classmethod(create)  # type: ignore[method-assign, assignment]
    store_mod.write_parquet = write


def rows(dataset: str, offsets: list[int]) -> pa.Table:
    """Rows of ``dataset`` for the given lines: ids, offsets, the rest null."""
    from toolwatch import schema

    sch = schema.DATASETS[dataset]
    n = len(offsets)
    given = {
        "event_id": pa.array([f"fp:{o}" for o in offsets], pa.string()),
        "source_fp": pa.array(["fp"] * n, pa.string()),
        "source": pa.array(["s"] * n, pa.string()),
        "offset": pa.array(offsets, pa.int64()),
        "line_no": pa.array([o + 1 for o in offsets], pa.int64()),
        "ts": pa.array([1_700_000_000_000_000 + o for o in offsets], schema.TS),
        "tool": pa.array(["read_file"] * n, pa.string()),
        "reason": pa.array(["invalid_json"] * n, pa.string()),
        "kind": pa.array(["SESSION_END"] * n, pa.string()),
    }
    return pa.table([given.get(f.name, pa.nulls(n, f.type)) for f in sch], schema=sch)


def writer(store_dir: str, n: int, seed: int, extra: bool, hooks: bool = True) -> None:
    """Write lines up to ``n`` in randomly cut batches, resuming from the checkpoint."""
    if hooks:
        install_hooks()
    from toolwatch.store import Checkpoint, Store

    rng = random.Random(seed)
    store = Store(store_dir)
    start = store.checkpoints().get("fp", 0)
    if start and rng.random() < 0.3:
        start = max(0, start - rng.randint(1, 200))  # re-read from an older position
    say("resume", start)
    while start < n:
        end = min(n, start + rng.choice((1, rng.randint(2, 40), rng.randint(40, 200))))
        tables = {}
        for name, every in EVERY.items():
            if name != "events" and not extra:
                continue
            offsets = [o for o in range(start, end) if o % every == 0]
            if offsets:
                tables[name] = rows(name, offsets)
        say("batch", start, end)
        store.write_batch(tables, [Checkpoint("fp", "s", end)])
        say("done", end)
        start = end
    say("finished")


def reader(store_dir: str, out: str, stop: str) -> None:
    """Poll the store until ``stop`` exists; one JSON line per answer.

    Every 8th poll goes through :func:`toolwatch.query.query` (the views toolwatch reads through,
    ~0.2 s a poll); the others read each table's snapshot (:meth:`Store.files`, what the
    views list) with DuckDB directly, ~15 ms, so the reader sees many more snapshots.
    """
    import duckdb

    from toolwatch.query import query
    from toolwatch.store import Store

    store = Store(store_dir)
    polls = 0
    with open(out, "a") as fh:
        while not os.path.exists(stop):
            try:
                if polls % 8 == 0:
                    vals = list(query(store, SQL).to_pylist()[0].values())
                    rec = {"via": "query", "events": vals[0:3], "summaries": vals[3:6],
                           "quarantine": vals[6:9]}
                else:
                    rec = {"via": "files"}
                    for name in EVERY:
                        files = store.files(name)
                        rec[name] = list(duckdb.execute(
                            'SELECT count(*), count(DISTINCT event_id), max("offset") '
                            "FROM read_parquet($files)", {"files": files}).fetchone()
                        ) if files else [0, 0, None]
                fh.write(json.dumps(rec) + "\n")
            except Exception as exc:  # recorded: the test asserts there are none
                fh.write(json.dumps({"error": f"{type(exc).__name__}: {exc}"}) + "\n")
            fh.flush()
            polls += 1
            time.sleep(0.04)  # leave the writer most of a core


def zygote() -> None:
    """Fork writers on request, each a process of its own the test can SIGKILL."""
    install_hooks()
    import deltalake  # noqa: F401  (imported once here, inherited by every writer)

    import toolwatch.store  # noqa: F401

    # First calls that cost ~0.3 s once (time zone data, lazy imports), paid here rather
    # than by every writer, whose kills are meant for the store's work. Only pyarrow:
    # nothing here may start a thread pool a forked child would inherit without its
    # threads (a warm-up through polars hung a writer in rayon's pool).
    for name in EVERY:
        rows(name, [0])

    for line in sys.stdin:
        _, store_dir, n, seed, extra, fifo, err = line.split()
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.dup2(os.open(err, os.O_WRONLY | os.O_APPEND | os.O_CREAT), 2)
                os.dup2(os.open(fifo, os.O_WRONLY), 1)
                writer(store_dir, int(n), int(seed), extra == "1", hooks=False)
                code = 0
            except BaseException:
                import traceback

                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        say("pid", pid)
        _, status = os.waitpid(pid, 0)
        say("exit", os.waitstatus_to_exitcode(status))


if __name__ == "__main__":
    if sys.argv[1] == "zygote":
        zygote()
    elif sys.argv[1] == "writer":
        writer(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1")
    else:
        reader(sys.argv[2], sys.argv[3], sys.argv[4])
