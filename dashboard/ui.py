"""Streamlit helpers shared by the pages: store location, caching, time zones, safe output.

Safety rules for page code (every string from the logs is attacker-controlled):

* log strings go to ``st.text``, ``st.code``, ``st.json``, dataframes, or widget
  *options* — never to ``st.markdown``/``st.write``/``st.caption``/titles/labels/``help``
  (those interpret Markdown) and never with ``unsafe_allow_html``;
* strings that go into Plotly figures pass through :func:`plot_text`, since Plotly
  interprets a subset of HTML tags in labels and hover text.
"""

from __future__ import annotations

import getpass
import html
import os
import re
import sys
import zoneinfo
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import polars as pl
import streamlit as st
from toolwatch.dashboard import data

from toolwatch.output import safe_text
from toolwatch.store import Store

#: Seconds a query result is reused; below the shortest live-refresh interval.
CACHE_TTL_S = 2.0
#: Live refresh intervals offered in the sidebar (seconds).
REFRESH_CHOICES = (5, 10, 30, 60)
DEFAULT_REFRESH_S = 10
#: Page files, relative to ``dashboard/app.py``.
PAGES = {
    "incidents": "views/incidents.py",
    "incident": "views/incident.py",
    "overview": "views/overview.py",
    "flagged": "views/flagged.py",
    "session": "views/session.py",
    "entity": "views/entity.py",
    "forensics": "views/forensics.py",
}
#: Plotly colours per call outcome and alert severity (stable across charts).
STATUS_COLORS = {
    "ok": "#2e7d32",
    "error": "#c62828",
    "not_found": "#ef6c00",
    "denied": "#6a1b9a",
    "auth_failed": "#ad1457",
    "rate_limited": "#1565c0",
    "unknown": "#757575",
}
SEVERITY_COLORS = {"critical": "#b71c1c", "high": "#e65100", "medium": "#f9a825", "low": "#78909c"}
#: One colour per alert category, all distinct (Plotly's default cycle has 10 colours
#: and repeated one for the 11th and 12th categories). Every chart by category uses it.
CATEGORY_COLORS = {
    "enumeration": "#1f77b4",
    "bulk_extraction": "#ff7f0e",
    "credential_stuffing": "#d62728",
    "scraping_loop": "#2ca02c",
    "tool_loop": "#9467bd",
    "privilege_chain": "#8c564b",
    "step_skip": "#e377c2",
    "duplicate_execution": "#7f7f7f",
    "cross_server_flow": "#bcbd22",
    "concurrency_abuse": "#17becf",
    "race_condition": "#393b79",
    "anomaly": "#ad494a",
}
_COMMON_ZONES = (
    "UTC",
    "Europe/London",
    "Europe/Berlin",
    "America/New_York",
    "America/Chicago",
    "America/Los_Angeles",
    "Asia/Kolkata",
    "Asia/Singapore",
    "Asia/Tokyo",
    "Australia/Sydney",
)


# ---------------------------------------------------------------- store location
def _argv_data_dir(argv: Sequence[str]) -> str | None:
    for i, a in enumerate(argv):
        if a == "--data-dir" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--data-dir="):
            return a.split("=", 1)[1]
    return None


def resolve_data_dir(argv: Sequence[str] | None = None) -> Path:
    """Store directory: ``--data-dir`` after ``--`` in ``streamlit run``, else
    ``$TOOLWATCH_DATA_DIR``, else the configuration (``toolwatch.toml``/defaults)."""
    found = _argv_data_dir(sys.argv[1:] if argv is None else argv)
    if found:
        return Path(found)
    env = os.environ.get("TOOLWATCH_DATA_DIR")
    if env:
        return Path(env)
    from toolwatch.config import load_config

    return load_config().data_dir


def data_dir() -> Path:
    """The store directory of this session (``st.session_state['toolwatch_data_dir']``
    overrides, for tests)."""
    override = st.session_state.get("toolwatch_data_dir")
    return Path(override) if override else resolve_data_dir()


@st.cache_resource(show_spinner=False)
def _store(root: str) -> Store:
    s = Store(root)
    # The configured [detectors.incidents] windows and bands, as `toolwatch incidents`.
    try:
        from toolwatch.detectors.config import DetectorsConfig

        from toolwatch.config import load_config

        s.incident_config = DetectorsConfig.from_dict(load_config().detectors).incidents
    except Exception:  # a bad config file is reported by the CLI; defaults here
        s.incident_config = None
    return s


def store() -> Store:
    """The :class:`~toolwatch.store.Store` (reader side only; never writes)."""
    return _store(str(data_dir()))


@st.cache_data(ttl=CACHE_TTL_S, show_spinner=False, max_entries=512)
def _cached(name: str, root: str, args: tuple[Any, ...], kwargs: tuple[Any, ...]) -> Any:
    fn: Callable[..., Any] = getattr(data, name)
    return fn(_store(root), *args, **dict(kwargs))


def q(name: str, *args: Any, **kwargs: Any) -> Any:
    """Call ``dashboard.data.<name>(store, *args, **kwargs)``, cached for a moment."""
    return _cached(name, str(data_dir()), args, tuple(sorted(kwargs.items())))


# ---------------------------------------------------------------- sidebar settings
def zone_options(browser_tz: str | None) -> list[str]:
    """Time zones for the picker: the browser's first, then common ones, then the rest."""
    first = [z for z in (browser_tz, *_COMMON_ZONES) if z]
    rest = sorted(zoneinfo.available_timezones() - set(first))
    return list(dict.fromkeys(first)) + rest


def timezone() -> str:
    """The zone chosen in the sidebar (``UTC`` until the sidebar ran)."""
    tz = st.session_state.get("tz") or "UTC"
    try:
        zoneinfo.ZoneInfo(tz)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return "UTC"
    return tz


def refresh_every() -> float | None:
    """Live-refresh interval in seconds, or ``None`` when live refresh is off."""
    if not st.session_state.get("live", True):
        return None
    return float(st.session_state.get("refresh_s", DEFAULT_REFRESH_S))


def sidebar() -> None:
    """Time zone, live refresh and store location widgets (run by the entry point)."""
    with st.sidebar:
        browser = None
        try:
            browser = st.context.timezone
        except Exception:
            browser = None
        zones = zone_options(browser)
        if "tz" not in st.session_state:
            st.session_state["tz"] = browser if browser in zones else "UTC"
        st.selectbox("Time zone", zones, key="tz", help="Times in tables and charts.")
        st.toggle(
            "Live refresh",
            key="live",
            value=True,
            help="Re-query the overview and the flagged list while ingest runs.",
        )
        st.selectbox(
            "Refresh every (s)",
            REFRESH_CHOICES,
            key="refresh_s",
            index=REFRESH_CHOICES.index(DEFAULT_REFRESH_S),
            disabled=not st.session_state.get("live", True),
        )
        st.text(f"Store: {data_dir()}")


# ---------------------------------------------------------------- rendering helpers
#: Every ASCII punctuation character: CommonMark lets each be backslash-escaped, which
#: turns off links/images (``![x](url)``), emphasis, HTML (``<img``), Streamlit's
#: ``:color[…]``/``:material/…:`` directives and ``$…$`` math alike.
_MD_SPECIAL = re.compile(r"([!-/:-@\[-`{-~])")


def md_text(value: Any) -> str:
    """A log-derived value as Markdown that renders as exactly its (escaped) text.

    For the few places whose API only takes Markdown — ``st.error``/``st.warning``
    messages, widget labels, ``help`` — when they must quote a logged value. Control and
    invisible characters are shown as escapes (:func:`toolwatch.output.safe_text`), then
    every punctuation character (the backslashes of those escapes too) is
    backslash-escaped, so no Markdown construct can start.
    """
    return _MD_SPECIAL.sub(r"\\\1", safe_text(value))


def option_text(value: Any) -> str:
    """A picker option (``selectbox``/``multiselect`` ``format_func``) as shown.

    Options are drawn as plain text, but a logged tool name, caller or id may carry bidi
    overrides (``\u202e`` reverses what follows), zero-width or control characters that
    make one option read as another: those are shown as escapes
    (:func:`toolwatch.output.safe_text`). The option's value stays the logged string.
    """
    return safe_text(value)


def error(message: Any) -> None:
    """``st.error`` with ``message`` (which may quote logged values) as plain text."""
    st.error(md_text(message))


def plot_text(value: Any) -> str:
    """Escape a log string for Plotly, which interprets tags like ``<a>``/``<b>``.

    Plotly turns the entities back into the literal characters, so the label reads
    exactly as logged.
    """
    return html.escape("" if value is None else str(value), quote=False)


def plot_safe(df: pl.DataFrame, columns: Sequence[str]) -> pl.DataFrame:
    """:func:`plot_text` applied to string columns of ``df``."""
    return df.with_columns(
        pl.col(c).cast(pl.Utf8).map_elements(plot_text, return_dtype=pl.Utf8)
        for c in columns
        if c in df.columns
    )


def fmt_bytes(n: float | int | None) -> str:
    """Human-readable byte count (``1.2 MB``)."""
    if n is None:
        return "–"
    v = float(n)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(v) < 1000 or unit == "TB":
            return f"{v:,.0f} {unit}" if unit == "B" else f"{v:,.1f} {unit}"
        v /= 1000
    return f"{v:,.1f} TB"  # pragma: no cover


def fmt_time(ts: datetime | None, tz: str | None = None) -> str:
    """A UTC timestamp as ``YYYY-MM-DD HH:MM:SS`` in the chosen zone."""
    if ts is None:
        return "–"
    zone = zoneinfo.ZoneInfo(tz or timezone())
    return ts.astimezone(zone).strftime("%Y-%m-%d %H:%M:%S")


def tz_caption() -> None:
    """State the display zone once per page."""
    st.caption(f"Times shown in {timezone()}.")


def table(
    df: pl.DataFrame,
    *,
    key: str | None = None,
    select: bool = False,
    height: int | str = "auto",
    column_config: dict[str, Any] | None = None,
    column_order: Sequence[str] | None = None,
) -> Any:
    """A sortable table with times in the chosen zone; returns the selection if ``select``.

    Cell values are drawn as text by the grid, so log strings are safe here.
    """
    shown = data.to_timezone(df, timezone())
    cfg: dict[str, Any] = {
        c: st.column_config.DatetimeColumn(c, format="YYYY-MM-DD HH:mm:ss")
        for c, t in shown.schema.items()
        if isinstance(t, pl.Datetime)
    }
    cfg.update(column_config or {})
    kwargs: dict[str, Any] = {
        "hide_index": True,
        "column_config": cfg,
        "height": height,
        "key": key,
        "column_order": column_order,
    }
    if select:
        # A fresh key after every page switch: a row clicked to navigate away must not
        # still be selected (and navigate again) when the analyst comes back.
        kwargs["key"] = f"{key}_{st.session_state.get('_nav_nonce', 0)}"
        return st.dataframe(shown, on_select="rerun", selection_mode="single-row", **kwargs)
    st.dataframe(shown, **kwargs)
    return None


def selected_row(event: Any, df: pl.DataFrame) -> dict[str, Any] | None:
    """The row a user clicked in a :func:`table` with ``select=True``."""
    try:
        rows = event.selection.rows if event is not None else []
    except AttributeError:
        rows = (event or {}).get("selection", {}).get("rows", [])
    if not rows or rows[0] >= df.height:
        return None
    return df.row(rows[0], named=True)


def plotly(fig: Any, *, key: str | None = None) -> None:
    """Render a Plotly figure without the logo/toolbar clutter."""
    fig.update_layout(margin={"l": 10, "r": 10, "t": 40, "b": 10})
    st.plotly_chart(fig, key=key, config={"displaylogo": False, "displayModeBar": "hover"})


def time_bars(fig: Any, bucket: str, counts: pl.DataFrame | None = None, y: str = "") -> Any:
    """Give time-bucketed bars their bucket's width on the time axis; whole-number ticks.

    Parameters
    ----------
    counts, y
        The plotted frame and its count column, to use unit ticks for small counts.
    """
    widths = {"minute": 60_000, "hour": 3_600_000, "day": 86_400_000}
    fig.update_traces(width=0.85 * widths.get(bucket, 3_600_000), offset=0)
    fig.update_yaxes(rangemode="tozero")
    if counts is not None and counts.height and y in counts.columns:
        peak = counts.group_by("bucket").agg(pl.col(y).sum())[y].max()
        if peak is not None and peak <= 8:  # type: ignore[operator]
            fig.update_yaxes(dtick=1)
    return fig


def default_actor() -> str:
    """Who is triaging: the OIDC user's e-mail, ``$TOOLWATCH_ANALYST`` or the OS user."""
    try:
        if st.user.get("is_logged_in"):
            return str(st.user.get("email") or st.user.get("name") or "")
    except Exception:  # noqa: S110 - st.user unavailable outside a server
        pass
    env = os.environ.get("TOOLWATCH_ANALYST")
    if env:
        return env
    try:
        return getpass.getuser()
    except Exception:
        return "analyst"


def _bump_nav_nonce() -> None:
    st.session_state["_nav_nonce"] = st.session_state.get("_nav_nonce", 0) + 1


def open_session(session_id: str | None = None, alert_id: str | None = None) -> None:
    """Switch to the session detail page for a session or an alert."""
    params = {k: v for k, v in (("session", session_id), ("alert", alert_id)) if v}
    _bump_nav_nonce()
    st.switch_page(PAGES["session"], query_params=params)


def open_incident(incident_id: str) -> None:
    """Switch to the incident page for one incident."""
    _bump_nav_nonce()
    st.switch_page(PAGES["incident"], query_params={"incident": incident_id})


def open_entity(entity_type: str, entity_id: str) -> None:
    """Switch to the entity page for a caller or client address."""
    _bump_nav_nonce()
    st.switch_page(PAGES["entity"], query_params={"type": entity_type, "id": entity_id})


def query_param(name: str) -> str | None:
    """One query parameter's value (``None`` if absent or empty)."""
    val = st.query_params.get(name)
    return val or None


# ---------------------------------------------------------------- triage-aware alert list
def triage_store() -> Any:
    """The :class:`~toolwatch.dashboard.triage.TriageStore` of this store (never cached: verdicts
    must show at once)."""
    from toolwatch.dashboard.triage import TriageStore

    return TriageStore(data_dir())


def incidents() -> pl.DataFrame:
    """Every incident with its current triage status, riskiest first.

    The verdicts are read fresh (a small SQLite read) and passed to the cached roll-up as
    arguments: a verdict just saved changes the cache key, so the status shows at once.
    """
    from toolwatch.triage_store import alert_statuses, incident_statuses

    by_alert = tuple(sorted(alert_statuses(data_dir()).items()))
    by_incident = tuple(sorted(incident_statuses(data_dir()).items()))
    return q("list_incidents", by_alert, by_incident)


def alerts(flt: data.AlertFilter | None = None) -> pl.DataFrame:
    """Alerts matching ``flt`` with their current triage status, most severe first."""
    import dataclasses

    flt = flt or data.AlertFilter()
    base = q("list_alerts", dataclasses.replace(flt, statuses=()))
    base = base.drop(
        [c for c in ("status", "triaged_by", "triaged_at", "note") if c in base.columns]
    )
    df = data.attach_triage(base, triage_store().current_frame())
    from toolwatch.detectors.suppress import load_suppressions, suppressed_by

    rules = load_suppressions(data_dir())
    df = df.with_columns(suppressed_by(df, rules))
    if flt.statuses:
        df = df.filter(pl.col("status").is_in(list(flt.statuses)))
    return data.sort_alerts(df)
