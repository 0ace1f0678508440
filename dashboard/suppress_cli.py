"""``toolwatch suppress``: make, list and delete triage suppression rules from the shell.

The rules are the dashboard's (``<data_dir>/_triage/suppressions.json``, format in
:mod:`toolwatch.dashboard.triage`); batch ``analyze`` and live ``tail``/``kafka`` apply
them to the alerts they emit, a running tail from its next flush on.
"""

from __future__ import annotations

import getpass
import os
from pathlib import Path
from typing import Annotated

import typer

from toolwatch.cli_common import ConfigOpt, DataDirOpt, config_for, fail
from toolwatch.output import json_dumps, safe_text

suppress_app = typer.Typer(
    no_args_is_help=True,
    help="Suppression rules: silence an actor, server, tool or category, with an expiry.",
)


def _store_dir(config: Path | None, data_dir: Path | None) -> Path:
    root = Path(config_for(config, data_dir).data_dir)
    if not (root / "_state").is_dir():
        raise fail(ValueError(
            f"no toolwatch store at {root} (check -d / $TOOLWATCH_DATA_DIR)"), 1)
    return root


def _who() -> str:
    env = os.environ.get("TOOLWATCH_ANALYST")
    if env:
        return env
    try:
        return getpass.getuser()
    except Exception:  # no passwd entry (containers)
        return "cli"


@suppress_app.command("add")
def add(
    config: ConfigOpt = None,
    data_dir: DataDirOpt = None,
    caller: Annotated[str | None, typer.Option(help="Caller id (exact).")] = None,
    address: Annotated[str | None, typer.Option(help="Client address (exact).")] = None,
    server: Annotated[str | None, typer.Option(help="Server (exact).")] = None,
    tool: Annotated[str | None, typer.Option(help="Tool the alert is about (exact).")] = None,
    category: Annotated[str | None, typer.Option(help="Alert category.")] = None,
    expires: Annotated[
        str | None,
        typer.Option(help="When the rule stops: 30m, 12h, 7d, 2w, an ISO time, or never."),
    ] = None,
    note: Annotated[str, typer.Option(help="Why (ticket, approval).")] = "",
    by: Annotated[
        str | None, typer.Option(help="Who decided (default $TOOLWATCH_ANALYST, else user).")
    ] = None,
    fmt: Annotated[str, typer.Option("--format", "-f", help="text | json")] = "text",
) -> None:
    """Add a rule: alerts matching every given field are dropped until it expires.

    Example: toolwatch suppress add -d STORE --caller svc-nightly-export
    --category bulk_extraction --expires 7d --note "CHG-1234"
    """
    from dataclasses import asdict

    from toolwatch.detectors.config import CATEGORIES
    from toolwatch.detectors.suppress import add_suppression, parse_expiry

    if category is not None and category not in CATEGORIES:
        raise fail(ValueError(f"--category must be one of {', '.join(CATEGORIES)}"), 2)
    if fmt not in ("text", "json"):
        raise fail(ValueError(f"unknown format {fmt!r}: use text or json"), 2)
    if not any((caller, address, server, tool, category)):
        raise fail(ValueError(
            "give a scope: --caller, --address, --server, --tool and/or --category"), 2)
    try:
        when = parse_expiry(expires)
    except ValueError as exc:
        raise fail(exc, 2) from None
    root = _store_dir(config, data_dir)
    try:
        rule = add_suppression(
            root, caller_id=caller, client_ip=address, server=server, tool=tool,
            category=category, expires_at=when, note=note, created_by=by or _who(),
        )
    except ValueError as exc:
        raise fail(exc, 2) from None
    if fmt == "json":
        print(json_dumps(asdict(rule)))
        return
    until = rule.expires_at or "never"
    print(safe_text(f"{rule.id}: suppress {rule.scope_text()} until {until}"))


@suppress_app.command("list")
def list_rules(
    config: ConfigOpt = None,
    data_dir: DataDirOpt = None,
    all_: Annotated[bool, typer.Option("--all", help="Expired rules too.")] = False,
    fmt: Annotated[str, typer.Option("--format", "-f", help="text | json")] = "text",
) -> None:
    """List the rules (active ones unless --all)."""
    from dataclasses import asdict

    from toolwatch.detectors.suppress import load_suppressions

    if fmt not in ("text", "json"):
        raise fail(ValueError(f"unknown format {fmt!r}: use text or json"), 2)
    rules = load_suppressions(_store_dir(config, data_dir))
    shown = [r for r in rules if all_ or not r.expired()]
    if fmt == "json":
        print(json_dumps([{**asdict(r), "expired": r.expired()} for r in shown]))
        return
    if not shown:
        print("no suppression rules" + ("" if all_ else " in force (--all for expired ones)"))
        return
    for r in shown:
        state = "EXPIRED " if r.expired() else ""
        line = (f"{r.id}  {state}{r.scope_text()}  until {r.expires_at or 'never'}  "
                f"by {r.created_by}  {r.note}")
        print(safe_text(line.rstrip()))


@suppress_app.command("rm")
def rm(
    rule_id: Annotated[str, typer.Argument(help="The rule's id (sup-…).")],
    config: ConfigOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Delete a rule by id (exit 1 if there is none)."""
    from toolwatch.detectors.suppress import remove_suppression

    if not remove_suppression(_store_dir(config, data_dir), rule_id):
        raise fail(ValueError(f"no suppression rule {rule_id!r}"), 1)
    print(safe_text(f"removed {rule_id}"))
