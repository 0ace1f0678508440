"""Look-alike folding: secret *names* normalized before they are matched.

A name written with letters of other scripts that look Latin (``pаssword`` with a
Cyrillic ``а``), fullwidth or mathematical letters, or invisible characters inside a word
must not escape :mod:`toolwatch.ingest.secrets`' key and prose rules. :func:`key_skeleton` folds
a key; :func:`_prose_fold` is the same folding as a one-to-one ``str.translate`` table
for prose; the patterns below tell cheaply whether a text may hold such a name at all.
"""

from __future__ import annotations

import contextlib
import re
import unicodedata
from typing import Any

try:  # google-re2 (a pyproject dependency)
    import re2 as _re2
except ImportError:  # pragma: no cover - an environment installed before it was added
    _re2 = None

#: Letters of other scripts (Cyrillic, Greek, Armenian, IPA, Latin small capitals) that
#: look like a Latin letter, lower case: ``"pаssword"`` with a Cyrillic ``а`` must not
#: escape the key rule. NFKD already folds fullwidth, mathematical, circled letters and
#: ligatures; this table covers what Unicode does not fold (from Unicode's
#: confusables.txt, the letters that matter for key names).
_CONFUSABLE_PAIRS = (
    "аa бb вb гr дd еe ёe ѕs іi їi јj кk лn мm нh оo пn рp сc тt уy хx ҳx ԁd ԛq ԝw һh"
    " ӏl ɡg ѵv ьb ъb ԍg ӕe ϲc"
    " αa βb γy δd εe ζz ηn ιi κk λa μu νv οo πn ρp ςc σo τt υu φo χx ψw ωw ϳj"
    " օo սu ոn ոn հh ռn ցg զq"
    " ɑa ɐa ɓb ɕc ɖd ɗd ɛe ɜe ɡg ɢg ɦh ɩi ɪi ɫl ɭl ɯw ɱm ɲn ɳn ɴn ɵo ɸo ɹr ɾr ʀr ʂs ʈt ʉu"
    " ʋv ʌv ʍw ʏy ʐz ʑz ıi ȷj ᴀa ʙb ᴄc ᴅd ᴇe ꜰf ʜh ᴊj ᴋk ʟl ᴍm ᴏo ᴘp ꞯq ꜱs ᴛt ᴜu ᴠv ᴡw ᴢz"
    " ꮃw ꭰd ꭼm ꮪs ꮤw ꮋh ꭱa"
)
_CONFUSABLES: dict[str, str] = {p[0]: p[1] for p in _CONFUSABLE_PAIRS.split()}
#: Runs of letters (any script) of a key skeleton.
_LETTER_RUN_RE = re.compile(r"[^\W\d_]+")
#: Characters a key skeleton drops: combining marks (``to\u0301ken``), format and
#: invisible characters (zero width space/joiner, soft hyphen, BOM), variation selectors.
_DROP_CATEGORIES = frozenset({"Mn", "Me", "Cf"})


def key_skeleton(key: str) -> str:
    """A key name with look-alike letters folded to ASCII (NFKD, confusables, invisible
    characters dropped); ASCII keys are returned as they are.

    ``"pаssword"`` (Cyrillic а), ``"ｐａｓｓ"`` (fullwidth), ``"p\u200bin"`` (zero width
    inside), ``"ſecret"`` (long s) and ``"tóken"`` become ``"password"``, ``"pass"``,
    ``"pin"``, ``"secret"``, ``"token"``. Case is kept (``ΑPI`` → ``API``) so words still
    split on case changes. Letters with no Latin look-alike stay as they are.
    """
    if key.isascii():
        return key
    out: list[str] = []
    for ch in unicodedata.normalize("NFKD", key):
        if ch.isascii():
            out.append(ch)
            continue
        if unicodedata.category(ch) in _DROP_CATEGORIES:
            continue
        low = ch.lower()
        m = _CONFUSABLES.get(low[0]) if low else None
        if m is None:
            out.append(ch)
        else:
            out.append(m.upper() if ch != low else m)
    return "".join(out)

#: A word mixing a Latin letter with a non-ASCII character, or a letter that folds to
#: Latin on its own (fullwidth, mathematical, circled): a name may be disguised in prose.
_LOOKALIKE_WORD_RE = re.compile(
    r"[A-Za-z][^\x00-\x7f]|[^\x00-\x7f][A-Za-z]"
    r"|[\uff21-\uff3a\uff41-\uff5a\u24b6-\u24e9\U0001d400-\U0001d7ff\u017f]"
    r"|[\uff1a\uff1d\ufe13\ufe55\ufe66\ua789\u2236]"  # look-alike ":" and "="
)
#: Blocks whose characters :func:`key_skeleton` folds to one Latin letter or drops.
_FOLD_BLOCKS = (
    (0x80, 0x58F), (0x13A0, 0x13FF), (0x1D00, 0x1DBF), (0x1E00, 0x1EFF),
    (0x2000, 0x206F), (0x2100, 0x214F), (0x2460, 0x24FF), (0x2C60, 0x2C7F),
    (0xA720, 0xA7FF), (0xAB30, 0xABBF), (0xFE00, 0xFE0F), (0xFEFF, 0xFEFF),
    (0xFF00, 0xFFEF), (0x1D400, 0x1D7FF), (0x1F130, 0x1F189), (0xFE10, 0xFE1F),
    (0xFE50, 0xFE6F),
)
#: Separators that look like ``:`` / ``=`` and have no compatibility decomposition.
_SEP_LOOKALIKES = {0xA789: ord(":"), 0x2236: ord(":"), 0x02D0: ord(":")}
_PROSE_FOLD: dict[int, int | None] = {}
#: The names :data:`_PROSE_RE` knows, for the look-alike patterns below.
_PROSE_NAMES = (
    "token", "tokens", "key", "keys", "password", "passwords", "passwd", "passphrase",
    "passcode", "pwd", "pin", "otp", "secret", "secrets", "credential", "credentials",
    "apikey", "authorization",
)


def _lookalike_classes() -> dict[str, list[str]]:
    """Per Latin letter, itself and the characters of other scripts that fold to it
    (the confusables table, both cases, and the fullwidth forms)."""
    out: dict[str, list[str]] = {c: [c, c.upper()] for c in "abcdefghijklmnopqrstuvwxyz"}
    for ch, lat in _CONFUSABLES.items():
        for form in {ch, ch.upper()}:
            if len(form) == 1 and not form.isascii():
                out[lat].append(form)
    for i, c in enumerate("abcdefghijklmnopqrstuvwxyz"):
        out[c] += [chr(0xFF41 + i), chr(0xFF21 + i)]
    return out


def _lookalike_names_pattern(as_bytes: bool) -> str:
    """A prose name spelled wholly in look-alike letters of other scripts (``токен``
    with Cyrillic letters, Greek, fullwidth), invisible characters allowed between the
    letters, then a space. For RE2's Latin-1 scan (``as_bytes``: each letter as its
    UTF-8 bytes) or Python ``re`` (characters). Russian prose does not match: only the
    exact spellings of these names do."""
    classes = _lookalike_classes()
    gap = (r"(?:\xe2\x80[\x8b-\x8f]|\xe2\x81[\xa0-\xa4]|\xc2\xad|\xef\xbb\xbf"
           r"|\xcc[\x80-\xbf]|\xcd[\x80-\xaf]|\xef\xb8[\x80-\x8f])*"
           if as_bytes else "[\u200b-\u200f\u2060-\u2064\u00ad\ufeff\u0300-\u036f\ufe00-\ufe0f]*")

    def one(c: str) -> str:
        if not as_bytes:
            return "[" + "".join(classes[c]) + "]"
        return _byte_alternation({ch.encode() for ch in classes[c]})

    if not as_bytes:
        words = (gap.join(one(c) for c in w) for w in _PROSE_NAMES)
        return "(?:" + "|".join(words) + ")" + gap + "\\s"

    # The names as a trie of letters ("pass" once for its five names): the same
    # language as the names' alternation, in ~55% of the text. This alternative is most
    # of the candidate pattern, which Arrow compiles again on every batch it scans.
    def spell(rests: set[str]) -> str:
        """The alternation of ``rests`` (non-empty letter strings), gaps between letters."""
        by: dict[str, set[str]] = {}
        for w in rests:
            by.setdefault(w[0], set()).add(w[1:])
        alts = []
        for c, tails in sorted(by.items()):
            more = {t for t in tails if t}
            tail = gap + spell(more) if more else ""
            alts.append(one(c) + (f"(?:{tail})?" if more and "" in tails else tail))
        return alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"

    return "(?:" + spell(set(_PROSE_NAMES)) + ")" + gap + "[ \\t]"


def _byte_alternation(seqs: set[bytes]) -> str:
    """An RE2 (Latin-1) pattern matching exactly the byte strings ``seqs``, factored by
    prefix and with first bytes of equal continuations merged into one class
    (``\\xd0[\\x90\\xb0]``): the same language as their plain alternation, shorter to
    compile. ``seqs`` may hold ``b""`` (then the whole is optional)."""
    by: dict[int, set[bytes]] = {}
    for s in seqs:
        if s:
            by.setdefault(s[0], set()).add(s[1:])
    heads: dict[frozenset[bytes], list[int]] = {}
    for b, tails in by.items():
        heads.setdefault(frozenset(tails), []).append(b)
    alts = []
    for tails, bs in sorted(heads.items(), key=lambda kv: min(kv[1])):
        bs.sort()
        head = (f"\\x{bs[0]:02x}" if len(bs) == 1
                else "[" + "".join(f"\\x{b:02x}" for b in bs) + "]")
        alts.append(head + ("" if tails == {b""} else _byte_alternation(set(tails))))
    body = alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"
    return f"(?:{body})?" if b"" in seqs else body


_LOOKALIKE_NAME_RE = re.compile(_lookalike_names_pattern(False))
#: A prose name whose every letter is itself or any non-ASCII character, non-ASCII
#: characters between letters: what folding *could* turn into a name (a superset).
#: Texts without it skip the fold (``str.translate`` costs ~100 ns per character).
_LOOSE_NAMES_PATTERN = "(?i:" + "|".join(
    "[^\\x00-\\x7f]*".join(f"(?:{c}|[^\\x00-\\x7f])" for c in w) for w in _PROSE_NAMES
) + ")"
_LOOSE_NAMES_RE = re.compile(_LOOSE_NAMES_PATTERN)
_LOOSE_NAMES_RE2: Any = None
_LOOKALIKE_RE2: Any = None
if _re2 is not None:
    with contextlib.suppress(Exception):  # (a pattern RE2 refuses: the ``re`` path)
        # (compiled as bytes and run on UTF-8 bytes encoded with surrogatepass: a text
        # may hold lone surrogates, which re2's own str encoding refuses)
        _LOOSE_NAMES_RE2 = _re2.compile(_LOOSE_NAMES_PATTERN.encode(), _re2.Options())
    with contextlib.suppress(Exception):
        _LOOKALIKE_RE2 = _re2.compile(
            (r"[A-Za-z][^\x00-\x7f]|[^\x00-\x7f][A-Za-z]|[\x{ff21}-\x{ff3a}\x{ff41}-\x{ff5a}"
             r"\x{24b6}-\x{24e9}\x{1d400}-\x{1d7ff}\x{17f}\x{ff1a}\x{ff1d}\x{fe13}\x{fe55}"
             r"\x{fe66}\x{a789}\x{2236}]|" + _LOOKALIKE_NAME_RE.pattern).encode(),
            _re2.Options(),
        )


def _prose_fold() -> dict[int, int | None]:
    """``str.translate`` table folding look-alike letters one to one (and dropping
    invisible characters) as :func:`key_skeleton` does; built on first use (~10k
    characters, a few ms)."""
    if not _PROSE_FOLD:
        table: dict[int, int | None] = {}
        for lo, hi in _FOLD_BLOCKS:
            for cp in range(lo, hi + 1):
                f = key_skeleton(chr(cp))
                if f == "":
                    table[cp] = None
                elif len(f) == 1 and f.isascii() and (f.isalpha() or f in ":="):
                    table[cp] = ord(f)  # (fullwidth and small ":" "=" too: "password：S")
        table.update(_SEP_LOOKALIKES)
        _PROSE_FOLD.update(table)
    return _PROSE_FOLD

def _lookalike_prose(text: str) -> bool:
    """Whether a non-ASCII text may name a secret in prose with look-alike letters.
    Long texts: one RE2 pass (``re`` tries the names' alternation at every character,
    ~100 ns each on a megabyte of Cyrillic prose)."""
    if len(text) >= 512 and _LOOKALIKE_RE2 is not None:
        return _LOOKALIKE_RE2.search(text.encode("utf-8", "surrogatepass")) is not None
    return (
        _LOOKALIKE_WORD_RE.search(text) is not None
        or _LOOKALIKE_NAME_RE.search(text) is not None
    )
