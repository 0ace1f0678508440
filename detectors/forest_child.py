"""The one place that touches scikit-learn for the isolation forest, runnable as a child.

A live process (``toolwatch tail``/``run``/``collect``/``kafka``) must not import
scikit-learn: with scipy it adds ~90 MiB of RSS to a process that has 512 MiB in all. It
fits or loads its forest *once*, so that step runs here, in a short-lived child process
started by :func:`toolwatch.detectors.forest_trees.run_child`; the child hands back the
trees as plain arrays (an ``.npz``) and exits, and the live process scores them with the
numpy scorer of :mod:`toolwatch.detectors.forest_trees`. Batch commands (``analyze``,
``train``) call the same functions in-process.

This module imports nothing from toolwatch (the child starts with ``python -I <this file>``
so it loads neither polars nor the detectors, only numpy, scikit-learn and skops).

Child protocol
--------------
``python -I forest_child.py fit X.npy OUT.npz N_ESTIMATORS MAX_SAMPLES RANDOM_STATE``
    Fit an ``IsolationForest`` on the float64 matrix in ``X.npy``; write its trees.
``python -I forest_child.py load MODEL.skops OUT.npz TRUSTED_TYPES_JSON``
    Load a model saved by ``toolwatch train`` (refusing types outside the trusted list);
    write its trees and its learned fields.

Exit status 0 on success; 2 with a one-line reason on stderr when the input is bad (an
unreadable, untrusted or foreign model file); anything else is a crash.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

#: Exit status of a child refusing its input (the reason is the last line on stderr).
BAD_INPUT = 2

#: Every type a saved model may contain beyond skops' built-in safe set. Loading refuses
#: files holding anything else.
TRUSTED_TYPES: list[str] = [
    "sklearn.ensemble._iforest.IsolationForest",
    "sklearn.tree._classes.ExtraTreeRegressor",
    "sklearn.tree._tree.Tree",
    "numpy.ndarray",
    "numpy.dtype",
    "numpy.float64",
    "numpy.int64",
    "builtins.dict",
    "builtins.list",
    "builtins.str",
    "builtins.int",
    "builtins.float",
]


class BadInput(Exception):
    """The child's input cannot be used (reported with exit status :data:`BAD_INPUT`)."""


def import_sklearn() -> None:
    """Import scikit-learn's forest without pandas when pandas is not loaded yet.

    ``sklearn.utils.fixes`` imports pandas whenever it is installed (for its optional
    DataFrame output, which the forest never uses): ~37 MiB of RSS and ~0.3 s of CPU in
    every process that fits or loads a forest. pandas is hidden for the duration of that
    first import only; ``import pandas`` works normally afterwards, and a process that
    already has pandas (the dashboard) is not affected.
    """
    if "sklearn.ensemble" in sys.modules:
        return
    hide = "pandas" not in sys.modules
    if hide:
        sys.modules["pandas"] = None  # type: ignore[assignment]  # import -> ImportError
    try:
        import sklearn.ensemble  # noqa: F401
    finally:
        if hide and sys.modules.get("pandas", 0) is None:
            del sys.modules["pandas"]


def tree_arrays(model: Any) -> dict[str, np.ndarray]:
    """A fitted ``IsolationForest``'s trees as flat arrays (public tree attributes only).

    Nodes of all trees are concatenated; ``node_offsets[t]`` is tree ``t``'s first node
    (``node_offsets[-1]`` the total). ``features[t]`` maps tree ``t``'s feature indices
    to the input's columns (all columns unless ``max_features`` < 1).
    """
    trees = [est.tree_ for est in model.estimators_]
    counts = [int(t.node_count) for t in trees]
    n_in = int(model.n_features_in_)
    feats = np.full((len(trees), n_in), -1, dtype=np.int64)
    for i, f in enumerate(model.estimators_features_):
        feats[i, : len(f)] = np.asarray(f, dtype=np.int64)
    return {
        "node_offsets": np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
        "children_left": np.concatenate([t.children_left for t in trees]).astype(np.int64),
        "children_right": np.concatenate([t.children_right for t in trees]).astype(np.int64),
        "feature": np.concatenate([t.feature for t in trees]).astype(np.int64),
        "threshold": np.concatenate([t.threshold for t in trees]).astype(np.float64),
        "n_node_samples": np.concatenate([t.n_node_samples for t in trees]).astype(np.int64),
        "missing_go_to_left": np.concatenate(
            [np.asarray(t.missing_go_to_left, dtype=np.uint8) for t in trees]
        ).astype(bool),
        "features": feats,
        "max_samples": np.array(int(model._max_samples), dtype=np.int64),
        "n_features_in": np.array(n_in, dtype=np.int64),
    }


def sklearn_version() -> str:
    """The scikit-learn version of this process's import."""
    import sklearn

    return str(sklearn.__version__)


def fit_model(x: np.ndarray, n_estimators: int, max_samples: int, random_state: int) -> Any:
    """Fit the detector's ``IsolationForest`` (single-threaded, fixed seed)."""
    import_sklearn()
    from sklearn.ensemble import IsolationForest

    return IsolationForest(
        n_estimators=n_estimators,
        max_samples=min(max_samples, x.shape[0]),
        random_state=random_state,
        n_jobs=1,
    ).fit(x)


def load_state(path: str | Path, trusted: list[str] | None = None) -> dict[str, Any]:
    """The state dict of a skops model file, refusing types outside ``trusted``.

    Raises
    ------
    BadInput
        Missing, unreadable or untrusted file.
    """
    import_sklearn()
    import skops.io as sio

    trusted = TRUSTED_TYPES if trusted is None else trusted
    p = Path(path)
    if not p.is_file():
        raise BadInput(f"model file {p} not found (run `toolwatch train`)")
    try:
        untrusted = sio.get_untrusted_types(file=p)
    except Exception as exc:  # skops raises various errors on corrupt files
        raise BadInput(f"model file {p} is not a readable skops file: {exc}") from exc
    bad = sorted(set(untrusted) - set(trusted))
    if bad:
        raise BadInput(f"model file {p} holds untrusted types {bad}; refusing to load")
    try:
        state = sio.load(p, trusted=trusted)
    except Exception as exc:
        raise BadInput(f"cannot load model file {p}: {exc}") from exc
    if not isinstance(state, dict):
        raise BadInput(f"model file {p} has an unknown format; retrain it")
    return state


#: Learned fields of a saved model carried to the parent besides the trees.
STATE_ARRAYS = ("medians", "center", "scale", "raw_medians")
STATE_SCALARS = ("format_version", "sklearn_version", "learned_threshold", "n_train",
                 "trained_at", "features")


def peak_rss_kib() -> int:
    """This process's peak RSS in KiB: ``VmHWM`` (per address space, so it starts afresh
    at exec; ``ru_maxrss`` would carry over the parent's peak), else ``ru_maxrss``."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource  # Unix only
    except ImportError:  # pragma: no cover
        return 0
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def _write(out: Path, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
    meta = {**meta, "peak_rss_kib": peak_rss_kib()}
    tmp = out.with_name(out.name + ".part.npz")
    np.savez(tmp, meta=np.array(json.dumps(meta)), **arrays)
    tmp.replace(out)


def _main(argv: list[str]) -> int:
    cmd, *args = argv
    if cmd == "fit":
        src, out, n_est, max_s, seed = args
        try:
            x = np.load(src, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise BadInput(f"cannot read the feature matrix {src}: {exc}") from exc
        if x.ndim != 2 or x.shape[0] < 1 or x.shape[1] < 1:
            raise BadInput(f"feature matrix {src} has shape {x.shape}, expected (rows, cols)")
        model = fit_model(x, int(n_est), int(max_s), int(seed))
        _write(Path(out), tree_arrays(model), {"sklearn_version": sklearn_version()})
        return 0
    if cmd == "load":
        src, out, trusted = args
        state = load_state(src, json.loads(trusted))
        model = state.get("model")
        if type(model).__name__ != "IsolationForest":
            raise BadInput(f"model file {src} holds no isolation forest; retrain it")
        arrays = tree_arrays(model)
        for k in STATE_ARRAYS:
            if k in state:
                arrays[f"state_{k}"] = np.asarray(state[k], dtype=np.float64)
        meta: dict[str, Any] = {k: state.get(k) for k in STATE_SCALARS}
        meta = json.loads(json.dumps(meta, default=str))  # numpy scalars -> plain JSON
        meta["installed_sklearn_version"] = sklearn_version()
        _write(Path(out), arrays, meta)
        return 0
    raise BadInput(f"unknown command {cmd!r} (fit or load)")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the child (see the module docstring for the protocol)."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        return _main(argv)
    except BadInput as exc:
        print(str(exc).replace("\n", " "), file=sys.stderr)
        return BAD_INPUT
    except ValueError as exc:  # wrong argument count / numbers
        print(f"bad arguments {argv!r}: {exc}", file=sys.stderr)
        return BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
