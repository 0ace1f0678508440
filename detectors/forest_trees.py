"""Isolation-forest scoring in numpy, and the child process that fits or loads the trees.

:class:`TreeEnsemble` evaluates a fitted scikit-learn ``IsolationForest`` from its trees'
arrays, exactly as ``IsolationForest.score_samples`` does (same float32 input, same
comparisons, same per-tree accumulation order): scores agree to the last bit in the
project's tests. It needs numpy only, so a live process scores its forest without
importing scikit-learn or scipy (~90 MiB of RSS), and batch uses the same scorer so batch
and live scores are identical.

:func:`run_child` fits or loads a forest in a short-lived child process
(:mod:`toolwatch.detectors.forest_child`) and returns its trees.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from toolwatch.detectors import forest_child

from toolwatch.errors import ModelError

#: Wall-clock limit of one child (fit or load). Fitting 100 trees of 256 samples takes
#: well under a second; the limit only catches a hung child.
CHILD_TIMEOUT_S = 300.0

#: Rows scored per block: ``trees x rows`` node indices stay small enough for the caches
#: (2^15: measured fastest of 2^14..2^18 on 20k rows x 100 trees).
BLOCK_ELEMENTS = 1 << 15

_ARRAY_KEYS = ("node_offsets", "children_left", "children_right", "feature", "threshold",
               "n_node_samples", "missing_go_to_left", "features", "max_samples",
               "n_features_in")


def _average_path_length(n: np.ndarray) -> np.ndarray:
    """scikit-learn's ``_average_path_length`` (c(n) of Liu et al.), same float ops."""
    n = np.asarray(n, dtype=np.float64)
    out = np.zeros(n.shape)
    big = n > 2
    out[n == 2] = 1.0
    out[big] = 2.0 * (np.log(n[big] - 1.0) + np.euler_gamma) - 2.0 * (n[big] - 1.0) / n[big]
    return out


@dataclass(frozen=True)
class TreeEnsemble:
    """A fitted isolation forest as arrays, scored without scikit-learn.

    Nodes are renumbered breadth-first per tree so that a node's children are adjacent
    (``right = left + 1``): one step of the descent is then
    ``node = left[node] + (not goes_left)``, with no separate right-child lookup. Leaves
    point at themselves with an infinite threshold, so the descent runs a fixed number
    of steps (the deepest leaf) for every row, vectorised over rows and trees at once.
    """

    #: Per node (all trees): left child (``= self`` for leaves), global input column,
    #: threshold (``+inf`` at leaves), NaN goes left, path length if the row ends here.
    left: np.ndarray
    feature: np.ndarray
    threshold: np.ndarray
    nan_left: np.ndarray
    leaf_value: np.ndarray
    #: Each tree's root node.
    roots: np.ndarray
    #: Steps from a root to the deepest leaf.
    steps: int
    #: ``n_trees * c(max_samples)``: the normaliser of the mean path length.
    denominator: float
    n_features: int
    #: The arrays this was built from (:meth:`to_arrays`), for saving.
    source: dict[str, np.ndarray]

    @property
    def n_trees(self) -> int:
        """Number of trees."""
        return int(self.roots.shape[0])

    # ------------------------------------------------------------------ building
    @classmethod
    def from_sklearn(cls, model: Any) -> TreeEnsemble:
        """The trees of a fitted ``sklearn.ensemble.IsolationForest``."""
        return cls.from_arrays(forest_child.tree_arrays(model))

    @classmethod
    def from_arrays(cls, a: dict[str, np.ndarray]) -> TreeEnsemble:
        """Build from :func:`forest_child.tree_arrays` output (validated: the arrays may
        come from a file).

        Raises
        ------
        ModelError
            Missing arrays, wrong shapes, or a node structure that is not a forest.
        """
        try:
            src = {k: np.asarray(a[k]) for k in _ARRAY_KEYS}
        except KeyError as exc:
            raise ModelError(f"forest arrays lack {exc}") from exc
        offs = src["node_offsets"].astype(np.int64)
        cl = src["children_left"].astype(np.int64)
        cr = src["children_right"].astype(np.int64)
        feat = src["feature"].astype(np.int64)
        thr = src["threshold"].astype(np.float64)
        nns = src["n_node_samples"].astype(np.int64)
        mleft = src["missing_go_to_left"].astype(bool)
        fmap = src["features"].astype(np.int64)
        n_in = int(src["n_features_in"])
        max_samples = int(src["max_samples"])
        n_nodes = int(offs[-1]) if offs.size else 0
        n_trees = offs.size - 1
        if (n_trees < 1 or offs[0] != 0 or np.any(np.diff(offs) < 1) or n_in < 1
                or any(v.shape != (n_nodes,) for v in (cl, cr, feat, thr, nns, mleft))
                or fmap.shape[0] != n_trees or fmap.ndim != 2):
            raise ModelError("forest arrays have inconsistent shapes")
        tree_of = np.repeat(np.arange(n_trees), np.diff(offs))
        local = np.arange(n_nodes) - offs[tree_of]
        size = np.diff(offs)[tree_of]
        leaf = cl == -1
        inner = ~leaf
        # Children after their parent, inside the tree: guarantees a finite descent.
        if (np.any(cr[leaf] != -1) or np.any(cl[inner] <= local[inner])
                or np.any(cr[inner] <= local[inner]) or np.any(cl[inner] >= size[inner])
                or np.any(cr[inner] >= size[inner])):
            raise ModelError("forest arrays do not describe trees")
        if np.any(feat[inner] < 0) or np.any(feat[inner] >= fmap.shape[1]):
            raise ModelError("forest arrays name features out of range")
        gfeat = np.zeros(n_nodes, dtype=np.int64)
        gfeat[inner] = fmap[tree_of[inner], feat[inner]]
        if np.any(gfeat < 0) or np.any(gfeat >= n_in):
            raise ModelError("forest arrays name features out of range")

        # Depth of every node (root = 1, as scikit-learn's compute_node_depths), parents
        # first: children always have higher indices than their parent.
        depth = np.zeros(n_nodes, dtype=np.int64)
        depth[offs[:-1]] = 1
        g_left = np.where(inner, cl + offs[tree_of], -1)
        g_right = np.where(inner, cr + offs[tree_of], -1)
        frontier = offs[:-1].copy()
        order = [frontier]
        while frontier.size:
            fr = frontier[inner[frontier]]
            kids = np.stack([g_left[fr], g_right[fr]], axis=1).ravel()
            depth[kids] = np.repeat(depth[fr] + 1, 2)
            frontier = kids
            if kids.size:
                order.append(kids)
        if int(sum(o.size for o in order)) != n_nodes:
            raise ModelError("forest arrays do not describe trees (unreachable nodes)")
        # scikit-learn: depths += decision_path_length[leaf] + c(n_node_samples[leaf]) - 1.
        leaf_value = depth.astype(np.float64) + _average_path_length(nns) - 1.0

        # Breadth-first renumbering: siblings adjacent (left child first).
        bfs = np.concatenate(order)  # new index -> old global index
        new_of = np.empty(n_nodes, dtype=np.int64)
        new_of[bfs] = np.arange(n_nodes)
        o_inner = inner[bfs]
        left = np.arange(n_nodes, dtype=np.int64)
        left[o_inner] = new_of[g_left[bfs][o_inner]]
        if np.any(new_of[g_right[bfs][o_inner]] != left[o_inner] + 1):
            raise ModelError("forest arrays do not describe trees")  # pragma: no cover
        threshold = np.where(o_inner, thr[bfs], np.inf)
        # A leaf must keep every row, NaN included: NaN "goes left" (to itself) there.
        nan_left = np.where(o_inner, mleft[bfs], True)
        denominator = float(n_trees) * float(_average_path_length(np.array([max_samples]))[0])
        # intp: numpy converts any other index type to intp on every gather.
        return cls(
            left=left.astype(np.intp),
            feature=gfeat[bfs].astype(np.intp),
            threshold=threshold,
            nan_left=nan_left,
            leaf_value=leaf_value[bfs],
            roots=new_of[offs[:-1]].astype(np.intp),
            steps=int(depth.max()) - 1,
            denominator=denominator,
            n_features=n_in,
            source=src,
        )

    def to_arrays(self) -> dict[str, np.ndarray]:
        """The arrays :meth:`from_arrays` takes (for an ``.npz``)."""
        return dict(self.source)

    # ------------------------------------------------------------------ scoring
    def path_lengths(self, x: np.ndarray) -> np.ndarray:
        """Sum over trees of each row's path length (scikit-learn's ``depths``)."""
        n = x.shape[0]
        # scikit-learn scores float32 input (validate_data(dtype=float32)); comparing the
        # float32 values, widened exactly to float64, with the float64 thresholds is what
        # its tree code does.
        with np.errstate(over="ignore"):  # |x| > 3.4e38 becomes inf, as in scikit-learn
            xv = np.ascontiguousarray(np.asarray(x, dtype=np.float64).astype(np.float32),
                                      dtype=np.float64)
        has_nan = bool(np.isnan(xv).any())
        depths = np.zeros(n, dtype=np.float64)
        block = max(1, BLOCK_ELEMENTS // self.n_trees)
        f = self.n_features
        for lo in range(0, n, block):
            xb = xv[lo: lo + block]
            m = xb.shape[0]
            flat = xb.ravel()
            base = (np.arange(m, dtype=np.intp) * f)[None, :]
            node = np.repeat(self.roots[:, None], m, axis=1)
            for _ in range(self.steps):
                v = flat[base + self.feature[node]]
                # v > t is "not v <= t" except for NaN, which goes where the tree says.
                right = v > self.threshold[node]
                if has_nan:
                    right |= np.isnan(v) & ~self.nan_left[node]
                node = self.left[node] + right
            # scikit-learn adds the trees one after the other: same order, same rounding.
            lv = self.leaf_value[node]
            d = depths[lo: lo + m]
            for t in range(self.n_trees):
                d += lv[t]
        return depths

    def iso_scores(self, x: np.ndarray) -> np.ndarray:
        """Isolation scores ``2^(-E[h(x)] / c(n))`` (= ``-score_samples``) of the rows."""
        x = np.asarray(x)
        if x.ndim != 2 or x.shape[1] != self.n_features:
            raise ValueError(f"expected a (rows, {self.n_features}) matrix, got {x.shape}")
        depths = self.path_lengths(x)
        denom = np.array([self.denominator])
        q = np.divide(depths, denom, out=np.ones_like(depths), where=denom != 0)
        return 2 ** (-q)


# ---------------------------------------------------------------------- child process
@dataclass
class ChildResult:
    """What a child process handed back."""

    trees: TreeEnsemble
    #: Learned fields (``load``) and versions; JSON values.
    meta: dict[str, Any]
    #: Learned arrays of a loaded model (``medians``, ``center``, ``scale``, ``raw_medians``).
    state: dict[str, np.ndarray]
    wall_s: float
    peak_rss_mib: float


def _read_npz(path: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    meta = json.loads(str(arrays.pop("meta"))) if "meta" in arrays else {}
    if not isinstance(meta, dict):
        raise ModelError(f"{path}: metadata is not a mapping")
    return arrays, meta


def run_child(cmd: str, *args: str, timeout: float | None = None) -> ChildResult:
    """Run :mod:`forest_child` ``cmd`` in a fresh interpreter and read back its trees.

    ``cmd`` is ``fit`` (``args``: the ``.npy`` feature matrix, n_estimators, max_samples,
    random_state) or ``load`` (``args``: the skops file, the trusted-types JSON); the
    output path is added here.

    Raises
    ------
    ModelError
        The child refused its input (its reason), crashed, was killed, timed out, or
        wrote unusable output.
    """
    with tempfile.TemporaryDirectory(prefix="toolwatch-forest-") as tmp:
        out = Path(tmp) / "trees.npz"
        args_l = list(args)
        argv = [sys.executable, "-I", forest_child.__file__, cmd, args_l[0], str(out),
                *args_l[1:]]
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(
                argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                timeout=CHILD_TIMEOUT_S if timeout is None else timeout,
                env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")},
            )
        except subprocess.TimeoutExpired as exc:
            raise ModelError(
                f"isolation forest child ({cmd}) timed out after {exc.timeout:.0f} s"
            ) from exc
        except OSError as exc:
            raise ModelError(f"cannot start the isolation forest child: {exc}") from exc
        wall = time.perf_counter() - t0
        err = (proc.stderr or "").strip().splitlines()
        if proc.returncode == forest_child.BAD_INPUT:
            raise ModelError(err[-1] if err else f"isolation forest child ({cmd}) refused")
        if proc.returncode < 0:
            raise ModelError(
                f"isolation forest child ({cmd}) was killed by signal {-proc.returncode}"
            )
        if proc.returncode != 0:
            tail = err[-1] if err else "no message"
            raise ModelError(
                f"isolation forest child ({cmd}) failed with status {proc.returncode}: {tail}"
            )
        try:
            arrays, meta = _read_npz(out)
        except (OSError, ValueError, KeyError) as exc:
            raise ModelError(f"isolation forest child ({cmd}) wrote no usable trees: {exc}") \
                from exc
    state = {k.removeprefix("state_"): v for k, v in arrays.items() if k.startswith("state_")}
    trees = TreeEnsemble.from_arrays({k: v for k, v in arrays.items() if k in _ARRAY_KEYS})
    return ChildResult(trees, meta, state, wall, float(meta.get("peak_rss_kib", 0)) / 1024)
