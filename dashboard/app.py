"""Entry point of the toolwatch dashboard (``toolwatch dashboard`` runs it).

Run directly with ``streamlit run dashboard/app.py -- --data-dir DIR``. Pages live in
``dashboard/views/``; shared helpers in :mod:`toolwatch.dashboard.ui`; queries in
:mod:`toolwatch.dashboard.data`.

Access control: if ``$TOOLWATCH_DASHBOARD_PASSWORD`` is set, every session must enter it
first. If ``$TOOLWATCH_DASHBOARD_AUTH=oidc`` and ``.streamlit/secrets.toml`` has an
``[auth]`` section, users log in with OpenID Connect (``st.login``) instead.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from pathlib import Path

import streamlit as st
from toolwatch.dashboard import ui
from toolwatch.dashboard.launch import LOGIN_THROTTLE, PROXY_HEADER_ENV, client_address

ICON = Path(__file__).resolve().parent / "icon.png"


def _client_address() -> str | None:
    """The client's address: the trusted proxy header's when configured, else the peer's."""
    try:
        addr = st.context.ip_address
    except Exception:  # no client context
        addr = None
    peer = addr if isinstance(addr, str) else None  # None on localhost (and in AppTest)
    header = os.environ.get(PROXY_HEADER_ENV, "")
    if not header:
        return peer
    try:
        headers = dict(st.context.headers)
    except Exception:  # no request context
        headers = {}
    return client_address(peer, headers, header)


def _password_gate() -> bool:
    """Ask for the shared password once per session; True when access is granted.

    Wrong guesses are throttled per client address and for the whole process
    (:data:`toolwatch.dashboard.launch.LOGIN_THROTTLE`), not per browser session: during a
    back-off an attempt is held before it is checked, but the right password is never
    refused (so nobody can lock the analysts out by failing on purpose).
    """
    expected = os.environ.get("TOOLWATCH_DASHBOARD_PASSWORD", "")
    if not expected or st.session_state.get("_authed"):
        return True
    st.title("toolwatch")
    with st.form("login"):
        pw = st.text_input("Password", type="password")
        ok = st.form_submit_button("Sign in")
    if ok:
        good, _held = LOGIN_THROTTLE.attempt(
            _client_address(),
            lambda: hmac.compare_digest(
                hashlib.sha256(pw.encode()).digest(), hashlib.sha256(expected.encode()).digest()
            ),
        )
        if good:
            st.session_state["_authed"] = True
            st.rerun()
        st.error("Wrong password.")
    return False


def _oidc_gate() -> bool:
    """Require an OpenID Connect login when configured; True when access is granted."""
    if os.environ.get("TOOLWATCH_DASHBOARD_AUTH", "").lower() != "oidc":
        return True
    if st.user.get("is_logged_in"):
        with st.sidebar:
            st.button("Log out", on_click=st.logout)
        return True
    st.title("toolwatch")
    st.button("Log in", on_click=st.login)
    return False


def main() -> None:
    """Configure the page, check access, build the navigation and run the chosen page."""
    # A bundled file: a ``:material/…:`` page icon makes the browser fetch the favicon
    # from fonts.gstatic.com (the in-page icons below use the font Streamlit serves).
    # Navigation on top and the settings sidebar collapsed: the incident queue needs the
    # full 1440 px width to show who, stages, risk, status and the action without
    # horizontal scrolling (the sidebar's » opens time zone and live-refresh settings).
    st.set_page_config(
        page_title="toolwatch",
        page_icon=str(ICON),
        layout="wide",
        initial_sidebar_state="collapsed",
    )
    if not (_oidc_gate() and _password_gate()):
        st.stop()
    pages = [
        st.Page(ui.PAGES[path], title=title, icon=f":material/{icon}:", url_path=path,
                default=path == "incidents")
        for path, title, icon in (
            ("incidents", "Incidents", "crisis_alert"),
            ("incident", "Incident detail", "assignment_late"),
            ("overview", "Overview", "monitoring"),
            ("flagged", "Flagged sessions", "flag"),
            ("session", "Session detail", "timeline"),
            ("entity", "Entity", "person_search"),
            ("forensics", "Forensics (SQL)", "database"),
        )
    ]
    nav = st.navigation(pages, position="top")
    ui.sidebar()
    nav.run()


main()
