"""tool_loop and finished polls (issue 11): a poll that ends in a changed response followed by
the next step on the same business key is progress; a loop that never changes is not."""

from __future__ import annotations

from datetime import timedelta

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from toolwatch.detectors import DetectorsConfig

from tests.fixtures.traffic import T0, Traffic
from toolwatch import detectors

T = T0 + timedelta(hours=3)
OFF = {"tool_loop": {"finished_poll_quiet": False}}
NO_PROBE = {"tool_loop": {"probe_quiet": False}}


def _poll(tr: Traffic, sid: str, *, polls: int = 40, gaps: list[float] | None = None,
          end: str | None = "size", after: int = 0, follow: str | None = "download_result",
          job: str = "job_7f3k", caller: str = "analyst") -> None:
    """``polls`` identical get_job_status(job) calls; then the response changes (``end``:
    'size' = same outcome, bigger body; 'outcome' = another outcome; None = no change);
    ``after`` more polls returning the changed response; then ``follow`` on the same job."""
    at = T
    gaps = gaps or [5.0]

    def status(nbytes: int, outcome: str = "ok") -> None:
        tr.call(sid, at, "get_job_status", caller=caller, server="analytics",
                resource_key="jobId", resource_id=job, nbytes=nbytes, status=outcome)

    for k in range(polls):
        status(160)
        at += timedelta(seconds=gaps[k % len(gaps)])
    changed = {"size": (240, "ok"), "outcome": (160, "error"), None: (160, "ok")}[end]
    for _ in range(1 + after if end else after):
        status(*changed)
        at += timedelta(seconds=5)
    if follow:
        tr.call(sid, at, follow, caller=caller, server="analytics", resource_key="jobId",
                resource_id=job, nbytes=3_000_000)


def _loops(tr: Traffic, cfg: dict | None = None) -> set[str]:
    res = detectors.detect(tr.events(), tr.summaries(), DetectorsConfig.from_dict(cfg or {}),
                           detectors=["tool_loop_rules"])
    return set(res.alerts.filter(pl.col("category") == "tool_loop")["session_id"].to_list())


#: Gaps of an agent's own pace (its inference and tool latency vary): no poll's shape.
AGENT_GAPS = [3.0, 7.5, 4.2, 9.1, 5.5, 2.4]


def _mixed(gaps: list[float]) -> Traffic:
    tr = Traffic(seed=3)
    tr.background(days=2, users=20, per_day=2)
    _poll(tr, "finished", caller="a", gaps=gaps)
    _poll(tr, "finished-error", end="outcome", follow="get_job_logs", caller="b", gaps=gaps)
    _poll(tr, "never-changes", end=None, caller="c", gaps=gaps)
    _poll(tr, "loops-after-change", after=30, follow=None, caller="d", gaps=gaps)
    _poll(tr, "loops-after-change-then-next", after=30, caller="e", gaps=gaps)
    _poll(tr, "changed-no-next-step", follow=None, caller="f", gaps=gaps)
    _poll(tr, "next-step-other-key", caller="g", follow=None, gaps=gaps)
    tr.call("next-step-other-key", T + timedelta(hours=1), "download_result", caller="g",
            server="analytics", resource_key="jobId", resource_id="job_other")
    return tr


@pytest.fixture(scope="module")
def mixed() -> Traffic:
    return _mixed(AGENT_GAPS)


def test_finished_poll_is_quiet_and_loops_alert(mixed: Traffic) -> None:
    """At an agent's irregular pace a streak is a finished poll only when its response
    changes *and* the job's next step follows on the same key."""
    assert _loops(mixed) == {"never-changes", "loops-after-change",
                             "loops-after-change-then-next", "changed-no-next-step",
                             "next-step-other-key"}


def test_poll_shaped_streak_that_ends_is_quiet() -> None:
    """Gaps growing like a back-off: one end (a changed response, or the next step on the
    same key) is enough; polling on after the response changed is still a loop."""
    tr = _mixed([min(2.0 * 1.5 ** k, 30.0) for k in range(40)])
    assert _loops(tr) == {"loops-after-change", "loops-after-change-then-next"}


def test_read_on_a_fixed_timer_is_a_probe_but_a_write_loop_is_not() -> None:
    """A health check every 10 s (±0.3 s) is monitoring; the same timer on a write, or an
    agent's irregular pace on the read, is a loop."""
    tr = Traffic(seed=8)
    for k in range(30):
        jitter = 0.3 * ((k * 7) % 3 - 1)
        tr.call("probe", T + timedelta(seconds=10 * k + jitter), "get_health", caller="ci",
                server="ops", args={"service": "api", "env": "prod"}, nbytes=90)
        tr.call("writes", T + timedelta(seconds=10 * k + jitter), "add_comment", caller="w",
                server="tickets", args={"id": "T-1", "body": "same"}, nbytes=90)
        tr.call("agent", T + timedelta(seconds=sum(AGENT_GAPS[: k % 6]) + 40 * (k // 6)),
                "get_health", caller="ag", server="ops", args={"service": "api"}, nbytes=90)
    assert _loops(tr) == {"writes", "agent"}


def test_poll_that_never_ends_alerts(mixed: Traffic) -> None:
    """No changed response and no next step on the job: a loop, at any shape."""
    tr = Traffic(seed=4)
    _poll(tr, "stuck", end=None, follow=None, caller="h", gaps=AGENT_GAPS)
    _poll(tr, "stuck-backoff", end=None, follow=None, caller="i", polls=14,
          gaps=[2.0 * 1.5 ** k for k in range(14)])
    assert _loops(tr) == {"stuck", "stuck-backoff"}


def test_backoff_poll_then_download_is_quiet() -> None:
    """Start a report, poll its status with gaps growing x1.5 to a cap, then download it:
    the poll's responses never changed size, the next step on the job ends it."""
    tr = Traffic(seed=6)
    gaps = [min(2.0 * 1.5 ** k, 30.0) for k in range(15)]
    _poll(tr, "report", end=None, follow="download_report", caller="j", polls=15, gaps=gaps)
    # The same shape at a machine pace (a stuck agent) is a loop.
    _poll(tr, "fast", end=None, follow="download_report", caller="k", polls=15,
          gaps=[0.05])
    assert _loops(tr) == {"fast"}


def test_switch_off_restores_the_longest_streak_rule(mixed: Traffic) -> None:
    assert _loops(mixed, OFF) == {"finished", "finished-error", "never-changes",
                                  "loops-after-change", "loops-after-change-then-next",
                                  "changed-no-next-step", "next-step-other-key"}


def test_second_loop_after_a_finished_poll_alerts() -> None:
    """A finished poll, then the same job polled 40 more times without change: a loop."""
    tr = Traffic(seed=5)
    _poll(tr, "s")
    for k in range(40):
        tr.call("s", T + timedelta(hours=1, seconds=3 * k), "get_job_status", caller="analyst",
                server="analytics", resource_key="jobId", resource_id="job_7f3k", nbytes=240)
    assert _loops(tr) == {"s"}


@settings(max_examples=25, deadline=None)
@given(polls=st.integers(12, 80),
       gaps=st.lists(st.floats(0.5, 30.0), min_size=1, max_size=6),
       end=st.sampled_from(["size", "outcome"]))
def test_finished_poll_any_pace_is_quiet(polls: int, gaps: list[float], end: str) -> None:
    """Fixed interval, model pace or back-off, 12-80 polls: quiet once it finishes; the same
    poll that never finishes alerts."""
    tr = Traffic(seed=7)
    _poll(tr, "done", polls=polls, gaps=gaps, end=end, caller="a")
    _poll(tr, "stuck", polls=polls + 1, gaps=gaps, end=None, caller="b", job="job_2",
          follow=None)
    # (A read on a fixed timer is a probe, whatever else: that rule is tested apart.)
    assert _loops(tr, NO_PROBE) == {"stuck"}


_CALL = st.tuples(st.sampled_from(["get_job_status", "list_jobs"]),
                  st.sampled_from(["job_a", "job_b"]), st.sampled_from([160, 240]),
                  st.sampled_from(["ok", "ok", "error"]))


@settings(max_examples=25, deadline=None)
@given(prefix=st.lists(_CALL, max_size=10), reps=st.integers(0, 40), tail=st.lists(_CALL,
                                                                                    max_size=10))
def test_switch_only_ever_removes_alerts(prefix: list, reps: int, tail: list) -> None:
    """On arbitrary sessions the finished-poll rule only quiets streaks, never adds one, and a
    session whose repeated calls never change result and never reach a next step (another
    tool on the same key) alerts exactly as without the rule."""
    tr = Traffic(seed=11)
    calls = [*prefix, *[("get_job_status", "job_a", 160, "ok")] * reps, *tail]
    for k, (tool, job, nbytes, outcome) in enumerate(calls):
        tr.call("s", T + timedelta(seconds=4 * k), tool, caller="c", server="analytics",
                resource_key="jobId", resource_id=job, nbytes=nbytes, status=outcome)
    if not calls:
        return
    on, off = _loops(tr), _loops(tr, OFF)
    assert on <= off
    result: dict[tuple[str, str], tuple[int, str]] = {}
    steady = True
    for tool, job, nbytes, outcome in calls:
        steady &= result.setdefault((tool, job), (nbytes, outcome)) == (nbytes, outcome)
    tools_per_job: dict[str, set[str]] = {}
    for tool, job, _, _ in calls:
        tools_per_job.setdefault(job, set()).add(tool)
    if steady and all(len(t) == 1 for t in tools_per_job.values()):
        assert on == off


# ----------------------------------------------------------- re-reading one's own files
REREAD_OFF = {"tool_loop": {"reread_quiet": False}}


def _cycle(tr: Traffic, sid: str, *, reps: int, gap_s: float | list[float],
           sizes: str, caller: str, n_files: int = 3, server: str = "drive") -> None:
    """``reps`` reads cycling over ``n_files`` files (plus their first reads); ``sizes``:
    'changing' (each read returns a new size: the file was edited), 'same'."""
    gaps = gap_s if isinstance(gap_s, list) else [gap_s]
    at = T
    for k in range(reps + n_files):
        f = k % n_files
        nbytes = 20_000 + 997 * k if sizes == "changing" else 20_000 + f
        tr.call(sid, at, "read_file", caller=caller, server=server, resource_key="fileId",
                resource_id=f"file-{caller}-{f}", nbytes=nbytes)
        at += timedelta(seconds=gaps[k % len(gaps)])


@pytest.fixture(scope="module")
def rereads() -> Traffic:
    tr = Traffic(seed=13)
    tr.background(days=2, users=20, per_day=2)
    # The power-day false positive (seed 9202): 3 own files re-read 13 times over 91
    # minutes at irregular human gaps, each read returning the edited file.
    _cycle(tr, "review", reps=13, gap_s=[78, 153, 1, 1330, 875, 300, 45, 600, 90, 240],
           sizes="changing", caller="nora")
    # Hard negatives of the rule (they must still alert):
    _cycle(tr, "fast-changing", reps=40, gap_s=5, sizes="changing", caller="a")  # model pace
    _cycle(tr, "slow-same", reps=20, gap_s=300, sizes="same", caller="b")  # nothing changes
    _cycle(tr, "fast-same", reps=40, gap_s=2, sizes="same", caller="c")  # the generator's loop
    return tr


def test_human_paced_review_of_changing_files_is_quiet(rereads: Traffic) -> None:
    assert _loops(rereads) == {"fast-changing", "slow-same", "fast-same"}


def test_reread_switch_off_flags_the_review_again(rereads: Traffic) -> None:
    assert _loops(rereads, REREAD_OFF) == {"review", "fast-changing", "slow-same", "fast-same"}


@settings(max_examples=25, deadline=None)
@given(reps=st.integers(12, 120), gap=st.floats(0.5, 59.0),
       sizes=st.sampled_from(["changing", "same"]), n_files=st.integers(1, 4))
def test_model_paced_loops_alert_whatever_their_responses(reps: int, gap: float, sizes: str,
                                                          n_files: int) -> None:
    """Any loop at under a minute per call at a model's varying pace (changing responses or
    not) still alerts, so the generator's loops (2-15 s) cannot hide behind the re-read
    rule. (A fixed timer is the scheduled-probe rule's, tested above.)"""
    tr = Traffic(seed=17)
    paced = [gap * f for f in (0.6, 1.3, 0.9, 1.5, 0.7)]
    _cycle(tr, "loop", reps=reps, gap_s=paced, sizes=sizes, caller="x", n_files=n_files)
    assert _loops(tr) == {"loop"}


# ------------------------------------- a cycle through tools; a probe on a timer all day
def test_search_summarize_cycle_at_human_pace_is_a_loop() -> None:
    """Seed 003's circular chain (search_tickets -> summarize_ticket -> search_tickets ...)
    with responses of varying size, a minute or more apart: a chain coming round, not a
    person re-reading their files with one tool (the re-read rule keeps that quiet)."""
    tr = Traffic(seed=21)
    tr.background(days=2, users=20, per_day=2)
    gaps = [70.0, 95.0, 62.0, 140.0, 81.0, 118.0, 66.0]
    at = T
    for k in range(60):
        tool, args = (("search_tickets", {"query": "renewal"}) if k % 2 == 0
                      else ("summarize_ticket", {"id": "TCK-1"}))
        tr.call("slow-cycle", at, tool, caller="agent-t", server="helpdesk", args=args,
                nbytes=900 + 613 * k % 2_000)
        at += timedelta(seconds=gaps[k % len(gaps)])
    _cycle(tr, "review", reps=13, gap_s=[78, 153, 1, 1330, 875, 300, 45, 600, 90, 240],
           sizes="changing", caller="nora")
    assert _loops(tr) == {"slow-cycle"}


def test_probe_on_a_timer_all_day_is_quiet_but_a_machine_paced_loop_is_not() -> None:
    """A health check polls one status on a fixed timer all day: hundreds of repeats, no
    end, at a rate its schedule bounds. Its length is no evidence; the same call repeated
    at a stuck agent's varying pace still is a loop."""
    tr = Traffic(seed=23)
    tr.background(days=2, users=20, per_day=2)
    at = T
    for _ in range(700):
        tr.call("probe-day", at, "getStatus", caller="ci-bot", server="ci",
                args={"target": "api"}, nbytes=120)
        at += timedelta(seconds=30.0 + (0.2 if _ % 2 else -0.2))
    at = T
    for k in range(120):
        tr.call("stuck", at, "getStatus", caller="agent-z", server="ci",
                args={"target": "api"}, nbytes=120)
        at += timedelta(seconds=AGENT_GAPS[k % len(AGENT_GAPS)])
    assert _loops(tr) == {"stuck"}
    assert _loops(tr, NO_PROBE) == {"probe-day", "stuck"}


def test_a_document_reread_on_a_steady_clock_is_a_loop_not_a_probe() -> None:
    """A probe is a status check: the same ~15 s clock on getDocument of one document
    (the demo's stuck agent, 140 repeats) is a loop; on getStatus it is a health bot."""
    tr = Traffic(seed=29)
    tr.background(days=2, users=20, per_day=2)
    at = T
    for k in range(140):
        tr.call("reread", at, "getDocument", caller="agent-r", server="docs",
                args={"documentId": "doc-1475"}, nbytes=1493)
        tr.call("health", at + timedelta(seconds=3), "getStatus", caller="ci-bot-2",
                server="ci", args={"target": "api"}, nbytes=120)
        at += timedelta(seconds=15.0 + (0.8 if k % 3 else -0.9))
    assert _loops(tr) == {"reread"}
