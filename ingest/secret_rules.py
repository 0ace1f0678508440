"""Token formats and key words of a maintained secret-detection rule set.

toolwatch does not keep its own list of credential formats: it reads CredSweeper's rules
(``credsweeper/rules/config.yaml``, a pinned dependency) from the installed distribution
at import time, as data (the package, its ML model and its dependencies are never
imported), and compiles them for RE2:

* every *token format* rule (a pattern for code, not ``weak``, not an identifier rule such
  as UUID, gated by literals of 3+ characters) becomes a :class:`TokenRule`: an exact RE2
  pattern whose ``value`` group :mod:`toolwatch.ingest.secrets` hashes, and a looser copy for the
  batch prefilter. Python ``re`` constructs RE2 lacks are translated to a superset
  (look-arounds dropped, repetition bounds loosened); a pattern with a back-reference, a
  conditional or nested counts over RE2's limit is skipped and counted (:data:`RULE_COUNTS`);
* the *keyword* rules' words (``key``, ``secret``, ``token``, ``salt`` …) are
  :data:`RULE_WORDS`, the key names :mod:`toolwatch.ingest.secrets` hashes values under.

Structural rules (values under secret keys, URL credentials, name/value pairs, command
lines, file formats) stay in :mod:`toolwatch.ingest.secrets`, on top of these.
"""

from __future__ import annotations

import functools
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
#: (``[A-Za-z0-9]{36,255}`` → ``{4,}``: a superset, and a much smaller DFA).
_PREFILTER_MIN_REPEAT = 4


class _NoRE2(ValueError):
    """A construct RE2 has no equivalent for (a back-reference, a conditional)."""


@functools.lru_cache(maxsize=256)
def _parse(pattern: str) -> Any:
    """``pattern``'s parse tree (each rule is translated twice: parsed once)."""
    from re import _parser  # type: ignore[attr-defined]

    return _parser.parse(pattern)


def _re2_text(pattern: str, cap: int | None, name: str = "value") -> tuple[str, int]:
    """A Python ``re`` pattern rewritten for RE2, as a superset of what it matches.

    Look-arounds are dropped (each only narrows a match) and counted repetitions lose
    their upper bound (RE2 refuses counts above 1000). With ``cap`` (the batch
    prefilter's copy) lower bounds are cut to ``cap`` and only the ``value`` group is
    kept, up to the atom after its first run of 3+ literal characters (``ya29\\.`` and
    ``[0-9A-Za-z_-]{4,}``): every match of the rule starts with a match of that, and the
    copy's DFA stays small next to a hundred others. Returns the text and the least
    length of a ``value`` match. Raises :class:`_NoRE2` for back-references and
    conditionals."""
    from re import _constants as c  # type: ignore[attr-defined]

    cats = {c.CATEGORY_DIGIT: r"\d", c.CATEGORY_NOT_DIGIT: r"\D", c.CATEGORY_SPACE: r"\s",
            c.CATEGORY_NOT_SPACE: r"\S", c.CATEGORY_WORD: r"\w", c.CATEGORY_NOT_WORD: r"\W"}
    ats = {c.AT_BEGINNING: "(?m:^)", c.AT_END: "(?m:$)", c.AT_BOUNDARY: r"\b",
           c.AT_NON_BOUNDARY: r"\B", c.AT_BEGINNING_STRING: r"\A", c.AT_END_STRING: r"\z"}

    depth = [1]  # product of the enclosing repetition counts

    def ch(code: int) -> str:
        return re.escape(chr(code)) if code < 128 else f"\\x{{{code:x}}}"

    def seq(items: Any, trunc: bool, lead: bool = False) -> tuple[str, bool]:
        """RE2 text of ``items``; with ``trunc``, cut (and True) after the first atom that
        follows a run of 3+ literal characters. ``lead``: nothing precedes ``items``, so
        a leading ``X{n,}`` is ``X`` (an unanchored search finds the same lines, and the
        DFA does not count ``n`` for every rule at every byte)."""
        out: list[str] = []
        run, seen = 0, False
        for op, av in items:
            first = lead and not out
            run = run + 1 if op is c.LITERAL else 0
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
                alts = [seq(b, trunc, first) for b in av[1]]
                out.append("(?:" + "|".join(t for t, _ in alts) + ")")
                if any(d for _, d in alts):  # a branch was cut: nothing may follow it
                    return "".join(out), True
            elif op is c.SUBPATTERN:
                group, add, rem, sub = av
                flags = ("i" if add & re.I else "") + ("s" if add & re.S else "")
                flags += "-i" if rem & re.I else ""
                text, done = seq(sub, trunc, first)
                inner = f"(?{flags}:{text})" if flags else text
                name = names.get(group)
                out.append(f"(?P<{name}>{inner})" if name else f"(?:{inner})")
                if done:
                    return "".join(out), True
            elif op in (c.MAX_REPEAT, c.MIN_REPEAT, c.POSSESSIVE_REPEAT):
                lo, hi, sub = av
                lo = min(lo, 1 if first else cap) if cap is not None else lo
                hi_s = "" if hi is c.MAXREPEAT or hi > 1000 or cap is not None else str(hi)
                hi_s = str(lo) if first and cap is not None else hi_s
                if lo > 1000:
                    raise _NoRE2("repeat")
                size = int(hi_s or lo or 1)
                if size * depth[0] > 1000:  # RE2 refuses nested counts over 1000 in all
                    raise _NoRE2("repetition size")
                depth[0] *= size
                out.append(f"(?:{seq(sub, False)[0]}){{{lo},{hi_s}}}")
                depth[0] //= size
            elif op in (c.ASSERT, c.ASSERT_NOT):
                continue
            elif op is c.ATOMIC_GROUP:
                out.append(f"(?:{seq(av, False)[0]})")
            else:  # GROUPREF, GROUPREF_EXISTS
                raise _NoRE2(str(op))
            if trunc and seen and op is not c.LITERAL:
                return "".join(out), True
            seen = seen or run >= 3
        return "".join(out), False

    def find(items: Any, group: int) -> Any:
        """The items of group ``group`` (at any depth), or None."""
        for op, av in items:
            if op is c.SUBPATTERN and av[0] == group:
                return av[3]
            subs = (av[1] if op is c.BRANCH else [av[3]] if op is c.SUBPATTERN
                    else [av[2]] if op in (c.MAX_REPEAT, c.MIN_REPEAT) else [])
            for sub in subs:
                hit = find(sub, group)
                if hit is not None:
                    return hit
        return None

    def starts_literal(items: Any) -> bool:
        """Whether every match of ``items`` starts with a literal character."""
        if not items:
            return False
        op, av = items[0]
        if op is c.BRANCH:
            return all(starts_literal(b) for b in av[1])
        if op is c.SUBPATTERN:
            return starts_literal(av[3])
        return op is c.LITERAL

    parsed = _parse(pattern)
    value = parsed.state.groupdict.get("value")
    # (the value group is named in the exact pattern only: the prefilter joins many rules)
    names = {value: name} if cap is None and value is not None else {}
    items = parsed
    if cap is not None and value is not None:
        items = find(parsed, value) or parsed
    if cap is not None and not starts_literal(items):
        raise _NoRE2("no literal start")  # (the prefilter takes the rule's literals)
    text = seq(items, cap is not None, cap is not None)[0]
    vitems = find(parsed, value) if value is not None else None
    width = int((vitems if vitems is not None else parsed).getwidth()[0])
    return (f"(?i:{text})" if parsed.state.flags & re.I else text), width


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
    index
        The rule's place in :data:`TOKEN_RULES` (its value group is ``v<index>``).
    """

    def __init__(self, name: str, literals: tuple[str, ...], pattern: str, index: int = 0):
        self.name = name
        self.literals = literals
        self.literals_b = tuple(x.encode() for x in literals)
        self.pattern = pattern
        #: the exact pattern, its value group named ``v<index>`` (see :func:`tokens_regex`)
        self.exact, self.min_len = _re2_text(pattern, None, f"v{index}")
        try:
            if "(?P<variable>" in pattern:  # a webhook URL: its host and path are literals
                raise _NoRE2("variable")
            self.prefilter = _re2_text(pattern, _PREFILTER_MIN_REPEAT)[0]
        except _NoRE2:  # a value that starts with a class (``[0-9]{8,10}:…``): its literals
            self.prefilter = "(?:" + "|".join(re.escape(x) for x in literals) + ")"


@functools.lru_cache(maxsize=1)
def tokens_regex() -> Any:
    """Every token rule's exact pattern in one RE2 alternation (Latin-1: raw lines may be
    invalid UTF-8), compiled on first use: one pass per text, and the matching rule's
    value is the match's last group. Most ingest runs never need it."""
    opts = _re2.Options()
    opts.log_errors = False
    opts.encoding = _re2.Options.Encoding.LATIN1
    return _re2.compile("|".join(f"(?:{r.exact})" for r in TOKEN_RULES).encode(), opts)


@functools.lru_cache(maxsize=1)
def tokens_gate() -> Any:
    """:func:`tokens_regex` without its capture groups: whether a text
    holds some token at all, for a fraction of the cost.

    RE2 answers a search with capture groups by running its NFA over the match once the
    DFA found one; google-re2's wrapper asks for every group (one per rule, ~100), which
    made each search ~20 µs on a 300-byte line that holds no token. Without groups the
    DFA alone decides (~2 µs). A line this gate passes runs the exact regex, so what is
    hashed does not change: the two match the same texts.
    """
    opts = _re2.Options()
    opts.log_errors = False
    opts.encoding = _re2.Options.Encoding.LATIN1
    # (the exact translation with its value group left unnamed: google-re2's
    # ``never_capture`` option does not reach the compiled RE2)
    return _re2.compile(
        "|".join(f"(?:{_re2_text(r.pattern, None, '')[0]})" for r in TOKEN_RULES).encode(), opts
    )


def _read_rule_set() -> tuple[list[dict[str, Any]], str]:
    """The rule set's rules and its version (raises when it is not installed)."""
    import importlib.metadata

    import yaml

    dist = importlib.metadata.distribution(RULES_PACKAGE)
    with open(str(dist.locate_file(RULES_PATH)), encoding="utf-8") as fh:
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        return yaml.load(fh, Loader=loader), dist.version  # noqa: S506 (a safe loader)


def _literals(rule: dict[str, Any]) -> list[str]:
    """A rule's gate literals of 3+ characters, or all of them when it has none."""
    lits = rule.get("required_substrings") or []
    return [x for x in lits if len(x) >= 3] or lits


def _is_token_rule(rule: dict[str, Any]) -> bool:
    """A rule that names a token *format*: a pattern rule for code, not weak, holding no
    key name (``variable``: pairs are toolwatch's structural rules) unless that is a URL
    (webhooks), and gated by literals of 3+ characters (a 1- or 2-letter gate, as
    Twilio's ``AC`` or Jira's ``M``, matches resource ids; shorter ones beside a longer
    one, as MailGun's ``-`` beside ``key-``, are dropped: :func:`_literals`)."""
    lits = _literals(rule)
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
                out.append(TokenRule(f"{rule['name']}#{i}", tuple(_literals(rule)),
                                     pattern, len(out)))
                counts["taken"] += 1
            except Exception:  # RE2 refuses it (a conditional, a back-reference)
                counts["skipped"] += 1
    return tuple(out), tuple(sorted(words)), counts


TOKEN_RULES, RULE_WORDS, RULE_COUNTS = load_rules()
