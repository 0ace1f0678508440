"""Micro-benchmark of secret redaction cost per byte (``SecretHasher.redact_line``).

Prints ns/byte (best of ``--repeat`` runs, CPU time of this process) for lines an agent
controls: long lines full of secret-ish keys, a long line with one secret at its end, a
normal line with a secret, and the pathological shapes the scanner must stay linear on.
A linear scanner shows about the same ns/byte at every size; a quadratic one grows with
the size (``--scale`` multiplies the long lines to check).

Run: ``.venv/bin/python benchmarks/bench_secrets.py [--repeat 5] [--scale 1] [--old REV]``
(``--old REV``: the same cases with ``ingest/secrets.py`` of git revision ``REV`` too,
interleaved in one run, and the new/old ratio. ``--old REV --compare FILE...``: per log
file, the lines ingest's prefilter picks and the lines whose redaction differs.)
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from toolwatch.ingest.secrets import SecretHasher


def cases(scale: int) -> dict[str, bytes]:
    """Name -> one line, for the benchmark (sizes scale with ``scale``)."""
    k = 1_000 * scale
    return {
        "300KB secret-ish keys": (
            b'{"a":1,' + b'"passwordHint":"x","tokenizer":1,' * (9 * k) + b'"z":1}'
        ),
        "300KB secret keys (each hashed)": b'{' + b'"password":"x","y":1,' * (14 * k) + b'"z":1}',
        "1MB, one secret at end": b'{"a":"' + b"x" * (1_000 * k) + b'","token":"sek"}',
        "400B normal line + secret": (
            b'{"ts":"2026-01-01T00:00:00Z","session":"s-81","tool":"login","args":'
            b'{"user":"bob","password":"hunter2","note":"' + b"design doc " * 22 + b'"}}'
        ),
        "1MB unterminated string": b'{"password":"' + b"ab" * (500 * k),
        "1MB ://-without-@": b'{"a":"' + b"http://x" * (125 * k) + b'"}',
        "1MB eyJ run": b'{"a":"' + b"eyJ" * (333 * k) + b'"}',
        "1MB backslash run": b'{"a":"' + b"\\\\" * (500 * k) + b'"}',
        "1MB escaped password keys": b'{"a":"' + b'\\"password\\":1,' * (70 * k) + b'"}',
        "1MB name=value pairs": b'{"a":"' + b"q=1&" * (250 * k) + b'"}',
        "1MB scrub_text (cut line)": b'{"x":"' + b'a:b=c ' * (170 * k),
        # a run of scheme characters before "//…@" (was quadratic: ~1 s at 20 kB)
        "1MB a.a.a. run, //x@ and :/": b'{"a":"' + b"a." * (500 * k) + b'//x@ :/"}',
        "1MB percent-escapes": b'{"a":"' + b"%41" * (333 * k) + b'"}',
        # user:pass@host without a scheme, and credentials named in prose (session 4)
        "1MB a:a@ run (one userinfo)": b'{"a":"' + b"a:a@" * (250 * k) + b'"}',
        "1MB ' a:b' run (no @)": b'{"a":"' + b" a:b" * (250 * k) + b'@x"}',
        "1MB ',a:b@' run": b'{"a":"' + b",a:b@" * (200 * k) + b'"}',
        "1MB 'token ' run": b'{"a":"' + b"token " * (166 * k) + b'"}',
        "1MB 'secret key ' run": b'{"a":"' + b"secret key " * (90 * k) + b'"}',
        "1MB 'api key: x1y2z3' run": b'{"a":"' + b"api key: x1y2z3 " * (62 * k) + b'"}',
        "1MB ' -u a:b' run": b'{"a":"' + b" -u a:b" * (142 * k) + b'"}',
        "1MB 'key=' run": b'{"a":"' + b"key=" * (250 * k) + b'"}',
        "1MB 'token -token-token…' run": b'{"a":"token ' + b"-token" * (166 * k) + b'"}',
        "1MB tokentoken… (no boundary)": b'{"a":"' + b"token" * (200 * k) + b'"}',
        "1MB [\"password\",x] list": b'{"a":[' + b'"password","x",' * (66 * k) + b'"z"]}',
        "1MB [\"password\",{ unclosed": b'{"a":"' + b'[\\"password\\",{' * (60 * k),
        "1MB scrub_text prose+userinfo": b'{"x":"invalid token a1 u:p@h ' * (35 * k),
        # session 5 (red team round 3): look-alike key names, keys holding a credential,
        # CLI password flags, pair objects in text (a mixed-script key word was quadratic)
        "1MB mixed-script key (a+я…)": ('{"a":{"a' + "я" * (500 * k) + '":1}}').encode(),
        "1MB mixed-script key (aяaя…)": ('{"a":{"' + "aя" * (250 * k) + '":1}}').encode(),
        "1MB fullwidth key": ('{"a":{"' + "\uff50" * (333 * k) + '":1}}').encode(),
        "1MB secret key passwordpassword…": b'{"a":{"' + b"password" * (125 * k) + b'x1":1}}',
        "1MB 'docker ' run + -p": b'{"a":"' + b"docker " * (142 * k) + b'-p x"}',
        "1MB 'mysql -p ' run": b'{"a":"mysql ' + b"-p " * (333 * k) + b'"}',
        "1MB htpasswd -b -a -a…": b'{"a":"htpasswd -b ' + b"-a " * (333 * k) + b'"}',
        "1MB [\"sshpass\",\"-p\"…] argv": b'{"a":["sshpass",' + b'"-p",' * (200 * k) + b'"x"]}',
        "1MB 'value' keys, cut": b'{"password":1,' + b'{"value":1},' * (83 * k),
        # session 6 (red team round 4): look-alike names in prose, cut heads, -p argv
        "1MB 'café 2024 ' prose (folded)": ('{"a":"' + "café 2024 " * (100 * k) + '"}').encode(),
        "1MB 'токен abc123 ' run": ('{"a":"' + "токен abc123 " * (55 * k) + '"}').encode(),
        "1MB 'pass\u200bword is ' run": (
            '{"a":"' + "pass​word is " * (60 * k) + 'x1y2z3"}'
        ).encode(),
        "1MB 'Пароль 42 ' Russian prose": ('{"a":"' + "Пароль 42 " * (60 * k) + '"}').encode(),
        "1MB cut head 'ssword=' + x…": b"ssword=" + b"x" * (1_000 * k),
        "1MB [\"-p\",\"x1\"…] argv": b'{"a":["-u",' + b'"-p","x1",' * (100 * k) + b'"x"]}',
        # issue 28: the rule set's token formats (their literals repeated, a literal and a
        # long run of token characters), normalisation (repr, cookies, ANSI), file formats
        "1MB 'ya29.' run": b'{"a":"' + b"ya29." * (200 * k) + b'"}',
        "1MB 'hvs.' + token run": b'{"a":"hvs.' + b"A" * (1_000 * k) + b'"}',
        "1MB b64 PEM literal run": b'{"a":"LS0tLS1CRUdJTi' + b"A" * (1_000 * k) + b'"}',
        "1MB 'MIIa' b64 run": b'{"a":"MIIa' + b"Ab1+" * (250 * k) + b'"}',
        "1MB repr pairs 'k': 'v'": b"{" + b"'key': 'v', " * (83 * k) + b"}",
        "1MB cookie list": b"Cookie: " + b"a=1; " * (200 * k),
        "1MB ANSI run": b'{"a":"' + b"\\u001b[1m" * (100 * k) + b'token=x"}',
        "1MB 'h:1:d:u:' run (pgpass)": b'{"a":"' + b" h:1:d:u:p" * (100 * k) + b'"}',
        "1MB ':$1$' run (crypt)": b'{"a":"' + b" u:$1$" * (166 * k) + b'"}',
    }


def best_cpu(fn: Callable[[], object], repeat: int) -> float:
    """Best CPU seconds of ``fn`` over ``repeat`` runs."""
    best = float("inf")
    for _ in range(repeat):
        t = time.process_time()
        fn()
        best = min(best, time.process_time() - t)
    return best


def old_hasher(rev: str) -> SecretHasher:
    """A hasher from ``secrets.py`` as of git revision ``rev`` (for A/B)."""
    import importlib.util
    import subprocess
    import tempfile

    root = Path(__file__).resolve().parents[1]
    # The module moved from toolwatch/ to ingest/ (issue 29): an older revision has it there.
    for rel in ("ingest/secrets.py", "toolwatch/secrets.py"):
        got = subprocess.run(["git", "-C", str(root), "show", f"{rev}:{rel}"],
                             capture_output=True)
        if got.returncode == 0:
            break
    got.check_returncode()
    src = got.stdout
    path = Path(tempfile.mkdtemp()) / "secrets_old.py"
    path.write_bytes(src)
    spec = importlib.util.spec_from_file_location("secrets_old", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.SecretHasher(b"k" * 32)


def _prefilter(h: SecretHasher) -> Any:
    """Ingest's batch prefilter: the candidate pattern, Latin-1, case-insensitive RE2."""
    import re2

    o = re2.Options()
    o.case_sensitive = False
    o.encoding = re2.Options.Encoding.LATIN1
    o.max_mem = 64 << 20
    return re2.compile(h.candidate_pattern.encode(), o)


def compare(old: SecretHasher, new: SecretHasher, files: list[str]) -> None:
    """Per file: lines picked by each prefilter, and lines whose redaction differs."""
    import gzip

    po, pn = _prefilter(old), _prefilter(new)
    for f in files:
        opener: Any = gzip.open if f.endswith(".gz") else open
        with opener(f, "rb") as fh:
            lines = [ln.rstrip(b"\n") for ln in fh]
        picked_old = picked_new = only_one = differ = 0
        example = None
        for ln in lines:
            a, b = po.search(ln) is not None, pn.search(ln) is not None
            picked_old += a
            picked_new += b
            only_one += a != b  # same counts could hide different lines
            if (a or b) and old.redact_line(ln)[0] != new.redact_line(ln)[0]:
                differ += 1
                example = example or ln[:200]
        print(f"{f}: {len(lines):,d} lines, picked old {picked_old:,d} new {picked_new:,d}, "
              f"picked by only one {only_one:,d}, redaction differs on {differ:,d}"
              + (f" (e.g. {example!r})" if example else ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--scale", type=int, default=1, help="multiply the long lines' size")
    ap.add_argument("--old", metavar="REV", help="also time secrets.py of git revision REV, "
                    "interleaved (same run), and print new/old")
    ap.add_argument("--compare", nargs="+", metavar="FILE",
                    help="with --old: instead of timing, count per log file (.gz too) the "
                    "lines ingest's prefilter picks and the lines whose redaction differs "
                    "between REV and now (a new rule's false-positive cost)")
    args = ap.parse_args()
    hashers = {"new": SecretHasher(b"k" * 32)}
    if args.old:
        hashers["old"] = old_hasher(args.old)
    if args.compare:
        if not args.old:
            ap.error("--compare needs --old REV")
        compare(hashers["old"], hashers["new"], args.compare)
        return
    cols = "".join(f" {w + ' ns/B':>11s}" for w in hashers)
    print(f"{'case':36s} {'bytes':>10s}{cols} {'ms':>9s}" + ("  new/old" if args.old else ""))
    for name, line in cases(args.scale).items():
        best = {}
        for _ in range(args.repeat):  # interleaved: both see the same load
            for w, h in hashers.items():
                if name.startswith("1MB scrub_text") or name.endswith("unclosed"):
                    fn: Callable[[], object] = lambda h=h, line=line: h.scrub_text(line)  # noqa: E731
                else:
                    fn = lambda h=h, line=line: h.redact_line(line)  # noqa: E731
                if w not in best:
                    fn()  # warm caches (key memo, compiled patterns)
                n = 2_000 if len(line) < 10_000 else 1
                s = best_cpu(lambda fn=fn, n=n: [fn() for _ in range(n)], 1) / n
                best[w] = min(best.get(w, s), s)
        figs = "".join(f" {best[w] * 1e9 / len(line):11.1f}" for w in hashers)
        ratio = f"  {best['new'] / best['old']:7.2f}" if args.old else ""
        print(f"{name:36s} {len(line):10,d}{figs} {best['new'] * 1e3:9.3f}{ratio}", flush=True)


if __name__ == "__main__":
    main()
