"""Memory by distinct values (issue 28 item 8): per-tool state is columnar.

1M distinct tool names once took analyze to 6.0 GB: ``tools.tool_table`` built its
``idem_args`` column from one Python list per distinct tool (~5 KB each once polars had
converted them). These tests pin the columnar table to the scalar rule it replaces and
bound its memory per distinct tool in a real child process.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from toolwatch.detectors import tools
from toolwatch.detectors.config import DetectorsConfig

NAMES = [
    "getCustomerExport", "fulfillOrder", None, "", "readSecret", "ÜberPassword",
    "applyCoupon", "run_query", "x/y.deleteAll", "PAYMENT", "send-mail", "tool-000001",
    "adminGrantRole", "bulkDelete", "orders.fulfill", "createPayment",
]
SERVERS = ["docs", None, "shop", ""]

OVERRIDES = {
    "tools": {
        "business_keys": {"fulfillOrder": "orderId", "shop/applyCoupon": "code",
                          "None/readSecret": "k"},
        "idempotency_args": {"docs/run_query": ["dedupe", "requestId"], "": ["e"]},
        "data_tools": ["send-mail", "docs/PAYMENT"],
        "roles": {"shop/tool-000001": "outbound"},
    }
}


def _scalar_table(pairs: pl.DataFrame, config: DetectorsConfig) -> list[dict]:
    """The per-tool rule written out in plain Python (what the columnar table must equal)."""
    tc = config.tools
    out = []
    for server, tool in pairs.rows():
        role = tools.role_of(tool, server, tc)
        low = (tool or "").lower()
        extra = tools._override(tc.idempotency_args, server, tool) or []
        out.append({
            "server": server,
            "tool": tool,
            "tool_role": role,
            "mutates": role in tools.MUTATING_ROLES,
            "irreversible": role == "irreversible",
            "outbound": role == "outbound",
            "sensitive_tool": any(t.lower() in low for t in tc.sensitive_terms),
            "data_tool": any(t.lower() in low for t in tc.data_terms)
            or tool in tc.data_tools or f"{server}/{tool}" in tc.data_tools,
            "bk_arg": tools._override(tc.business_keys, server, tool),
            "idem_args": [*tc.idempotency_keys,
                          *[k for k in extra if k not in tc.idempotency_keys]],
        })
    return out


#: Names where the Rust regex (no lookahead) and Python's backtracking could part.
WORD_CASES = ["fulfillOrder", "HTTPServer", "getURLs", "XMLHttpRequest", "IDs", "ID", "aB",
              "x/y.deleteAll", "a.b:c/Dd", "a\nb.cX", "12getX", "９９get", "00bz", "ÜberPass",
              "tool-000000123", "run_query", "", "..", "_", "ÀbcDef"]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(WORD_CASES),
                          st.text(alphabet="aAbBzZ09./:_-Ü１\n", max_size=10)), max_size=40))
def test_first_words_is_the_scalar_first_word(names: list[str]) -> None:
    # first_words replaces a per-name Python loop over (possibly a million) tool names.
    got = tools.first_words(pl.Series([*names, None], dtype=pl.String)).to_list()
    assert got == [*[(tools._words(n) or [""])[0] for n in names], None]


@pytest.mark.parametrize("overrides", [{}, OVERRIDES], ids=["default", "overrides"])
def test_columnar_tool_table_equals_the_scalar_rule(overrides: dict) -> None:
    cfg = DetectorsConfig.from_dict(overrides)
    pairs = pl.DataFrame(
        [(s, n) for s in SERVERS for n in NAMES],
        schema={"server": pl.String, "tool": pl.String},
        orient="row",
    )
    got = tools.tool_table(pairs, cfg)
    assert got.to_dicts() == _scalar_table(pairs, cfg)
    assert got["idem_args"].dtype == pl.List(pl.String)


def test_annotation_looks_for_each_configured_key_once() -> None:
    cfg = DetectorsConfig.from_dict(OVERRIDES)
    ev = pl.DataFrame({
        "server": ["docs", "shop", "docs"],
        "tool": ["run_query", "applyCoupon", "fulfillOrder"],
        "args": ['{"dedupe": "d1"}', '{"code": "C9"}', '{"orderId": "o-1"}'],
        "resource_id": [None, None, "o-1"],
    })
    out, (idem_keys, bk_keys) = tools._annotate(ev, cfg)
    assert idem_keys == tuple(sorted({*cfg.tools.idempotency_keys, "dedupe"}))
    assert bk_keys == ("code", "orderId")
    assert out["idem"].to_list() == ["d1", None, None]
    assert out["bk"].to_list() == [None, "C9", "o-1"]


@pytest.mark.slow  # starts a process
def test_memory_per_distinct_tool_is_bounded() -> None:
    # 200k distinct names in a child process: the per-tool Python lists took ~5 KB per
    # name (1 GB here); the columnar table needs well under 0.5 KB.
    code = textwrap.dedent(
        """
        import resource
        import polars as pl
        from toolwatch.detectors import tools
        from toolwatch.detectors.config import DetectorsConfig
        n = 200_000
        i = pl.int_range(n)
        ev = pl.select(
            pl.lit("docs").alias("server"),
            pl.format("tool-{}", i).alias("tool"),
            pl.concat_str(pl.lit('{"documentId": "doc-'), (i % 500).cast(pl.String),
                          pl.lit('"}')).alias("args"),
            pl.format("doc-{}", i % 500).alias("resource_id"),
        )
        cfg = DetectorsConfig()
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        out = tools.annotate(ev, cfg)
        assert out.height == n and out["tool_role"].null_count() == 0
        print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base)
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    grew_kib = int(done.stdout.split()[-1])
    assert grew_kib < 200_000 * 0.5, f"annotate grew {grew_kib} KiB for 200k distinct tools"


def test_a_caller_above_the_cap_is_spread_over_partitions() -> None:
    import duckdb

    from toolwatch.analyze import _split_big_keys
    from toolwatch.config import Config

    con = duckdb.connect()
    # One caller with 60 sessions of 50 events (3,000), 30 small callers of 20 events.
    con.execute(
        "CREATE TEMP TABLE tw_keys AS "
        "SELECT hash('big-' || s) AS sk, hash('big') AS ck, NULL::UBIGINT AS ik, 50 AS n "
        "FROM range(60) t(s) UNION ALL "
        "SELECT hash('c' || s), hash('c' || s), NULL, 20 FROM range(30) t(s)"
    )
    cfg = Config()
    cfg.analyze.max_events_per_caller = 400
    parts = 8

    def sizes() -> list[int]:
        rows = con.execute(
            f"SELECT ck % {parts} AS p, sum(n) FROM tw_keys GROUP BY p ORDER BY 2 DESC"
        ).fetchall()
        return [int(r[1]) for r in rows]

    assert max(sizes()) >= 3000  # before: the big caller is one partition
    assert _split_big_keys(con, cfg, parts) == (1, 400)
    after = sizes()
    assert sum(after) == 3000 + 600  # every session still in exactly one partition
    assert max(after) < 1500  # spread: 8 keys of ~375 events over 8 partitions
    small = con.execute(
        "SELECT count(*) FROM tw_keys WHERE n = 20 AND ck = sk"
    ).fetchone()[0]
    assert small == 30  # callers under the cap keep their key
    assert _split_big_keys(con, cfg, 1) is None  # single pass: nothing to split


@pytest.mark.slow  # analyze end to end
def test_analyze_reports_the_callers_it_split(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import orjson

    from toolwatch.analyze import analyze_paths
    from toolwatch.config import Config

    log = tmp_path / "big-caller.jsonl"
    lines = []
    for i in range(600):
        caller = "solo" if i % 6 else f"other-{i % 12}"
        lines.append(orjson.dumps({
            "ts": f"2026-11-02T00:{i // 60:02d}:{i % 60:02d}Z",
            "session_id": f"{caller}-{i // 40}",
            "caller_id": caller,
            "server": "docs-server",
            "tool": "getDocument",
            "args": {"documentId": f"doc-{i % 37}"},
            "status": "ok",
        }))
    log.write_bytes(b"\n".join(lines) + b"\n")
    cfg = Config()
    cfg.store.data_dir = str(tmp_path / "store")
    cfg.analyze.partitions = 4
    cfg.analyze.max_events_per_caller = 100
    with caplog.at_level("WARNING", logger="toolwatch.analyze"):
        analyze_paths(cfg, [str(log)], alerts_out=tmp_path / "a.jsonl", progress=False)
    msgs = [r.getMessage() for r in caplog.records if "max_events_per_caller" in r.getMessage()]
    assert msgs and msgs[0].startswith("analyze: 1 caller(s) with more than 100 events")


def test_tool_table_of_pairs_known_distinct_is_the_same_table() -> None:
    # _annotate hands tool_table pairs that are distinct already (distinct 64-bit keys):
    # skipping the string de-duplication must not change a row.
    cfg = DetectorsConfig.from_dict(OVERRIDES)
    pairs = pl.DataFrame([(s, n) for s in SERVERS for n in NAMES],
                         schema={"server": pl.String, "tool": pl.String}, orient="row")
    twice = pl.concat([pairs, pairs])
    want = tools.tool_table(twice, cfg, idem_lists=False)
    assert want.height == pairs.height
    assert tools.tool_table(pairs, cfg, idem_lists=False, distinct=True).equals(want)


def _oversize_traffic() -> tuple[pl.DataFrame, pl.DataFrame]:
    from datetime import timedelta

    from tests.fixtures.traffic import T0, Traffic

    tr = Traffic(seed=28)
    # Tools called in many sessions (baselines of their own), a tool in one session only
    # (compared with the population), a few oversized responses, and null servers.
    for s in range(12):
        t = T0 + timedelta(hours=s)
        for k in range(8):
            tool = ("getDocument", "searchDocuments", f"rare-{s}", "exportCustomers")[k % 4]
            big = (s % 3 == 0 and k % 4 == 0) or (s % 4 == 1 and k == 3)
            tr.call(f"s{s}", t + timedelta(seconds=5 * k), tool, caller=f"c{s % 4}",
                    server="crm" if k % 2 else "docs-server", resource_key="id",
                    resource_id=f"r-{s}-{k}", nbytes=900_000 if big else 2_000 + 37 * k,
                    rows=5_000 if big else 10)
    ev = tr.events().with_columns(
        # Oversized exports without a server in three sessions: never matched to a
        # baseline (the strings' joins drop null servers), so judged on the population.
        pl.when(pl.col("session_id").is_in(["s1", "s5", "s9"])
                & (pl.col("tool") == "exportCustomers"))
        .then(None).otherwise(pl.col("server")).alias("server"))
    return ev, tr.summaries()


def _typicals_by_strings(events: pl.DataFrame, min_sessions: int,
                         factor: float) -> pl.DataFrame:
    """bulk.tool_typicals' table as it was written before its 64-bit keys."""
    from toolwatch.detectors.bulk import _big

    ok = events.lazy().filter(pl.col("ok")).select("sh", "server", "tool", "bytes", "rows")
    pop = ok.select(pl.col("bytes").filter(pl.col("bytes") > 0).median().alias("b"),
                    pl.col("rows").filter(pl.col("rows") > 0).median().alias("r")).collect()
    typ = (ok.group_by("server", "tool")
           .agg(pl.col("sh").n_unique().alias("_n"),
                pl.col("bytes").filter(pl.col("bytes") > 0).median().cast(pl.Float64)
                .alias("typ_b"),
                pl.col("rows").filter(pl.col("rows") > 0).median().cast(pl.Float64)
                .alias("typ_r"))
           .filter(pl.col("_n") >= min_sessions))
    del pop
    return (ok.join(typ, on=["server", "tool"], how="inner")
            .group_by("server", "tool", "sh")
            .agg(_big(factor, 0.0, 0.0).any().alias("_heavy"), pl.col("typ_b").first(),
                 pl.col("typ_r").first())
            .group_by("server", "tool")
            .agg(pl.col("typ_b").first(), pl.col("typ_r").first(),
                 pl.col("_heavy").mean().cast(pl.Float64).alias("heavy_share"))
            .collect())


def _oversized_by_strings(fs: object, typ: pl.DataFrame, pop_b: float, pop_r: float,
                          factor: float, heavy_share: float) -> pl.DataFrame:
    """bulk._oversized as it was written before its 64-bit keys (strings joined)."""
    from toolwatch.detectors.bulk import _big
    from toolwatch.detectors.tools import annotated

    routine = pl.col("heavy_share").is_null() | (pl.col("heavy_share") >= heavy_share)
    named = pl.col("data").fill_null(False) | pl.col("sensitive").fill_null(False)
    big = pl.col("ok") & _big(factor, pop_b, pop_r) & (~routine | named)
    countable = ~((pl.col("heavy_share") >= heavy_share).fill_null(False) & ~named)
    cb = pl.col("bytes").fill_null(0).filter(countable)
    cr = pl.col("rows").fill_null(0).filter(countable)
    over = ["over_bytes", "over_rows", "over_calls", "over_share"]
    return (annotated(fs).lazy()  # type: ignore[arg-type]
            .select("sh", "server", "tool", "ok", "bytes", "rows", "data", "sensitive")
            .join(typ.lazy(), on=["server", "tool"], how="left", maintain_order="left")
            .with_columns(big.alias("_big"))
            .with_columns(pl.col("_big").any().over("sh", "server", "tool").alias("_big_tool"))
            .group_by("sh")
            .agg(pl.col("bytes").filter(pl.col("_big")).fill_null(0).sum().cast(pl.Int64)
                 .alias("over_bytes"),
                 pl.col("rows").filter(pl.col("_big")).fill_null(0).sum().cast(pl.Int64)
                 .alias("over_rows"),
                 pl.col("_big").sum().cast(pl.Int64).alias("over_calls"),
                 pl.col("_big_tool").mean().cast(pl.Float64).alias("over_share"),
                 (cb.sum() - cb.max().fill_null(0)).cast(pl.Int64).alias("named_beyond_bytes"),
                 (cr.sum() - cr.max().fill_null(0)).cast(pl.Int64).alias("named_beyond_rows"))
            # sessions without an oversized call: no oversized figures (null)
            .with_columns(*[pl.when(pl.col("over_calls") > 0).then(pl.col(c)).alias(c)
                            for c in over])
            .collect())


@pytest.mark.parametrize("heavy_share", [0.2, 0.9])
def test_oversized_reads_on_pair_keys_equal_the_string_join(heavy_share: float) -> None:
    # bulk_extraction's per-(server, tool) baselines are found, joined and windowed on a
    # 64-bit pair key (a million distinct tools); every figure must be the strings' one,
    # null servers included (a null server never matches a baseline).
    from toolwatch.detectors import bulk
    from toolwatch.detectors.base import FeatureSet

    ev, su = _oversize_traffic()
    cfg = DetectorsConfig()
    fs = FeatureSet.build(ev, su, cfg)
    factor = 5.0
    typ, pop_b, pop_r = bulk.tool_typicals(fs.events, 3, factor)
    want = _typicals_by_strings(fs.events, 3, factor)
    keys = ["server", "tool"]
    assert typ.height >= 3
    assert typ.sort(keys, nulls_last=True).equals(
        want.select(typ.columns).sort(keys, nulls_last=True))
    got = bulk._oversized(fs, typ, pop_b, pop_r, factor, heavy_share)
    ref = _oversized_by_strings(fs, typ, pop_b, pop_r, factor, heavy_share)
    assert ref["over_calls"].drop_nulls().len() > 0
    assert got.sort("sh").equals(ref.select(got.columns).sort("sh"))


def _tagged_by_python(names: list[str | None], rules: list[dict]) -> tuple[set, set]:
    """step_skip's rule matching as it was: every distinct name through ``_words``."""
    distinct = sorted({n for n in names if n is not None})
    verbs = [(tools._words(n) or [""])[0] for n in distinct]

    def hits(spec: str) -> list[bool]:
        if spec.startswith("verb:"):
            return [v == spec[5:].lower() for v in verbs]
        return [n == spec for n in distinct]

    st_rows, pr_rows = set(), set()
    for r in rules:
        st = [n for n, h in zip(distinct, hits(r["step"]), strict=True) if h]
        if not st:
            continue
        req = [hits(x) for x in r["requires"]]
        st_rows |= {(n, r["id"], r["server"]) for n in st}
        pr_rows |= {(n, r["id"], None) for i, n in enumerate(distinct) if any(h[i] for h in req)}
    return st_rows, pr_rows


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(st.sampled_from([*WORD_CASES, "shipOrder", "SHIPorder", "chargeCard",
                                           "refund", "x.Refund_all", "CHARGE", "payInvoice"]),
                          st.text(alphabet="aAcCeghprsSz./_", max_size=8)), max_size=30))
def test_step_skip_matches_only_names_a_rule_can_match(names: list[str]) -> None:
    # step_skip keeps (Aho-Corasick) only the names containing a rule's verb or name before
    # making them distinct: a million distinct tools never leave polars; the rows tagged
    # must be the ones every name's first word gave.
    from toolwatch.detectors.sequence import StepSkipDetector

    det = StepSkipDetector(DetectorsConfig())
    det.rules_ = [
        {"id": 0, "step": "verb:ship", "requires": ["verb:charge", "payInvoice"],
         "server": None},
        {"id": 1, "step": "refund", "requires": ["verb:Pay"], "server": "shop"},
        {"id": 2, "step": "verb:nothing", "requires": ["verb:charge"], "server": None},
        {"id": 3, "step": "verb:s", "requires": ["verb:a"], "server": None},
    ]
    st_f, pr_f = det._tagged(pl.DataFrame({"tool": [*names, None]}, schema={"tool": pl.String}))
    want_st, want_pr = _tagged_by_python([*names, None], det.rules_)
    assert set(st_f.iter_rows()) == want_st and st_f.height == len(want_st)
    assert set(pr_f.iter_rows()) == want_pr and pr_f.height == len(want_pr)
    # A verb rule of no word at all ("verb:"): names without a word ("..", "_", "").
    det.rules_ = [{"id": 0, "step": "verb:", "requires": ["verb:ship"], "server": None}]
    ev = pl.DataFrame({"tool": [*names, None]}, schema={"tool": pl.String})
    st_f, pr_f = det._tagged(ev)
    want_st, want_pr = _tagged_by_python([*names, None], det.rules_)
    assert set(st_f.iter_rows()) == want_st and st_f.height == len(want_st)
    assert set(pr_f.iter_rows()) == want_pr and pr_f.height == len(want_pr)


def _addresses(table) -> set[int]:
    return {b.address for col in table.columns for chunk in col.chunks
            for b in chunk.buffers() if b is not None}


def test_kept_batch_columns_do_not_share_the_parsed_batch() -> None:
    # analyze keeps a few columns of every parsed batch; each buffer of DuckDB's Arrow
    # export kept the whole export (its raw lines included) alive until detection ended.
    import duckdb

    from toolwatch.analyze import _compact

    con = duckdb.connect()
    parsed = con.sql(
        "SELECT 'tool-' || r AS tool, r AS bytes, repeat('x', 500) || r AS raw "
        "FROM range(3000) t(r)"
    ).to_arrow_table()
    kept = _compact(parsed.select(["tool", "bytes"]))
    assert kept.equals(parsed.select(["tool", "bytes"]))
    assert kept.schema == parsed.select(["tool", "bytes"]).schema
    assert all(col.num_chunks == 1 for col in kept.columns)
    assert not _addresses(kept) & _addresses(parsed)
    empty = parsed.slice(0, 0)
    assert _compact(empty).num_rows == 0


@pytest.mark.slow  # starts a process
def test_kept_columns_release_the_parsed_batch() -> None:
    # In a child (glibc heap figures of its own): DuckDB's exported buffers are glibc
    # memory, and dropping the batch must return them once only compact copies are held.
    code = textwrap.dedent(
        """
        import ctypes, sys
        import duckdb
        from toolwatch.analyze import _compact

        class MallInfo(ctypes.Structure):
            _fields_ = [(n, ctypes.c_size_t) for n in (
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks "
                "keepcost").split()]

        try:
            libc = ctypes.CDLL("libc.so.6")
            libc.mallinfo2.restype = MallInfo
        except (OSError, AttributeError):
            print("skip"); sys.exit(0)

        def used():
            m = libc.mallinfo2()
            return m.uordblks + m.hblkhd

        con = duckdb.connect()
        held = []
        before = used()
        for _ in range(4):
            batch = con.sql(
                "SELECT 'tool-' || r AS tool, repeat('x', 1000) || r AS raw "
                "FROM range(20000) t(r)").to_arrow_table()
            held.append(KEEP(batch.select(["tool"])))
            del batch
        print((used() - before) >> 20)
        """
    )
    grew = {}
    for name, keep in (("select", "lambda t: t"), ("compact", "_compact")):
        done = subprocess.run([sys.executable, "-c", code.replace("KEEP", f"({keep})")],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        if done.stdout.split()[-1] == "skip":
            pytest.skip("not glibc")
        grew[name] = int(done.stdout.split()[-1])
    # 4 x 20k raw lines of ~1 KB: ~80 MB stay with a plain select, none with the copy.
    assert grew["select"] > 60, grew
    assert grew["compact"] < 10, grew


@pytest.mark.slow  # starts a process
def test_a_partition_read_hands_back_duckdb_pages() -> None:
    # DuckDB's own jemalloc kept a partition read's freed pages (its sort, its Arrow
    # export) resident through the partition's detection pass: ~0.4 GB at 3M events.
    code = textwrap.dedent(
        """
        import duckdb
        from toolwatch.analyze import _duckdb_mallctl, _release_read

        def rss():
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * 4096 >> 20

        if _duckdb_mallctl() is None:
            print("skip"); raise SystemExit(0)
        con = duckdb.connect()
        part = con.sql("SELECT 'x' || r AS s, r FROM range(3000000) t(r) "
                       "ORDER BY s DESC").to_arrow_table()
        del part
        before = rss()
        _release_read()
        print(before - rss())
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    if done.stdout.split()[-1] == "skip":
        pytest.skip("DuckDB without its own jemalloc")
    assert int(done.stdout.split()[-1]) > 80, done.stdout
