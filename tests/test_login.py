"""Dashboard login back-off: never refuses the right password; keyed per client address.

Issue 28 item 10: the back-off refused even the right password, and behind a proxy every
client shared one key, so anyone could lock the analysts out.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from toolwatch.dashboard.launch import LoginThrottle, client_address

APP = Path(__file__).resolve().parent.parent / "dashboard" / "app.py"


class _Clock:
    """A clock that only moves when the throttle sleeps (no real waiting in tests)."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s


def _throttle(clock: _Clock, **kw: float) -> LoginThrottle:
    return LoginThrottle(clock=clock, sleep=clock.sleep, **kw)  # type: ignore[arg-type]


def test_right_password_gets_in_during_a_backoff() -> None:
    clock = _Clock()
    th = _throttle(clock, base_s=300, max_s=3600, max_delay_s=5)
    for _ in range(6):  # an attacker fails on purpose from the analysts' address
        good, _ = th.attempt("10.0.0.7", lambda: False)
        assert not good
    assert th.wait_s("10.0.0.7") > 0
    good, held = th.attempt("10.0.0.7", lambda: True)
    assert good  # held at most max_delay_s, never refused
    assert 0 < held <= 5
    assert th.wait_s("10.0.0.7") == 0 or th._by_addr.get("10.0.0.7") is None


def test_wrong_passwords_are_delayed_and_the_delay_grows() -> None:
    clock = _Clock()
    th = _throttle(clock, base_s=1, max_s=60, max_delay_s=60, process_burst=100)
    for _ in range(5):
        assert th.attempt("a", lambda: False)[0] is False
    # One free typo, then 1, 2, 4 s before each next check.
    assert clock.slept == [1, 2, 4]
    assert th.wait_s("b") == 0  # another address is not delayed by a's failures


def test_exhausted_process_bucket_delays_but_never_refuses() -> None:
    clock = _Clock()
    th = _throttle(clock, base_s=1, max_s=60, process_burst=3, process_per_min=6)
    for addr in ("x", "y", "z"):  # rotating addresses empty the process bucket
        th.attempt(addr, lambda: False)
    assert th.wait_s("analyst") > 0
    good, held = th.attempt("analyst", lambda: True)
    assert good and held > 0


def test_attempts_from_one_address_are_checked_one_at_a_time() -> None:
    th = LoginThrottle(base_s=0.05, max_s=0.05, max_delay_s=0.05, free_failures=0)
    inside = 0
    peak = 0
    lock = threading.Lock()

    def check() -> bool:
        nonlocal inside, peak
        with lock:
            inside += 1
            peak = max(peak, inside)
        threading.Event().wait(0.02)
        with lock:
            inside -= 1
        return False

    ts = [threading.Thread(target=th.attempt, args=("1.2.3.4", check)) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert peak == 1


def test_client_address_trusts_the_header_only_when_configured() -> None:
    hdr = {"X-Forwarded-For": "6.6.6.6, 203.0.113.9", "Host": "x"}
    # Not configured: the header is ignored (a client could forge it).
    assert client_address("10.0.0.1", hdr, "") == "10.0.0.1"
    # Configured: the last entry (the one the proxy appended), any header case.
    assert client_address("10.0.0.1", hdr, "x-forwarded-for") == "203.0.113.9"
    assert client_address(None, {"x-real-ip": "2001:db8::1"}, "X-Real-IP") == "2001:db8::1"
    # Missing or garbage header: the peer address.
    assert client_address("10.0.0.1", {"Host": "x"}, "X-Forwarded-For") == "10.0.0.1"
    assert client_address("10.0.0.1", {"X-Forwarded-For": "<script>"}, "X-Forwarded-For") == (
        "10.0.0.1"
    )


def test_clients_behind_a_proxy_get_separate_backoffs() -> None:
    clock = _Clock()
    th = _throttle(clock, base_s=300, max_s=3600, process_burst=100)
    attacker = client_address("127.0.0.1", {"X-Forwarded-For": "198.51.100.5"}, "X-Forwarded-For")
    analyst = client_address("127.0.0.1", {"X-Forwarded-For": "192.0.2.10"}, "X-Forwarded-For")
    for _ in range(5):
        th.attempt(attacker, lambda: False)
    assert th.wait_s(attacker) > 0
    assert th.wait_s(analyst) == 0  # same proxy peer, different key
    good, held = th.attempt(analyst, lambda: True)
    assert good and held == 0


@pytest.mark.slow  # starts a process
def test_dashboard_lets_the_right_password_in_after_wrong_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from streamlit.testing.v1 import AppTest
    from toolwatch.dashboard import launch

    clock = _Clock()
    monkeypatch.setenv("TOOLWATCH_DASHBOARD_PASSWORD", "correct horse")
    monkeypatch.setattr(launch, "LOGIN_THROTTLE", _throttle(clock, base_s=300, max_delay_s=3))

    def attempt(pw: str) -> AppTest:
        at = AppTest.from_file(str(APP), default_timeout=120)  # a new browser session
        at.session_state["toolwatch_data_dir"] = str(tmp_path / "store")
        at.run()
        at.text_input[0].input(pw)
        at.button[0].click().run()
        return at

    for guess in ("guess-1", "guess-2", "guess-3"):
        at = attempt(guess)
        assert [e.value for e in at.error] == ["Wrong password."]
        assert "_authed" not in at.session_state
    right = attempt("correct horse")
    assert right.session_state["_authed"] is True
    assert not right.error
    assert clock.slept and max(clock.slept) <= 3  # held, not refused
