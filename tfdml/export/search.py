"""The `search` signature: images in, gallery neighbours out, with core TensorFlow ops only (stock TF Serving).

`GallerySearch` holds the gallery of a version in variables (not graph constants: a proto is limited to
2 GB) and scores query embeddings against it block by block: `[rows, D]` slices of the gallery, one matmul
and `tf.math.top_k` per block, merged into a running top-k, so memory stays at one block whatever the
gallery size. Scores are cosine similarities (embeddings and gallery are L2-normalised), descending.

Gallery storage (`gallery_dtype`):

- `"float32"`: exact (scores equal a float32 brute force to ~1e-6);
- `"bfloat16"`: half the memory; each stored value keeps 8 significant bits, so a score is off by at most
  `2^-9 * ||q|| * ||g|| ~ 0.002` for unit vectors;
- `"int8"`: a quarter of the memory; row `g` is stored as `round(g / s)` with the per-row scale
  `s = max|g| / 127`, so a score is off by at most `s / 2 * ||q||_1 <= s / 2 * sqrt(D)`.

Blocks are cast to float32 before the matmul (the query is never rounded).

With `search_dims` (nested embeddings, `tfdml.losses.NestedLoss`) the gallery's L2-normalised `search_dims`
prefixes are searched first, exactly, for a `shortlist` of candidates, which are then scored with the stored full
vectors: what `tfdml.export.PrefixIndex` does with ScaNN, in core TensorFlow ops.
"""

import math

import numpy as np
import tensorflow as tf

from tfdml.export.prefix import check_search_dims, normalised_prefix
from tfdml.retrieval import expansion

GALLERY_DTYPES = ("float32", "bfloat16", "int8")
DEFAULT_TOP_K = 10
# Gallery rows scored per step: a [rows, 512] float32 block is 32 MiB, a [batch, rows] score block is small.
DEFAULT_BLOCK_ROWS = 16384
SEARCH_OUTPUTS = ("scores", "labels", "ids", "match", "embedding")


def quantize(embeddings, dtype):
    """`(values, scales)` stored for `embeddings` `[G, D]` in `dtype` (see the module docstring); `scales` is
    the per-row float32 `[G]` of `"int8"`, else None. `values` is a NumPy array, or a tf.Tensor for
    bfloat16 (NumPy has no bfloat16)."""
    embeddings = np.asarray(embeddings, np.float32)
    if dtype == "float32":
        return embeddings, None
    if dtype == "bfloat16":
        return tf.cast(tf.constant(embeddings), tf.bfloat16), None
    if dtype == "int8":
        peak = np.abs(embeddings).max(axis=1)
        scales = np.where(peak > 0, peak / 127.0, 1.0).astype(np.float32)
        values = np.clip(np.rint(embeddings / scales[:, None]), -127, 127).astype(np.int8)
        return values, scales
    raise ValueError(f"gallery_dtype must be one of {', '.join(GALLERY_DTYPES)}, got {dtype!r}.")


def dequantized(values, scales):
    """The float32 gallery that `quantize` stored (what the signature's scores are exact dot products of)."""
    values = np.asarray(tf.cast(values, tf.float32))
    return values if scales is None else values * np.asarray(scales)[:, None]


def blocked_top_k(queries, gallery, k, block_rows, scales=None):
    """`(scores, positions)` `[N, k]`: the `k` largest `queries @ gallery^T` per row, descending (ties: the
    lower position first, as one `tf.math.top_k` over all rows).

    `gallery` `[G, D]` (a variable or tensor of float32, bfloat16 or int8) is read `block_rows` rows at a
    time and cast to float32; `scales` `[G]` multiplies the scores of int8 rows. Runs in graph mode (a
    `tf.while_loop`, one block at a time).
    """
    size = int(gallery.shape[0])
    if not 1 <= k <= size:
        raise ValueError(f"k must be in [1, gallery size {size}], got {k}.")
    block_rows = int(min(block_rows, size))
    num_blocks = math.ceil(size / block_rows)
    values = tf.convert_to_tensor(gallery)  # a variable read: on CPU it aliases the stored buffer
    scales = None if scales is None else tf.convert_to_tensor(scales)
    queries = tf.convert_to_tensor(queries, tf.float32)
    batch = tf.shape(queries)[0]

    def body(block, best_scores, best_positions):
        start = block * block_rows
        rows = tf.minimum(block_rows, size - start)
        part = tf.cast(tf.slice(values, [start, 0], [rows, -1]), tf.float32)
        scores = tf.matmul(queries, part, transpose_b=True)
        if scales is not None:
            scores *= tf.slice(scales, [start], [rows])[None, :]
        part_scores, part_positions = tf.math.top_k(scores, tf.minimum(k, rows))
        # The running best first: for equal scores top_k keeps the earlier (lower) gallery positions.
        merged_scores = tf.concat([best_scores, part_scores], axis=1)
        merged_positions = tf.concat([best_positions, part_positions + start], axis=1)
        best_scores, chosen = tf.math.top_k(merged_scores, k)
        return block + 1, best_scores, tf.gather(merged_positions, chosen, batch_dims=1)

    initial = (tf.constant(0), tf.fill([batch, k], tf.constant(-np.inf, tf.float32)), tf.zeros([batch, k], tf.int32))
    # One block at a time (parallel_iterations=1): that is what bounds the memory.
    _, scores, positions = tf.while_loop(
        lambda block, *_: block < num_blocks, body, initial, parallel_iterations=1, maximum_iterations=num_blocks
    )
    return tf.ensure_shape(scores, [None, k]), tf.ensure_shape(positions, [None, k])


def _utf8(strings):
    """`[G]` UTF-8 bytes of strings (class names and paths may be any text)."""
    return np.array([str(text).encode("utf-8") for text in strings], dtype=object)


class GallerySearch(tf.Module):
    """The gallery of a version as variables, and its top-k search.

    Args:
      embeddings: `[G, D]` L2-normalised gallery embeddings (as `serving_default` gives them).
      ids: `[G]` strings, one per item (file path or `<data set>:<index>`).
      labels: `[G]` strings, the class name of each item (empty strings when unknown).
      k: neighbours returned per query (at most `G`).
      gallery_dtype: `"float32"`, `"bfloat16"` or `"int8"` (see the module docstring).
      threshold: `match = score >= threshold` (`inf`: nothing matches, e.g. uncalibrated).
      block_rows: gallery rows scored per step.
      query_expansion, database_augmentation, expansion_alpha: alpha-QE of each query (one more search) and
        DBA of the gallery (once, here) with that many neighbours, as `tfdml.retrieval.expansion` (0: off).
        Scores are then those of the expanded query; the match threshold is the one given.
      search_dims, shortlist: search the normalised `search_dims` prefixes for `shortlist` candidates, then score
        those with the full vectors (None: every full vector is scored).

    Calling it on `[N, D]` query embeddings returns `{"scores", "labels", "ids", "match"}`, each `[N, k]`.
    """

    def __init__(
        self,
        embeddings,
        ids,
        labels,
        k=DEFAULT_TOP_K,
        gallery_dtype="float32",
        threshold=math.inf,
        block_rows=DEFAULT_BLOCK_ROWS,
        query_expansion=0,
        database_augmentation=0,
        expansion_alpha=3.0,
        search_dims=None,
        shortlist=None,
    ):
        super().__init__(name="gallery_search")
        embeddings = np.asarray(embeddings, np.float32)
        self.query_expansion, self.expansion_alpha = expansion.check_expansion(query_expansion, expansion_alpha)
        self.database_augmentation = expansion.check_expansion(
            database_augmentation, expansion_alpha, "database_augmentation"
        )[0]
        if embeddings.ndim != 2 or not len(embeddings):
            raise ValueError(f"the gallery must be a non-empty [items, dim] array, got shape {embeddings.shape}.")
        if len(ids) != len(embeddings) or len(labels) != len(embeddings):
            raise ValueError(f"{len(embeddings)} gallery embeddings but {len(ids)} ids and {len(labels)} labels.")
        if int(k) < 1:
            raise ValueError(f"top_k must be at least 1, got {k}.")
        if int(block_rows) < 1:
            raise ValueError(f"block_rows must be at least 1, got {block_rows}.")
        if self.database_augmentation and len(embeddings) > 1:
            embeddings = expansion.database_augmentation(embeddings, self.database_augmentation, self.expansion_alpha)
        self.k = int(min(k, len(embeddings)))  # a gallery smaller than k returns all of it
        self.block_rows, self.gallery_dtype = int(block_rows), gallery_dtype
        values, scales = quantize(embeddings, gallery_dtype)
        self.gallery = tf.Variable(values, trainable=False, name="gallery_embeddings")
        self.scales = None if scales is None else tf.Variable(scales, trainable=False, name="gallery_scales")
        self.ids = tf.Variable(_utf8(ids), trainable=False, name="gallery_ids")
        self.labels = tf.Variable(_utf8(labels), trainable=False, name="gallery_labels")
        self.threshold = tf.Variable(float(threshold), dtype=tf.float32, trainable=False, name="match_threshold")
        self.search_dims = self.prefixes = None
        if search_dims:
            self.search_dims = check_search_dims(search_dims, embeddings.shape[1])
            # The shortlist also serves the query expansion's neighbours.
            self.shortlist = int(min(len(embeddings), max(self.k, self.query_expansion, shortlist or self.k)))
            prefixes = normalised_prefix(embeddings, self.search_dims)
            self.prefixes = tf.Variable(prefixes, trainable=False, name="gallery_prefixes")

    @property
    def size(self):
        return int(self.gallery.shape[0])

    def __call__(self, embedding):
        if self.query_expansion:
            embedding = self._expanded(embedding)
        scores, positions = self._top_k(embedding, self.k)
        return {
            "scores": scores,
            "labels": tf.gather(self.labels, positions),
            "ids": tf.gather(self.ids, positions),
            "match": scores >= self.threshold,
        }

    def _top_k(self, embedding, k):
        """`(scores, positions)` `[N, k]` of the `k` best gallery rows, through the prefixes when there are."""
        if self.search_dims:
            return self._prefix_then_full(embedding, k)
        return blocked_top_k(embedding, self.gallery, k, self.block_rows, self.scales)

    def _expanded(self, embedding):
        """alpha-QE: the query plus its top gallery rows weighted by `max(score, 0) ** alpha`, normalised."""
        n = min(self.query_expansion, self.size)
        scores, positions = self._top_k(embedding, n)
        rows = tf.cast(tf.gather(self.gallery, positions), tf.float32)
        if self.scales is not None:
            rows *= tf.gather(self.scales, positions)[..., None]
        weights = tf.pow(tf.maximum(scores, 0.0), self.expansion_alpha)
        return tf.math.l2_normalize(embedding + tf.einsum("nk,nkd->nd", weights, rows), axis=1)

    def _prefix_then_full(self, embedding, k):
        """`(scores, positions)` `[N, k]`: the `shortlist` best on the normalised prefixes, scored in full."""
        embedding = tf.convert_to_tensor(embedding, tf.float32)
        queries = tf.math.l2_normalize(embedding[:, : self.search_dims], axis=1)
        _, candidates = blocked_top_k(queries, self.prefixes, self.shortlist, self.block_rows)
        rows = tf.cast(tf.gather(self.gallery, candidates), tf.float32)  # [N, shortlist, D]
        scores = tf.einsum("nsd,nd->ns", rows, embedding)
        if self.scales is not None:
            scores *= tf.gather(self.scales, candidates)
        scores, chosen = tf.math.top_k(scores, k)
        return scores, tf.gather(candidates, chosen, batch_dims=1)

    def memory_bytes(self):
        """Bytes of the stored gallery embeddings (and scales, and prefixes)."""
        prefixes = 0 if self.prefixes is None else 4 * self.prefixes.shape.num_elements()
        return int(
            self.gallery.shape.num_elements() * self.gallery.dtype.size
            + (0 if self.scales is None else 4 * self.size)
            + prefixes
        )


def item_strings(ids, labels, class_names, size, source=None):
    """`(ids, labels)` as the strings the signature returns: ids are file paths as they are, and item
    numbers as `<source>:<n>` (`<n>` alone without a source name); labels are class names where known."""
    if ids is None:
        ids = np.arange(size)
    ids = [str(i) if isinstance(i, str) or source is None else f"{source}:{i}" for i in np.asarray(ids).tolist()]
    if labels is None:
        names = [""] * size
    else:
        names = [
            class_names[label]
            if class_names is not None and isinstance(label, int) and 0 <= label < len(class_names)
            else str(label)
            for label in np.asarray(labels).tolist()
        ]
    return ids, names


def search_signature_info(k, dim):
    """The `search` signature as the metadata file describes it."""
    return {
        "inputs": {"images": "uint8 [batch, height, width, 1 or 3]"},
        "outputs": {
            "scores": f"float32 [batch, {k}]",
            "labels": f"string [batch, {k}]",
            "ids": f"string [batch, {k}]",
            "match": f"bool [batch, {k}]",
            "embedding": f"float32 [batch, {dim}]",
        },
    }
