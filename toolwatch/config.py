"""Typed configuration.

Config lives in a TOML file (``--config``, ``$TOOLWATCH_CONFIG`` or ``./toolwatch.toml``)
whose tables map onto the dataclasses below. Unknown keys are rejected with the file and
the dotted key named, so a typo never silently falls back to a default. Every field
carries its documentation in ``metadata["doc"]``; ``toolwatch config`` prints them.

Secrets are never defaulted in code: the HMAC key comes from ``$TOOLWATCH_HMAC_KEY`` or a
key file outside the store, generated on first run (see :mod:`toolwatch.ingest.secrets`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from toolwatch.errors import ConfigError

T = TypeVar("T")


def available_cpus() -> int:
    """CPUs this process may run on (its affinity mask, e.g. a container's cpuset), not
    the machine's count: machine-shaped defaults (``0`` = auto) resolve through this."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


def auto_count(value: int, cap: int | None = None) -> int:
    """``value``, or for ``0`` the CPUs available (:func:`available_cpus`), at most ``cap``."""
    if value > 0:
        return value
    n = available_cpus()
    return min(n, cap) if cap else n


def doc(
    text: str,
    default: Any = dataclasses.MISSING,
    factory: Any = dataclasses.MISSING,
    *,
    tuning: bool = False,
) -> Any:
    """Declare a dataclass field with its user-facing documentation.

    ``tuning=True`` marks a performance knob (memory, threads, batch sizes): it is
    documented apart and may be set under ``[tuning.<section>]`` (:func:`merge_tuning`).
    """
    meta = {"doc": text, "tuning": tuning}
    if factory is not dataclasses.MISSING:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def is_tuning(f: dataclasses.Field[Any]) -> bool:
    """Whether a config field is a performance knob (see :func:`doc`)."""
    return bool(f.metadata.get("tuning"))


#: Sections whose performance knobs ``[tuning.<section>]`` may set.
TUNING_SECTIONS = ("store", "ingest", "query", "analyze", "live")


def merge_tuning(data: dict[str, Any], path: str | None = None) -> dict[str, Any]:
    """``data`` (a parsed config file) with ``[tuning.<section>]`` keys moved into their
    section, where the section's parser reads them as usual. The ``tuning`` table itself
    is kept, so a layer parsing a plain-table section (``live``) can check that only its
    knobs were set there (:func:`check_tuning`).

    Raises
    ------
    ConfigError
        On an unknown section, a tuning table that is not a table, or a key set both
        under ``[tuning.<section>]`` and in ``[<section>]``.
    """
    tuning = data.get("tuning")
    if tuning is None:
        return data
    if not isinstance(tuning, dict):
        raise ConfigError("expected a table", path=path, key="tuning")
    out = dict(data)
    for section, table in tuning.items():
        if section not in TUNING_SECTIONS:
            raise ConfigError(f"unknown section; known: {', '.join(TUNING_SECTIONS)}",
                              path=path, key=f"tuning.{section}")
        if not isinstance(table, dict):
            raise ConfigError("expected a table", path=path, key=f"tuning.{section}")
        own = dict(out.get(section) or {})
        both = sorted(set(own) & set(table))
        if both:
            raise ConfigError(f"set both here and in [{section}]", path=path,
                              key=f"tuning.{section}.{both[0]}")
        out[section] = {**own, **table}
    return out


def check_tuning(cls: type, keys: Any, section: str, path: str | None = None) -> None:
    """Refuse a ``[tuning.<section>]`` key that is not a performance knob of ``cls``."""
    knobs = {f.name for f in dataclasses.fields(cls) if is_tuning(f)}  # type: ignore[arg-type]
    for key in keys or ():
        if key not in knobs:
            raise ConfigError(
                f"not a tuning key (set it in [{section}]); tuning keys: "
                f"{', '.join(sorted(knobs))}", path=path, key=f"tuning.{section}.{key}")


def _default_key_file() -> str:
    from toolwatch.keys import default_key_file

    return default_key_file()


@dataclass
class StoreConfig:
    """Where and how events are kept."""

    data_dir: str = doc(
        "The forensic store: a directory (Delta Lake tables + this machine's state), or "
        "s3://bucket/prefix for tables on S3-compatible storage shared by several "
        "machines (each keeps its own state in state_dir). Env: TOOLWATCH_DATA_DIR.",
        ".toolwatch/data",
    )
    state_dir: str = doc(
        "With an s3:// data_dir: this machine's state (live status, triage, spools). "
        "Empty: ~/.toolwatch/state/s3/<bucket>_<prefix>.",
        "",
    )
    endpoint_url: str = doc(
        "With an s3:// data_dir: the S3-compatible endpoint (MinIO, Ceph, a test "
        "server). Empty: AWS, or $AWS_ENDPOINT_URL. Credentials come only from the "
        "environment ($AWS_ACCESS_KEY_ID/$AWS_SECRET_ACCESS_KEY or a profile).",
        "",
    )
    region: str = doc("With an s3:// data_dir: the bucket's region (empty: $AWS_REGION).", "")
    allow_http: bool = doc(
        "With an s3:// data_dir: allow a plain-HTTP endpoint (a test server on loopback).",
        False,
    )
    compact_min_files: int = doc(
        "A table with at least this many small files has them merged (live: a few merges "
        "per commit; ingest: at the end).",
        16,
        tuning=True,
    )
    vacuum_hours: float = doc(
        "Files a compaction replaced are deleted this many hours later. A reader that "
        "listed the table before the compaction (a long query, Spark) can read them until "
        "then (Delta time travel: see docs/store.md).",
        1.0,
    )


@dataclass
class IngestConfig:
    """How raw log lines become events."""

    max_line_bytes: int = doc(
        "Lines longer than this are quarantined (reason line_too_long), never parsed.", 1_048_576
    )
    chunk_bytes: int = doc(
        "Bytes read per batch from a file; memory use is a small multiple of this.",
        16_777_216,
        tuning=True,
    )
    parse_workers: int = doc(
        "Batches parsed at once by ingest/analyze (one single-threaded DuckDB connection "
        "each); memory use grows by about one chunk per worker. 0: one per CPU this "
        "process may run on, at most 4.",
        0,
        tuning=True,
    )
    session_gap_minutes: float = doc(
        "Events without a session id are grouped per caller (else client address) into "
        "sessions that end after this much inactivity.",
        30.0,
    )
    quarantine_raw_chars: int = doc(
        "Quarantined raw lines are kept up to this many characters.", 4096
    )
    max_depth: int = doc(
        "Nesting limit of a line's JSON (objects/arrays, the line's own object counted): "
        "a deeper line keeps its event, with args stored truncated as "
        '{"_truncated": "<first 1024 chars>"} and flag too_deep.',
        32,
    )
    ts_marks: str = doc(
        "What a per-call line's single timestamp marks when it also carries a duration: "
        "'end' (the call's completion, as access logs do: start = ts - duration) or "
        "'start' (end = ts + duration). Explicit start/end fields and JSON-RPC "
        "request/response times need no such choice.",
        "end",
    )
    field_aliases: dict[str, list[str]] = doc(
        "Extra source field names per canonical field, tried after the built-in aliases, "
        "e.g. {tool = ['op']}. Dotted names are literal keys; use a/b for nesting.",
        factory=dict,
    )
    secret_keys: list[str] = doc(
        "Extra secret key names, beyond the built-in vocabulary (docs/log-format.md, "
        "Secrets): a key whose name, lower-cased with separators removed, contains one of "
        "these (normalized the same way) has its value replaced by a keyed hash.",
        factory=list,
    )
    secret_key_exceptions: list[str] = doc(
        "Key names never treated as secret although they contain a secret word (compared "
        "lower-cased with separators removed, e.g. 'token_budget'); added to the built-in "
        "exceptions (authFailures, max_tokens and other token counters).",
        factory=list,
    )


@dataclass
class SecretsConfig:
    """Where the HMAC key for hashing secrets comes from."""

    hmac_key_file: str = doc(
        "File holding the HMAC key (hex). Generated with mode 0600 on first run if missing. "
        "Kept outside the store so the store alone cannot be brute-forced. "
        "Env TOOLWATCH_HMAC_KEY (hex) takes precedence.",
        factory=_default_key_file,
    )


@dataclass
class QueryConfig:
    """Bounds of analysts' SQL (``toolwatch query``, the dashboard's Forensics page)."""

    memory_limit_mb: int = doc(
        "DuckDB memory limit per query, MiB. Nothing spills to disk: a query that needs "
        "more fails with an out-of-memory error.",
        1024,
    )
    memory_limit_mib: int = doc(
        "OS memory cap of the child process each query runs in (RLIMIT_AS above the "
        "child's start-up size), MiB. DuckDB's memory_limit does not cover list and string "
        "values; this does: a query that allocates more fails, or its child dies, and the "
        "caller is unharmed.",
        1024,
    )
    threads: int = doc(
        "DuckDB threads per query. 0: one per CPU this process may run on.", 0, tuning=True
    )
    timeout_seconds: float = doc(
        "A query running longer than this is killed (SIGKILL of its child process) and "
        "fails.",
        60.0,
    )
    max_result_mib: int = doc(
        "Bytes of result (Arrow IPC) a query hands back at most, MiB; a bigger result is "
        "cut and reported as truncated. The result is printed (escaped) by the command or "
        "dashboard itself, outside the query child's memory cap, where text can take ~6x "
        "its Arrow size.",
        64,
    )
    max_columns: int = doc("A query returning more columns than this is refused.", 1000)
    max_rows: int = doc(
        "Rows returned at most; a longer result is cut and reported as truncated. "
        "0 means no cap.",
        100_000,
    )


@dataclass
class AnalyzeConfig:
    """Memory bounds of ``toolwatch analyze`` (see toolwatch.analyze.run_partitioned)."""

    max_events_in_memory: int = doc(
        "Above this many events, analyze detects in hash partitions of callers (and of "
        "client addresses) read back from the store instead of holding every event; "
        "population baselines are then fitted on a uniform sample of callers. 0 = never.",
        2_500_000,
        tuning=True,
    )
    partitions: int = doc(
        "Force this many partitions (0 = chosen from max_events_in_memory). For tests "
        "and tuning.",
        0,
        tuning=True,
    )
    max_events_per_caller: int = doc(
        "In partitioned analysis, a caller with more events than this has its sessions "
        "spread over several partitions (whole sessions, by session hash), so one caller "
        "with millions of events cannot hold them all in memory at once; its windows that "
        "cross sessions then see part of its traffic. Reported in a warning with the count "
        "of callers split. 0 = max_events_in_memory / 3.",
        0,
        tuning=True,
    )


@dataclass
class DashboardConfig:
    """Settings of ``toolwatch dashboard``."""

    trusted_proxy_header: str = doc(
        "Header a reverse proxy in front of the dashboard sets to the client's address "
        "(e.g. 'X-Forwarded-For'; its last entry is used). Empty (default): the header is "
        "never trusted and the login back-off is keyed by the TCP peer address. Set it "
        "only when every request passes through that proxy: a client could forge it.",
        "",
    )


@dataclass
class TriageConfig:
    """How the suppressions analysts create in triage are applied (batch and live)."""

    suppress_unauthenticated_callers: bool = doc(
        "Whether a suppression scoped by caller also silences a caller whose events say "
        "caller_authenticated = false (a self-declared name, which anyone can claim). "
        "False (default): such a rule silences only callers the log's writer vouched for "
        "(or whose logs say nothing either way), so logging in under a suppressed "
        "caller's name does not hide an alert. True: the name alone matches.",
        False,
    )


@dataclass
class Config:
    """Root of the toolwatch configuration."""

    store: StoreConfig = doc("Forensic store settings.", factory=StoreConfig)
    ingest: IngestConfig = doc("Parsing and normalization settings.", factory=IngestConfig)
    secrets: SecretsConfig = doc("Secret hashing settings.", factory=SecretsConfig)
    query: QueryConfig = doc("Bounds of forensic SQL queries.", factory=QueryConfig)
    analyze: AnalyzeConfig = doc("Memory bounds of analyze.", factory=AnalyzeConfig)
    dashboard: DashboardConfig = doc("Dashboard settings.", factory=DashboardConfig)
    triage: TriageConfig = doc("Triage suppressions.", factory=TriageConfig)
    detectors: dict[str, Any] = doc(
        "Detector thresholds and windows (see docs/detectors.md); parsed by "
        "detectors.config.DetectorsConfig.",
        factory=dict,
    )
    live: dict[str, Any] = doc(
        "Live-mode settings (flush interval, sinks); parsed by the live pipeline.",
        factory=dict,
    )
    tuning: dict[str, Any] = doc(
        "Performance knobs by section ([tuning.live], [tuning.ingest], ...): memory "
        "bounds, threads and batch sizes, kept apart from what toolwatch does. Each is "
        "also accepted in its own section.",
        factory=dict,
    )

    @property
    def data_dir(self) -> Path:
        """The store directory as a :class:`~pathlib.Path`."""
        return Path(self.store.data_dir)

    @property
    def forest_path(self) -> Path:
        """Where ``toolwatch train`` saves the isolation forest (skops)."""
        return self.data_dir / "models" / "forest.skops"

    @property
    def trained_forest(self) -> Path | None:
        """The saved forest if there is one (detection then loads it instead of fitting)."""
        return self.forest_path if self.forest_path.exists() else None


def _check_type(value: Any, tp: Any, where: str, path: str | None) -> Any:
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError("expected a table", path=path, key=where)
        return from_dict(tp, value, path=path, prefix=where)  # type: ignore[arg-type]
    if origin in (list,):
        (item,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise ConfigError(f"expected a list, got {type(value).__name__}", path=path, key=where)
        return [_check_type(v, item, f"{where}[{i}]", path) for i, v in enumerate(value)]
    if origin in (dict,):
        _, vt = typing.get_args(tp)
        if not isinstance(value, dict):
            raise ConfigError(f"expected a table, got {type(value).__name__}", path=path, key=where)
        return {str(k): _check_type(v, vt, f"{where}.{k}", path) for k, v in value.items()}
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        for a in args:
            if a is type(None):
                continue
            try:
                return _check_type(value, a, where, path)
            except ConfigError:
                continue
        raise ConfigError(f"invalid value {value!r}", path=path, key=where)
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp in (int, float) and isinstance(value, bool):
        raise ConfigError(f"expected {tp.__name__}, got bool", path=path, key=where)
    if isinstance(tp, type) and not isinstance(value, tp):
        raise ConfigError(
            f"expected {tp.__name__}, got {type(value).__name__} {value!r}", path=path, key=where
        )
    return value


def from_dict(
    cls: type[T], data: dict[str, Any], *, path: str | None = None, prefix: str = ""
) -> T:
    """Build dataclass ``cls`` from a mapping, rejecting unknown keys and wrong types.

    Parameters
    ----------
    cls
        A dataclass type whose fields may themselves be dataclasses.
    data
        The mapping (e.g. a parsed TOML table).
    path
        File the mapping came from, for error messages.
    prefix
        Dotted key of ``data`` inside the file, for error messages.

    Raises
    ------
    ConfigError
        On an unknown key or a value of the wrong type.
    """
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(fields))
    if unknown:
        known = ", ".join(sorted(fields))
        raise ConfigError(
            f"unknown key(s) {', '.join(unknown)}; known: {known}",
            path=path,
            key=f"{prefix}.{unknown[0]}".lstrip("."),
        )
    kwargs = {
        name: _check_type(value, hints[name], f"{prefix}.{name}".lstrip("."), path)
        for name, value in data.items()
    }
    return cls(**kwargs)


def load_config(path: str | Path | None = None) -> Config:
    """Load configuration: explicit path, ``$TOOLWATCH_CONFIG``, ``./toolwatch.toml``, defaults.

    Environment overrides applied last: ``TOOLWATCH_DATA_DIR``.
    """
    chosen = path or os.environ.get("TOOLWATCH_CONFIG")
    if chosen is None and Path("toolwatch.toml").is_file():
        chosen = "toolwatch.toml"
    if chosen is None:
        cfg = Config()
    else:
        p = Path(chosen)
        if not p.is_file():
            raise ConfigError("config file not found", path=str(p))
        try:
            data = tomllib.loads(p.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"not valid TOML: {exc}", path=str(p)) from exc
        cfg = from_dict(Config, merge_tuning(data, str(p)), path=str(p))
        for section in ("store", "ingest", "query", "analyze"):
            check_tuning(type(getattr(cfg, section)), cfg.tuning.get(section), section,
                         str(p))
    env_dir = os.environ.get("TOOLWATCH_DATA_DIR")
    if env_dir:
        cfg.store.data_dir = env_dir
    return locate_store(cfg)


_REMOTE_DIR = re.compile(r"^s3a?:/+(?P<rest>[^/].*)$", re.IGNORECASE)


def locate_store(cfg: Config) -> Config:
    """Resolve an ``s3://`` ``data_dir`` to this machine's state directory.

    Everything but the tables stays local (status files, triage, spools), so the
    commands go on working with a directory. The directory records where its tables
    are (``_state/tables.json``: the URI and endpoint settings, never credentials), so
    every process started on it (dashboard, query children) finds them.
    """
    m = _REMOTE_DIR.match(cfg.store.data_dir)  # a Path() of -d s3://b/p reads s3:/b/p
    if m is None:
        return cfg
    rest = m.group("rest").strip("/")
    local = Path(cfg.store.state_dir or Path.home() / ".toolwatch" / "state" / "s3"
                 / rest.replace("/", "_")).expanduser()
    pointer = {"uri": f"s3://{rest}", "endpoint_url": cfg.store.endpoint_url,
               "region": cfg.store.region, "allow_http": cfg.store.allow_http}
    try:
        (local / "_state").mkdir(parents=True, exist_ok=True)
        path = local / "_state" / "tables.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(pointer), encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        raise ConfigError(f"cannot create the state directory {local}: {exc}",
                          key="store.state_dir") from exc
    cfg.store.data_dir = str(local)
    return cfg


def markdown_table(rows: list[tuple[str, str, str]]) -> str:
    """``(key, default, meaning)`` rows as a Markdown ``| key | default | meaning |`` table."""
    lines = ["| key | default | meaning |", "| --- | --- | --- |"]
    for key, default, text in rows:
        cell, meaning = default.replace("|", "\\|"), text.replace("|", "\\|")
        lines.append(f"| `{key}` | `{cell}` | {meaning} |")
    return "\n".join(lines)


def _portable(text: str) -> str:
    """A default as the reference prints it on any machine: this user's config directory
    (``$XDG_CONFIG_HOME``, by default ``~/.config``) as ``~/.config``."""
    xdg = os.environ.get("XDG_CONFIG_HOME")
    if xdg:
        text = text.replace(xdg.rstrip("/"), "~/.config")
    return text.replace(str(Path.home()), "~")


def describe(
    cls: type = Config, prefix: str = "", *, tuning: bool | None = None
) -> list[tuple[str, str, str]]:
    """List ``(dotted key, default, doc)`` for every field, for ``toolwatch config``.

    ``tuning``: ``False`` lists settings only, ``True`` performance knobs only (see
    :func:`doc`), ``None`` both.
    """
    rows: list[tuple[str, str, str]] = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        key = f"{prefix}.{f.name}".lstrip(".")
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            rows.extend(describe(tp, key, tuning=tuning))  # type: ignore[arg-type]
            continue
        if tuning is not None and is_tuning(f) != tuning:
            continue
        if f.default is not dataclasses.MISSING:
            default = repr(f.default)
        elif f.default_factory is not dataclasses.MISSING:
            default = _portable(repr(f.default_factory()))
        else:
            default = "(required)"
        rows.append((key, default, f.metadata.get("doc", "")))
    return rows
