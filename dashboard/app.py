"""Entry point of the toolwatch dashboard (``toolwatch dashboard`` runs it).

Run directly with ``streamlit run dashboard/app.py -- --data-dir DIR``. Pages live in
``dashboard/views/``; shared helpers in :mod:`dashboard.ui`; queries in
:mod:`dashboard.data`.

Access control: if ``$TOOLWATCH_DASHBOARD_PASSWORD`` is set, every session must enter it
first. If ``$TOOLWATCH_DASHBOARD_AUTH=oidc`` and ``.streamlit/secrets.toml`` has an
``[auth]`` section, users log in with OpenID Connect (``st.login``) instead.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import sys
import time
from pathlib import Path

try:
    import dashboard  # noqa: F401
except ImportError:  # run from a checkout without an install
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import streamlit as st

from dashboard import ui


def _password_gate() -> bool:
    """Ask for the shared password once per session; True when access is granted."""
    expected = os.environ.get("TOOLWATCH_DASHBOARD_PASSWORD", "")
    if not expected or st.session_state.get("_authed"):
        return True
    st.title("toolwatch")
    with st.form("login"):
        pw = st.text_input("Password", type="password")
        ok = st.form_submit_button("Sign in")
    if ok:
        good = hmac.compare_digest(
            hashlib.sha256(pw.encode()).digest(), hashlib.sha256(expected.encode()).digest()
        )
        if good:
            st.session_state["_authed"] = True
            st.rerun()
        time.sleep(1.0)  # slow down guessing
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
    st.set_page_config(page_title="toolwatch", page_icon=":material/shield:", layout="wide")
    if not (_oidc_gate() and _password_gate()):
        st.stop()
    pages = [
        st.Page(
            ui.PAGES["overview"],
            title="Overview",
            icon=":material/monitoring:",
            url_path="overview",
            default=True,
        ),
        st.Page(
            ui.PAGES["flagged"],
            title="Flagged sessions",
            icon=":material/flag:",
            url_path="flagged",
        ),
        st.Page(
            ui.PAGES["session"],
            title="Session detail",
            icon=":material/timeline:",
            url_path="session",
        ),
        st.Page(
            ui.PAGES["entity"], title="Entity", icon=":material/person_search:", url_path="entity"
        ),
        st.Page(
            ui.PAGES["forensics"],
            title="Forensics (SQL)",
            icon=":material/database:",
            url_path="forensics",
        ),
    ]
    nav = st.navigation(pages)
    ui.sidebar()
    nav.run()


main()
