"""The vectorized feature code gives what a plain per-row reference gives.

``prepare_events`` parses id shapes and pagination arguments once per *distinct* value and
joins the figures back; the id-walk code screens ids with a hash prefilter before grouping.
These tests check both against straightforward Python on small random data, so a faster
rewrite cannot silently change a figure.
"""

from __future__ import annotations

import random
import re
from datetime import UTC, datetime, timedelta

import polars as pl
import pytest
from toolwatch.detectors.config import DetectorsConfig
from toolwatch.detectors.features import (
    SEED,
    _arg_pattern,
    prepare_events,
    prepare_summaries,
    resource_features,
    session_features,
)

RESOURCE_IDS = [
    None, "doc-1001", "doc-1002", "doc-0012", "nodigits", "", "x-123-y", "a1b2",
    "/book/chapter-03.md", "invoice-10", "invoice-20", "9" * 21, "doc-1001 ", "DOC-1001",
]
ARGS = [
    None, "", "{}", '{"page": 3}', '{"page":"4"}', '{"pageNumber": 12, "q": "x"}',
    '{"cursor": "abc"}', '{"nextToken":"zz-1"}', '{"offset": 100, "cursor": "c2"}',
    '{"q": "page"}', '{"documentId": "doc-1001"}', '{"from": 7}',
]
TOOLS = [None, "", "getDocument", "searchItems", "listDocuments"]


def _events(seed: int, n: int = 1500) -> pl.DataFrame:
    rng = random.Random(seed)
    t0 = datetime(2026, 11, 2, tzinfo=UTC)
    rows = []
    for k in range(n):
        rid = rng.choice(RESOURCE_IDS)
        if rid is not None and rng.random() < 0.5:
            rid = f"doc-{rng.randint(1, 60)}"
        rows.append({
            "ts": t0 + timedelta(seconds=k * rng.choice([0, 1, 7])),
            "session_id": f"s-{rng.randint(1, 25)}",
            "caller_id": rng.choice([None, "alice", "bob"]),
            "client_ip": rng.choice(["10.0.0.1", "10.0.0.2"]),
            "tool": rng.choice(TOOLS),
            "args": rng.choice(ARGS),
            "resource_id": rid,
            "status": rng.choice(["ok", "not_found", "denied", "auth_failed", None]),
            "credential_hash": rng.choice([None, None, "k1", "k2", "k3"]),
            "bytes": rng.randint(0, 5000),
        })
    return pl.DataFrame(rows)


def _hash(values: list[str | None]) -> list[int | None]:
    hashed = pl.Series(values, dtype=pl.String).hash(SEED).to_list()
    return [None if v is None else h for v, h in zip(values, hashed, strict=True)]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_prepared_figures_match_per_row_reference(seed: int) -> None:
    cfg = DetectorsConfig.from_dict({})
    raw = _events(seed)
    ev = prepare_events(raw, cfg)
    assert ev["i"].to_list() == list(range(raw.height))  # input order kept
    shapes, nums, pages, cursors = [], [], [], []
    page_re = re.compile(_arg_pattern(cfg.page_keys, r'"?(\d{1,12})\b'))
    cursor_re = re.compile(_arg_pattern(cfg.cursor_keys, r'"([^"]{1,512})"'))
    for rid, args in zip(raw["resource_id"], raw["args"], strict=True):
        m = re.search(r"(\d{1,18})(\D*)$", rid) if rid is not None else None
        nums.append(int(m.group(1)) if m else None)
        shapes.append(rid[: m.start(1)] + "#" + m.group(2) if m else None)
        pm = page_re.search(args) if args else None
        pages.append(int(pm.group(1)) if pm else None)
        cm = cursor_re.search(args) if args else None
        cursors.append(cm.group(1) if cm else None)
    assert ev["rnum"].to_list() == nums
    assert ev["th"].to_list() == _hash(shapes)
    assert ev["page"].to_list() == pages
    assert ev["cuh"].to_list() == _hash(cursors)


@pytest.mark.parametrize("seed", [4, 5])
def test_session_counts_match_per_row_reference(seed: int) -> None:
    cfg = DetectorsConfig.from_dict({})
    raw = _events(seed)
    feats = session_features(prepare_events(raw, cfg), prepare_summaries(None), cfg)
    got = {r["session_id"]: r for r in feats.iter_rows(named=True)}
    expect: dict[str, dict[str, set]] = {}
    for r in raw.iter_rows(named=True):
        e = expect.setdefault(r["session_id"], {"calls": set(), "tools": set(), "res": set(),
                                                 "creds": set(), "failed": set()})
        e["calls"].add((r["tool"] or "", r["args"] or ""))
        e["tools"].add(r["tool"] or "")
        if r["resource_id"] is not None:
            e["res"].add(r["resource_id"])
        if r["credential_hash"] is not None:
            e["creds"].add(r["credential_hash"])
            if r["status"] == "auth_failed":
                e["failed"].add(r["credential_hash"])
    assert set(got) == set(expect)
    for sid, e in expect.items():
        g = got[sid]
        assert g["distinct_calls"] == len(e["calls"])
        assert g["distinct_tools"] == len(e["tools"])
        assert g["distinct_resources"] == len(e["res"])
        assert g["distinct_creds"] == len(e["creds"])
        assert g["failed_creds"] == len(e["failed"])


def test_walk_prefilter_keeps_every_id_with_a_neighbour() -> None:
    """Ids exactly max_step apart, straddling every cell boundary, still form one run."""
    cfg = DetectorsConfig.from_dict({})
    step = cfg.enumeration.max_step
    t0 = datetime(2026, 11, 2, tzinfo=UTC)
    for start in range(0, 4 * (step + 1)):
        ids = [start + k * step for k in range(8)]
        raw = pl.DataFrame({
            "ts": [t0 + timedelta(seconds=k) for k in range(len(ids))],
            "session_id": ["s-1"] * len(ids),
            "resource_id": [f"doc-{n}" for n in ids],
            "status": ["ok"] * len(ids),
        })
        ev = prepare_events(raw, cfg)
        res = resource_features(ev, ["sh"], cfg, ev["resource_id"])
        assert res["seq_run"].to_list() == [len(ids)], start
        assert res["seq_step"].to_list() == [step], start
