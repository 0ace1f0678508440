"""The look-alike names alternative of the candidate pattern, written as a trie (session 6,
to make the prefilter cheaper to compile), picks exactly the lines the flat alternation of
round 4 picked.

The reference below is round 4's builder (commit e85a0ba) verbatim: each name's letters as
an alternation of their look-alikes' UTF-8 bytes, joined by the invisible-character gap.
Both are compiled the way ingest's batch scan does (RE2, Latin-1, case-insensitive) and
run on generated hostile text: look-alike spellings of every name, with invisible
characters, combining marks, cut and extended words, other scripts, noise.
"""

from __future__ import annotations

import re2
from hypothesis import given, settings
from hypothesis import strategies as st
from toolwatch.ingest.secret_fold import (
    _PROSE_NAMES,
    _byte_alternation,
    _lookalike_classes,
    _lookalike_names_pattern,
)
from toolwatch.ingest.secrets import SecretHasher

_CLASSES = _lookalike_classes()
_GAP = (r"(?:\xe2\x80[\x8b-\x8f]|\xe2\x81[\xa0-\xa4]|\xc2\xad|\xef\xbb\xbf"
        r"|\xcc[\x80-\xbf]|\xcd[\x80-\xaf]|\xef\xb8[\x80-\x8f])*")


def _flat_reference() -> str:
    """Round 4's (e85a0ba) byte pattern of the look-alike names, before factoring."""

    def one(c: str) -> str:
        alts = sorted({"".join(f"\\x{b:02x}" for b in ch.encode()) for ch in _CLASSES[c]})
        return "(?:" + "|".join(alts) + ")"

    words = (_GAP.join(one(c) for c in w) for w in _PROSE_NAMES)
    return "(?:" + "|".join(words) + ")" + _GAP + "[ \\t]"


def _compile(pattern: str) -> re2._Regexp:
    opts = re2.Options()
    opts.encoding = re2.Options.Encoding.LATIN1
    opts.case_sensitive = False
    opts.never_nl = True
    opts.max_mem = 64 << 20
    return re2.compile(f"(?m:{pattern})".encode(), opts)


FLAT = _compile(_flat_reference())
FACTORED = _compile(_lookalike_names_pattern(True))
HASHER = SecretHasher(b"k" * 32)
# the whole candidate pattern, with the flat alternative put back
CANDIDATE = _compile(HASHER.candidate_pattern)
CANDIDATE_FLAT = _compile(
    HASHER.candidate_pattern.replace(_lookalike_names_pattern(True), _flat_reference())
)

_INVISIBLE = ["\u200b", "\u200d", "\u2060", "\u00ad", "\ufeff", "\u0301", "\u036f", "\ufe0f"]
_NOISE = ["x", "s", " ", "\t", "=", ":", '"', "\u0430", "\u0442", "\u4e2d", "é", "\U0001d41a",
          "\ufffd", "\\u", "1"]


@st.composite
def disguised(draw: st.DrawFn) -> str:
    """A name in look-alike letters (maybe cut, extended, with gaps), in some noise."""
    name = draw(st.sampled_from(_PROSE_NAMES))
    out = []
    for c in name:
        out.append(draw(st.sampled_from(_CLASSES[c])))
        out += draw(st.lists(st.sampled_from(_INVISIBLE), max_size=2))
    if draw(st.booleans()):  # cut, or a letter swapped for noise
        i = draw(st.integers(0, len(out)))
        out[i:i + draw(st.integers(0, 1))] = draw(st.lists(st.sampled_from(_NOISE), max_size=2))
    before = draw(st.lists(st.sampled_from(_NOISE), max_size=3))
    after = draw(st.lists(st.sampled_from([*_NOISE, *_INVISIBLE]), max_size=3))
    return "".join(before + out + after)


hostile = st.one_of(
    disguised(),
    st.lists(disguised(), min_size=2, max_size=4).map(" ".join),
    st.text(alphabet=st.sampled_from(
        sorted({ch for forms in _CLASSES.values() for ch in forms} | set(_INVISIBLE)
               | {c for c in _NOISE if len(c) == 1})), max_size=40),
    st.text(max_size=40),
)


@settings(max_examples=1200, deadline=None)
@given(hostile)
def test_factored_names_pick_the_same_texts(text: str) -> None:
    raw = text.encode("utf-8", "surrogatepass")
    assert (FACTORED.search(raw) is None) == (FLAT.search(raw) is None)
    assert (CANDIDATE.search(raw) is None) == (CANDIDATE_FLAT.search(raw) is None)


def test_every_plain_lookalike_spelling_matches() -> None:
    """Each name in each single look-alike per letter position, then a space."""
    for name in _PROSE_NAMES:
        for i, c in enumerate(name):
            for form in _CLASSES[c]:
                raw = (name[:i] + form + name[i + 1:] + " S").encode()
                assert FACTORED.search(raw) is not None, (name, form)
                assert FLAT.search(raw) is not None


@given(st.sets(st.binary(max_size=4), min_size=1, max_size=12), st.binary(max_size=6))
def test_byte_alternation_is_the_plain_alternation(seqs: set[bytes], probe: bytes) -> None:
    def esc(s: bytes) -> str:
        return "".join(f"\\x{b:02x}" for b in s)

    factored = _compile(f"^(?:{_byte_alternation(seqs)})$")
    plain = _compile("^(?:" + "|".join(esc(s) for s in sorted(seqs)) + ")$")
    for raw in (probe, *seqs, *(s[:-1] for s in seqs if s), *(s + probe for s in seqs)):
        raw = raw.replace(b"\n", b"")
        assert (factored.search(raw) is None) == (plain.search(raw) is None), raw


def test_factored_is_shorter() -> None:
    assert len(_lookalike_names_pattern(True)) < 0.7 * len(_flat_reference())
