"""Run toolwatch (or a benchmark script) with the code of another source tree, for A/B runs.

    python benchmarks/run_tree.py TREE [toolwatch arguments...]
    BENCH_SCRIPT=benchmarks/bench_live.py python benchmarks/run_tree.py TREE latency ...

``TREE`` is a checkout (``git worktree add /tmp/base REV``). ``toolwatch``,
``toolwatch.ingest``, ``toolwatch.detectors``, ``toolwatch.dashboard`` and
``toolwatch.sample_logs`` are imported from it (the installed package maps the same
names to this checkout's folders), then the console entry point runs (its allocator
settings included), or the script in ``$BENCH_SCRIPT`` runs as ``__main__``. As a
``bench_live.py rss`` launcher::

    python benchmarks/bench_live.py rss --events 2400000 --log-rate 10000 --realtime 10000 \\
        --launcher "python benchmarks/run_tree.py /tmp/base"

Not a test.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from types import ModuleType

ROOT = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else ""
#: Import name -> folder of the tree (setuptools' package-dir mapping in pyproject.toml).
PACKAGES = {"toolwatch": "toolwatch", "toolwatch.detectors": "detectors",
            "toolwatch.ingest": "ingest", "toolwatch.sample_logs": "sample_logs",
            "toolwatch.dashboard": "dashboard"}


class _TreeFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if name in PACKAGES:
            d = os.path.join(ROOT, PACKAGES[name])
            return importlib.util.spec_from_file_location(
                name, os.path.join(d, "__init__.py"), submodule_search_locations=[d])
        return None


def main() -> None:
    """Install the finder, then run the entry point or ``$BENCH_SCRIPT``."""
    if not ROOT or not os.path.isdir(os.path.join(ROOT, "toolwatch")):
        sys.exit("usage: run_tree.py TREE [arguments...] (TREE: a toolwatch checkout)")
    sys.path[:] = [p for p in sys.path if p not in ("", ".")]
    sys.meta_path.insert(0, _TreeFinder())
    script = os.environ.get("BENCH_SCRIPT")
    if script:
        sys.argv = [script, *sys.argv[2:]]
        with open(script) as fh:
            code = compile(fh.read(), script, "exec")
        exec(code, {"__name__": "__main__", "__file__": os.path.abspath(script)})
        return
    sys.argv = ["toolwatch", *sys.argv[2:]]
    from toolwatch.spool import main as entry

    sys.exit(entry())


if __name__ == "__main__":
    main()
