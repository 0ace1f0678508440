"""Transform ``normalize`` (outcomes): map logged status values to :data:`OUTCOMES`.

Servers spell outcomes in many ways (``success``, ``OK``, ``200``, ``PERMISSION_DENIED``,
``invalid api key`` …). A batch holds only a handful of distinct spellings, so the rules
run once per *distinct* value (Arrow dictionary encoding), never per row: a regex per row
cost more than the JSON parse itself.
"""

from __future__ import annotations

import re

import pyarrow as pa
import pyarrow.compute as pc
from toolwatch.ingest import arrays

_OK, _ERROR, _UNKNOWN = (arrays.scalar(s) for s in ("ok", "error", "unknown"))

# Exact spellings seen in the wild, checked before any normalization.
_FAST: dict[str, str] = {
    **dict.fromkeys(("ok", "OK", "success", "SUCCESS", "succeeded", "200", "true"), "ok"),
    **dict.fromkeys(("error", "ERROR", "failed", "failure", "500", "502", "503"), "error"),
    **dict.fromkeys(("not_found", "NOT_FOUND", "notfound", "404", "Not Found"), "not_found"),
    **dict.fromkeys(
        ("denied", "forbidden", "403", "permission_denied", "access_denied"), "denied"
    ),
    **dict.fromkeys(
        ("auth_failed", "unauthorized", "401", "invalid_api_key", "unauthenticated"),
        "auth_failed",
    ),
    **dict.fromkeys(("rate_limited", "429", "throttled", "too_many_requests"), "rate_limited"),
}
_OK_WORDS = frozenset(
    ("ok", "success", "succeeded", "successful", "completed", "complete", "done", "true")
)
# ASCII classes on purpose: a status is a protocol token, not prose.
_A = re.ASCII
_SEP = re.compile(r"[\s\-]+", _A)
_RULES: tuple[tuple[str, str | None, re.Pattern[str]], ...] = (
    ("not_found", "404", re.compile(r"not_?found|no_such|missing|does_not_exist", _A)),
    (
        "auth_failed",
        "401",
        re.compile(
            r"auth\w*_?fail|unauthori[sz]ed|unauthenticated|invalid_?(api_?)?key|invalid_?token"
            r"|invalid_?credential|bad_?credential|authentication",
            _A,
        ),
    ),
    ("denied", "403", re.compile(r"denied|forbidden|permission|not_?allowed", _A)),
    ("rate_limited", "429", re.compile(r"rate_?limit|throttl|too_?many|quota", _A)),
)
_OK_CODE = re.compile(r"2\d\d", _A)
_ERR_CODE = re.compile(r"[45]\d\d", _A)
_ERR_WORDS = re.compile(r"err|fail|exception|timeout|invalid", _A)


def normalize_status(raw: str | None) -> str | None:
    """One logged status value -> an outcome, ``unknown``, or None when empty/absent.

    Parameters
    ----------
    raw
        The value as logged (``status`` / ``outcome`` field, or a JSON-RPC error text).

    Returns
    -------
    str or None
        ``ok``, ``error``, ``not_found``, ``denied``, ``auth_failed``, ``rate_limited``,
        ``unknown`` (a value no rule recognises), or None (nothing was logged).
    """
    if raw is None:
        return None
    fast = _FAST.get(raw)
    if fast is not None:
        return fast
    s = _SEP.sub("_", raw.strip(" ").lower())
    if not s:
        return None
    if s in _OK_WORDS or _OK_CODE.fullmatch(s):
        return "ok"
    for outcome, code, pattern in _RULES:
        if s == code or pattern.search(s):
            return outcome
    if _ERR_CODE.fullmatch(s) or _ERR_WORDS.search(s):
        return "error"
    return "unknown"


def outcome_column(status_raw: pa.ChunkedArray | pa.Array, is_error: pa.ChunkedArray | pa.Array
                   ) -> pa.Array:
    """The ``status`` column: the logged value's outcome, else the error flag, else unknown.

    Rules run once per distinct value of ``status_raw`` (dictionary encoding), so a batch
    costs O(rows) in Arrow kernels plus O(distinct values) in Python.
    """
    if len(status_raw) == 0:  # (combine_chunks of no chunks calls pa.array: pandas)
        return arrays.strings([])
    if isinstance(status_raw, pa.ChunkedArray):
        status_raw = status_raw.combine_chunks()
    enc = pc.dictionary_encode(status_raw)
    # A value that says nothing usable maps to null, so the error flag decides.
    mapped = arrays.strings(
        [o if (o := normalize_status(v)) != "unknown" else None
         for v in enc.dictionary.to_pylist()]
    )
    from_value = pc.take(mapped, enc.indices)
    from_flag = pc.if_else(is_error, _ERROR, _OK)
    return pc.coalesce(from_value, from_flag, _UNKNOWN)
