"""Build ``notebooks/forensics.ipynb`` from the cells below (outputs stripped).

Edit the cells here, then run ``python notebooks/build_forensics.py``; commit both files.
CI executes the notebook (``tests/test_notebook.py``), so it cannot rot.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

CELLS: list[tuple[str, str]] = [
    (
        "md",
        """# Post-incident walkthrough: from an alert to the evidence

This notebook walks through a typical investigation with toolwatch's forensic store:

1. analyze the sample MCP logs (`sample_logs/demo/`) into a fresh store,
2. start from the **top alert**,
3. **pivot to the caller** (or the client address) behind it,
4. list **all of its sessions** and the **resources** it touched,
5. look at **what it did in the hour before** the alert, on a **timeline**,
6. **export the evidence** as CSV and JSON for the incident ticket.

Everything is DuckDB SQL over the store's read-only views (`events`, `sessions`,
`alerts`, `summaries`, `quarantine`) through `toolwatch.query.query`, with values passed
as bound parameters (`$name`), never pasted into the SQL — log strings are
attacker-controlled.

Environment overrides: `TOOLWATCH_NOTEBOOK_DATA_DIR` (use an existing store instead of
analyzing the sample logs), `TOOLWATCH_NOTEBOOK_OUT` (where the evidence goes). Relative
paths in them are taken from the repository root (where `make demo` puts
`.toolwatch/demo/store`), not from `notebooks/`, where the kernel runs.""",
    ),
    (
        "code",
        """import os
import tempfile
import warnings
from datetime import UTC, datetime
from pathlib import Path

import orjson
import plotly.express as px
import polars as pl

from toolwatch.config import Config
from toolwatch.query import query
from toolwatch.store import Store

warnings.filterwarnings("ignore", message="Arrow output on a DB-API result")
pl.Config.set_tbl_rows(20)
pl.Config.set_fmt_str_lengths(80)

# The repository root: the notebook runs from notebooks/ (or from the root).
ROOT = next(p for p in (Path.cwd(), *Path.cwd().parents) if (p / "sample_logs").is_dir())


def from_root(value: str) -> Path:
    \"\"\"A path from the environment; relative ones mean the repository root.

    The kernel's working directory is notebooks/, so `.toolwatch/demo/store` taken as is
    would name an empty new store there and silently analyze the sample logs into it.
    \"\"\"
    path = Path(value).expanduser()
    return path if path.is_absolute() else ROOT / path


_data = os.environ.get("TOOLWATCH_NOTEBOOK_DATA_DIR")
_out = os.environ.get("TOOLWATCH_NOTEBOOK_OUT")
DATA_DIR = from_root(_data) if _data else Path(tempfile.mkdtemp(prefix="tw-nb-"))
OUT_DIR = from_root(_out) if _out else DATA_DIR / "evidence"
OUT_DIR.mkdir(parents=True, exist_ok=True)
print("store:", DATA_DIR)
print("evidence to:", OUT_DIR)""",
    ),
    (
        "md",
        """## 1. Analyze the sample logs into the store

`analyze_paths` ingests the files (bad lines are quarantined, never fatal) and runs every
detector over them, writing alerts to the store. Skipped when the store already has alerts
(`TOOLWATCH_NOTEBOOK_DATA_DIR`).""",
    ),
    (
        "code",
        """store = Store(DATA_DIR)


def q(sql: str, **params) -> pl.DataFrame:
    \"\"\"One read-only query over the store's views; values bound as $name parameters.\"\"\"
    return pl.from_arrow(query(store, sql, params))


if q("SELECT count(*) AS n FROM alerts")["n"][0] == 0:
    from toolwatch.analyze import analyze_paths

    logs = sorted(
        str(p) for p in (ROOT / "sample_logs" / "demo").glob("*.jsonl*")
        if not p.name.startswith("labels")
    )
    cfg = Config()
    cfg.store.data_dir = str(DATA_DIR)
    result = analyze_paths(cfg, logs, progress=False)
    print(f"{len(logs)} files, {result.ingest.counters.as_dict()['events_stored']:,} events, "
          f"{result.alerts.height} alerts")

q(\"\"\"
SELECT (SELECT count(*) FROM events) AS events,
       (SELECT count(DISTINCT session_id) FROM events) AS sessions,
       (SELECT count(*) FROM alerts) AS alerts,
       (SELECT count(*) FROM quarantine) AS quarantined
\"\"\")""",
    ),
    ("md", "## 2. What was flagged"),
    (
        "code",
        """q(\"\"\"
SELECT category, severity, count(*) AS alerts, round(max(score), 3) AS max_score
FROM alerts GROUP BY category, severity
ORDER BY CASE severity WHEN 'critical' THEN 0 WHEN 'high' THEN 1 WHEN 'medium' THEN 2 ELSE 3 END,
         alerts DESC
\"\"\")""",
    ),
    (
        "md",
        """## 3. Start from the top alert

The most severe, highest-scoring alert — whatever its id is in this run.""",
    ),
    (
        "code",
        """top = q(\"\"\"
SELECT * FROM alerts
ORDER BY CASE severity WHEN 'critical' THEN 0 WHEN 'high' THEN 1 WHEN 'medium' THEN 2 ELSE 3 END,
         score DESC, alert_id
LIMIT 1
\"\"\")
assert top.height == 1, "no alerts in the store: are the detectors installed?"
alert = top.row(0, named=True)
for k in ("alert_id", "category", "severity", "score", "detector", "entity_type", "entity_id",
          "caller_id", "client_ip", "server", "first_seen", "last_seen"):
    print(f"{k:>12}: {alert[k]}")
print("reasons:")
for r in alert["reasons"] or []:
    print("  -", r)
evidence = orjson.loads(alert["evidence"]) if alert["evidence"] else {}
evidence""",
    ),
    (
        "md",
        """## 4. Pivot to the caller

Attribution goes through the caller id when the log has one, else through the client
address. Everything below is about that entity, across all of its sessions.""",
    ),
    (
        "code",
        """if alert["caller_id"]:
    PIVOT, WHO = "caller_id", alert["caller_id"]
elif alert["entity_type"] == "caller_id":
    PIVOT, WHO = "caller_id", alert["entity_id"]
else:
    PIVOT, WHO = "client_ip", alert["client_ip"] or alert["entity_id"]
# PIVOT is one of two fixed column names (never log data); WHO is bound as a parameter.
assert PIVOT in ("caller_id", "client_ip")
print(f"pivot: {PIVOT} = {WHO}")

q(f\"\"\"
SELECT count(*) AS calls, count(DISTINCT session_id) AS sessions,
       count(DISTINCT tool) AS tools, count(DISTINCT resource_id) AS resources,
       count(DISTINCT client_ip) AS addresses, count(DISTINCT caller_id) AS callers,
       min(ts) AS first_seen, max(ts) AS last_seen, sum(bytes)::BIGINT AS bytes
FROM events WHERE {PIVOT} = $who
\"\"\", who=WHO)""",
    ),
    ("md", "### All of its sessions"),
    (
        "code",
        """sessions = q(f\"\"\"
SELECT s.session_id, s.first_seen, s.last_seen, s.calls, s.distinct_tools,
       s.distinct_resources, s.total_bytes, s.errors, s.auth_failures, s.client_ip, s.server,
       (SELECT count(*) FROM alerts a WHERE a.session_id = s.session_id
          OR (a.entity_type = 'session' AND a.entity_id = s.session_id)) AS alerts
FROM sessions s
WHERE s.session_id IN (SELECT DISTINCT session_id FROM events WHERE {PIVOT} = $who)
ORDER BY s.first_seen
\"\"\", who=WHO)
sessions""",
    ),
    ("md", "### The resources it touched"),
    (
        "code",
        """resources = q(f\"\"\"
SELECT resource_id, count(*) AS calls, count(DISTINCT session_id) AS sessions,
       list(DISTINCT tool ORDER BY tool) AS tools,
       list(DISTINCT status ORDER BY status) AS outcomes,
       sum(bytes)::BIGINT AS bytes, min(ts) AS first_touch, max(ts) AS last_touch
FROM events WHERE {PIVOT} = $who AND resource_id IS NOT NULL
GROUP BY resource_id ORDER BY calls DESC, resource_id
\"\"\", who=WHO)
print(f"{resources.height} distinct resources")
resources.head(20)""",
    ),
    (
        "md",
        """### Who else touched the same resources?

A resource touched by this entity *and* by others can widen the incident (shared
credentials, a second agent).""",
    ),
    (
        "code",
        """q(f\"\"\"
WITH mine AS (SELECT DISTINCT resource_id FROM events
              WHERE {PIVOT} = $who AND resource_id IS NOT NULL)
SELECT e.caller_id, e.client_ip, count(*) AS calls, count(DISTINCT e.resource_id) AS shared
FROM events e JOIN mine USING (resource_id)
WHERE e.{PIVOT} IS DISTINCT FROM $who
GROUP BY ALL ORDER BY shared DESC, calls DESC LIMIT 20
\"\"\", who=WHO)""",
    ),
    (
        "md",
        """## 5. The hour before the alert, and the alert window

What exactly did it do leading up to the detection?""",
    ),
    (
        "code",
        """window = q(f\"\"\"
SELECT ts, session_id, tool, resource_id, status, bytes, client_ip, args
FROM events
WHERE {PIVOT} = $who
  AND ts BETWEEN $first_seen::TIMESTAMPTZ - INTERVAL 1 HOUR AND $last_seen::TIMESTAMPTZ
ORDER BY ts
\"\"\", who=WHO, first_seen=alert["first_seen"], last_seen=alert["last_seen"])
print(f"{window.height} calls from 1 h before the alert to its end")
window.group_by("tool", "status").len().sort("len", descending=True)""",
    ),
    (
        "md",
        "### Timeline\n\nEvery call of the entity, coloured by outcome; alert window shaded.",
    ),
    (
        "code",
        """timeline = q(f\"\"\"
SELECT ts, session_id, tool, status, resource_id, bytes FROM events
WHERE {PIVOT} = $who ORDER BY ts
\"\"\", who=WHO)
fig = px.scatter(
    timeline.to_pandas(), x="ts", y="tool", color="status", symbol="session_id"
    if timeline["session_id"].n_unique() <= 8 else None,
    hover_data=["session_id", "resource_id", "bytes"],
    title=f"{PIVOT} {WHO}: {timeline.height} calls",
)
fig.add_vrect(x0=alert["first_seen"], x1=alert["last_seen"], fillcolor="red", opacity=0.12,
              line_width=0, annotation_text="alert window")
fig.update_layout(height=420, showlegend=timeline["session_id"].n_unique() <= 8)
fig""",
    ),
    ("md", "## 6. Other alerts on this entity"),
    (
        "code",
        """related = q(f\"\"\"
SELECT alert_id, category, severity, score, entity_type, entity_id, session_id,
       first_seen, last_seen, reasons[1] AS first_reason
FROM alerts
WHERE {PIVOT} = $who OR (entity_type = $ptype AND entity_id = $who)
   OR session_id IN (SELECT DISTINCT session_id FROM events WHERE {PIVOT} = $who)
ORDER BY first_seen
\"\"\", who=WHO, ptype=PIVOT)
related""",
    ),
    (
        "md",
        """## 7. Export the evidence

CSV for spreadsheets, one JSON bundle for the ticket (the alert, the pivot, sessions,
resources, related alerts, the calls around the alert). Times are UTC, ISO 8601.""",
    ),
    (
        "code",
        """def nested_to_json(df: pl.DataFrame) -> pl.DataFrame:
    \"\"\"CSV cannot hold lists: write list columns as JSON text.\"\"\"
    return df.with_columns(
        pl.col(c).map_elements(lambda v: orjson.dumps(list(v)).decode(), return_dtype=pl.Utf8)
        for c, t in df.schema.items() if isinstance(t, pl.List)
    )


stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
files = {
    "sessions.csv": sessions,
    "resources.csv": resources,
    "calls_around_alert.csv": window,
    "related_alerts.csv": related,
}
for name, df in files.items():
    nested_to_json(df).write_csv(OUT_DIR / name)

bundle = {
    "generated_at": stamp,
    "store": str(DATA_DIR),
    "alert": {**alert, "evidence": evidence},
    "pivot": {"column": PIVOT, "value": WHO},
    "sessions": sessions.to_dicts(),
    "resources": resources.to_dicts(),
    "related_alerts": related.to_dicts(),
    "calls_around_alert": window.to_dicts(),
}
(OUT_DIR / "evidence.json").write_bytes(
    orjson.dumps(bundle, option=orjson.OPT_INDENT_2 | orjson.OPT_UTC_Z | orjson.OPT_NAIVE_UTC,
                 default=str)
)
for p in sorted(OUT_DIR.iterdir()):
    print(f"{p.name:>24}  {p.stat().st_size:>9,} bytes")""",
    ),
    (
        "md",
        """## 8. Record the verdict

The dashboard's triage store (`<data_dir>/_triage/triage.sqlite`) keeps who decided what
and when; the ingester never touches it. A notebook re-run must not page anyone: the
verdict below is written to a **temporary copy** of the store's triage directory, never
into the store this notebook was pointed at. Record the real verdict in the dashboard
(incident page) once a person has read the evidence.""",
    ),
    (
        "code",
        """import shutil

from toolwatch.dashboard.triage import TriageStore

draft = Path(tempfile.mkdtemp(prefix="tw-nb-triage-"))
if (DATA_DIR / "_triage").is_dir():
    shutil.copytree(DATA_DIR / "_triage", draft / "_triage")
triage = TriageStore(draft)  # a copy: the store's own _triage/ is left as it was
triage.mark(alert["alert_id"], "escalated", actor="forensics-notebook",
            note=f"draft: evidence exported to {OUT_DIR}")
print("draft verdict written to", draft / "_triage", "(not to", DATA_DIR, ")")
[(v.status, v.actor, v.at.isoformat(timespec="seconds"))
 for v in triage.history(alert["alert_id"])]""",
    ),
    (
        "md",
        """Next: open the same store in the dashboard — `toolwatch dashboard -d <store>` — to
review the session detail and the other flagged sessions.""",
    ),
]


def build() -> nbformat.NotebookNode:
    """The notebook, cells in order, no outputs."""
    nb = new_notebook()
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nb.metadata["language_info"] = {"name": "python"}
    for kind, src in CELLS:
        nb.cells.append(new_markdown_cell(src) if kind == "md" else new_code_cell(src))
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"cell-{i:02d}"
    return nb


if __name__ == "__main__":
    out = Path(__file__).with_name("forensics.ipynb")
    nbformat.write(build(), out)
    print(f"wrote {out}")
