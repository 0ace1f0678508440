"""Issue 28 item 2: a caller-scoped suppression silences only an authenticated caller.

An analyst's rule for caller ``svc-x`` must not hide an unauthenticated client that merely
claims the name ``svc-x`` (``caller_authenticated: false`` in its log lines), unless
``[triage] suppress_unauthenticated_callers = true``. Real logs, real store, real
detectors: batch ``analyze`` (single pass and partitioned, which reads the marking back
from the store) and the live ``tail`` loop.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

try:
    from tests.test_live_support import call_line, config_for, stored_alerts
except ImportError:  # tests/ itself on sys.path
    from test_live_support import call_line, config_for, stored_alerts  # type: ignore[no-redef]

from toolwatch.config import ConfigError, TriageConfig, from_dict
from toolwatch.live import StopFlag

pytestmark = pytest.mark.timeout(180)


def _log(path: Path, authenticated: bool | None) -> None:
    """``svc-x`` and ``bob`` enumerate document ids (mostly not found); benign sessions."""
    lines = []
    i = 0
    for caller in ("svc-x", "bob"):
        for k in range(60):
            line = orjson.loads(call_line(i, session=f"s-{caller}", caller=caller,
                                          ip="10.0.0.9", resource=f"{caller}-{k}",
                                          status="not_found", seconds=0.5))
            if caller == "svc-x" and authenticated is not None:
                line["caller_authenticated"] = authenticated
            lines.append(orjson.dumps(line) + b"\n")
            i += 1
    for s in range(12):
        for k in range(5):
            lines.append(call_line(i, session=f"benign-{s}", caller=f"user{s}",
                                   ip="10.1.0.1", resource=f"doc-{k}", seconds=0.5))
            i += 1
    path.write_bytes(b"".join(lines))


def _alerted(data: Path) -> set[str]:
    al = stored_alerts(data)
    return set(al["caller_id"].drop_nulls().to_list()) | set(
        al.filter(al["entity_type"] == "caller_id")["entity_id"].to_list())


def _run(tmp_path: Path, name: str, *, authenticated: bool | None, trust_claims: bool,
         mode: str) -> set[str]:
    from toolwatch.detectors.suppress import add_suppression

    data = tmp_path / name / "store"
    data.mkdir(parents=True)
    log = tmp_path / name / "calls.jsonl"
    _log(log, authenticated)
    cfg = config_for(data, detect=True, flush_interval_s=0.2)
    cfg.triage.suppress_unauthenticated_callers = trust_claims
    add_suppression(data, entity_type="caller_id", entity_id="svc-x", created_by="analyst",
                    note="our export job")
    if mode == "live":
        from toolwatch.live_cli import tail_files

        tail_files(cfg, [str(log)], stop=StopFlag(), idle_exit_s=1.0)
    else:
        from toolwatch.analyze import analyze_paths

        if mode == "partitioned":
            cfg.analyze.partitions = 2
        analyze_paths(cfg, [str(log)], progress=False)
    return _alerted(data)


@pytest.mark.slow  # three full detections per mode
@pytest.mark.parametrize("mode", ["batch", "partitioned", "live"])
def test_claimed_name_is_not_silenced(tmp_path: Path, mode: str) -> None:
    # The real svc-x (the log's writer vouched for it): the rule silences it.
    real = _run(tmp_path, "real", authenticated=True, trust_claims=False, mode=mode)
    assert "bob" in real  # the control: detection ran and alerts
    assert "svc-x" not in real
    # A client that only claims the name: its alert stays.
    claimed = _run(tmp_path, "claimed", authenticated=False, trust_claims=False, mode=mode)
    assert {"bob", "svc-x"} <= claimed
    # Configured to trust claimed names: silenced again.
    trusted = _run(tmp_path, "trusted", authenticated=False, trust_claims=True, mode=mode)
    assert "bob" in trusted and "svc-x" not in trusted


def test_log_that_says_nothing_is_silenced_as_before(tmp_path: Path) -> None:
    """Logs without the field (most servers' own logs) keep their caller suppressions."""
    found = _run(tmp_path, "silent", authenticated=None, trust_claims=False, mode="batch")
    assert "bob" in found and "svc-x" not in found


def test_config_key_is_checked() -> None:
    assert from_dict(TriageConfig, {"suppress_unauthenticated_callers": True},
                     prefix="triage").suppress_unauthenticated_callers is True
    with pytest.raises(ConfigError):
        from_dict(TriageConfig, {"suppress_unauthenticated": True}, prefix="triage")
    with pytest.raises(ConfigError):
        from_dict(TriageConfig, {"suppress_unauthenticated_callers": "yes"}, prefix="triage")
