"""The dashboard's Forensics page, headless (Streamlit AppTest), against runaway queries
(issue 28 §4 acceptance): ``len(range(2.5e8))`` is refused in a child while the dashboard
process stays far under 1.5 GB, and an uninterruptible query is killed at the timeout.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from tests.fixtures.dashboard_store import build_store

pytestmark = pytest.mark.slow  # runs the app (AppTest)

APP = Path(__file__).resolve().parent.parent / "dashboard" / "app.py"


def _kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(field)


@pytest.fixture(scope="module")
def forensics(tmp_path_factory: pytest.TempPathFactory) -> AppTest:
    root = tmp_path_factory.mktemp("dash-query")
    build_store(root)
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.session_state["toolwatch_data_dir"] = str(root)
    at.run()
    at.switch_page("views/forensics.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _run(at: AppTest, sql: str) -> str:
    """Run ``sql`` on the page; the texts and errors shown (Markdown escapes removed)."""
    at.text_area(key="fx_sql").set_value(sql).run()
    at.button(key="fx_run").click().run()
    assert not at.exception, [e.value for e in at.exception]
    shown = [t.value for t in at.text] + [e.value for e in at.error]
    return "\n".join(shown).replace("\\", "")


def test_forensics_page_survives_a_list_of_250m_values(forensics: AppTest):
    before = _kib("VmRSS")
    started = time.monotonic()
    shown = _run(forensics, "SELECT len(range(250000000)) AS n")
    elapsed = time.monotonic() - started
    hwm = _kib("VmHWM")
    print(f"\nForensics page, len(range(250000000)): {elapsed:.2f} s; dashboard process RSS "
          f"{before // 1024} -> {_kib('VmRSS') // 1024} MiB, VmHWM {hwm // 1024} MiB")
    assert "Query failed: query exceeded the 1,024 MiB memory cap" in shown, shown
    assert hwm < 1_500 * 1024
    # The page still answers the next query.
    shown = _run(forensics, "SELECT count(*) AS n FROM events")
    assert "1 row(s)" in shown and "Query failed" not in shown


def test_forensics_page_refusal_is_said_once(forensics: AppTest):
    shown = _run(forensics, "WITH pg_settings AS (SELECT * FROM pg_settings) "
                            "SELECT * FROM pg_settings")
    assert "Query refused: CTE name 'pg_settings'" in shown, shown
    assert "Query refused: query refused" not in shown
