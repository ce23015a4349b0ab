"""`ScannIndex`: a ScaNN nearest-neighbour index over embeddings, with ids, save/load and size-based settings.

Automatic settings (`mode="auto"`), by database size `N` (see `auto_settings`):

- `N < 20,000`: exact brute force: fast enough at that size, and nothing to tune.
- `N >= 20,000`: partitioning tree (`num_leaves ~ sqrt(N)`, ScaNN's guidance) + anisotropic hashing + exact
  re-ordering; trees and codebooks train on the whole gallery up to 100k points, on a 100k sample above.
- Embeddings of 128 dimensions or more whose energy lies in a subspace of at most half of them (real
  embeddings: low intrinsic dimension) are partitioned and hashed after a PCA projection onto the fewest
  principal directions (a multiple of 16) that hold `PROJECTION_ENERGY` of their summed squared norms; the
  candidates are still re-ordered with the full vectors, so the returned values are exact. A projected index
  that misses its recall target is built again without the projection (`index.recall["projected"]` keeps
  the first attempt's record). Other data, and `"squared_l2"` indexes, are not projected (`principal_dims`).

How many leaves to search and how many candidates to re-score depend on the data far more than on its size,
so an approximate index **meets a recall target** rather than trusting fixed fractions: `target_recall`
(default 0.95) is the recall@k against exact search the index must reach. After building, it measures it on
`RECALL_QUERIES` gallery items, each left out of its own neighbour lists (or on the `recall_queries` given),
finds for each number of re-ordered candidates the fewest leaves at which the target holds at
`RECALL_CONFIDENCE` (one-sided: the mean less `z` standard errors is at least the target), keeps the fastest
of these settings and records the recall, its standard error and bound, the settings and the query time in
`index.recall` (saved in `tfdml_index.json`). A target not met with every leaf searched, or only no faster than
exact search, falls back to brute force (`mode` becomes `"exact"`, `index.recall["fallback"]` says why).
Explicit `leaves_to_search` or `reorder` are kept (the recall is still recorded); `target_recall=None` skips
the measurement. The search benchmark of the documentation measures speed and recall against faiss."""

import json
import math
import os
import shutil
import statistics
import tempfile

import numpy as np

from tfdml import durable
from tfdml.ops.neighbours import validate_distance
from tfdml.retrieval import tuning
from tfdml.retrieval.tuning import RECALL_CONFIDENCE, RECALL_QUERIES, describe_recall  # noqa: F401
from tfdml.retrieval_options import INDEX_MODES, TARGET_RECALL

MODES = INDEX_MODES
EXACT_BELOW = 20000
DEFAULT_TARGET_RECALL = TARGET_RECALL
# PCA projection (see the module docstring): the share of the summed squared norms the kept directions hold, the
# least dimension projected, the rows its spectrum is computed from, and the multiple the kept dimension rounds to.
PROJECTION_ENERGY = 0.98
_PROJECT_FROM_DIM = 128
_PROJECTION_SAMPLE = 20000
_PROJECTION_MULTIPLE = 16
_META_FILE = "tfdml_index.json"
_SCANN_DIR = "scann"


def auto_settings(num_points, dim, distance="dot_product", projection_dims=0):
    """Tree / AH / reorder parameters for an approximate index of `num_points` vectors of size `dim`, searched
    in `projection_dims` principal directions (0: none; `ScannIndex` chooses them with `principal_dims`)."""
    searched_dim = int(projection_dims) or dim
    num_leaves = int(min(max(round(math.sqrt(num_points)), 16), 4000))
    # The starting point of the recall search (see the module docstring): ~10% of the leaves of a small
    # tree, 1% of a 1M-point tree (neighbours spread over fewer leaves as the tree gets finer).
    fraction = 0.1 if num_points <= 200000 else 0.01
    leaves_to_search = int(max(4, min(num_leaves, round(num_leaves * fraction))))
    return {
        "num_leaves": num_leaves,
        "leaves_to_search": leaves_to_search,
        # Up to 100k samples train the tree and the AH codebooks: a tree trained on a small sample needs many
        # more leaves for the same recall, and larger samples did not hold the recall on fresh queries
        # (the search benchmark).
        "training_sample_size": int(min(num_points, 100000)),
        # 4 dimensions per 4-bit block from 256 dimensions: faster queries and builds at the same recall after
        # tuning (the recall target makes up for the coarser codes with leaves and re-ordering); below 256 (also
        # after a projection) 2 dimensions a block need fewer re-ordered candidates (the search benchmark).
        "dimensions_per_block": 4 if searched_dim >= 256 else 2,
        "anisotropic_quantization_threshold": 0.2 if distance == "dot_product" else float("nan"),
        # Candidates re-scored exactly: max(reorder, reorder_factor * k) at search time. Codes of
        # low-dimensional vectors are coarse (few 2-d blocks), so they need more candidates.
        # Re-ordering fetches each candidate's float32 vector (a cache miss each): 100 candidates cost about
        # as much as searching 10 leaves of 316 at 100k x 512, so the recall search starts at 40 (then 80, 160).
        "reorder": 40,
        "reorder_factor": 2 if dim >= 128 else 8,
        # Principal directions the tree and the hashed codes work in (0: the vectors as they are).
        "projection_dims": int(projection_dims),
    }


def principal_dims(embeddings, energy=None):
    """The PCA dimension an index over `[N, D]` `embeddings` partitions and hashes in: the fewest principal
    directions (of the uncentred second moment of up to `_PROJECTION_SAMPLE` rows, rounded up to a multiple of
    16) that hold `energy` (default `PROJECTION_ENERGY`) of the summed squared norms, where that is at most
    `D / 2` and `D >= 128`; else 0 (no projection: it would save too little, or lose what the exact
    re-ordering cannot recover)."""
    energy = PROJECTION_ENERGY if energy is None else float(energy)
    num_points, dim = embeddings.shape
    if dim < _PROJECT_FROM_DIM or num_points < 2:
        return 0
    rows = np.random.default_rng(0).choice(num_points, min(num_points, _PROJECTION_SAMPLE), replace=False)
    sample = np.asarray(embeddings[np.sort(rows)], np.float64)
    spectrum = np.linalg.eigvalsh(sample.T @ sample)[::-1].clip(min=0.0)
    total = spectrum.sum()
    if not total > 0:
        return 0
    kept = int(np.searchsorted(np.cumsum(spectrum) / total, energy) + 1)
    kept = _PROJECTION_MULTIPLE * math.ceil(kept / _PROJECTION_MULTIPLE)
    return kept if kept <= dim // 2 else 0


def _as_float_matrix(x, name):
    x = np.ascontiguousarray(x, dtype=np.float32)  # no copy when it already is
    if x.ndim != 2:
        raise ValueError(f"{name} must have shape [rows, dim], got shape {x.shape}.")
    _check_finite(x, name)
    return x


def _check_finite(x, name):
    """Raises on a NaN or Inf in the float32 C-ordered `x`. The sum of squares is NaN or Inf whenever an entry
    is, so a finite one (one BLAS dot product: ~2 us for a 512-d query) proves every entry finite without the
    boolean array of `np.isfinite(x)`; only a sum that is not finite (a NaN, an Inf, or entries whose squares
    overflow) is checked entry by entry."""
    flat = x.reshape(-1)
    with np.errstate(over="ignore", invalid="ignore"):
        squares = np.dot(flat, flat)
    if not math.isfinite(squares) and not np.isfinite(flat).all():
        raise ValueError(f"{name} contain NaN or Inf values.")


class ScannIndex:
    """Nearest-neighbour index over `[N, D]` embeddings backed by ScaNN.

    Args:
      embeddings: `[N, D]` float array (the gallery).
      ids: optional `[N]` ids returned by `search` (ints or strings, e.g. image paths); default `0..N-1`.
      labels: optional `[N]` class labels, saved with the index (used by `tfdml search` to mark same-class
        neighbours).
      class_names: optional names of the classes, `class_names[label]` (printed by `tfdml search`).
      distance: `"dot_product"` (use for L2-normalised embeddings) or `"squared_euclidean"`; the index keeps
        ScaNN's name of it, `"squared_l2"` (also accepted), in `distance` and in its saved metadata.
      mode: `"exact"` (brute force), `"approximate"` (tree + AH + reorder), or `"auto"` (exact below
        20,000 points).
      num_neighbors: default `k` of `search`, and the `k` of the recall target.
      metadata: optional JSON-serialisable dict saved with the index (e.g. the model version it embeds).
      target_recall: for an approximate index, the recall@k against exact search it must reach (see the
        module docstring); None: no measurement.
      recall_queries: optional `[Q, D]` queries the recall is measured on (default: `RECALL_QUERIES`
        gallery items, each left out of its own neighbour lists).
      num_leaves, leaves_to_search, reorder, dimensions_per_block, anisotropic_quantization_threshold,
        training_sample_size, reorder_factor, projection_dims: override the automatic approximate settings
        (`projection_dims=0`: no PCA projection).

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
        target_recall=DEFAULT_TARGET_RECALL,
        recall_queries=None,
        **settings,
    ):
        distance = "squared_l2" if validate_distance(distance) == "squared_euclidean" else distance  # ScaNN's
        if target_recall is not None and not 0.0 < float(target_recall) <= 1.0:
            raise ValueError(f"target_recall must be in (0, 1] or None, got {target_recall}.")
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
            projection = settings.get("projection_dims")
            if projection is None:  # chosen from the data (see the module docstring); ScaNN projects dot products only
                projection = principal_dims(embeddings) if distance == "dot_product" else 0
            elif projection and distance != "dot_product":
                raise ValueError(f"projection_dims applies to the dot_product distance only (ScaNN), got {distance!r}.")
            self._set_approximate(settings, projection)
        self.recall = None
        self._searcher = self._build(embeddings)
        if self.mode == "approximate" and target_recall is not None:
            fixed = bool({"leaves_to_search", "reorder"} & set(settings))
            self.tune(embeddings, target_recall, recall_queries, search_settings=not fixed)
            if self.recall["fell_back"] and projection and settings.get("projection_dims") is None:
                # The automatic projection lost too much: the vectors as they are, before brute force.
                projected = self.recall
                self.mode = "approximate"
                self._set_approximate(settings, 0)
                self._searcher = self._build(embeddings)
                self.tune(embeddings, target_recall, recall_queries, search_settings=not fixed)
                self.recall["projected"] = projected

    def _set_approximate(self, settings, projection):
        """The approximate settings: the automatic ones for `projection_dims=projection`, then those given."""
        self.settings = {**auto_settings(self.size, self.dim, self.distance, projection), **settings}
        self.settings["projection_dims"] = int(projection)
        self.settings["num_leaves"] = int(min(self.settings["num_leaves"], self.size))
        self.settings["leaves_to_search"] = int(min(self.settings["leaves_to_search"], self.settings["num_leaves"]))

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
        projection = int(s.get("projection_dims") or 0)  # indexes saved before projections have none
        if projection:
            if not 0 < projection < self.dim:
                raise ValueError(f"projection_dims must be in (0, {self.dim}) or 0 (none), got {projection}.")
            builder = builder.pca(reduction_dim=projection, pca_significance_threshold=None)
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

    def search(self, queries, k=None, leaves_to_search=None, reorder=None, positions=False):
        """Top-`k` neighbours of each `[Q, D]` query row.

        Returns `(ids, values)`: `[Q, k]` ids (the constructor's `ids`, else row numbers; with
        `positions=True` always the row numbers, e.g. to look up `labels`) nearest first, and float32
        `[Q, k]` dot products or squared distances. A single `[D]` query gives `[k]` results.
        """
        k = self.num_neighbors if k is None else int(k)
        if not 1 <= k <= self.size:
            raise ValueError(f"k must be between 1 and the index size {self.size}, got {k}.")
        queries = np.ascontiguousarray(queries, dtype=np.float32)  # no copy for float32 C-ordered queries
        single = queries.ndim == 1
        if single:  # the single-query path: a `[D]` vector straight to ScaNN's single-query call
            if queries.shape[0] != self.dim:
                raise ValueError(
                    f"the query has dimension {queries.shape[0]} but the index holds {self.dim}-d embeddings."
                )
            _check_finite(queries, "queries")
        else:
            queries = _as_float_matrix(queries, "queries")
            if queries.shape[1] != self.dim:
                raise ValueError(
                    f"queries have dimension {queries.shape[1]} but the index holds {self.dim}-d embeddings."
                )
        indices, values = self._search(queries, k, leaves_to_search, reorder)
        indices = np.asarray(indices, np.int64)
        if indices.shape[-1] < k:  # ScaNN pads nothing when fewer candidates exist; make it an error
            raise RuntimeError(
                f"ScaNN returned only {indices.shape[-1]} neighbours for k={k}; search more "
                f"leaves (leaves_to_search) or use mode='exact'."
            )
        ids = indices if self.ids is None or positions else self.ids[indices]
        return ids, np.asarray(values, np.float32)

    def _search(self, queries, k, leaves_to_search=None, reorder=None):
        """ScaNN's `(indices, values)`: `[k]` for a `[D]` float32 query, `[Q, k]` for `[Q, D]` queries. A `[D]`
        query or a batch of one goes through ScaNN's single-query call (`search`): the batched-parallel one
        starts a thread pool per call, which costs more than the search itself for one query. A `[D]` query is
        passed as it is (no `[1, D]` copy, no conversion of the answer). ScaNN scores the hashed codes of a
        batch of several queries with another kernel than one query's, so an approximate index may order two
        near-tied candidates differently: on 100k x 512 embedding-like data 3 of 256 queries differ in one
        neighbour at the cut between the two calls, with the same recall."""
        kwargs = {}
        if self.mode == "approximate":
            factor = self.settings.get("reorder_factor", 2)
            pre_reorder = int(max(reorder or self.settings["reorder"], math.ceil(factor * k)))
            kwargs["pre_reorder_num_neighbors"] = pre_reorder
            kwargs["leaves_to_search"] = int(leaves_to_search or self._leaves_for(pre_reorder, k))
        if queries.ndim == 1:
            return self._searcher.search(queries, final_num_neighbors=k, **kwargs)
        if len(queries) == 1:
            found, values = self._searcher.search(queries[0], final_num_neighbors=k, **kwargs)
            return np.asarray(found)[None], np.asarray(values)[None]
        return self._searcher.search_batched_parallel(queries, final_num_neighbors=k, **kwargs)

    def _leaves_for(self, candidates, k):
        """Configured leaves to search. Where the recall target chose them (for `k` up to the tuned one) they
        are used as measured; otherwise they are raised so that the searched leaves hold ~8x the reorder
        candidates."""
        leaves = self.settings["num_leaves"]
        if self.recall and self.recall.get("tuned") and k <= self.recall["k"]:
            return min(leaves, self.settings["leaves_to_search"])
        mean_leaf = self.size / leaves
        needed = math.ceil(8 * candidates / mean_leaf)
        return min(leaves, max(self.settings["leaves_to_search"], needed))

    def tune(
        self,
        embeddings,
        target_recall=DEFAULT_TARGET_RECALL,
        queries=None,
        k=None,
        search_settings=True,
        fallback=True,
        confidence=RECALL_CONFIDENCE,
    ):
        """Measures recall@k against exact search and, with `search_settings`, sets the fewest leaves to search
        (and re-ordered candidates) that reach `target_recall`, or falls back to brute force (see the module
        docstring). `embeddings` are the indexed `[N, D]` vectors (for the exact neighbours); `queries`
        default to `RECALL_QUERIES` of them, each left out of its own neighbour lists. `fallback=False` keeps
        the approximate index where the target is not met (the record's `fallback` says so, `fell_back` is
        False). Returns `self.recall`.

        The target is met when the lower confidence bound of the recall holds it: the sample's mean recall less
        `z` standard errors of that mean (`z` = 1.645 for the one-sided `confidence` 0.95), so that the target
        also holds, at that confidence, on queries other than the sample. The record keeps the mean
        (`measured`), its `standard_error`, the `lower_bound`, the `confidence` and the number of `queries`.
        """
        if self.mode != "approximate":
            raise ValueError("tune applies to an approximate index; this one is exact.")
        if not 0.0 < float(target_recall) <= 1.0:
            raise ValueError(f"target_recall must be in (0, 1], got {target_recall}.")
        if not 0.5 <= float(confidence) < 1.0:
            raise ValueError(f"confidence must be in [0.5, 1), got {confidence}.")
        z = statistics.NormalDist().inv_cdf(float(confidence))
        embeddings = _as_float_matrix(embeddings, "embeddings")
        if embeddings.shape != (self.size, self.dim):
            raise ValueError(f"tune needs the {self.size} x {self.dim} indexed embeddings, got {embeddings.shape}.")
        k = int(min(k or self.num_neighbors, self.size - 1))
        if queries is None:
            rows = np.random.default_rng(0).choice(self.size, min(RECALL_QUERIES, self.size), replace=False)
            queries, source = embeddings[rows], "gallery items, each left out of its own neighbours"
        else:
            queries = _as_float_matrix(queries, "recall_queries")
            rows, source = None, "given queries"
        exact, exact_seconds = tuning.timed(
            lambda: tuning.exact_neighbours(queries, embeddings, k, self.distance, rows)
        )
        # Measured as `search` will run: with the leaves as given where they are being tuned.
        self.recall = {"tuned": bool(search_settings), "k": k + 1}
        probe = tuning.Probe(self, queries, rows, exact, k, z)
        record, leaves, seconds = tuning.recall_record(
            self, probe, target_recall, confidence, search_settings, source, exact_seconds
        )
        record["fallback"] = tuning.fallback_reason(record, leaves, seconds, exact_seconds, search_settings)
        record["fell_back"] = bool(record["fallback"]) and fallback
        if record["fell_back"]:
            record["fallback"] += ": brute force instead"
            self.mode, self.settings = "exact", {}
            self._searcher = self._build(embeddings)
            record["approximate_recall"] = record["measured"]
            record["measured"], record["standard_error"], record["lower_bound"] = 1.0, 0.0, 1.0
        self.recall = record
        return record

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
            "recall": self.recall,
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
            replace_directory(tmp, directory)
            self.directory = directory
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return directory

    @classmethod
    def load(cls, directory):
        """Loads an index written by `save` (from wherever the directory now lives)."""
        import scann  # loaded when an index is built or loaded: its custom ops are not needed before

        directory = os.fspath(directory)
        metadata_path = os.path.join(directory, _META_FILE)
        if not os.path.exists(metadata_path):
            raise FileNotFoundError(f"{directory!r} is not a saved ScannIndex (no {_META_FILE}).")
        with open(metadata_path) as f:
            config = json.load(f)
        index = cls.__new__(cls)
        index.distance = config["distance"]
        index.mode = config["mode"]
        index.requested_mode = config.get("requested_mode", index.mode)
        index.num_neighbors = config["num_neighbors"]
        index.size, index.dim = config["size"], config["dim"]
        index.settings = config["settings"]
        index.recall = config.get("recall")
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


def replace_directory(new, target):
    """Moves directory `new` to `target` once its files are on the disk; an existing `target` is swapped out
    first and then deleted."""
    durable.sync_tree(new)
    old = None
    if os.path.exists(target):
        old = tempfile.mkdtemp(prefix=".old-", dir=os.path.dirname(target))
        os.rename(target, os.path.join(old, "previous"))
    os.rename(new, target)
    durable.sync_folder(os.path.dirname(os.path.abspath(target)))
    if old:
        shutil.rmtree(old, ignore_errors=True)
