"""The checked inputs of the retrieval measures (`evaluate`, `worst_queries`): embeddings, labels and the
query set, with errors that name the argument."""

import numpy as np


def checked_labels(labels, rows, name):
    """`[rows]` integer class ids (a `[rows, 1]` column is flattened)."""
    labels = np.asarray(labels)
    if labels.ndim == 2 and labels.shape[1] == 1:
        labels = labels[:, 0]
    if labels.ndim != 1 or labels.shape[0] != rows:
        raise ValueError(f"{name} must have shape [{rows}] (one label per embedding), got {labels.shape}.")
    if not np.issubdtype(labels.dtype, np.integer):
        raise TypeError(f"{name} must be integer class ids, got dtype {labels.dtype}.")
    return labels


def checked_embeddings(x, name):
    """Finite floating-point `[rows, dim]` embeddings, as a contiguous float32 array."""
    x = np.asarray(x)
    if x.ndim != 2:
        raise ValueError(f"{name} must have shape [rows, dim], got shape {x.shape}.")
    if not np.issubdtype(x.dtype, np.floating):
        raise TypeError(f"{name} must be floating point, got dtype {x.dtype}.")
    if not np.isfinite(x).all():
        raise ValueError(f"{name} contain NaN or Inf values.")
    return np.ascontiguousarray(x, np.float32)


def checked(embeddings, labels, query_embeddings=None, query_labels=None):
    """`(gallery, gallery labels, queries, query labels)`: the queries are the gallery itself (same-set mode)
    or the checked query set."""
    gallery = checked_embeddings(embeddings, "embeddings")
    gallery_labels = checked_labels(labels, gallery.shape[0], "labels")
    if (query_embeddings is None) != (query_labels is None):
        raise ValueError("query_embeddings and query_labels must be given together.")
    if query_embeddings is None:
        return gallery, gallery_labels, gallery, gallery_labels
    queries = checked_embeddings(query_embeddings, "query_embeddings")
    if queries.shape[1] != gallery.shape[1]:
        raise ValueError(f"query_embeddings have dimension {queries.shape[1]}, embeddings have {gallery.shape[1]}.")
    return gallery, gallery_labels, queries, checked_labels(query_labels, queries.shape[0], "query_labels")


def unit_norm(x):
    """Whether every row of `x` has norm 1 (to 1e-3): cosine and squared L2 then rank alike."""
    return bool(np.allclose(np.einsum("ij,ij->i", x, x), 1.0, atol=1e-3))
