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


def test_expansion_through_a_prefix_search_that_scores_every_item_equals_the_full_search():
    gallery, queries = _data(2)
    ids = list(range(42))
    full = GallerySearch(gallery, ids, [""] * 42, k=5, query_expansion=3, database_augmentation=2)
    prefix = GallerySearch(
        gallery, ids, [""] * 42, k=5, query_expansion=3, database_augmentation=2, search_dims=4, shortlist=42
    )
    a, b = full(tf.constant(queries)), tf.function(prefix)(tf.constant(queries))
    np.testing.assert_array_equal(a["ids"].numpy(), b["ids"].numpy())
    np.testing.assert_allclose(a["scores"].numpy(), b["scores"].numpy(), atol=1e-5)


@pytest.mark.slow
def test_export_writes_the_expanded_search_and_records_it(tmp_path):
    """`export_saved_model(query_expansion=, database_augmentation=)`: the served `search` returns what
    `tfdml.retrieval.expansion` and an exact search give on the `serving_default` embeddings; the metadata says so."""
    import keras

    from tfdml import data
    from tfdml import export as E

    rng = np.random.default_rng(0)
    labels = np.arange(60) % 6
    colours = np.random.default_rng(9).integers(30, 226, (6, 1, 1, 3))
    images = np.clip(colours[labels] + rng.normal(0, 40, (60, 8, 8, 3)), 0, 255).astype(np.uint8)
    inputs = keras.Input((8, 8, 3))
    dense = keras.layers.Dense(12, kernel_initializer=keras.initializers.HeNormal(seed=1))
    model = keras.Model(inputs, dense(keras.layers.Flatten()(keras.layers.Rescaling(1 / 127.5, -1.0)(inputs))))
    path = E.export_saved_model(
        model, tmp_path, name="qe", version=1, gallery=data.array_source(images, labels, name="colours"),
        top_k=4, query_expansion=2, database_augmentation=1, expansion_alpha=2.0,
    )  # fmt: skip
    loaded = tf.saved_model.load(path)
    embedded = loaded.signatures["serving_default"](images=tf.constant(images))["embedding"].numpy()
    out = loaded.signatures["search"](images=tf.constant(images[:10]))
    expected_gallery = database_augmentation(embedded, 1, 2.0)
    expected_queries = query_expansion(embedded[:10], expected_gallery, 2, 2.0)
    scores = expected_queries @ expected_gallery.T
    order = np.argsort(-scores, axis=1, kind="stable")[:, :4]
    np.testing.assert_allclose(out["scores"].numpy(), np.take_along_axis(scores, order, 1), atol=1e-5)
    search = E.load_metadata(path)["search"]
    assert (search["query_expansion"], search["database_augmentation"], search["expansion_alpha"]) == (2, 1, 2.0)


def test_the_cli_refuses_expansion_without_the_search_signature(capsys, tmp_path):
    from tfdml import cli

    model = tmp_path / "m.keras"
    model.write_bytes(b"")
    assert cli.main(["export", "--model", str(model), "--no-search", "--query-expansion", "2"]) == 2
    assert "--no-search writes none" in capsys.readouterr().err
