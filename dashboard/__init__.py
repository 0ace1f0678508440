"""Streamlit dashboard and data layer for reviewing toolwatch alerts.

``dashboard.data`` holds every query (plain functions returning polars frames),
``dashboard.triage`` the analysts' verdicts and suppression rules, ``dashboard.app`` the
Streamlit entry point and ``dashboard.views`` one module per page. ``toolwatch dashboard``
(:func:`toolwatch.dashboard.launch.dashboard_command`) starts it.
"""
