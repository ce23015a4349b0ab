"""`ScannIndex`: a ScaNN nearest-neighbour index over embeddings, with ids, save/load and size-based settings.

Automatic settings (`mode="auto"`), by database size `N` (see `auto_settings`):

- `N < 20,000`: exact brute force. It answers the default evaluation jobs in well under a second per
  thousand queries and leaves nothing to tune.
- `N >= 20,000`: partitioning tree + anisotropic hashing (AH, 2 dimensions per 4-bit block, anisotropic
  threshold 0.2 for dot products) + exact re-ordering. `num_leaves ~ sqrt(N)` (ScaNN's guidance, so a leaf
  holds ~sqrt(N) points); 10% of the leaves are searched up to 200k points, 1% above (finer trees); at
  search time this is raised so the searched leaves hold at least 8x the candidates, and
  `max(reorder, 2 * k)` AH candidates are re-scored exactly (`8 * k` below 128 dimensions, where AH
  codes are coarse). Trees and codebooks train on 20k samples
  (100k above 200k points). Tuned on `scripts/bench_retrieval.py`: on 60,000 x 512 clustered SOP-like data
  (k = 101) Recall@1 / MAP@R stay within 0.05 points of exact search; fewer leaves cost accuracy fast
  (8% of the leaves: -0.3 points Recall@1 and -0.5 MAP@R; 6%: -2 points), more re-ordering does not help.
  On 1,000,000 x 128 clustered vectors (k = 10), 10 of 1,000 leaves give neighbour recall@10 0.986 at ~31k
  queries/s on 2 cores. Pass `num_leaves`, `leaves_to_search`, `reorder`, ... to override.

Values returned by `search` follow ScaNN: dot products (larger = nearer) for `"dot_product"`, squared
Euclidean distances (smaller = nearer) for `"squared_l2"`.
"""

import json
import math
import os
import shutil
import tempfile

import numpy as np

from tfdml.ops.neighbours import validate_distance

MODES = ("auto", "exact", "approximate")
EXACT_BELOW = 20000
_META_FILE = "tfdml_index.json"
_SCANN_DIR = "scann"


def auto_settings(num_points, dim, distance="dot_product"):
    """Tree / AH / reorder parameters for an approximate index of `num_points` vectors of size `dim`."""
    num_leaves = int(min(max(round(math.sqrt(num_points)), 16), 4000))
    # Searching ~10% of the leaves of a small tree (1% of a 1M-point tree) keeps the recall of clustered
    # data high: neighbours of a query are spread over fewer leaves as the tree gets finer.
    fraction = 0.1 if num_points <= 200000 else 0.01
    leaves_to_search = int(max(4, min(num_leaves, round(num_leaves * fraction))))
    return {
        "num_leaves": num_leaves,
        "leaves_to_search": leaves_to_search,
        # 20k samples train a ~250-leaf tree and the AH codebooks as well as 60k do, in a third of the time.
        "training_sample_size": int(min(num_points, 20000 if num_points <= 200000 else 100000)),
        "dimensions_per_block": 2,
        "anisotropic_quantization_threshold": 0.2 if distance == "dot_product" else float("nan"),
        # Candidates re-scored exactly: max(reorder, reorder_factor * k) at search time. Codes of
        # low-dimensional vectors are coarse (few 2-d blocks), so they need more candidates.
        "reorder": 100,
        "reorder_factor": 2 if dim >= 128 else 8,
    }


def _as_float_matrix(x, name):
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"{name} must have shape [rows, dim], got shape {x.shape}.")
    if not np.isfinite(x).all():
        raise ValueError(f"{name} contain NaN or Inf values.")
    return x


class ScannIndex:
    """Nearest-neighbour index over `[N, D]` embeddings backed by ScaNN.

    Args:
      embeddings: `[N, D]` float array (the gallery).
      ids: optional `[N]` ids returned by `search` (ints or strings, e.g. image paths); default `0..N-1`.
      labels: optional `[N]` class labels, saved with the index (used by `tfdml search` to mark same-class
        neighbours).
      class_names: optional names of the classes, `class_names[label]` (printed by `tfdml search`).
      distance: `"dot_product"` (use for L2-normalised embeddings) or `"squared_l2"`.
      mode: `"exact"` (brute force), `"approximate"` (tree + AH + reorder), or `"auto"` (exact below
        20,000 points).
      num_neighbors: default `k` of `search`.
      metadata: optional JSON-serialisable dict saved with the index (e.g. the model version it embeds).
      num_leaves, leaves_to_search, reorder, dimensions_per_block, anisotropic_quantization_threshold,
        training_sample_size: override the automatic approximate settings.

    Example:
      >>> index = ScannIndex(gallery_embeddings, ids=paths)
      >>> ids, scores = index.search(query_embeddings, k=5)
      >>> index.save("exported_models/cub/index"); ScannIndex.load("exported_models/cub/index")
    """

    def __init__(
        self,
        embeddings,
        ids=None,
        labels=None,
        distance="dot_product",
        mode="auto",
        num_neighbors=10,
        metadata=None,
        class_names=None,
        **settings,
    ):
        validate_distance(distance)
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}.")
        embeddings = _as_float_matrix(embeddings, "embeddings")
        num_points = embeddings.shape[0]
        if num_points == 0:
            raise ValueError("cannot build an index over 0 embeddings.")
        self.ids = self._check_vector(ids, num_points, "ids")
        self.labels = self._check_vector(labels, num_points, "labels")
        self.class_names = self._check_class_names(class_names, self.labels)
        self.directory = None
        self.distance = distance
        self.requested_mode = mode
        self.mode = ("exact" if num_points < EXACT_BELOW else "approximate") if mode == "auto" else mode
        self.num_neighbors = int(num_neighbors)
        self.metadata = dict(metadata or {})
        self.size, self.dim = embeddings.shape
        unknown = set(settings) - set(auto_settings(1, 1))
        if unknown:
            raise TypeError(f"unknown ScannIndex settings {sorted(unknown)}; valid: {sorted(auto_settings(1, 1))}.")
        self.settings = {}
        if self.mode == "approximate":
            self.settings = {**auto_settings(num_points, self.dim, distance), **settings}
            self.settings["num_leaves"] = int(min(self.settings["num_leaves"], num_points))
            self.settings["leaves_to_search"] = int(min(self.settings["leaves_to_search"], self.settings["num_leaves"]))
        self._searcher = self._build(embeddings)

    @staticmethod
    def _check_vector(values, num_points, name):
        if values is None:
            return None
        values = np.asarray(values)
        if values.shape != (num_points,):
            raise ValueError(f"{name} must have one entry per embedding ({num_points}), got shape {values.shape}.")
        return values

    @staticmethod
    def _check_class_names(class_names, labels):
        if class_names is None:
            return None
        class_names = [str(name) for name in class_names]
        if (
            labels is not None
            and labels.size
            and np.issubdtype(labels.dtype, np.integer)
            and (labels.min() < 0 or labels.max() >= len(class_names))
        ):
            raise ValueError(
                f"class_names has {len(class_names)} names but the labels go from "
                f"{labels.min()} to {labels.max()}: class_names[label] must name every label."
            )
        return class_names

    def class_name(self, position):
        """Name (or label as a string) of the class of the gallery item at `position`; None without labels."""
        if self.labels is None:
            return None
        label = self.labels[position]
        return self.class_names[int(label)] if self.class_names is not None else str(label)

    def _build(self, embeddings):
        import scann  # loaded when an index is built or loaded: its custom ops are not needed before

        builder = scann.scann_ops_pybind.builder(embeddings, self.num_neighbors, self.distance)
        if self.mode == "exact":
            return builder.score_brute_force().build()
        s = self.settings
        builder = builder.tree(
            num_leaves=s["num_leaves"],
            num_leaves_to_search=s["leaves_to_search"],
            training_sample_size=s["training_sample_size"],
            min_partition_size=max(1, min(50, self.size // (4 * s["num_leaves"]))),
        )
        builder = builder.score_ah(
            s["dimensions_per_block"],
            anisotropic_quantization_threshold=s["anisotropic_quantization_threshold"],
            training_sample_size=s["training_sample_size"],
        )
        return builder.reorder(max(s["reorder"], self.num_neighbors)).build()

    def search(self, queries, k=None, leaves_to_search=None, reorder=None):
        """Top-`k` neighbours of each `[Q, D]` query row.

        Returns `(ids, values)`: `[Q, k]` ids (the constructor's `ids`, else row numbers) nearest first, and
        float32 `[Q, k]` dot products or squared distances. A single `[D]` query gives `[k]` results.
        """
        k = self.num_neighbors if k is None else int(k)
        if not 1 <= k <= self.size:
            raise ValueError(f"k must be between 1 and the index size {self.size}, got {k}.")
        queries = np.asarray(queries)
        single = queries.ndim == 1
        queries = _as_float_matrix(queries[None] if single else queries, "queries")
        if queries.shape[1] != self.dim:
            raise ValueError(f"queries have dimension {queries.shape[1]} but the index holds {self.dim}-d embeddings.")
        kwargs = {}
        if self.mode == "approximate":
            factor = self.settings.get("reorder_factor", 2)
            pre_reorder = int(max(reorder or self.settings["reorder"], math.ceil(factor * k)))
            kwargs["pre_reorder_num_neighbors"] = pre_reorder
            kwargs["leaves_to_search"] = int(leaves_to_search or self._leaves_for(pre_reorder))
        indices, values = self._searcher.search_batched_parallel(queries, final_num_neighbors=k, **kwargs)
        indices = np.asarray(indices, np.int64)
        if indices.shape[1] < k:  # ScaNN pads nothing when fewer candidates exist; make it an error
            raise RuntimeError(
                f"ScaNN returned only {indices.shape[1]} neighbours for k={k}; search more "
                f"leaves (leaves_to_search) or use mode='exact'."
            )
        ids = indices if self.ids is None else self.ids[indices]
        values = np.asarray(values, np.float32)
        return (ids[0], values[0]) if single else (ids, values)

    def _leaves_for(self, candidates):
        """Configured leaves to search, raised so the searched leaves hold ~8x the reorder candidates."""
        leaves = self.settings["num_leaves"]
        mean_leaf = self.size / leaves
        needed = math.ceil(8 * candidates / mean_leaf)
        return min(leaves, max(self.settings["leaves_to_search"], needed))

    def config(self):
        """JSON-serialisable description of the index (saved next to the ScaNN artifacts)."""
        return {
            "format": "tfdml.ScannIndex/1",
            "distance": self.distance,
            "mode": self.mode,
            "requested_mode": self.requested_mode,
            "num_neighbors": self.num_neighbors,
            "size": int(self.size),
            "dim": int(self.dim),
            "settings": self.settings,
            "has_ids": self.ids is not None,
            "has_labels": self.labels is not None,
            "class_names": self.class_names,
            "metadata": self.metadata,
        }

    def save(self, directory, arrays=None):
        """Writes the index to `directory` (replaced atomically if it exists); returns the path.

        `arrays`: optional `{file_name.npy: array}` saved with it (read back with `load_array`). The ScaNN
        artifacts use relative paths, so the directory can be moved or copied and still loads.
        """
        directory = os.path.abspath(os.fspath(directory))
        parent = os.path.dirname(directory)
        os.makedirs(parent, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=".tmp-index-", dir=parent)
        try:
            os.makedirs(os.path.join(tmp, _SCANN_DIR))
            self._searcher.serialize(os.path.join(tmp, _SCANN_DIR), relative_path=True)
            if self.ids is not None:
                np.save(os.path.join(tmp, "ids.npy"), self.ids, allow_pickle=False)
            if self.labels is not None:
                np.save(os.path.join(tmp, "labels.npy"), self.labels, allow_pickle=False)
            for file_name, array in (arrays or {}).items():
                np.save(os.path.join(tmp, file_name), np.asarray(array), allow_pickle=False)
            with open(os.path.join(tmp, _META_FILE), "w") as f:
                json.dump(self.config(), f, indent=2)
            _replace_directory(tmp, directory)
            self.directory = directory
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return directory

    @classmethod
    def load(cls, directory):
        """Loads an index written by `save` (from wherever the directory now lives)."""
        import scann  # loaded when an index is built or loaded: its custom ops are not needed before

        directory = os.fspath(directory)
        meta_path = os.path.join(directory, _META_FILE)
        if not os.path.exists(meta_path):
            raise FileNotFoundError(f"{directory!r} is not a saved ScannIndex (no {_META_FILE}).")
        with open(meta_path) as f:
            config = json.load(f)
        index = cls.__new__(cls)
        index.distance = config["distance"]
        index.mode = config["mode"]
        index.requested_mode = config.get("requested_mode", index.mode)
        index.num_neighbors = config["num_neighbors"]
        index.size, index.dim = config["size"], config["dim"]
        index.settings = config["settings"]
        index.metadata = config.get("metadata", {})
        index.class_names = config.get("class_names")
        index.directory = os.path.abspath(directory)

        def optional(name, wanted):
            return np.load(os.path.join(directory, name), allow_pickle=False) if wanted else None

        index.ids = optional("ids.npy", config["has_ids"])
        index.labels = optional("labels.npy", config["has_labels"])
        index._searcher = scann.scann_ops_pybind.load_searcher(os.path.join(directory, _SCANN_DIR))
        return index

    def load_array(self, file_name):
        """An array saved with `save(..., arrays=...)`, or None when the saved index has none of that name."""
        path = os.path.join(self.directory or "", file_name)
        return np.load(path, allow_pickle=False) if self.directory and os.path.exists(path) else None

    def __repr__(self):
        return f"ScannIndex(size={self.size}, dim={self.dim}, distance={self.distance!r}, mode={self.mode!r})"


def _replace_directory(new, target):
    """Moves directory `new` to `target`; an existing `target` is swapped out first and then deleted."""
    old = None
    if os.path.exists(target):
        old = tempfile.mkdtemp(prefix=".old-", dir=os.path.dirname(target))
        os.rename(target, os.path.join(old, "previous"))
    os.rename(new, target)
    if old:
        shutil.rmtree(old, ignore_errors=True)
