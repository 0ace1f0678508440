"""Token formats and key words of a maintained secret-detection rule set.

toolwatch does not keep its own list of credential formats: it reads CredSweeper's rules
(``credsweeper/rules/config.yaml``, a pinned dependency) from the installed distribution
at import time, as data (the package, its ML model and its dependencies are never
imported), and compiles them for RE2:

* every *token format* rule (a pattern for code, not ``weak``, not an identifier rule such
  as UUID, gated by literals of 3+ characters) becomes a :class:`TokenRule`: an exact RE2
  pattern whose ``value`` group :mod:`toolwatch.secrets` hashes, and a looser copy for the
  batch prefilter. Python ``re`` constructs RE2 lacks are translated to a superset
  (look-arounds dropped, repetition bounds loosened); a pattern with a back-reference or a
  conditional is skipped and counted (:data:`RULE_COUNTS`);
* the *keyword* rules' words (``key``, ``secret``, ``token``, ``salt`` …) are
  :data:`RULE_WORDS`, the key names :mod:`toolwatch.secrets` hashes values under.

Structural rules (values under secret keys, URL credentials, name/value pairs, command
lines, file formats) stay in :mod:`toolwatch.secrets`, on top of these.
"""

from __future__ import annotations

import re
from typing import Any

try:  # google-re2 (a pyproject dependency): every rule runs in linear time
    import re2 as _re2
except ImportError:  # pragma: no cover - an environment installed before it was added
    _re2 = None

#: The maintained rule set (pinned in pyproject.toml) and its rules file.
RULES_PACKAGE = "credsweeper"
RULES_PATH = "credsweeper/rules/config.yaml"
#: Rule names that detect identifiers, not credentials (UUIDs, bucket and domain names).
_NOT_CREDENTIALS = frozenset(
    {"UUID", "Firebase Domain", "AWS S3 Bucket", "Tencent WeChat API App ID"}
)
#: Lower bound kept of a counted repetition in the batch prefilter's copy of a rule
#: (``[A-Za-z0-9]{36,255}`` → ``{8,}``: a superset, and a DFA ~30x smaller).
_PREFILTER_MIN_REPEAT = 8


class _NoRE2(ValueError):
    """A construct RE2 has no equivalent for (a back-reference, a conditional)."""


def _re2_text(pattern: str, cap: int | None) -> str:
    """A Python ``re`` pattern rewritten for RE2, as a superset of what it matches.

    Look-arounds are dropped (each only narrows a match), counted repetitions lose their
    upper bound (RE2 refuses counts above 1000) and, with ``cap``, have their lower bound
    cut to ``cap``. Raises :class:`_NoRE2` for back-references and conditionals."""
    from re import _constants as c  # type: ignore[attr-defined]
    from re import _parser  # type: ignore[attr-defined]

    cats = {c.CATEGORY_DIGIT: r"\d", c.CATEGORY_NOT_DIGIT: r"\D", c.CATEGORY_SPACE: r"\s",
            c.CATEGORY_NOT_SPACE: r"\S", c.CATEGORY_WORD: r"\w", c.CATEGORY_NOT_WORD: r"\W"}
    ats = {c.AT_BEGINNING: "(?m:^)", c.AT_END: "(?m:$)", c.AT_BOUNDARY: r"\b",
           c.AT_NON_BOUNDARY: r"\B", c.AT_BEGINNING_STRING: r"\A", c.AT_END_STRING: r"\z"}

    def ch(code: int) -> str:
        return re.escape(chr(code)) if code < 128 else f"\\x{{{code:x}}}"

    def seq(items: Any) -> str:
        out = []
        for op, av in items:
            if op is c.LITERAL:
                out.append(ch(av))
            elif op is c.NOT_LITERAL:
                out.append(f"[^{ch(av)}]")
            elif op is c.ANY:
                out.append("(?s:.)")
            elif op is c.IN:
                neg = av and av[0][0] is c.NEGATE
                body = "".join(
                    ch(a) if o is c.LITERAL else f"{ch(a[0])}-{ch(a[1])}" if o is c.RANGE
                    else cats[a] for o, a in av[neg:]
                )
                out.append(f"[{'^' if neg else ''}{body}]")
            elif op is c.CATEGORY:
                out.append(cats[av])
            elif op is c.AT:
                out.append(ats[av])
            elif op is c.BRANCH:
                out.append("(?:" + "|".join(seq(b) for b in av[1]) + ")")
            elif op is c.SUBPATTERN:
                group, add, rem, sub = av
                flags = ("i" if add & re.I else "") + ("s" if add & re.S else "")
                flags += "-i" if rem & re.I else ""
                inner = f"(?{flags}:{seq(sub)})" if flags else seq(sub)
                name = names.get(group)
                out.append(f"(?P<{name}>{inner})" if name else f"(?:{inner})")
            elif op in (c.MAX_REPEAT, c.MIN_REPEAT, c.POSSESSIVE_REPEAT):
                lo, hi, sub = av
                lo = min(lo, cap) if cap is not None else lo
                hi_s = "" if hi is c.MAXREPEAT or hi > 1000 or cap is not None else str(hi)
                if lo > 1000:
                    raise _NoRE2("repeat")
                out.append(f"(?:{seq(sub)}){{{lo},{hi_s}}}")
            elif op in (c.ASSERT, c.ASSERT_NOT):
                continue
            elif op is c.ATOMIC_GROUP:
                out.append(f"(?:{seq(av)})")
            else:  # GROUPREF, GROUPREF_EXISTS
                raise _NoRE2(str(op))
        return "".join(out)

    parsed = _parser.parse(pattern)
    # (the value group is named in the exact pattern only: the prefilter joins many rules)
    names = {v: k for k, v in parsed.state.groupdict.items() if k == "value" and cap is None}
    text = seq(parsed)
    return f"(?i:{text})" if parsed.state.flags & re.I else text


class TokenRule:
    """One token format of the maintained rule set, compiled for the exact path (RE2,
    linear: the ``value`` group is hashed) and for the batch prefilter (a superset).

    Parameters
    ----------
    name
        The rule's name in the rule set.
    literals
        Substrings one of which a text must hold for the rule to match (its own).
    pattern
        The rule's Python ``re`` pattern, with a ``value`` group.
    """

    def __init__(self, name: str, literals: tuple[str, ...], pattern: str):
        self.name = name
        self.literals = literals
        self.literals_b = tuple(x.encode() for x in literals)
        exact = _re2_text(pattern, None)
        self.prefilter = _re2_text(pattern, _PREFILTER_MIN_REPEAT)
        opts = _re2.Options()
        opts.log_errors = False
        self.rx = _re2.compile(exact, opts)
        opts.encoding = _re2.Options.Encoding.LATIN1  # raw lines may be invalid UTF-8
        self.rx_b = _re2.compile(exact.encode(), opts)
        self.group = self.rx.groupindex["value"]


def _read_rule_set() -> tuple[list[dict[str, Any]], str]:
    """The rule set's rules and its version (``("", "")`` when it is not installed)."""
    import importlib.metadata

    import yaml

    dist = importlib.metadata.distribution(RULES_PACKAGE)
    with open(str(dist.locate_file(RULES_PATH)), encoding="utf-8") as fh:
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        return yaml.load(fh, Loader=loader), dist.version  # noqa: S506 (a safe loader)


def _is_token_rule(rule: dict[str, Any]) -> bool:
    """A rule that names a token *format*: a pattern rule for code, not weak, holding no
    key name (``variable``: pairs are toolwatch's structural rules) unless that is a URL
    (webhooks), and gated by literals of 3+ characters (a 1- or 2-letter gate, as
    Twilio's ``AC`` or Jira's ``M``, matches resource ids)."""
    lits = rule.get("required_substrings") or []
    text = "".join(rule.get("values") or [])
    return (
        rule.get("type") == "pattern" and "code" in (rule.get("target") or [])
        and rule.get("confidence") != "weak" and rule.get("severity") != "info"
        and rule.get("name") not in _NOT_CREDENTIALS
        and bool(lits) and all(len(x) >= 3 and x.isascii() for x in lits)
        and ("(?P<variable>" not in text or all("/" in x and "." in x for x in lits))
    )


def load_rules() -> tuple[tuple[TokenRule, ...], tuple[str, ...], dict[str, int]]:
    """Token formats and key words of the maintained rule set (:data:`RULES_PACKAGE`).

    Returns
    -------
    (rules, words, counts)
        The token rules RE2 compiles; the key words of its keyword rules (their
        ``required_substrings``, 3+ letters: ``key``, ``secret``, ``token`` …); and
        ``counts``: ``taken`` / ``skipped`` patterns, ``keyword`` rules read.
    """
    counts = {"taken": 0, "skipped": 0, "keyword": 0}
    if _re2 is None:
        return (), (), counts
    try:
        rules, _ = _read_rule_set()
    except (ImportError, OSError):  # pragma: no cover - installed as a dependency
        return (), (), counts
    out: list[TokenRule] = []
    words: set[str] = set()
    for rule in rules:
        if rule.get("type") == "keyword":
            counts["keyword"] += 1
            words.update(w for w in rule.get("required_substrings") or [] if len(w) >= 3)
            continue
        if not _is_token_rule(rule):
            continue
        for i, pattern in enumerate(rule["values"]):
            try:
                out.append(TokenRule(f"{rule['name']}#{i}", tuple(rule["required_substrings"]),
                                     pattern))
                counts["taken"] += 1
            except Exception:  # RE2 refuses it (a conditional, a back-reference)
                counts["skipped"] += 1
    return tuple(out), tuple(sorted(words)), counts


TOKEN_RULES, RULE_WORDS, RULE_COUNTS = load_rules()
