"""Red team round 2: the dashboard's pickers show logged strings with their tricks visible.

A caller id, server, tool or session id may carry a bidi override (``\\u202e`` shows
what follows reversed: ``\\u202emallory`` reads ``yrollam``), isolates, zero-width
characters, a BOM, tag characters or terminal escapes: the selectbox / multiselect
options (flagged list filters, entity picker, alert and session pickers) showed them raw,
so one option could pose as another. Options are now shown through
:func:`toolwatch.dashboard.ui.option_text` (escapes) while their values stay the logged
strings, so picking one still filters on the exact value.

A real store: ``toolwatch analyze`` over a generated hostile log (a credential-stuffing
and an enumeration session by the hostile caller), then Streamlit's AppTest.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from tests.conftest import TOOLWATCH
from toolwatch.output import is_unsafe_char, safe_text

pytestmark = pytest.mark.slow  # runs the app (AppTest)

APP = Path(__file__).resolve().parent.parent / "dashboard" / "app.py"
TIMEOUT = 120
#: one of each trick: bidi override and isolates, zero-width space and joiner, BOM,
#: ESC (a CSI sequence), BEL, line separator, a tag character
CALLER = "\u202emallory\u200b\x1b[31m\u2028x"
SERVER = "docs\u2066srv\u2069\ufeff"
SESSION_A = "s\u202ea\x07"
SESSION_B = "s\u200db\U000e0041"
TOOL = "log\u200bin\u202e"


@pytest.fixture(scope="module")
def hostile_store(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("dash-hostile")
    lines = []
    for i in range(60):  # credential stuffing: 60 distinct passwords failing
        lines.append({"ts": f"2026-11-02T10:00:{i:02d}Z", "session_id": SESSION_A,
                      "caller_id": CALLER, "client_ip": "203.0.113.9", "server": SERVER,
                      "tool": TOOL, "args": {"username": f"u{i}", "password": f"pw{i}"},
                      "status": "auth_failed"})
    for i in range(300):  # enumeration: walking document ids, half not found
        lines.append({"ts": f"2026-11-02T11:{i // 60:02d}:{i % 60:02d}Z",
                      "session_id": SESSION_B, "caller_id": CALLER, "client_ip": "203.0.113.9",
                      "server": SERVER, "tool": "getDocument",
                      "args": {"documentId": f"doc-{1000 + i}"},
                      "status": "not_found" if i % 2 else "ok"})
    src = root / "hostile.jsonl"
    src.write_text("".join(json.dumps(x) + "\n" for x in lines))
    env = dict(os.environ, XDG_CONFIG_HOME=str(root / "cfg"), TOOLWATCH_HMAC_KEY="ab" * 32)
    res = subprocess.run(
        [TOOLWATCH, "analyze", str(src), "-d", str(root / "st"), "--alerts-out",
         str(root / "alerts.jsonl")],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert len((root / "alerts.jsonl").read_text().splitlines()) >= 2
    return root / "st"


def _open(store: Path, page: str, **query) -> AppTest:
    at = AppTest.from_file(str(APP), default_timeout=TIMEOUT)
    at.session_state["toolwatch_data_dir"] = str(store)
    at.context["timezone"] = "UTC"
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    at.query_params.update(query)
    at.switch_page(f"views/{page}.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _pickers(at: AppTest) -> dict[str, list[str]]:
    return {w.key: [str(o) for o in w.options] for w in [*at.selectbox, *at.multiselect]}


def _assert_shown_safely(options: dict[str, list[str]]) -> None:
    for key, opts in options.items():
        for o in opts:
            bad = [hex(ord(c)) for c in o if is_unsafe_char(c)]
            assert not bad, (key, ascii(o), bad)


def test_flagged_filters_show_escapes_and_still_filter(hostile_store: Path) -> None:
    at = _open(hostile_store, "flagged")
    opts = _pickers(at)
    _assert_shown_safely(opts)
    assert safe_text(CALLER) in opts["fl_caller"]
    assert safe_text(SERVER) in opts["fl_server"]
    # the option's value is the logged string: picking it filters on the exact caller
    at.selectbox(key="fl_caller").set_value(CALLER).run()
    assert not at.exception, [e.value for e in at.exception]
    at.multiselect(key="fl_server").set_value([SERVER]).run()
    assert not at.exception, [e.value for e in at.exception]
    shown = [d.value for d in at.dataframe if "category" in d.value.columns]
    assert shown and len(shown[0]) >= 2, shown


def test_entity_picker_and_heading_show_escapes(hostile_store: Path) -> None:
    at = _open(hostile_store, "entity")
    opts = _pickers(at)
    _assert_shown_safely(opts)
    assert opts["en_id_caller_id"] == [safe_text(CALLER)]
    at.selectbox(key="en_id_caller_id").set_value(CALLER).run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.query_params["id"] == CALLER  # the URL keeps the exact id
    heading = [t.value for t in at.text if t.value.startswith("Caller:")]
    assert heading == [f"Caller: {safe_text(CALLER)}"], heading


def test_session_pickers_show_escapes(hostile_store: Path) -> None:
    at = _open(hostile_store, "session")
    opts = _pickers(at)
    _assert_shown_safely(opts)
    labels = opts["sd_pick_alert"]
    assert any(safe_text(SESSION_A) in lab for lab in labels), labels
    # open each alert: its ids, entity, reasons and the session's caller/server are
    # shown escaped (st.text draws bidi overrides as they act)
    alerts = [json.loads(x) for x in
              (hostile_store.parent / "alerts.jsonl").read_text().splitlines()]
    for a in alerts:
        at = _open(hostile_store, "session", alert=a["alert_id"])
        _assert_shown_safely(_pickers(at))
        shown = "\n".join(t.value for t in at.text)
        assert f"Session id: {safe_text(a['session_id'])}" in shown, shown[:500]
        for t in at.text:
            bad = [hex(ord(c)) for c in t.value if is_unsafe_char(c) and c != "\n"]
            assert not bad, (ascii(t.value), bad)
