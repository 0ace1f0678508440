"""Real-browser test: ``toolwatch dashboard`` in headless Debian Chromium via Playwright.

Starts the CLI on a fixture store, checks that the flagged sessions are listed, clicks
through to a session's detail, checks hostile log strings render as literal text and run
nothing, refreshes live, and saves screenshots to ``artifacts/`` (the session detail as
``artifacts/dashboard.png``, copied to ``docs/screenshot.png`` when
``TOOLWATCH_UPDATE_SCREENSHOT=1``).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from toolwatch.dashboard.testdata import XSS_ARG, XSS_CALLER, XSS_TOOL, build_store

CHROMIUM = "/usr/bin/chromium"
ROOT = Path(__file__).resolve().parent.parent
ARGS = [
    "--no-sandbox",  # CI runs as root
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
]

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    # In CI the project's setup installs Chromium: a missing browser must fail, not skip.
    pytest.mark.skipif(
        not Path(CHROMIUM).exists() and os.environ.get("CI") != "true",
        reason="needs Debian chromium at /usr/bin/chromium (apt-get install -y chromium)",
    ),
]
sync_api = pytest.importorskip("playwright.sync_api", reason="needs the playwright package")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("browser-store")
    info = build_store(data_dir)
    port = _free_port()
    log = open(tmp_path_factory.mktemp("browser-log") / "dashboard.log", "w+")  # noqa: SIM115
    env = {**os.environ, "TOOLWATCH_ANALYST": "browser-test"}
    env.pop("TOOLWATCH_DASHBOARD_PASSWORD", None)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "toolwatch.cli",
            "dashboard",
            "-d",
            str(data_dir),
            "--port",
            str(port),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=ROOT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            log.seek(0)
            os.killpg(proc.pid, signal.SIGKILL) if proc.poll() is None else None
            pytest.fail(f"dashboard did not start:\n{log.read()}")
        time.sleep(0.5)
    log.seek(0)
    assert f"{url}/" in log.read(), "toolwatch dashboard prints its URL"
    try:
        yield url, info
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser):
    ctx = browser.new_context(viewport={"width": 1440, "height": 1000}, timezone_id="Europe/Berlin")
    pg = ctx.new_page()
    pg.set_default_timeout(45_000)
    dialogs: list[str] = []
    pg.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    pg.dialogs = dialogs  # type: ignore[attr-defined]
    try:
        yield pg
    finally:
        ctx.close()


def _click_row(pg, table, row: int) -> None:
    """Click the row marker of a data row in a Streamlit (canvas) dataframe."""
    box = table.bounding_box()
    assert box is not None
    pg.mouse.click(box["x"] + 16, box["y"] + 35 + 35 * row + 17)


def test_flagged_list_and_click_through(server, page):
    url, info = server
    page.goto(f"{url}/flagged")
    page.get_by_text("6 alert(s). Click a row").wait_for()
    page.get_by_text("Times shown in Europe/Berlin.").wait_for()
    grid = page.locator('[data-testid="stDataFrame"]').first
    # the grid's accessible table carries the cell text
    for entity in (
        "session: sess-enum-1",
        f"client_ip: {info.stuffing_ip}",
        "caller_id: crawler-9",
    ):
        grid.locator("td", has_text=entity).first.wait_for(state="attached")
    page.wait_for_timeout(500)
    _click_row(page, grid, 1)  # the enumeration alert (second by severity)
    page.wait_for_url("**/session?**")
    page.get_by_text(f"Session id: {info.enum_session}").wait_for()
    page.get_by_text("Alert id: al-enum-0001").wait_for()
    assert "alert=al-enum-0001" in page.url
    # the known tool is named in the tools table and on the timeline's axis
    page.locator('[data-testid="stPlotlyChart"]').first.wait_for()
    page.get_by_text("Tools used").wait_for()
    page.locator("td", has_text=info.enum_tool).first.wait_for(state="attached")
    page.locator("svg text", has_text=info.enum_tool).first.wait_for(state="attached")
    page.wait_for_timeout(1500)  # let plots finish drawing
    out = ROOT / "artifacts"
    out.mkdir(exist_ok=True)
    page.set_viewport_size({"width": 1440, "height": 1500})
    page.wait_for_timeout(800)
    page.screenshot(path=str(out / "dashboard.png"))
    if os.environ.get("TOOLWATCH_UPDATE_SCREENSHOT") == "1":
        shutil.copy(out / "dashboard.png", ROOT / "docs" / "screenshot.png")
    # back to the list through the navigation: the clicked row must not navigate again
    page.locator('[data-testid="stSidebarNav"] a[href$="/flagged"]').click()
    page.wait_for_url("**/flagged")
    page.get_by_text("6 alert(s). Click a row").wait_for()
    page.wait_for_timeout(2500)
    assert page.url.endswith("/flagged")
    assert page.locator("h1").first.inner_text() == "Flagged sessions"
    assert not page.dialogs


def test_flagged_and_overview_screenshots(server, page):
    url, _ = server
    page.set_viewport_size({"width": 1440, "height": 900})
    page.goto(f"{url}/flagged")
    page.get_by_text("6 alert(s). Click a row").wait_for()
    page.wait_for_timeout(1500)
    out = ROOT / "artifacts"
    out.mkdir(exist_ok=True)
    page.screenshot(path=str(out / "dashboard-flagged.png"))
    page.goto(f"{url}/")
    page.get_by_text("Alerts over time").wait_for()
    page.locator('[data-testid="stMetric"]').first.wait_for()
    page.wait_for_timeout(1500)
    page.screenshot(path=str(out / "dashboard-overview.png"))


def test_hostile_log_strings_render_as_text(server, page):
    url, info = server
    page.add_init_script("window.__xss = undefined;")
    page.goto(f"{url}/session?alert=al-anom-0004")
    page.get_by_text(f"Session id: {info.xss_session}").wait_for()
    # literal text where the app prints it
    page.get_by_text(f"unusual tool {XSS_TOOL} called 5 times").wait_for()
    page.get_by_text(f"argument path={XSS_ARG} never seen before").wait_for()
    page.get_by_text(f"Caller: {XSS_CALLER}", exact=False).wait_for()
    page.locator('[data-testid="stPlotlyChart"]').nth(1).wait_for()
    page.wait_for_timeout(1500)
    # the tool name on the timeline axis is literal text, not markup
    page.locator("svg text", has_text=XSS_TOOL).first.wait_for(state="attached")
    # open a raw event: its log line shows as code text
    # the raw-events grid by its widget key (Streamlit puts st-key-<key> on the element;
    # the page now has more grids after it: call sequence, alerts on this session)
    raw = page.locator('[class*="st-key-sd_events"] [data-testid="stDataFrame"]').first
    raw.scroll_into_view_if_needed()
    page.wait_for_timeout(500)
    _click_row(page, raw, 0)
    page.locator('[data-testid="stCode"]').first.wait_for()
    assert XSS_ARG in page.locator('[data-testid="stCode"]').first.inner_text()
    page.wait_for_timeout(1000)
    assert page.evaluate("typeof window.__xss") == "undefined"
    assert page.evaluate("document.querySelectorAll('img[src=\"x\"]').length") == 0
    assert (
        page.evaluate("[...document.scripts].filter(s => s.textContent.includes('__xss')).length")
        == 0
    )
    assert not page.dialogs
    # the entity page for the hostile caller id too
    page.goto(f"{url}/entity?type=caller_id&id=mallory%3Cscript%3Ewindow.__xss%3D1%3C%2Fscript%3E")
    page.get_by_text(f"Caller: {XSS_CALLER}").wait_for()
    page.wait_for_timeout(1000)
    assert page.evaluate("typeof window.__xss") == "undefined"
    assert not page.dialogs


def test_live_refresh_shows_new_alerts_without_reload(server, page):
    """Runs last: adds an alert to the store while the flagged list is open."""
    import pyarrow as pa
    from toolwatch.dashboard.testdata import BASE

    from toolwatch import schema
    from toolwatch.store import Store

    url, info = server
    page.goto(f"{url}/flagged")
    page.get_by_text("6 alert(s). Click a row").wait_for()
    page.evaluate("window.__notReloaded = true")
    row = {
        "alert_id": "al-live-0007",
        "category": "enumeration",
        "detector": "rules.enumeration",
        "severity": "high",
        "score": 0.9,
        "entity_type": "session",
        "entity_id": "sess-live-1",
        "session_id": "sess-live-1",
        "caller_id": "late-agent",
        "client_ip": "203.0.113.99",
        "server": "crm-server",
        "first_seen": BASE,
        "last_seen": BASE,
        "detected_at": BASE,
        "reasons": ["written while the dashboard was open"],
        "evidence": "{}",
    }
    store = Store(info.data_dir)
    store.write_batch({"alerts": pa.Table.from_pylist([row], schema=schema.ALERTS)})
    store.close()
    # the fragment re-queries on its own (default every 10 s); no navigation, no reload
    page.get_by_text("7 alert(s). Click a row").wait_for(timeout=40_000)
    grid = page.locator('[data-testid="stDataFrame"]').first
    grid.locator("td", has_text="session: sess-live-1").first.wait_for(state="attached")
    assert page.evaluate("window.__notReloaded") is True
