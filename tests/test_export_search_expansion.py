"""alpha-QE and DBA inside the export's `search` (`tfdml.export.search.GallerySearch`): the same neighbours and
scores as `tfdml.retrieval.expansion` followed by an exact NumPy search, in a traced function too."""

import numpy as np
import pytest
import tensorflow as tf

from tfdml.export.search import GallerySearch
from tfdml.retrieval.expansion import database_augmentation, query_expansion


def _unit(x):
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _data(seed=0):
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(6, 12))
    gallery = _unit(centres[np.repeat(np.arange(6), 7)] + 0.7 * rng.normal(size=(42, 12)))
    queries = _unit(centres[rng.integers(0, 6, 9)] + 0.7 * rng.normal(size=(9, 12)))
    return gallery, queries


@pytest.mark.parametrize("qe, dba", [(3, 0), (0, 2), (2, 2)])
def test_search_applies_qe_and_dba_as_the_retrieval_module(qe, dba):
    gallery, queries = _data()
    ids = [f"item{i}" for i in range(len(gallery))]
    search = GallerySearch(
        gallery, ids, [""] * len(gallery), k=5, block_rows=8, query_expansion=qe, database_augmentation=dba
    )
    expected_gallery = database_augmentation(gallery, dba, 3.0)
    expected_queries = query_expansion(queries, expected_gallery, qe, 3.0)
    scores = expected_queries @ expected_gallery.T
    order = np.argsort(-scores, axis=1, kind="stable")[:, :5]
    out = tf.function(search)(tf.constant(queries))
    np.testing.assert_array_equal(out["ids"].numpy().astype(str), np.array(ids)[order])
    np.testing.assert_allclose(out["scores"].numpy(), np.take_along_axis(scores, order, 1), atol=1e-5)
    plain = GallerySearch(gallery, ids, [""] * len(gallery), k=5)(tf.constant(queries))
    assert not np.array_equal(plain["scores"].numpy(), out["scores"].numpy())


def test_int8_gallery_expands_with_the_stored_rows():
    gallery, queries = _data(1)
    search = GallerySearch(gallery, list(range(42)), [""] * 42, k=4, gallery_dtype="int8", query_expansion=2)
    stored = search.gallery.numpy().astype(np.float32) * search.scales.numpy()[:, None]
    expected = query_expansion(queries, stored, 2, 3.0)
    order = np.argsort(-(expected @ stored.T), axis=1, kind="stable")[:, :4]
    out = search(tf.constant(queries))
    np.testing.assert_array_equal(out["ids"].numpy().astype(int), order)


def test_bad_expansion_is_named():
    gallery, _ = _data()
    with pytest.raises(ValueError, match="query_expansion must be a whole number"):
        GallerySearch(gallery, list(range(42)), [""] * 42, query_expansion=-1)
