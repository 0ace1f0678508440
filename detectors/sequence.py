"""Sequence abuse: what only shows in the *order* of calls and the state they move through.

Five detectors, each one category (``docs/detectors.md``):

* :class:`ToolLoopDetector` (**tool_loop**) — a streak of calls that each repeat an
  earlier call of the session exactly (same tool, same arguments, same outcome), made of
  at most ``max_cycle`` distinct calls: the same call, or A→B→A→B…, with no progress.
* :class:`PrivilegeChainDetector` (**privilege_chain**) — sensitive reads (credentials,
  system files, user/role tables, other tenants) followed, in the same session, by writes,
  grants or executions.
* :class:`StepSkipDetector` (**step_skip**) — an irreversible workflow step without a
  successful prerequisite for the same business key and caller (declared rules, and rules
  learned from history by ``toolwatch train``).
* :class:`DuplicateExecutionDetector` (**duplicate_execution**) — an irreversible call
  executed successfully twice or more for one business key, without an idempotency key or
  with a different one each time (a replay with the *same* key is safe).
* :class:`CrossServerFlowDetector` (**cross_server_flow**) — data read in bulk or from a
  sensitive place on one server, then an outbound call (upload, send, post …) on another.

Everything is columnar: events are annotated once per feature set (``detectors.tools``),
reduced to the few rows each class needs (repeating sessions, irreversible calls, outbound
calls …) and scored with window / shift expressions. Evidence carries the ordered calls
that make the chain (tool, server, time, business key, outcome) so an analyst sees it
without a query. Business and idempotency keys are compared as stored (hashed secrets
compare equal to themselves).

Live mode runs these detectors over the buffered events of the sessions and callers a
micro-batch touches, like every detector; their state (the learned workflows and the
prerequisites seen in history) is fitted once and bounded by the buffer horizon.
"""

from __future__ import annotations

import logging
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar, Self

import orjson
import polars as pl
from toolwatch.detectors.base import Detector, FeatureSet, session_frame
from toolwatch.detectors.baseline import Baseline, daily_habits, habits, habitual_gate
from toolwatch.detectors.bulk import tool_typicals
from toolwatch.detectors.config import _FREEZING, DetectorsConfig, WorkflowRule
from toolwatch.detectors.features import SEED, US_PER_DAY
from toolwatch.detectors.scoring import all_of, any_of, band
from toolwatch.detectors.text import clean, num, size
from toolwatch.detectors.tools import (
    IRREVERSIBLE_NOUNS,
    _extract,
    _words,
    annotated,
    first_words,
)

log = logging.getLogger("toolwatch.detectors")

#: Calls listed in an alert's chain evidence, at most.
CHAIN_MAX = 20

_CHAIN_STRUCT = pl.Struct({"t": pl.Int64, "server": pl.String, "tool": pl.String,
                           "bk": pl.String, "status": pl.String})
_CHAIN = pl.List(_CHAIN_STRUCT)

#: Outcomes of a call the server refused (an attempt that did not take effect).
REFUSED = ("error", "denied")

#: Nouns of a tool name that make an outbound call move money (duplicate_execution).
_MONEY_NOUNS = tuple(n for n in IRREVERSIBLE_NOUNS if n != "coupon")


def _moves_money() -> pl.Expr:
    """The tool's name holds a money noun (sendPayout, sendPayment, transferFunds)."""
    return pl.col("tool").str.to_lowercase().str.contains(
        "|".join(re.escape(n) for n in _MONEY_NOUNS)).fill_null(False)

#: File name of the learned workflow model, beside the forest in the models directory.
WORKFLOWS_FILE = "workflows.json"


def _iso_ms(us: int | None) -> str | None:
    if us is None:
        return None
    return datetime.fromtimestamp(us / 1e6, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def chain_evidence(chain: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """The ordered calls of a chain as evidence records (tool, server, time, key, outcome)."""
    out = []
    for c in chain or []:
        out.append(clean({"time": _iso_ms(c.get("t")), "server": c.get("server"),
                          "tool": c.get("tool"), "business_key": c.get("bk"),
                          "outcome": c.get("status")}))
    return out


def _chain_expr(limit: int = CHAIN_MAX) -> pl.Expr:
    return pl.struct(
        pl.col("t"), pl.col("server"), pl.col("tool"), pl.col("bk"),
        pl.col("status").fill_null("unknown"),
    ).sort_by("t").head(limit).alias("chain")


def _seq(features: FeatureSet) -> pl.DataFrame:
    """Annotated events in session order (stable on time), cached on the feature set."""
    cached = getattr(features, "_seq_events", None)
    if cached is not None:
        return cached
    ev = annotated(features)
    ev = ev.select(
        # No ``args`` (long strings, moved by the sort): step_skip fetches them by ``i`` for
        # the few rows whose declared rule names a key argument.
        "sh", "session_id", "t", "i", "caller_id", "ceh", "server", "tool", "status",
        "ok", "bytes", "rows", "ch", "tool_role", "mutates", "irreversible", "outbound",
        "sensitive", "data", "bk", "bkh", "idemh",
    ).with_columns(pl.coalesce(pl.col("ceh"), pl.col("sh")).alias("ck"))
    # Time order is all the detectors need (group-bys keep it within each session); the
    # one that needs sessions contiguous (tool_loop's streaks) sorts its few candidate
    # sessions itself. Sorting all events by session cost a fifth of these detectors' CPU.
    if not ev["t"].is_sorted():
        ev = ev.sort(["t", "i"])
    features._seq_events = ev  # type: ignore[attr-defined]
    return ev


def _frame(features: FeatureSet, found: pl.DataFrame, extra: list[str]) -> pl.DataFrame:
    """Session score rows: every session, the found ones scored (``_s``) with evidence."""
    # Projection and join in one in-memory query (the left order kept, as the eager join
    # did); the constant columns ride in session_frame's query.
    df = features.sessions.lazy().select(
        "sh", "session_id", "caller_id", "client_ip", "server", "first_t", "last_t",
    ).join(found.lazy(), on="sh", how="left", maintain_order="left").collect(engine="in-memory")
    return session_frame(df, pl.col("_s"), [
        *extra,
        pl.lit(None, pl.List(pl.String)).alias("session_ids"),
        pl.lit(1, pl.Int64).alias("n_sessions"),
    ])


def _empty_found(schema: dict[str, pl.DataType]) -> pl.DataFrame:
    return pl.DataFrame(schema={"sh": pl.UInt64, "_s": pl.Float64, **schema})


class _SequenceDetector(Detector):
    """Shared explain plumbing: reasons from ``_reasons``, chain evidence from ``chain``."""

    def _evidence(self, row: dict[str, Any], figures: dict[str, Any]) -> dict[str, Any]:
        ev = clean(figures)
        ev["chain"] = chain_evidence(row.get("chain"))
        top = (row.get("chain") or [{}])[-1].get("tool")
        if top:
            ev["top_tool"] = top  # suppression by tool looks here
        return ev


# --------------------------------------------------------------------------- tool_loop
class ToolLoopDetector(_SequenceDetector):
    """Repetition without progress: an agent stuck in (or driven into) a cycle."""

    name = "tool_loop_rules"
    category = "tool_loop"
    config_key = "tool_loop"
    summary = "A streak of exact repeats (same call, same outcome): A, or A→B→A→B…"

    _extra: ClassVar[list[str]] = ["streak", "cycle", "periodic", "loop_tool", "loop_span_s",
                                   "calls", "chain"]

    def fit(self, history: FeatureSet) -> Self:
        """Learn which callers loop habitually (a scheduled probe) and their usual streak."""
        cfg = self.config
        found = self._find(history)
        # Batch mode fits on the very sessions it then scores: keep the streaks for score().
        self._found_cache = (history.sessions, found)
        per = self._per_session(history.sessions, found)
        self.caller_baseline_ = Baseline(
            ["streak"], ["caller_id"], min_rows=cfg.baseline_min_sessions,
            min_days=cfg.baseline_min_days, min_mad=cfg.baseline_min_mad,
        ).fit(per)
        self.habit_ = habits(per, "_raw", ["caller_id"], min_rows=cfg.baseline_min_sessions,
                             min_days=cfg.baseline_min_days)
        self.fitted_ = True
        return self

    def _raw(self) -> pl.Expr:
        s = self.settings
        # A cycle of several calls must come round in the same order to be a loop; a few
        # calls taken up again in no fixed order (an analyst switching between three
        # queries) count only from streak_hi repeats.
        ordered = (pl.col("cycle") <= 1) | (pl.col("periodic").fill_null(1.0) >= s.periodic_lo)
        return pl.when(pl.col("cycle") > s.max_cycle).then(0.0).when(ordered).then(
            band(pl.col("streak"), s.streak_lo, s.streak_hi)).otherwise(
            band(pl.col("streak"), s.streak_hi, 2 * s.streak_hi))

    def _per_session(self, sessions: pl.DataFrame, found: pl.DataFrame) -> pl.DataFrame:
        """Every session's caller, start, streak (0 without one) and raw score."""
        return sessions.lazy().select("sh", "caller_id", "first_t").join(
            found.lazy().select("sh", "streak", "cycle", "periodic"), on="sh", how="left",
            maintain_order="left",
        ).with_columns(pl.col("streak").fill_null(0), pl.col("cycle").fill_null(0)).with_columns(
            self._raw().alias("_raw")).collect(engine="in-memory")

    def score(self, features: FeatureSet) -> pl.DataFrame:
        """One row per session; score from the longest repeating streak, unless the caller
        loops like this habitually and this streak is not far beyond its own."""
        if not self.is_fitted:
            self.fit(FeatureSet.empty(self.config))
        cached, self._found_cache = getattr(self, "_found_cache", None), None
        found = (cached[1] if cached is not None and cached[0] is features.sessions
                 else self._find(features))
        found = found.with_columns(self._raw().alias("_raw"))
        if self.habit_.height and found.height:
            callers = features.sessions.select("sh", "caller_id")
            found = self.caller_baseline_.with_own(found.join(callers, on="sh", how="left"))
            found = habitual_gate(found, self.habit_, ["caller_id"], self.threshold,
                                  pl.col("own_z_streak"), self.settings.self_z)
        else:
            found = found.with_columns(pl.lit(False).alias("habitual"),
                                       pl.lit(None, pl.Float64).alias("habit_score"),
                                       pl.lit(1.0).alias("p_own"))
        found = found.with_columns(all_of(pl.col("_raw"), pl.col("p_own")).alias("_s"))
        return _frame(features, found.select(
            "sh", "_s", *[c for c in self._extra if c in found.columns], "habitual",
            "habit_score"), [*self._extra, "habitual", "habit_score"])

    def _find(self, features: FeatureSet) -> pl.DataFrame:
        s = self.settings
        sess = features.sessions
        # Only sessions with enough exact repeats can hold a streak: most have none.
        cand = sess.lazy().filter(
            (pl.col("calls") - pl.col("distinct_calls")) >= s.streak_lo
        ).select("sh", "calls").collect(engine="in-memory")
        schema = {"streak": pl.Int64, "cycle": pl.Int64, "periodic": pl.Float64,
                  "loop_tool": pl.String, "loop_span_s": pl.Float64, "calls": pl.Int64,
                  "chain": _CHAIN}
        if cand.height == 0:
            return _empty_found(schema)
        # The columns used below only: the sort then moves 10 columns, not 21. One
        # in-memory query up to the streaks (the steps were ~7 eager queries, a fixed cost
        # of every pass); rows are sorted by (session, time, event), as before.
        ev = _seq(features).lazy().select(
            "sh", "t", "i", "ch", "status", "tool", "server", "bk", "bkh", "bytes", "tool_role",
        ).join(cand.lazy().select("sh"), on="sh", how="semi", maintain_order="left")
        if s.probe_quiet:  # whether each call is a status check (see _schedule)
            ev = ev.join(annotated(features).lazy().select("i", "args"), on="i", how="left",
                         maintain_order="left").with_columns(
                self._says_status(s.probe_words).alias("_st")).drop("args")
        ev = ev.sort(["sh", "t", "i"])
        key = pl.struct("ch", pl.col("status").fill_null("")).hash(SEED)
        ev = ev.with_columns(key.alias("_k"))
        rep = ~pl.col("_k").is_first_distinct().over("sh")
        # Per call: whether it repeats the call 2, 3 … 2 x max_cycle calls before it (a
        # cycle coming round in order; a period may hold a call twice: A→B→A→C).
        lags = range(2, 2 * s.max_cycle + 1)
        ev = ev.with_columns(rep.alias("_rep"), *[
            (pl.col("_k") == pl.col("_k").shift(n).over("sh")).fill_null(False)
            .alias(f"_lag{n}") for n in lags])
        brk = (~pl.col("_rep")) | (pl.col("sh") != pl.col("sh").shift(1)).fill_null(True)
        ev = ev.with_columns(brk.cum_sum().alias("_run"))
        poll = s.finished_poll_quiet
        if poll:
            ev = self._changes(ev)
        reread = s.reread_quiet
        if reread or poll:
            # A repeat is "new" when its call never returned this result (size, outcome)
            # before in the session: the thing read has changed since.
            ev = ev.with_columns(pl.struct(
                "sh", "ch", pl.col("bytes").fill_null(-1), pl.col("status").fill_null("")
            ).hash(SEED).is_first_distinct().alias("_new"))
        ev = ev.collect(engine="in-memory")
        streaks = (
            ev.lazy().filter(pl.col("_rep"))
            .group_by("sh", "_run")
            .agg(
                pl.len().alias("streak"),
                pl.col("_k").n_unique().alias("cycle"),
                *[pl.col(f"_lag{n}").mean().alias(f"_lag{n}") for n in lags],
                pl.col("tool").mode().sort().first().alias("loop_tool"),
                ((pl.col("t").max() - pl.col("t").min()) / 1e6).alias("loop_span_s"),
                _chain_expr(6),
                *(self._change_point() if poll else []),
                *([pl.col("_new").mean().alias("_new_share"),
                   (pl.col("t").diff().median() / 1e6).alias("_gap_s"),
                   pl.col("tool").n_unique().alias("_tools")] if reread else []),
                *(self._schedule() if s.probe_quiet else []),
            )
            .collect(engine="in-memory")
        )
        # The share of the streak's calls that repeat the call one period before them, at
        # the period that fits best (a single repeated call is periodic by definition).
        streaks = streaks.with_columns(
            pl.when(pl.col("cycle") <= 1).then(1.0)
            .otherwise(pl.max_horizontal([f"_lag{n}" for n in lags])).alias("periodic")
        ).drop([f"_lag{n}" for n in lags])
        if s.probe_quiet:
            # A read on a fixed timer (a health check, a monitor) is a scheduled probe: a
            # machine's clock paces it, where an agent stuck in a loop is paced by its own
            # inference and tool latency, which vary. A timer runs all day by design (no
            # end, hundreds of repeats) at a rate its schedule bounds, so its length is no
            # evidence: a probe is quiet at any length.
            probe = ((pl.col("cycle") == 1) & pl.col("_p_read")
                     & (pl.col("_p_med_s") >= s.probe_min_gap_s)
                     & (pl.col("_p_cv") <= s.probe_max_cv)).fill_null(False)
            streaks = streaks.filter(~probe).drop("_p_read", "_p_med_s", "_p_cv")
        if poll:
            streaks = self._drop_finished_polls(streaks, ev)
        if reread:
            # Re-reading one's own changing files at human pace is review, not a loop. The
            # review re-reads with one tool; a cycle through different tools (search ->
            # summarize -> search, each feeding the next: seed 003's circular chain) is a
            # chain coming round, a loop at any pace whatever its responses.
            quiet = ((pl.col("_gap_s") >= s.reread_gap_s)
                     & (pl.col("_new_share") >= s.reread_new_share)
                     & (pl.col("_tools") <= 1)).fill_null(False)
            streaks = streaks.filter(~quiet).drop("_new_share", "_gap_s", "_tools")
        # The longest streak of each session (ties: the earliest run; _run is unique), in
        # one in-memory query.
        streaks = (
            streaks.lazy().sort(["streak", "_run"], descending=[True, False])
            .group_by("sh", maintain_order=True)
            .first()
        )
        return streaks.join(cand.lazy().select("sh", "calls"), on="sh",
                            maintain_order="left").select(
            "sh", pl.lit(0.0).alias("_s"), *schema).collect(engine="in-memory")

    @staticmethod
    def _changes(ev: pl.LazyFrame) -> pl.LazyFrame:
        """Per event: ``_chg`` (the same call as an earlier one of the session returned a
        result, size or outcome, it never returned before in the session) and the next
        event's ``_chg`` / call / time / key / tool, for the streak that the next event ends.
        """
        # "A new result for a known call" is two first-distinct tests on integer keys; the
        # "differs from the previous result" variant needs a window shift per (session,
        # call), ~35 ms more per 1M events for no better answer on polls.
        call = pl.struct("sh", "ch").hash(SEED)
        res = pl.struct("sh", "ch", pl.col("bytes").fill_null(-1),
                        pl.col("status").fill_null("")).hash(SEED)
        chg = ~call.is_first_distinct() & res.is_first_distinct()
        ev = ev.with_columns(chg.alias("_chg"), res.alias("_rh"))
        # The same result as the call right before (a poll repeating its finished answer).
        ev = ev.with_columns((pl.col("_rh") == pl.col("_rh").shift(1)).fill_null(False)
                             .alias("_same_prev")).drop("_rh")
        same = (pl.col("sh").shift(-1) == pl.col("sh")).fill_null(False)
        return ev.with_columns(
            (same & pl.col("_chg").shift(-1).fill_null(False)).alias("_nx_chg"),
            pl.col("ch").shift(-1).alias("_nx_ch"),
            pl.col("t").shift(-1).alias("_nx_t"),
            pl.col("bkh").shift(-1).alias("_nx_bkh"),
            pl.col("tool").shift(-1).alias("_nx_tool"),
        )

    @staticmethod
    def _says_status(words: tuple[str, ...]) -> pl.Expr:
        """Whether a call is a status check: one of ``words`` in its tool name or arguments
        (``getStatus``, ``searchItems(query="health")``), camelCase split, lower-cased, as
        a whole word (or plural)."""
        alt = "|".join(re.escape(w.lower()) for w in words) or "(?!)"

        def says(col: str) -> pl.Expr:
            spaced = pl.col(col).str.replace_all(r"([a-z0-9])([A-Z])", "${1}_${2}")
            return spaced.str.to_lowercase().str.contains(
                rf"(?:^|[^a-z])(?:{alt})s?(?:[^a-z]|$)").fill_null(False)

        return says("tool") | says("args")

    @staticmethod
    def _schedule() -> list[pl.Expr]:
        """Aggregations of a streak for the scheduled-probe rule: a status check (read-only,
        ``_st``: see :meth:`_says_status`), the median gap and the gaps' coefficient of
        variation."""
        gaps = pl.col("t").diff().drop_nulls().cast(pl.Float64)
        return [
            (pl.col("tool_role").is_in(["read", "list_search"]) & pl.col("_st"))
            .all().alias("_p_read"),
            (gaps.median() / 1e6).alias("_p_med_s"),
            (gaps.std() / gaps.mean()).alias("_p_cv"),
        ]

    @staticmethod
    def _change_point() -> list[pl.Expr]:
        """Aggregations of a streak: whether it is a poll whose response changed at its end
        (``_fin``) and that change's time, business key and tool (``_c_t``, ``_c_bkh``,
        ``_c_tool``).

        The change is the last repeat itself (same outcome, another size) when no earlier
        repeat changed; or, when no repeat changed, the call right after the streak when it
        is one of the streak's calls with another outcome (a new outcome is not a repeat,
        so it ends the streak)."""
        n_chg = pl.col("_chg").sum()
        at_last = pl.col("_chg").last() & (n_chg == 1)
        after = (n_chg == 0) & pl.col("_nx_chg").last() & (
            pl.col("ch") == pl.col("_nx_ch").last()).any()
        gaps = pl.col("t").diff().drop_nulls().cast(pl.Float64)
        return [
            (at_last | after).alias("_fin"),
            # The poll's shape: gaps that (almost) never shrink — a back-off, or a fixed
            # interval — and their spread, for _drop_finished_polls.
            # Once the response has changed, repeats returning the very result of the call
            # before: polling on after the job finished. (A progress poll's sizes change,
            # and may recur, but do not stand still.)
            ((pl.col("_chg").cum_sum() > 0) & pl.col("_same_prev")).sum().cast(pl.Int64)
            .alias("_after_chg"),
            (gaps >= gaps.shift(1) * 0.9).drop_nulls().mean().alias("_g_nondec"),
            (gaps.std() / gaps.mean()).alias("_g_cv"),
            (gaps.median() / 1e6).alias("_g_med_s"),
            pl.col("t").last().alias("_l_t"),
            pl.col("bkh").first().alias("_l_bkh"),
            pl.col("tool").first().alias("_l_tool"),
            pl.when(at_last).then(pl.col("t").last()).otherwise(pl.col("_nx_t").last())
            .alias("_c_t"),
            pl.when(at_last).then(pl.col("bkh").last()).otherwise(pl.col("_nx_bkh").last())
            .alias("_c_bkh"),
            pl.when(at_last).then(pl.col("tool").last()).otherwise(pl.col("_nx_tool").last())
            .alias("_c_tool"),
        ]

    def _drop_finished_polls(self, streaks: pl.DataFrame, ev: pl.DataFrame) -> pl.DataFrame:
        """Streaks minus polls that ended: progress, not a loop.

        A poll *ends* in a response never seen before for its call (``_fin``) or in a call
        of another tool on the same business key after it (the job's result downloaded).
        Two ways a streak is such a poll:

        * it ends both ways (changed response, then the next step on that key), at any
          pace; or
        * it has a poll's shape and ends either way: a single call (cycle 1) whose gaps
          never shrink (a back-off growing to its cap: share ``poll_nondecreasing``) or
          stay near-constant (coefficient of variation ``poll_max_cv``), at least
          ``poll_min_gap_s`` apart, that does not stand still once its response changed
          (at most two repeats of the result right before).

        A loop that never ends, keeps repeating after its response changed, repeats at a
        machine pace or cycles through several calls still counts.
        """
        s = self.settings
        shape = (
            (pl.col("cycle") == 1)
            & (pl.col("_g_med_s") >= s.poll_min_gap_s)
            & ((pl.col("_g_nondec") >= s.poll_nondecreasing) | (pl.col("_g_cv") <= s.poll_max_cv))
            & (pl.col("_after_chg") <= 2)
        ).fill_null(False)
        cand = streaks.filter(pl.col("_fin") | shape).with_columns(shape.alias("_shape"))
        step = pl.DataFrame(schema={"sh": pl.UInt64, "_run": pl.UInt32})
        # The streak's own key (the _c_* columns describe the next call even when it is
        # no change of this one).
        keyed = cand.with_columns(pl.col("_l_bkh").alias("_k_bkh")).filter(
            pl.col("_k_bkh").is_not_null()).select("sh", "_run", "_l_t", "_k_bkh", "_l_tool")
        if keyed.height:
            nxt = ev.select("sh", pl.col("bkh").alias("_k_bkh"), pl.col("t").alias("_t2"),
                            pl.col("tool").alias("_tool2")).join(
                keyed.select("sh", "_k_bkh").unique(), on=["sh", "_k_bkh"], how="semi")
            step = keyed.join(nxt, on=["sh", "_k_bkh"]).filter(
                (pl.col("_t2") > pl.col("_l_t")) & (pl.col("_tool2") != pl.col("_l_tool"))
            ).select("sh", "_run").unique()
        cand = cand.join(step.with_columns(pl.lit(True).alias("_next")), on=["sh", "_run"],
                         how="left").with_columns(pl.col("_next").fill_null(False))
        done = cand.filter(
            (pl.col("_fin") & pl.col("_next"))
            | (pl.col("_shape") & (pl.col("_fin") | pl.col("_next")))
        ).select("sh", "_run")
        if done.height:
            streaks = streaks.join(done, on=["sh", "_run"], how="anti")
        return streaks.drop("_fin", "_c_t", "_c_bkh", "_c_tool", "_after_chg", "_g_nondec",
                            "_g_cv", "_g_med_s", "_l_t", "_l_bkh", "_l_tool")

    def explain(self, row: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
        """Reasons: the streak, its cycle and the tool."""
        cyc = row.get("cycle") or 1
        ordered = cyc == 1 or (row.get("periodic") or 0.0) >= self.settings.periodic_lo
        what = ("the same call" if cyc == 1 else f"a cycle of {cyc} calls" if ordered
                else f"{cyc} calls in no fixed order")
        reasons = [
            f"{num(row.get('streak'))} consecutive calls repeat {what} exactly (same tool, "
            f"arguments and outcome) over {num(row.get('loop_span_s'))} s, mostly "
            f"{row.get('loop_tool')}: no progress.",
            f"The session made {num(row.get('calls'))} calls in all; polling and retries "
            f"repeat a handful of times (alert from {self.settings.streak_lo}).",
        ]
        if row.get("habitual"):
            reasons.append("This caller loops habitually, but this streak is far beyond its "
                           "own usual one.")
        return reasons, self._evidence(row, {
            "repeating_streak": row.get("streak"), "cycle_length": cyc,
            "loop_tool": row.get("loop_tool"), "loop_span_s": row.get("loop_span_s"),
            "periodic_share": row.get("periodic"), "calls": row.get("calls")})


# --------------------------------------------------------------------- privilege_chain
class PrivilegeChainDetector(_SequenceDetector):
    """Read → sensitive read → write / grant / execute, within one session."""

    name = "privilege_chain_rules"
    category = "privilege_chain"
    config_key = "privilege_chain"
    summary = "Sensitive reads followed by writes, grants or executions in one session."

    _extra: ClassVar[list[str]] = ["sensitive_reads", "mutations_after", "admin_after",
                                   "sensitive_writes", "planted_execs", "approved_after",
                                   "limit_resets", "first_escalation", "chain"]

    def score(self, features: FeatureSet) -> pl.DataFrame:
        """One row per session."""
        s = self.settings
        found = self._with_limit_resets(features, self._find(features))
        found = found.join(self._approved(features, found), on="sh", how="left").with_columns(
            pl.col("approved_after").fill_null(0))
        sens = band(pl.col("sensitive_reads"), s.sensitive_reads_lo, s.sensitive_reads_hi)
        ok = ((pl.col("sensitive_reads") >= s.sensitive_reads_lo)
              & (pl.col("mutations_after") > 0)) | (pl.col("planted_execs") > 0)
        raw = pl.when(ok).then(any_of(
            sens,
            pl.when(pl.col("admin_after") > 0).then(0.9).otherwise(0.0),
            pl.when(pl.col("sensitive_writes") > 0).then(0.85).otherwise(0.0),
        )).otherwise(0.0)
        # Every escalating call names a change or approval record: a change window, kept
        # visible (it is still a privileged change) but scored as low, not as an attack.
        approved = (pl.col("approved_after") >= pl.col("mutations_after")) & ok
        found = found.with_columns(
            pl.when(approved).then(pl.min_horizontal(raw, pl.lit(s.approved_score)))
            .otherwise(raw).alias("_s"))
        found = found.with_columns(pl.max_horizontal(
            "_s", pl.when(pl.col("limit_resets") > 0).then(s.limit_reset_score).otherwise(0.0)))
        return _frame(features, found, self._extra)

    def _with_limit_resets(self, features: FeatureSet, found: pl.DataFrame) -> pl.DataFrame:
        """``limit_resets``: calls lifting a limit (reset a usage counter, raise a quota)
        made after the same session was refused for that limit (``rate_limited``).

        Seed 000: an administrative tool resets the usage counter, then the rate-limited
        tool runs again. An actor lifting a limit placed on itself is escalating its own
        privileges, whoever may call the tool."""
        s = self.settings
        if not s.limit_verbs or not s.limit_nouns:
            return found.with_columns(pl.lit(0, pl.Int64).alias("limit_resets"))
        low = pl.col("tool").fill_null("").str.to_lowercase()
        lifts = (low.str.contains_any([v.lower() for v in s.limit_verbs])
                 & low.str.contains_any([n.lower() for n in s.limit_nouns]))
        ev = _seq(features).lazy().select("sh", "t", "server", "tool", "bk", "status")
        limited = pl.col("status") == "rate_limited"
        t0 = pl.col("t").filter(limited).min().over("sh")
        after = (lifts & (pl.col("t") > t0)).fill_null(False)
        hit = (ev.filter(pl.col("status").eq("rate_limited").any().over("sh"))
               .with_columns(after.alias("_lift"))
               .filter(pl.col("_lift").any().over("sh")))
        rows = hit.group_by("sh").agg(
            pl.col("_lift").sum().cast(pl.Int64).alias("limit_resets"),
            pl.col("tool").filter(pl.col("_lift")).first().alias("_first_lift"),
            _chain_expr_filtered(limited | pl.col("_lift"), CHAIN_MAX).alias("_lchain"),
        ).collect(engine="in-memory")
        if rows.height == 0:
            return found.with_columns(pl.lit(0, pl.Int64).alias("limit_resets"))
        out = found.join(rows, on="sh", how="full", coalesce=True)
        return out.with_columns(
            pl.col("limit_resets").fill_null(0),
            pl.col("_s").fill_null(0.0),
            *[pl.col(c).fill_null(0) for c in ("sensitive_reads", "mutations_after",
                                               "admin_after", "sensitive_writes",
                                               "planted_execs")],
            pl.coalesce("first_escalation", "_first_lift").alias("first_escalation"),
            pl.coalesce("chain", "_lchain").alias("chain"),
        ).drop("_first_lift", "_lchain")

    def _approved(self, features: FeatureSet, found: pl.DataFrame) -> pl.DataFrame:
        """Per found session: mutating calls whose arguments name an approval record."""
        keys = self.settings.approval_args
        if not keys or found.height == 0:
            return pl.DataFrame(schema={"sh": pl.UInt64, "approved_after": pl.Int64})
        ev = annotated(features).lazy().join(found.lazy().select("sh"), on="sh", how="semi")
        named = pl.col("args").fill_null("").str.contains_any(
            [f'"{k}"' for k in keys], ascii_case_insensitive=True)
        return ev.filter(pl.col("mutates")).group_by("sh").agg(
            named.sum().cast(pl.Int64).alias("approved_after")).collect(engine="in-memory")

    def _find(self, features: FeatureSet) -> pl.DataFrame:
        schema = {"sensitive_reads": pl.Int64, "mutations_after": pl.Int64,
                  "admin_after": pl.Int64, "sensitive_writes": pl.Int64,
                  "planted_execs": pl.Int64, "first_escalation": pl.String,
                  "chain": _CHAIN}
        ev = _seq(features)
        sread = pl.col("sensitive") & pl.col("tool_role").is_in(["read", "list_search"])
        # A write that plants something sensitive (a path or content naming credentials,
        # system files, admin rights) starts a chain too when a later call executes or
        # grants: seed 003's read-enumerate-write, where what was read was ordinary.
        swrite = (pl.col("mutates") & pl.col("sensitive")
                  & (pl.col("tool_role") != "admin_exec"))
        hit = ev.filter(sread | pl.col("mutates"))
        # Sessions with a sensitive read (or planted write) and a later mutating call.
        first_sens = hit.filter(sread | swrite).group_by("sh").agg(
            pl.col("t").min().alias("_t0"))
        if first_sens.height == 0:
            return _empty_found(schema)
        hit = hit.join(first_sens, on="sh").filter(pl.col("t") >= pl.col("_t0"))
        after = pl.col("mutates") & (pl.col("t") >= pl.col("_t0"))
        first_mut = hit.filter(after).group_by("sh").agg(pl.col("t").min().alias("_t1"))
        hit = hit.join(first_mut, on="sh")
        if hit.height == 0:
            return _empty_found(schema)
        before = sread & (pl.col("t") <= pl.col("_t1"))
        chain_rows = hit.filter(before | pl.col("mutates"))
        return chain_rows.group_by("sh").agg(
            pl.lit(0.0).alias("_s"),
            pl.struct("bk", "tool").filter(before).n_unique().cast(pl.Int64)
            .alias("sensitive_reads"),
            pl.col("mutates").sum().cast(pl.Int64).alias("mutations_after"),
            (pl.col("tool_role") == "admin_exec").sum().cast(pl.Int64).alias("admin_after"),
            (pl.col("mutates") & pl.col("sensitive")).sum().cast(pl.Int64)
            .alias("sensitive_writes"),
            ((pl.col("tool_role") == "admin_exec")
             & (pl.col("t") > pl.col("t").filter(swrite).min())).sum().cast(pl.Int64)
            .alias("planted_execs"),
            pl.col("tool").filter(pl.col("mutates")).first().alias("first_escalation"),
            _chain_expr_filtered(before, 10).alias("_c1"),
            _chain_expr_filtered(pl.col("mutates"), 10).alias("_c2"),
        ).with_columns(pl.concat_list("_c1", "_c2").alias("chain")).drop("_c1", "_c2")

    def explain(self, row: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
        """Reasons: what sensitive places were read, then which escalation followed."""
        chain = row.get("chain") or []
        sens_tools = sorted({c["tool"] for c in chain if c.get("tool")} - {
            row.get("first_escalation")})
        reasons = [
            f"{num(row.get('sensitive_reads'))} sensitive read(s) ("
            f"{', '.join(sens_tools[:4]) or 'sensitive places'}) followed in the same session "
            f"by {num(row.get('mutations_after'))} write/grant/exec call(s), first "
            f"{row.get('first_escalation')}."
        ] if row.get("sensitive_reads") else []
        if row.get("admin_after"):
            reasons.append(f"{num(row['admin_after'])} of them execute or grant (admin_exec).")
        if row.get("sensitive_writes"):
            reasons.append(f"{num(row['sensitive_writes'])} of them write to a sensitive place.")
        if row.get("planted_execs") and not row.get("sensitive_reads"):
            reasons.insert(0, (
                f"A write naming a sensitive place or right ({row.get('first_escalation')}) "
                f"was followed in the same session by {num(row['planted_execs'])} execute or "
                f"grant call(s)."))
        if row.get("limit_resets"):
            reasons.append(
                f"After being refused for a rate limit or quota, the session called "
                f"{row.get('first_escalation')} {num(row['limit_resets'])} time(s) to lift "
                "that limit (seed 000: quota exhaustion by a different path).")
        if row.get("approved_after"):
            reasons.append(
                f"{num(row['approved_after'])} of them name a change or approval record "
                f"({', '.join(self.settings.approval_args[:2])} …): "
                + ("a change window, scored low; check the record exists."
                   if row["approved_after"] >= (row.get("mutations_after") or 0)
                   else "the others do not."))
        return reasons, self._evidence(row, {
            "sensitive_reads": row.get("sensitive_reads"),
            "mutations_after": row.get("mutations_after"),
            "admin_exec_after": row.get("admin_after"),
            "sensitive_writes": row.get("sensitive_writes"),
            "planted_execs": row.get("planted_execs"),
            "approved_after": row.get("approved_after"),
            "limit_resets": row.get("limit_resets"),
            "first_escalation": row.get("first_escalation")})


def _chain_expr_filtered(cond: pl.Expr, limit: int) -> pl.Expr:
    return pl.struct(
        pl.col("t"), pl.col("server"), pl.col("tool"), pl.col("bk"),
        pl.col("status").fill_null("unknown"),
    ).filter(cond).head(limit)


# --------------------------------------------------------------------------- step_skip
def _verbs(tools: pl.Series) -> pl.DataFrame:
    """First word of each distinct tool name (``fulfillOrder`` → ``fulfill``)."""
    # Columnar (first_words): a million distinct names were a million Python strings.
    names = tools.unique().drop_nulls().cast(pl.String).rename("tool")
    return pl.DataFrame([names, first_words(names).rename("verb")])


def _spec(spec: str) -> tuple[str | None, str | None]:
    """(verb, object) of a ``verb:<verb>`` or ``verb:<verb>:<object>`` workflow spec (a
    tool whose first word is the verb and whose name holds the object word: payExpense
    for ``verb:pay:expense``, not payOrder); (None, None) for a plain tool name."""
    if not spec.startswith("verb:"):
        return None, None
    verb, _, obj = spec[5:].lower().partition(":")
    return verb, obj or None


def _spec_hit(spec: str, name: str, verb: str) -> bool:
    v, obj = _spec(spec)
    if v is None:
        return name == spec
    return verb == v and (obj is None or obj in name.lower())


def _matches(spec: str) -> pl.Expr:
    v, obj = _spec(spec)
    if v is None:
        return pl.col("tool") == spec
    hit = pl.col("verb") == v
    return hit if obj is None else hit & pl.col("tool").str.to_lowercase().str.contains(
        obj, literal=True)


def _rules_table(declared: list[WorkflowRule], learned: list[dict[str, Any]],
                 declared_score: float, learned_score: float) -> list[dict[str, Any]]:
    rules = [{"step": r.step, "requires": list(specs), "key": r.key or None, "kind": kind,
              "server": None, "score": declared_score, "source": "declared"}
             for r in declared if r.step
             for kind, specs in (("requires", r.requires), ("not_after", r.not_after))
             if specs]
    for r in learned:
        rules.append({"step": r["step"], "requires": list(r["requires"]), "key": None,
                      "kind": "requires", "server": r.get("server"), "score": learned_score,
                      "source": "learned"})
    for i, r in enumerate(rules):
        r["id"] = i
    return rules


def learn_workflows(events: pl.DataFrame, config: DetectorsConfig) -> list[dict[str, Any]]:
    """Prerequisites learned from history: transitions that never happen without one.

    For every mutating tool B *of one server* seen with a business key at least
    ``min_support`` times (first call per caller and key), every tool A that preceded it —
    successfully, for the same key and caller — at least ``min_confidence`` of the time is
    a learned prerequisite of B on that server. Workflows are a server's business logic:
    a shop's ``createOrder`` → ``chargePayment`` says nothing about a ``chargePayment`` on
    a travel server whose workflow was never observed. Steps a declared rule already names
    are left to the declared rule.

    Parameters
    ----------
    events
        Annotated events (:func:`toolwatch.detectors.tools.annotate`) with ``t``, ``ceh``/``sh``.

    Returns
    -------
    list of dict
        ``{"step", "server", "requires": [tool], "support", "confidence"}`` per learned
        rule (``server``: the server whose ``step`` it constrains).
    """
    s = config.step_skip
    if events.height == 0:
        return []
    # Only keys that saw a mutating call can hold a step: most keyed traffic is reads, so
    # narrow to those keys before grouping (no mutating call at all: nothing to learn).
    keyed = pl.col("bkh").is_not_null() & pl.col("ok")
    ck = pl.coalesce(pl.col("ceh"), pl.col("sh")).alias("ck")
    keys = events.filter(keyed & pl.col("mutates")).select(ck, "bkh").unique()
    if keys.height == 0:
        return []
    ev = events.filter(keyed).with_columns(ck).join(keys, on=["ck", "bkh"], how="semi")
    firsts = ev.group_by("ck", "bkh", "server", "tool").agg(
        pl.col("t").min(), pl.col("mutates").first())
    steps = firsts.filter(pl.col("mutates"))
    support = steps.group_by("server", "tool").agg(pl.len().alias("support")).filter(
        pl.col("support") >= s.min_support)
    if support.height == 0:
        return []
    steps = steps.join(support, on=["server", "tool"], how="semi")
    # A prerequisite is one tool (on whichever server) first done for the key and caller.
    pre = firsts.join(steps.select("ck", "bkh").unique(), on=["ck", "bkh"], how="semi")
    pre = pre.group_by("ck", "bkh", "tool").agg(pl.col("t").min())
    pairs = steps.join(pre, on=["ck", "bkh"], suffix="_a").filter(
        (pl.col("tool_a") != pl.col("tool")) & (pl.col("t_a") < pl.col("t")))
    conf = pairs.group_by("server", "tool", "tool_a").agg(pl.len().alias("n")).join(
        support, on=["server", "tool"]).with_columns(
        (pl.col("n") / pl.col("support")).alias("confidence"))
    conf = conf.filter(pl.col("confidence") >= s.min_confidence)
    # Only prerequisite rules take a step over: a declared not_after rule (nothing added to
    # a locked cart) says nothing about what must come before the step.
    required = [r for r in s.workflows if r.requires]
    declared = [r.step for r in required]
    out = []
    for (server, name), grp in conf.sort("server", "tool", "tool_a").group_by(
            "server", "tool", maintain_order=True):
        verb = ((_words(name) or [""])[0]).lower()
        if any(_spec_hit(d, name, verb) for d in declared):
            continue
        out.append({
            "step": name, "server": server, "requires": grp["tool_a"].to_list(),
            "support": int(grp["support"][0]),
            "confidence": round(float(grp["confidence"].min()), 4),
        })
    return out


def save_workflows(rules: list[dict[str, Any]], path: Path) -> Path:
    """Write the learned workflow model (JSON, inspectable) atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"version": 1, "trained_at": datetime.now(UTC).isoformat(), "rules": rules}
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    tmp.replace(path)
    return path


def load_workflows(path: Path) -> list[dict[str, Any]] | None:
    """Learned rules saved by :func:`save_workflows`, or None when there is no model."""
    if not path.is_file():
        return None
    try:
        doc = orjson.loads(path.read_bytes())
        rules = doc["rules"]
        # "server" is absent from models saved before rules were per server: any server.
        return [{"step": str(r["step"]),
                 "server": None if r.get("server") is None else str(r["server"]),
                 "requires": [str(x) for x in r["requires"]],
                 "support": int(r.get("support", 0)),
                 "confidence": float(r.get("confidence", 0.0))} for r in rules]
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        log.warning("ignoring unreadable workflow model %s: %s", path, exc)
        return None


class StepSkipDetector(_SequenceDetector):
    """An irreversible workflow step without its prerequisite for the same business key."""

    name = "step_skip_rules"
    category = "step_skip"
    config_key = "step_skip"
    summary = "Workflow steps (declared or learned) without their prerequisite."

    _extra: ClassVar[list[str]] = ["skipped_step", "skipped_key", "missing", "rule_source",
                                   "rule_kind", "skips", "refused", "chain"]

    #: Directory of saved models (set by the pipeline); a workflows.json there is used.
    model_dir: Path | None = None
    #: Events with ``args`` for the rows being keyed (set by score; _seq drops args).
    _args_src: pl.DataFrame | None = None

    def fit(self, history: FeatureSet) -> Self:
        """Learn workflows (unless a trained model exists) and remember prerequisites seen."""
        s = self.settings
        learned = None
        if self.model_dir is not None:
            learned = load_workflows(self.model_dir / WORKFLOWS_FILE)
            self.model_source_ = "loaded" if learned is not None else None
        if learned is None and s.learn:
            learned = learn_workflows(annotated(history), self.config)
            self.model_source_ = "fitted"
        self.learned_ = learned or []
        self.rules_ = _rules_table(s.workflows, self.learned_ if s.learn else [],
                                   s.declared_score, s.learned_score)
        # Prerequisites completed in history (per caller and key), so a step in the batch
        # whose charge happened earlier is not a skip. Bounded: one row per key and rule.
        self.prereqs_ = self._prereqs(annotated(history)) if history.events.height else None
        self.fitted_ = True
        return self

    def _tagged(self, ev: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
        """Step and prerequisite rows per rule (rule id ``rule``), with their key hash."""
        # Matched in Python over the few distinct tool names (the same equality tests as
        # _matches): two polars queries per rule were a fixed cost of every pass.
        # Only names some rule can match leave polars (a log may name a million tools):
        # a name whose first word is a wanted verb contains it (words are ASCII), so one
        # Aho-Corasick pass keeps a superset before the names are made distinct.
        specs = [x for r in self.rules_ for x in (r["step"], *r["requires"])]
        want_v = [v for v, _ in map(_spec, specs) if v is not None]
        want_n = [x for x in specs if not x.startswith("verb:")]
        tools = ev["tool"].cast(pl.String)
        tools = tools.filter(tools.str.contains_any([*want_v, *want_n],
                                                    ascii_case_insensitive=True)
                             ) if specs else tools.clear()
        verbs = _verbs(tools).filter(pl.col("verb").is_in(want_v) | pl.col("tool").is_in(want_n))
        names, vs = verbs["tool"].to_list(), verbs["verb"].to_list()

        def hits(spec: str) -> list[bool]:
            return [_spec_hit(spec, n, v) for n, v in zip(names, vs, strict=True)]

        st_rows: dict[str, list[Any]] = {"tool": [], "rule": [], "rule_server": []}
        pr_rows: dict[str, list[Any]] = {"tool": [], "rule": [], "rule_server": []}
        for r in self.rules_:
            st = [n for n, h in zip(names, hits(r["step"]), strict=True) if h]
            if not st:
                continue
            req = [hits(x) for x in r["requires"]]
            pr = [n for i, n in enumerate(names) if any(h[i] for h in req)]
            # A learned rule constrains its step on the server it was learned on only.
            st_rows["tool"] += st
            st_rows["rule"] += [r["id"]] * len(st)
            st_rows["rule_server"] += [r["server"]] * len(st)
            pr_rows["tool"] += pr
            pr_rows["rule"] += [r["id"]] * len(pr)
            pr_rows["rule_server"] += [None] * len(pr)
        schema = {"tool": pl.String, "rule": pl.Int32, "rule_server": pl.String}
        return pl.DataFrame(st_rows, schema=schema), pl.DataFrame(pr_rows, schema=schema)

    def _keyed(self, ev: pl.DataFrame, which: pl.DataFrame) -> pl.DataFrame:
        rows = ev.join(which, on="tool").filter(
            pl.col("rule_server").is_null() | (pl.col("rule_server") == pl.col("server"))
        ).drop("rule_server")
        keys = {r["id"]: r["key"] for r in self.rules_ if r["key"]}
        if keys and rows.height:
            if "args" not in rows.columns:
                src = self._args_src if self._args_src is not None else ev
                rows = rows.join(src.select("i", "args"), on="i", how="left")
            own = pl.coalesce([pl.when(pl.col("rule") == i).then(_extract(pl.col("args"), k))
                               for i, k in keys.items()])
            rows = rows.with_columns(pl.coalesce(own, pl.col("bk")).alias("bk"))
            rows = rows.with_columns(pl.when(pl.col("bk").is_not_null())
                                     .then(pl.col("bk").hash(0x7077)).alias("bkh"))
        if self.settings.prerequisite_any_caller:
            # The order's state is what counts: a customer paid, the warehouse ships.
            return rows.with_columns(pl.lit(0, pl.UInt64).alias("ck"))
        return rows.with_columns(pl.coalesce(pl.col("ceh"), pl.col("sh")).alias("ck"))

    def _prereqs(self, ev: pl.DataFrame) -> pl.DataFrame:
        _, pr = self._tagged(ev)
        done = self._keyed(ev, pr).filter(pl.col("ok") & pl.col("bkh").is_not_null())
        return done.group_by("ck", "bkh", "rule").agg(pl.col("t").min().alias("_tp"))

    def score(self, features: FeatureSet) -> pl.DataFrame:
        """One row per session: its skipped steps."""
        if not self.is_fitted:
            self.fit(FeatureSet.empty(self.config))
        schema = {"skipped_step": pl.String, "skipped_key": pl.String, "missing": pl.String,
                  "rule_source": pl.String, "rule_kind": pl.String, "skips": pl.Int64,
                  "refused": pl.Boolean, "chain": _CHAIN}
        ev = _seq(features)
        found = _empty_found(schema)
        if self.rules_ and ev.height:
            st, pr = self._tagged(ev)
            if st.height:
                self._args_src = annotated(features)
                try:
                    found = self._find(ev, st, pr, schema)
                finally:
                    self._args_src = None  # not kept between (live) batches
        return _frame(features, found, self._extra)

    def _find(self, ev: pl.DataFrame, st: pl.DataFrame, pr: pl.DataFrame,
              schema: dict[str, pl.DataType]) -> pl.DataFrame:
        status = pl.col("status").fill_null("unknown")
        # A step the server refused is still the attempt seed 000 describes: reported, at
        # attempt_score (a lower severity), with a reason saying it was refused.
        tried = status.is_in(list(REFUSED)) if self.settings.attempts else pl.lit(False)
        steps = self._keyed(ev, st).filter(
            pl.col("bkh").is_not_null() & (status.is_in(["ok", "unknown"]) | tried)
        ).with_columns(tried.alias("_refused"))
        if steps.height == 0:
            return _empty_found(schema)
        done = self._keyed(ev, pr).filter(pl.col("ok") & pl.col("bkh").is_not_null())
        done = done.group_by("ck", "bkh", "rule").agg(pl.col("t").min().alias("_tp"))
        if self.prereqs_ is not None and self.prereqs_.height:
            done = pl.concat([done, self.prereqs_]).group_by("ck", "bkh", "rule").agg(
                pl.col("_tp").min())
        rule_info = pl.DataFrame(
            {"rule": [r["id"] for r in self.rules_],
             "_score": [r["score"] for r in self.rules_],
             "rule_source": [r["source"] for r in self.rules_],
             "rule_kind": [r["kind"] for r in self.rules_],
             "missing": [" or ".join(x[5:] + "…" if x.startswith("verb:") else x
                                     for x in r["requires"]) for r in self.rules_]},
            schema={"rule": pl.Int32, "_score": pl.Float64, "rule_source": pl.String,
                    "rule_kind": pl.String, "missing": pl.String})
        j = steps.join(done, on=["ck", "bkh", "rule"], how="left").join(rule_info, on="rule")
        # A required step missing (or later), or a freezing step already done before.
        broken = pl.when(pl.col("rule_kind") == "not_after").then(
            pl.col("_tp").is_not_null() & (pl.col("_tp") < pl.col("t"))
        ).otherwise(pl.col("_tp").is_null() | (pl.col("_tp") > pl.col("t")))
        skips = j.filter(broken)
        if skips.height == 0:
            return _empty_found(schema)
        # One skip per (session, step call): the strongest rule it breaks.
        skips = skips.with_columns(
            pl.when(pl.col("_refused")).then(
                pl.min_horizontal(pl.col("_score"), pl.lit(self.settings.attempt_score)))
            .otherwise(pl.col("_score")).alias("_score"))
        skips = skips.sort(["sh", "t", "_score"],
                                                       descending=[False, False, True])
        skips = skips.unique(["sh", "i"], keep="first", maintain_order=True)
        # The session's calls on the skipped keys (what happened to that order, in order).
        keys = skips.select("sh", "bkh").unique()
        around = ev.join(keys, on=["sh", "bkh"], how="semi")
        chains = around.group_by("sh").agg(_chain_expr())
        origins = self._origins(ev, skips, pr)
        if origins.height:
            chains = pl.concat([chains, origins.select("sh", "chain")]).unique(
                "sh", keep="first", maintain_order=True)
            skips = pl.concat([skips, origins.drop("chain").select(skips.columns)])
        return skips.group_by("sh", maintain_order=True).agg(
            pl.col("_score").max().alias("_s"),
            pl.col("tool").first().alias("skipped_step"),
            pl.col("bk").first().alias("skipped_key"),
            pl.col("missing").first(),
            pl.col("rule_source").sort_by("_score", descending=True).first(),
            pl.col("rule_kind").sort_by("_score", descending=True).first(),
            pl.len().cast(pl.Int64).alias("skips"),
            pl.col("_refused").all().alias("refused"),
        ).join(chains, on="sh", how="left").select("sh", "_s", *schema)

    def _origins(self, ev: pl.DataFrame, skips: pl.DataFrame,
                 pr: pl.DataFrame) -> pl.DataFrame:
        """The caller's own unpaid orders a skipped step came from, in other sessions.

        A customer checks out in one session and fulfils in another without paying: when
        the checkout's session logs no order id, only the caller ties the two. Its other
        sessions that ran a freezing step (checkout, lock, finalise) within
        ``origin_minutes`` before the skip and never did the missing prerequisite
        afterwards are where the order came from: they carry the skip's rows (score,
        step, key), with their own calls as the chain."""
        win = self.settings.origin_minutes * 60_000_000
        # A checkout is where an *order* comes from: only a step whose missing prerequisite
        # is what follows a checkout (a payment, origin_requires) is tied to one. An
        # expense approved without being read an hour after the caller bought something
        # did not come from that purchase.
        after_checkout = set(self.settings.origin_requires)
        tied = [r["id"] for r in self.rules_ if after_checkout & set(r["requires"])]
        miss = skips.filter((pl.col("rule_kind") != "not_after") & pl.col("ceh").is_not_null()
                            & ~pl.col("_refused") & pl.col("rule").is_in(tied))
        if win <= 0 or miss.height == 0:
            return pl.DataFrame()
        verbs = _verbs(ev["tool"])
        freezing = verbs.filter(pl.col("verb").str.to_lowercase().is_in(list(_FREEZING)))
        if freezing.height == 0:
            return pl.DataFrame()
        ceh = miss.select("ceh").unique()
        mine = ev.join(ceh, on="ceh", how="semi")
        frz = mine.join(freezing.select("tool"), on="tool", how="semi").filter(
            pl.col("ok")).select("ceh", pl.col("sh").alias("_osh"), pl.col("t").alias("_tf"))
        if frz.height == 0:
            return pl.DataFrame()
        cand = miss.join(frz, on="ceh").filter(
            (pl.col("_osh") != pl.col("sh")) & (pl.col("_tf") <= pl.col("t"))
            & (pl.col("_tf") >= pl.col("t") - win))
        if cand.height == 0:
            return pl.DataFrame()
        # Sessions that did the missing prerequisite after their checkout paid for it.
        paid = mine.join(pr.select("tool", "rule"), on="tool").filter(pl.col("ok")).select(
            pl.col("sh").alias("_osh"), "rule", pl.col("t").alias("_tp2"))
        cand = cand.join(paid, on=["_osh", "rule"], how="left").filter(
            pl.col("_tp2").is_null() | (pl.col("_tp2") < pl.col("_tf"))).drop("_tp2")
        cand = cand.filter(~pl.col("_osh").is_in(
            cand.join(paid, on=["_osh", "rule"]).filter(pl.col("_tp2") >= pl.col("_tf"))
            ["_osh"].implode()))
        if cand.height == 0:
            return pl.DataFrame()
        cand = cand.sort("_score", descending=True).unique("_osh", keep="first")
        osh = cand.select(pl.col("_osh").alias("sh"))
        chains = ev.join(osh, on="sh", how="semi").group_by("sh").agg(_chain_expr())
        return cand.drop("sh", "_tf").rename({"_osh": "sh"}).join(chains, on="sh", how="left")

    def _by(self) -> str:
        return " by anyone" if self.settings.prerequisite_any_caller else " by this caller"

    def explain(self, row: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
        """Reasons: which step ran for which key without which prerequisite."""
        src = row.get("rule_source") or "declared"
        if row.get("rule_kind") == "not_after":
            done = "was attempted" if row.get("refused") else "succeeded"
            reasons = [
                f"{row.get('skipped_step')} {done} for {row.get('skipped_key')} after "
                f"{row.get('missing')} had already succeeded for that key{self._by()} ({src} "
                "workflow rule: nothing changes a cart or order once it is locked, and a "
                "refunded order is not sent).",
            ]
        elif row.get("refused"):
            reasons = [
                f"{row.get('skipped_step')} was attempted for {row.get('skipped_key')} with no "
                f"earlier successful {row.get('missing')} for that key{self._by()} ({src} "
                "workflow rule); the server refused it, so this is an attempt, not a "
                "completed skip.",
            ]
        else:
            reasons = [
                f"{row.get('skipped_step')} succeeded for {row.get('skipped_key')} with no "
                f"earlier successful {row.get('missing')} for that key{self._by()} ({src} "
                "workflow rule).",
            ]
        if (row.get("skips") or 0) > 1:
            reasons.append(f"{num(row['skips'])} steps in this session skipped a prerequisite.")
        return reasons, self._evidence(row, {
            "skipped_step": row.get("skipped_step"), "business_key": row.get("skipped_key"),
            "missing_prerequisite": (row.get("missing")
                                     if row.get("rule_kind") != "not_after" else None),
            "done_before": row.get("missing") if row.get("rule_kind") == "not_after" else None,
            "rule_source": src,
            "skipped_steps": row.get("skips"), "refused": bool(row.get("refused"))})


# ----------------------------------------------------------------- duplicate_execution
def _without_keys(args: pl.Expr, keys: list[str]) -> pl.Expr:
    """Argument text without the ``"key": value`` pairs of ``keys`` (any JSON scalar).

    What remains names the effective operation: a retry that differs only in its
    idempotency key, request id or client timestamp is the same operation.
    """
    if not keys:
        return args
    alt = "|".join(re.escape(k) for k in keys)
    scalar = r'"(?:[^"\\]|\\.)*"|-?[0-9][0-9.eE+-]*|true|false|null'
    return args.str.replace_all(rf'"(?:{alt})"\s*:\s*(?:{scalar})\s*,?\s*', "")


class DuplicateExecutionDetector(_SequenceDetector):
    """The same effective irreversible operation executed twice or more.

    An operation is the tool and its business arguments (the argument text without
    idempotency keys and the volatile fields of ``ignore_args``): two charges of one order
    for one amount, two refunds of one payment, one coupon applied twice. Several
    operations on one account (a treasury run paying different recipients) are the job,
    not duplicates. An idempotency key reused with *different* arguments is reported too.
    """

    name = "duplicate_execution_rules"
    category = "duplicate_execution"
    config_key = "duplicate_execution"
    summary = ("The same irreversible operation (tool and business arguments) executed "
               "twice without a shared idempotency key.")

    _extra: ClassVar[list[str]] = ["dup_tool", "dup_key", "executions", "idem_keys",
                                   "key_reuse", "retried_after", "chain", "reread"]

    def score(self, features: FeatureSet) -> pl.DataFrame:
        """One row per session: the session holding the repeated execution."""
        s = self.settings
        found = self._find(features).with_columns(
            # Repeated only after reading the object again (see _reread): a second
            # decision at a person's pace rather than a replay, reported at reread_score.
            pl.when(pl.lit(s.reread_score > 0) & pl.col("reread").fill_null(False)
                    & (pl.col("executions") >= 2))
            .then(s.reread_score)
            .when(pl.col("executions") >= 2)
            # Two executions of one irreversible operation is already money or goods moved
            # twice: medium; executions_hi of them critical.
            .then(band(pl.col("executions") - 1, 1, max(2, s.executions_hi - 1)) * 0.5 + 0.5)
            .when(pl.lit(s.attempts_lo > 0) & (pl.col("retried_after") >= s.attempts_lo))
            .then(s.attempt_score)
            .otherwise(0.0).clip(0.0, 1.0).alias("_s"))
        return _frame(features, found, self._extra)

    def _find(self, features: FeatureSet) -> pl.DataFrame:
        s = self.settings
        schema = {"dup_tool": pl.String, "dup_key": pl.String, "executions": pl.Int64,
                  "reread": pl.Boolean,
                  "idem_keys": pl.Int64, "key_reuse": pl.Boolean, "retried_after": pl.Int64,
                  "chain": _CHAIN}
        # A call that moves money is irreversible whatever its verb: "sendPayout",
        # "sendPayment" are outbound by their verb, but executing one twice pays twice
        # (the money nouns of detectors/tools.py; seed 000's charge / debit / send tools).
        ev = _seq(features).filter(pl.col("irreversible")
                                   | (pl.col("outbound") & _moves_money()))
        if ev.height < 2 or not ev["ok"].any():
            return _empty_found(schema)
        # The argument text of these few rows (``_seq`` drops args: long strings).
        ev = ev.join(annotated(features).select("i", "args"), on="i", how="left")
        ignore = sorted({*self.config.tools.idempotency_keys, *s.ignore_args})
        op = _without_keys(pl.col("args").fill_null(""), ignore)
        # No argument text: the business key is all that names the operation.
        op = pl.when(op.str.strip_chars("{} ") == "").then(
            pl.when(pl.col("bk").is_not_null()).then(pl.lit("bk:") + pl.col("bk"))
        ).otherwise(op)
        ev = ev.with_columns(op.alias("_op")).filter(pl.col("_op").is_not_null())
        ev = ev.with_columns(pl.col("_op").hash(SEED).alias("oph")).drop("args", "_op")
        if s.metered_min_ops:
            # Equal arguments name one operation only when they name the object acted on
            # (an order, payment, expense, recipient: the business key). A call naming none
            # ("spend 5 credits for ocr") is a quantity and a label; a caller running several
            # different ones of a tool is a metered workload, whose equal amounts and labels
            # recur by chance: separate intents, not a replay (its concurrent double spend is
            # race_condition's).
            kl = pl.col("bk").is_null() & pl.col("ok")
            ev = ev.filter(~(pl.col("bk").is_null() & (
                pl.col("oph").filter(kl).n_unique().over("ck", "tool") >= s.metered_min_ops)))
        if ev.height < 2:
            return _empty_found(schema)
        g = ["ck", "tool", "oph"]
        win = s.window_minutes * 60_000_000
        retried = self._retried_after(ev.sort([*g, "t"]), g, win)
        ev = ev.filter(pl.col("ok"))
        ev = ev.sort([*g, "t"])
        # A replay with the same idempotency key is one execution: keep its first call.
        first = ev.filter(pl.col("idemh").is_null()
                          | pl.struct(*g, "idemh").is_first_distinct())
        same = pl.all_horizontal([pl.col(c) == pl.col(c).shift(1) for c in g]).fill_null(False)
        dup = same & ((pl.col("t") - pl.col("t").shift(1)) <= win)
        first = first.with_columns(dup.alias("_dup"), (~dup).cum_sum().alias("_grp"),
                                   pl.col("t").shift(1).alias("_t_prev"))
        first = self._reread(features, first)
        groups = first.group_by("_grp").agg(
            pl.len().cast(pl.Int64).alias("executions"),
            # Every repeat came after a fresh read of the object: a second decision.
            (pl.col("_reread").filter(pl.col("_dup")).all()
             & pl.col("_dup").any()).alias("reread"),
            pl.col("idemh").drop_nulls().n_unique().cast(pl.Int64).alias("idem_keys"),
            pl.lit(False).alias("key_reuse"),
            pl.lit(0, pl.Int64).alias("retried_after"),
            pl.col("tool").first().alias("dup_tool"),
            pl.col("bk").first().alias("dup_key"),
            # Every session that ran the operation: a replay across reconnections
            # (seed 002) is one finding over all of them, the first included.
            pl.col("sh").unique().alias("_sessions"),
            _chain_expr(),
        ).filter(pl.col("executions") >= 2).drop("_grp")
        # One idempotency key carried by different operations of one tool: the key is
        # not protecting what it claims to (or is reused to slip a second execution by).
        reuse = ev.filter(pl.col("idemh").is_not_null()).group_by("ck", "tool", "idemh").agg(
            pl.col("oph").n_unique().cast(pl.Int64).alias("executions"),
            pl.lit(False).alias("reread"),
            pl.lit(1, pl.Int64).alias("idem_keys"),
            pl.lit(True).alias("key_reuse"),
            pl.lit(0, pl.Int64).alias("retried_after"),
            pl.col("tool").first().alias("dup_tool"),
            pl.col("bk").first().alias("dup_key"),
            pl.col("sh").unique().alias("_sessions"),
            _chain_expr(),
        ).filter(pl.col("executions") >= 2).drop("ck", "tool", "idemh")
        groups = pl.concat([groups, reuse.select(groups.columns),
                            retried.select(groups.columns)])
        if groups.height == 0:
            return _empty_found(schema)
        per = groups.explode("_sessions").rename({"_sessions": "sh"})
        return (per.sort("executions", descending=True).group_by("sh", maintain_order=True)
                .first().select("sh", pl.lit(0.0).alias("_s"), *schema))

    def _reread(self, features: FeatureSet, first: pl.DataFrame) -> pl.DataFrame:
        """``_reread``: a repeated execution the caller preceded with a successful read of
        the same business object, after the previous execution, and at a person's pace
        (``reread_min_minutes`` or more after it): getExpense, approveExpense, then both
        again minutes later. A retry loop or an exploit replays within seconds, reads
        in between or not (seed 000: a discount applied again and again between reads of
        the cart total and checkouts); reading the object again minutes later and acting
        on it again is a second decision."""
        gap = int(self.settings.reread_min_minutes * 60_000_000)
        cand = first.filter(pl.col("_dup") & pl.col("bk").is_not_null()
                            & (pl.col("t") - pl.col("_t_prev") >= gap))
        if cand.height == 0:
            return first.with_columns(pl.lit(False).alias("_reread"))
        reads = _seq(features).lazy().filter(
            pl.col("ok") & pl.col("tool_role").is_in(["read", "list_search"])
            & pl.col("bk").is_not_null()
        ).select("ck", "bk", pl.col("t").alias("_tr")).join(
            cand.lazy().select("ck", "bk").unique(), on=["ck", "bk"], how="semi")
        hit = (
            cand.lazy().select("i", "ck", "bk", "t", "_t_prev")
            .join(reads, on=["ck", "bk"], how="inner")
            .filter((pl.col("_tr") > pl.col("_t_prev")) & (pl.col("_tr") < pl.col("t")))
            .select("i").unique().with_columns(pl.lit(True).alias("_reread"))
            .collect(engine="in-memory")
        )
        return first.join(hit, on="i", how="left", maintain_order="left").with_columns(
            pl.col("_reread").fill_null(False))

    def _retried_after(self, ev: pl.DataFrame, g: list[str], win: int) -> pl.DataFrame:
        """Groups whose operation, once it had succeeded, was tried again and refused.

        Retrying a call that failed is what clients should do; trying an operation again
        after it went through — with no idempotency key or a new one, so the server cannot
        tell it is a replay — is a second execution the server happened to refuse (seed
        000: "chargePayment has been called N times this session")."""
        t_ok = pl.col("t").filter(pl.col("ok")).min().over(g)
        key_ok = pl.col("idemh").filter(pl.col("ok")).first().over(g)
        after = (~pl.col("ok") & (pl.col("t") > t_ok) & (pl.col("t") - t_ok <= win)
                 & (pl.col("idemh").is_null() | key_ok.is_null()
                    | (pl.col("idemh") != key_ok)).fill_null(True))
        cand = ev.with_columns(after.fill_null(False).alias("_after"))
        return cand.filter(pl.col("_after").any().over(g)).group_by(g).agg(
            pl.col("ok").sum().cast(pl.Int64).alias("executions"),
            pl.lit(False).alias("reread"),
            pl.col("idemh").drop_nulls().n_unique().cast(pl.Int64).alias("idem_keys"),
            pl.lit(False).alias("key_reuse"),
            pl.col("_after").sum().cast(pl.Int64).alias("retried_after"),
            pl.col("tool").first().alias("dup_tool"),
            pl.col("bk").first().alias("dup_key"),
            pl.col("sh").filter(pl.col("_after")).unique().alias("_sessions"),
            _chain_expr(),
        ).filter(pl.col("executions") == 1).drop(g)

    def explain(self, row: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
        """Reasons: how often the operation ran, and the idempotency keys."""
        k = row.get("idem_keys") or 0
        key = f" on {row.get('dup_key')}" if row.get("dup_key") else ""
        if row.get("retried_after") and (row.get("executions") or 0) < 2:
            reasons = [
                f"{row.get('dup_tool')}{key} succeeded, then the same operation was tried "
                f"{num(row['retried_after'])} more time(s) by one caller and refused each "
                "time, " + ("with no idempotency key" if k == 0 else "under a new "
                            "idempotency key") + ": an attempted second execution.",
            ]
        elif row.get("key_reuse"):
            reasons = [
                f"One idempotency key was used for {num(row.get('executions'))} different "
                f"{row.get('dup_tool')} operations{key} by one caller: a key meant to make a "
                "retry safe carried another operation.",
            ]
        else:
            idem = ("no idempotency key" if k == 0 else
                    f"{k} different idempotency keys" if k > 1 else "one idempotency key, "
                    "reused on only some calls")
            reasons = [
                f"{row.get('dup_tool')} executed successfully {num(row.get('executions'))} "
                f"times with the same business arguments{key} by one caller, each within "
                f"{num(self.settings.window_minutes)} min of the one before, with {idem}.",
            ]
            if row.get("reread"):
                reasons.append(
                    "Each repeat came after the caller read the object again: a second "
                    "decision rather than a retry loop's replay, but the operation still "
                    "ran twice; check that it was meant to.")
        return reasons, self._evidence(row, {
            "tool": row.get("dup_tool"), "business_key": row.get("dup_key"),
            "executions": row.get("executions"), "distinct_idempotency_keys": k,
            "refused_retries_after_success": row.get("retried_after"),
            "idempotency_key_reused": bool(row.get("key_reuse")),
            "repeated_after_reread": bool(row.get("reread"))})


# ------------------------------------------------------------------- cross_server_flow
class CrossServerFlowDetector(_SequenceDetector):
    """Data read on one server leaving through another server's outbound tool."""

    name = "cross_server_flow_rules"
    category = "cross_server_flow"
    config_key = "cross_server_flow"
    summary = "Bulk or sensitive reads on one server, then an outbound call on another."

    _extra: ClassVar[list[str]] = ["out_tool", "out_server", "read_bytes", "read_rows",
                                   "sensitive_reads", "data_reads", "record_reads",
                                   "source_servers", "out_dest", "dest_callers",
                                   "carried", "out_named", "rare_dest",
                                   "named_dest", "verbatim", "chain"]

    def _volume(self) -> pl.Expr:
        """Volume is bytes *or* records, and records of people or a business (a customer
        export) count at any size: each scored, the strongest decides."""
        s = self.settings
        # A call that is not outbound by name (a note, a file write, a summarizer) carries
        # data out only to a rare destination (below): writing a report into one's own
        # files after a day of queries is work, not a flow.
        named = pl.col("out_named").fill_null(True)
        return any_of(
            pl.when(named).then(band(pl.col("read_bytes"), s.min_bytes, s.bytes_hi))
            .otherwise(0.0),
            pl.when(named).then(band(pl.col("read_rows"), s.min_rows, s.rows_hi))
            .otherwise(0.0),
            pl.when(named & (pl.col("data_reads") > 0)).then(s.data_score).otherwise(0.0),
            # The call states the size of reads made elsewhere: those very reads left
            # (internal documents uploaded to a plugin), whatever their volume.
            pl.when(named & pl.col("verbatim").fill_null(False)).then(s.verbatim_score)
            .otherwise(0.0),
            # Records of people or a business, however few: sensitive by what they are.
            pl.when(named & (pl.col("record_reads") > 0)).then(s.record_score)
            .otherwise(0.0),
            # What was read, carried (attached, pasted) to a destination almost nobody in
            # the batch sends to: data leaving for outside, whatever its size.
            # A tool as destination (no address in the arguments) is rare by its few
            # callers only, which a small batch cannot tell from a team's own channel:
            # there, only records of people or a business count.
            pl.when(pl.col("carried").fill_null(False) & pl.col("rare_dest").fill_null(False))
            .then(pl.when((pl.col("record_reads") + pl.col("data_reads")) > 0)
                  .then(s.external_record_score)
                  .when(pl.col("named_dest").fill_null(False)).then(s.external_score)
                  .otherwise(0.0))
            .otherwise(0.0),
        )

    def _sensitive(self) -> pl.Expr:
        return pl.when((pl.col("sensitive_reads") > 0)
                       & pl.col("out_named").fill_null(True)).then(
            0.75 + 0.05 * pl.col("sensitive_reads").clip(0, 5)).otherwise(0.0)

    def fit(self, history: FeatureSet) -> Self:
        """Learn whose *routine* it is to read on some servers and send out through another
        (its typical active day holds such a flow), and how much it usually reads first."""
        cfg = self.config
        self.dest_ = None  # the history's own destination counts, below
        found = self._find(history)
        #: How many callers send to each destination, calls per tool and per (tool,
        #: destination) in the history: a partition of callers scores against these.
        self.dest_ = getattr(self, "_dest_seen", None)
        flows_out = self._flows_out
        # Batch mode fits on the very sessions it then scores: keep the flows for score().
        self._found_cache = (history.sessions, found)
        callers = history.sessions.select("sh", "caller_id", "first_t")
        per = callers.join(found.select("sh", self._volume().alias("_raw")), on="sh",
                           how="left")
        # A day's flows are what counts (one or two per working day, in a few of the many
        # per-server sessions of that day), so habits are per active day, not per session.
        self.habit_ = daily_habits(per, "_raw", ["caller_id"],
                                   min_rows=cfg.baseline_min_sessions,
                                   min_days=cfg.baseline_min_days)
        # The caller's usual flow: one observation per outbound call (a flow is carried by
        # several sessions), timed at the outbound call — every outbound call's flow, not
        # only those that are some session's strongest (which depended on which sessions
        # carry the alert, see sources_need_volume).
        flows = flows_out.lazy().join(callers.lazy().drop("first_t"), on="sh").filter(
            pl.col("caller_id").is_not_null()).unique(["caller_id", "t_out"]).select(
            "caller_id", "read_bytes", pl.col("t_out").alias("first_t"))
        if self.settings.self_vs_day_max:
            # The habit is judged per day (the day's largest flow), so is the excess: a
            # habitual flow is compared with the caller's usual *largest flow of a day*,
            # not with its median flow, which the many small posts of a day pull down.
            flows = flows.group_by(
                "caller_id", (pl.col("first_t") // US_PER_DAY).alias("_day")).agg(
                pl.col("read_bytes").max()).select(
                "caller_id", "read_bytes", (pl.col("_day") * US_PER_DAY).alias("first_t"))
        flows = flows.collect(engine="in-memory")
        self.caller_baseline_ = Baseline(
            ["read_bytes"], ["caller_id"], min_rows=cfg.baseline_min_sessions,
            min_days=cfg.baseline_min_days, min_mad=cfg.baseline_min_mad,
        ).fit(flows)
        self.fitted_ = True
        return self

    def score(self, features: FeatureSet) -> pl.DataFrame:
        """One row per session: the session of the outbound call (and those read in).

        Volume flows of a caller for whom they are routine must also read far more than
        its own usual flows; flows from sensitive reads always count."""
        if not self.is_fitted:
            self.fit(FeatureSet.empty(self.config))
        cached, self._found_cache = getattr(self, "_found_cache", None), None
        found = (cached[1] if cached is not None and cached[0] is features.sessions
                 else self._find(features))
        if self.habit_.height and found.height:
            callers = features.sessions.select("sh", "caller_id")
            found = self.caller_baseline_.with_own(found.join(callers, on="sh", how="left"))
            found = habitual_gate(found, self.habit_, ["caller_id"], self.threshold,
                                  pl.col("own_z_read_bytes"), self.settings.self_z,
                                  slack=self.settings.habit_margin)
        else:
            found = found.with_columns(pl.lit(False).alias("habitual"),
                                       pl.lit(1.0).alias("p_own"))
        found = found.with_columns(
            any_of(all_of(self._volume(), pl.col("p_own")), self._sensitive()).alias("_s"))
        return _frame(features, found.select("sh", "_s", *self._extra, "habitual"),
                      [*self._extra, "habitual"])

    def _outbound(self, features: FeatureSet, ev: pl.DataFrame) -> pl.DataFrame:
        """The calls that can take data out: outbound by name, and any call whose arguments
        carry content (``payload_args``: an attachment, a text or data field), with where
        each goes (``out_dest``: the e-mail domain or URL host its arguments name, else its
        server and tool) and how many callers of the batch send there (``dest_callers``).

        A payload handed to another server's tool leaves the server it was read on
        whatever the tool is called (seed 003: data read on a trusted server, passed to a
        less-trusted plugin); a destination nearly nobody else uses is outside the
        organisation's usual ones (its own mail domain, its shared tools)."""
        s = self.settings
        self._dest_seen: pl.DataFrame | None = None
        cols = ["ck", "sh", "i", "caller_id", "t", "server", "tool", "bk", "status",
                "outbound"]
        keys = [f'"{k}"' for k in s.payload_args]
        allargs = annotated(features).lazy().select("i", pl.col("args").fill_null(""))
        carries = (pl.col("args").str.contains_any(keys, ascii_case_insensitive=True)
                   if keys else pl.lit(False))
        # Outbound calls (with their arguments: where they go) and the calls carrying a
        # payload (one Aho-Corasick pass over the argument text).
        pay = allargs.filter(carries).select("i")
        # A call that moves money (sendPayout, sendPayment: outbound by its verb) sends a
        # recipient and an amount, not data: it is not a way out for what was read, unless
        # its arguments carry a payload (above).
        cand = pl.concat([ev.lazy().filter(pl.col("outbound") & ~_moves_money()).select("i"),
                          pay]).unique(
            "i").join(ev.lazy().select(cols), on="i").join(allargs, on="i", how="left")
        cand = cand.with_columns(carries.fill_null(False).alias("carried")).collect(
            engine="in-memory")
        if cand.height == 0:
            return pl.DataFrame(schema={
                "ck": pl.UInt64, "sh": pl.UInt64, "i": pl.Int64, "t_out": pl.Int64,
                "out_server": pl.String, "out_tool": pl.String, "out_bk": pl.String,
                "out_status": pl.String, "out_dest": pl.String, "dest_callers": pl.Int64,
                "carried": pl.Boolean, "out_named": pl.Boolean, "rare_dest": pl.Boolean,
                "named_dest": pl.Boolean, "out_size": pl.Int64})
        a = pl.col("args").fill_null("").str.to_lowercase()
        # The size the call says it carries (an upload's sizeBytes): what was read, when
        # some reads add up to it (_find).
        if s.size_args:
            alts = "|".join(re.escape(k.lower()) for k in s.size_args)
            stated = a.str.extract(rf'"(?:{alts})"\s*:\s*"?(\d{{1,15}})', 1).cast(pl.Int64)
        else:
            stated = pl.lit(None, dtype=pl.Int64)
        cand = cand.with_columns(stated.alias("out_size"))
        named = pl.coalesce(
            a.str.extract(r"@([a-z0-9-]+(?:\.[a-z0-9-]+)+)", 1),
            a.str.extract(r"https?://([a-z0-9.-]+)", 1))
        cand = cand.with_columns(
            pl.coalesce(named, pl.col("server").fill_null("") + "/"
                        + pl.col("tool").fill_null("")).alias("out_dest"),
            named.is_not_null().alias("_named_dest"))
        cand = cand.with_columns(
            pl.len().over("server", "tool").alias("_tool_calls"),
            pl.len().over("server", "tool", "out_dest").alias("_dest_calls"))
        n = cand.group_by("out_dest").agg(
            pl.col("caller_id").n_unique().cast(pl.Int64).alias("dest_callers"))
        cand = cand.join(n, on="out_dest", how="left")
        counts = ("dest_callers", "_tool_calls", "_dest_calls")
        # How usual a destination is, is a population figure: the history fit() saw
        # (every caller, where this batch may be one partition of callers) counts too.
        self._dest_seen = cand.select("server", "tool", "out_dest", *counts).unique(
            ["server", "tool", "out_dest"])
        known = getattr(self, "dest_", None)
        if known is not None and known.height:
            cand = cand.join(known, on=["server", "tool", "out_dest"], how="left",
                             suffix="_fit", nulls_equal=True).with_columns(
                *[pl.max_horizontal(c, f"{c}_fit").alias(c) for c in counts]).drop(
                [f"{c}_fit" for c in counts])
        # A destination its arguments name (a mail domain, a host) is judged against the
        # tool's other destinations: a domain three accounts share is still one that
        # almost none of the tool's mail goes to, while most goes to the organisation's
        # own (even when one service sends it all). A tool as destination (no address) is
        # rare by its callers only.
        rare = ((pl.col("dest_callers") < s.rare_dest_callers)
                | (pl.col("_named_dest")
                   & (pl.col("_dest_calls") < s.rare_dest_share * pl.col("_tool_calls"))))
        cand = cand.with_columns(rare.fill_null(False).alias("rare_dest"))
        return cand.sort("t", "i").select(
            "ck", "sh", "i", pl.col("t").alias("t_out"), pl.col("server").alias("out_server"),
            pl.col("tool").alias("out_tool"), pl.col("bk").alias("out_bk"),
            pl.col("status").alias("out_status"), "out_dest", "dest_callers", "carried",
            pl.col("outbound").alias("out_named"), "rare_dest",
            pl.col("_named_dest").alias("named_dest"), "out_size")

    def _stated(self, pairs: pl.DataFrame) -> pl.DataFrame:
        """Keep, for an outbound call that states the size it carries (``out_size``), only
        the reads that make it up when some do: in one session the data was read in, the
        latest reads before the call whose bytes add up to the stated size (within
        ``size_match_tolerance``). Those reads *are* what was sent (an export of 920,724
        bytes, then an upload of 920,724 bytes), so the flow is them (and any read of
        credentials), flagged ``_verbatim``: a busy caller's other reads of the hour
        (dashboards, job results) are not part of it, nor their sessions. A call whose
        stated size nothing adds up to keeps every read (an aggregate computed from them,
        or a size not logged)."""
        s = self.settings
        tol = s.size_match_tolerance
        if tol <= 0 or pairs.height == 0:
            return pairs.with_columns(pl.lit(False).alias("_verbatim"))
        src = ["sh", "i", "sh_r"]
        # Bytes of this read and every later one of its session before the call.
        later = pl.col("bytes").fill_null(0).cum_sum(reverse=True).over(src, order_by="t")
        size = pl.col("out_size")
        hit = ((size >= s.data_min_bytes)
               & ((later - size).abs() <= tol * size)).fill_null(False)
        # The latest read from which the sum matches: the fewest reads that make it up.
        start = pl.col("t").filter(pl.col("_hit")).max().over(src)
        pairs = pairs.with_columns(hit.alias("_hit")).with_columns(
            (start.is_not_null() & (pl.col("t") >= start)).alias("_in"))
        pairs = pairs.with_columns(pl.col("_in").any().over("sh", "i").alias("_verbatim"))
        # Reads of credentials stay whatever the size says: a few hundred bytes of .env
        # fit within the tolerance of a megabyte, and such reads are never excused.
        return pairs.filter(~pl.col("_verbatim") | pl.col("_in") | pl.col("sensitive")
                            ).drop("_hit", "_in")

    def _find(self, features: FeatureSet) -> pl.DataFrame:
        s = self.settings
        schema = {"out_tool": pl.String, "out_server": pl.String, "read_bytes": pl.Int64,
                  "read_rows": pl.Int64, "sensitive_reads": pl.Int64, "data_reads": pl.Int64,
                  "record_reads": pl.Int64, "source_servers": pl.String,
                  "out_dest": pl.String, "dest_callers": pl.Int64, "carried": pl.Boolean,
                  "out_named": pl.Boolean, "rare_dest": pl.Boolean,
                  "named_dest": pl.Boolean, "verbatim": pl.Boolean, "chain": _CHAIN}
        ev = _seq(features)
        #: One row per outbound call with reads before it (sh, t_out, read_bytes): what
        #: the caller's usual flows are learned from (set by every _find).
        self._flows_out = pl.DataFrame(schema={"sh": pl.UInt64, "t_out": pl.Int64,
                                               "read_bytes": pl.Int64})
        # Filter + projection (+ semi join) as one in-memory query each (the eager steps
        # copied every event column first); the semi join keeps the left order as before.
        out = self._outbound(features, ev)
        if out.height == 0:
            return _empty_found({**schema, "t_out": pl.Int64})
        # A read of records (data_terms) counts as a data read when it is a collection:
        # an export / dump by name, or at least data_min_rows records / data_min_bytes.
        whole = pl.col("tool").str.contains(r"(?i)export|dump|backup")
        collection = (whole | (pl.col("rows").fill_null(0) >= s.data_min_rows)
                      | (pl.col("bytes").fill_null(0) >= s.data_min_bytes))
        if s.oversized_factor > 0:
            # A read far beyond what its tool returns to everyone else is a collection
            # whatever its name: judged against the (server, tool) baseline of this batch.
            typ, _, _ = tool_typicals(ev, self.config.bulk_extraction.tool_min_sessions,
                                      s.oversized_factor)
            oversized = (pl.col("bytes").fill_null(0)
                         >= s.oversized_factor * pl.col("typ_b")).fill_null(False)
        else:
            typ = pl.DataFrame(schema={"server": pl.String, "tool": pl.String,
                                       "typ_b": pl.Float64})
            oversized = pl.lit(False)
        reads = ev.lazy().filter(
            pl.col("tool_role").is_in(["read", "list_search"])
            & (pl.col("ok") | pl.col("sensitive"))
        ).join(out.lazy().select("ck").unique(), on="ck", how="semi",
               maintain_order="left").join(
            typ.lazy().select("server", "tool", "typ_b"), on=["server", "tool"], how="left",
            maintain_order="left").select(
            "ck", "t", "server", "tool", "bk", "status", "bytes", "rows", "sensitive",
            (pl.col("ok") & ((pl.col("data") & collection) | oversized)).alias("data"),
            (pl.col("data") & pl.col("ok") & ~collection & ~oversized).alias("record"),
            pl.col("sh").alias("sh_r")).collect(engine="in-memory")
        win = s.window_minutes * 60_000_000
        pairs = out.join(reads, on="ck").filter(
            (pl.col("server") != pl.col("out_server")) & (pl.col("t") <= pl.col("t_out"))
            & (pl.col("t") >= pl.col("t_out") - win))
        if s.own_session_first:
            # An outbound call whose own session read on another server carries what that
            # session read (a multi-server agent host: read, then upload, in one session).
            # Only an upload-only session — each server giving the client its own session
            # id — takes the caller's reads in its other sessions: otherwise a small upload
            # of public figures would inherit every analyst query of the caller's hour.
            own = pl.col("sh_r") == pl.col("sh")
            pairs = pairs.filter(own | ~own.any().over("sh", "i"))
        pairs = self._stated(pairs)
        if pairs.height == 0:
            return _empty_found({**schema, "t_out": pl.Int64})
        # The sessions the data was read in are named only when they supplied a real part
        # of it (or a sensitive read): a busy caller's other connections, each with a few
        # small reads in the hour, are not where a flow's data came from.
        out_key, src_key = ["sh", "i"], ["sh", "i", "sh_r"]
        share = (pl.col("bytes").sum().over(src_key)
                 >= s.source_share_lo * pl.col("bytes").sum().over(out_key))
        if s.sources_need_volume:
            # A flow below min_bytes alerts only for its sensitive reads: the sessions that
            # merely supplied bytes are not part of what is alerted.
            share = share & (pl.col("bytes").sum().over(out_key) >= s.min_bytes)
        supplied = share | (pl.col("sensitive") | pl.col("data")).any().over(src_key)
        per_out = pairs.with_columns(supplied.alias("_supplied")).group_by("sh", "i").agg(
            pl.col("bytes").sum().cast(pl.Int64).alias("read_bytes"),
            pl.col("rows").sum().cast(pl.Int64).alias("read_rows"),
            pl.struct("tool", "bk").filter(pl.col("sensitive")).n_unique().cast(pl.Int64)
            .alias("sensitive_reads"),
            pl.struct("tool", "bk").filter(pl.col("data")).n_unique().cast(pl.Int64)
            .alias("data_reads"),
            pl.struct("tool", "bk").filter(pl.col("record")).n_unique().cast(pl.Int64)
            .alias("record_reads"),
            pl.col("server").unique().sort().str.join(", ").alias("source_servers"),
            pl.col("sh_r").filter(pl.col("_supplied")).unique().alias("_src"),
            pl.col("out_tool").first(), pl.col("out_server").first(),
            pl.col("t_out").first(), pl.col("out_bk").first(), pl.col("out_status").first(),
            pl.col("out_dest").first(), pl.col("dest_callers").first(),
            pl.col("carried").first(), pl.col("out_named").first(),
            pl.col("rare_dest").first(), pl.col("named_dest").first(),
            pl.col("_verbatim").first().alias("verbatim"),
            # The chain: sensitive reads first, then the largest reads, in time order.
            pl.struct(pl.col("t"), pl.col("server"), pl.col("tool"), pl.col("bk"),
                      pl.col("status").fill_null("unknown"))
            .sort_by([pl.col("sensitive"), pl.col("data"), pl.col("bytes")],
                     descending=[True, True, True])
            .head(CHAIN_MAX - 1).alias("_reads"),
        ).with_columns(
            # A session that supplied several flows carries the one that scores (an export
            # uploaded to a plugin), before a bigger one that does not (the same export
            # and more, then a report written into the caller's own files).
            any_of(self._volume(), self._sensitive()).alias("_best"),
            (pl.col("read_bytes") + pl.col("sensitive_reads") * 10**12
             + pl.col("data_reads") * 10**11).alias("_rank"))
        self._flows_out = per_out.select("sh", "t_out", "read_bytes")
        # The chain spans sessions (one per server): the outbound call's session and the
        # sessions the data was read in all carry it.
        per_out = pl.concat([
            per_out.drop("_src"),
            per_out.explode("_src").filter(pl.col("_src").is_not_null()).drop("sh")
            .rename({"_src": "sh"}).select(per_out.drop("_src").columns),
        ])
        best = per_out.sort("_best", "_rank", descending=True).group_by(
            "sh", maintain_order=True).first()
        outcall = pl.struct(
            pl.col("t_out").alias("t"), pl.col("out_server").alias("server"),
            pl.col("out_tool").alias("tool"), pl.col("out_bk").alias("bk"),
            pl.col("out_status").fill_null("unknown").alias("status"))
        best = best.with_columns(
            pl.concat_list(pl.col("_reads").list.sort(), pl.concat_list(outcall))
            .alias("chain"))
        return best.select("sh", pl.lit(0.0).alias("_s"), *schema, "t_out")

    def explain(self, row: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
        """Reasons: what was read where, then where it went out."""
        recs = f" ({num(row['read_rows'])} records)" if row.get("read_rows") else ""
        reasons = [
            f"{row.get('out_tool')} on {row.get('out_server')} sent data out after this "
            f"caller read {size(row.get('read_bytes'))}{recs} from "
            f"{row.get('source_servers')} within the previous "
            f"{self.settings.window_minutes} min.",
        ]
        if row.get("data_reads"):
            reasons.append(f"{num(row['data_reads'])} of those reads returned records of "
                           "people or a business (an export, customer or user data): "
                           "sensitive whatever their size.")
        if row.get("record_reads") and not row.get("data_reads"):
            reasons.append(f"{num(row['record_reads'])} of those reads returned records of "
                           "people or a business (by the tool's name or arguments), too "
                           "few to be a collection: sensitive by what they are.")
        if row.get("sensitive_reads"):
            reasons.append(f"{num(row['sensitive_reads'])} of those reads touched sensitive "
                           "places (credentials, secrets, system files, user/role tables).")
        if row.get("carried") and row.get("rare_dest"):
            reasons.append(f"The call carried content (an attachment, a text or data field) "
                           f"to {row.get('out_dest')}, a destination "
                           f"{num(row.get('dest_callers') or 0)} caller(s) of this batch "
                           "use, outside the ones the organisation routinely sends to.")
        if row.get("verbatim"):
            reasons.append("The outbound call states the size of what it carries, and those "
                           "reads add up to it: the data read is what was sent.")
        if not row.get("sensitive_reads") and row.get("habitual"):
            reasons.append("Reading elsewhere and then sending out is part of this caller's "
                           "usual day, but this flow read far more than its usual ones.")
        return reasons, self._evidence(row, {
            "outbound_tool": row.get("out_tool"), "outbound_server": row.get("out_server"),
            "bytes_read_elsewhere": row.get("read_bytes"),
            "records_read_elsewhere": row.get("read_rows"),
            "sensitive_reads": row.get("sensitive_reads"),
            "data_reads": row.get("data_reads"),
            "record_reads": row.get("record_reads"),
            "source_servers": row.get("source_servers"),
            "destination": row.get("out_dest"), "destination_callers": row.get("dest_callers"),
            "rare_destination": bool(row.get("rare_dest") and row.get("carried")),
            "sent_what_was_read": bool(row.get("verbatim"))})


#: The sequence detectors, in registry order.
SEQUENCE_DETECTORS: tuple[type[Detector], ...] = (
    ToolLoopDetector, PrivilegeChainDetector, StepSkipDetector, DuplicateExecutionDetector,
    CrossServerFlowDetector,
)
