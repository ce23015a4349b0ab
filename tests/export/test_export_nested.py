"""`export_saved_model(search_dims=...)` / `tfdml export --search-dims`: the version's index searches the normalised
prefix and re-ranks with the full vector (`PrefixIndex`), meets its recall target against exact full-vector search
on fresh queries (a NumPy brute force over `serving_default` embeddings), records it in the metadata; the `search`
signature equals a NumPy prefix-then-full search; `PrefixIndex` alone (approximate ScaNN prefix, save and load);
the option's help text and errors."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfdml import cli, data
from tfdml import export as E
from tfdml.export.prefix import PrefixIndex, load_prefix_or_full_index, normalised_prefix

SIZE, DIMS, SEARCH_DIMS, K, TARGET = 10, 16, 4, 5, 0.9


def nested_like_model():
    """A fixed projection whose leading coordinates carry most of the variance, as a nested model's do."""
    inputs = keras.Input((SIZE, SIZE, 3))
    dense = keras.layers.Dense(DIMS, use_bias=False, kernel_initializer=keras.initializers.HeNormal(seed=3))
    model = keras.Model(inputs, dense(keras.layers.Flatten()(keras.layers.Rescaling(1 / 127.5, -1.0)(inputs))))
    dense.set_weights([dense.get_weights()[0] * 0.75 ** np.arange(DIMS)])
    return model


def images(count, seed):
    rng = np.random.default_rng(seed)
    labels = np.arange(count) % 12
    colours = np.random.default_rng(99).integers(30, 226, (12, 1, 1, 3))
    return np.clip(colours[labels] + rng.normal(0, 45, (count, SIZE, SIZE, 3)), 0, 255).astype(np.uint8), labels


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    gallery, labels = images(600, seed=0)
    source = data.array_source(gallery, labels, name="colours")
    path = E.export_saved_model(
        nested_like_model(),
        tmp_path_factory.mktemp("nested"),
        name="nested",
        version=1,
        gallery=source,
        top_k=K,
        search_dims=SEARCH_DIMS,
        index_settings={"target_recall": TARGET},
    )
    loaded = tf.saved_model.load(path)
    embed = loaded.signatures["serving_default"]
    queries, _ = images(150, seed=1)
    return {
        "path": path,
        "metadata": E.load_metadata(path),
        "gallery": np.asarray(embed(images=tf.constant(gallery))["embedding"]),
        "query_images": queries,
        "queries": np.asarray(embed(images=tf.constant(queries))["embedding"]),
        "search": loaded.signatures["search"],
    }


def _exact_full(queries, gallery, k):
    return np.argsort(-(queries @ gallery.T), axis=1, kind="stable")[:, :k]


def _recall(found, exact):
    return float(np.mean([len(set(a) & set(b)) / exact.shape[1] for a, b in zip(found, exact)]))


@pytest.mark.slow
def test_the_prefix_index_meets_its_target_against_exact_full_vector_search(exported):
    summary = exported["metadata"]["index"]
    record = summary["recall"]
    assert summary["search_dims"] == SEARCH_DIMS and record["full_dims"] == DIMS
    assert record["met"] and record["lower_bound"] >= TARGET and record["target"] == TARGET
    assert record["shortlist"] < 600 // 4, "a real shortlist, not the whole gallery"
    _, index = E.load_index(exported["path"])
    assert isinstance(index, PrefixIndex) and index.search_dims == SEARCH_DIMS and index.dim == DIMS
    exact = _exact_full(exported["queries"], exported["gallery"], K)
    found, scores = index.search(exported["queries"], k=K, positions=True)
    assert _recall(found, exact) >= TARGET  # on queries the tuning never saw
    np.testing.assert_allclose(scores, np.sum(exported["gallery"][found] * exported["queries"][:, None], -1), atol=1e-5)
    # The prefix alone, without the re-ranking, is worse: the full vector does the re-ranking's work.
    prefix_only = _exact_full(
        normalised_prefix(exported["queries"], SEARCH_DIMS), normalised_prefix(exported["gallery"], SEARCH_DIMS), K
    )
    assert _recall(prefix_only, exact) < _recall(found, exact)


def test_the_search_signature_searches_the_prefix_then_the_full_vector(exported):
    info = exported["metadata"]["search"]["prefix"]
    assert info["search_dims"] == SEARCH_DIMS and info["met"] and info["shortlist"] == info["shortlist_factor"] * K
    out = exported["search"](images=tf.constant(exported["query_images"]))
    queries, gallery = exported["queries"], exported["gallery"]
    prefixes = normalised_prefix(gallery, SEARCH_DIMS) @ normalised_prefix(queries, SEARCH_DIMS).T
    shortlist = np.argsort(-prefixes.T, axis=1, kind="stable")[:, : info["shortlist"]]
    full = np.sum(gallery[shortlist] * queries[:, None], -1)
    expected = np.take_along_axis(full, np.argsort(-full, axis=1, kind="stable")[:, :K], 1)
    np.testing.assert_allclose(out["scores"].numpy(), expected, atol=1e-5)
    assert (
        _recall(
            np.array([[int(i.decode().split(":")[1]) for i in row] for row in out["ids"].numpy()]),
            _exact_full(queries, gallery, K),
        )
        >= TARGET
    )


@pytest.mark.slow
def test_prefix_index_on_an_approximate_scann_index_saves_and_loads(tmp_path):
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(200, 32)) * 0.8 ** np.arange(32)
    x = centres[rng.integers(0, 200, 25000)] + 0.3 * rng.normal(size=(25000, 32)) * 0.8 ** np.arange(32)
    x = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
    index = PrefixIndex(x[1000:], 8, num_neighbors=10, target_recall=0.9)
    assert index.mode == "approximate" and index.recall["met"] and index.recall["shortlist"] < 1000
    exact = _exact_full(x[:1000], x[1000:], 10)
    assert _recall(index.search(x[:1000], k=10, positions=True)[0], exact) >= 0.9
    index.save(tmp_path / "index")
    again = load_prefix_or_full_index(tmp_path / "index")
    assert isinstance(again, PrefixIndex) and again.recall == index.recall
    np.testing.assert_array_equal(again.search(x[:20], k=10)[0], index.search(x[:20], k=10)[0])


def test_bad_search_dims_are_refused():
    x = np.eye(8, dtype=np.float32)
    for dims in (0, 8, 9, 2.5):
        with pytest.raises(ValueError, match="search_dims must be a prefix shorter than the 8-d embedding"):
            PrefixIndex(x, dims)


def test_the_cli_option_is_documented_and_checked(capsys, tmp_path):
    with pytest.raises(SystemExit):
        cli.main(["export", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--search-dims D" in text and "first D dimensions of each embedding, normalised" in text
    assert "re-rank its shortlist with the full vector" in text
    model = tmp_path / "m.keras"
    nested_like_model().save(model)
    assert cli.main(["export", "--model", str(model), "--name", "m", "--search-dims", "4", "--no-index"]) == 2
    assert "--search-dims sets how the gallery index searches; --no-index writes none" in capsys.readouterr().err


def test_the_cli_exports_a_prefix_index_and_prints_its_recall(tmp_path, capsys):
    gallery, labels = images(240, seed=2)
    for c in range(12):
        folder = tmp_path / "gallery" / f"class_{c}"
        folder.mkdir(parents=True)
        for i in np.flatnonzero(labels == c):
            tf.io.write_file(str(folder / f"{i}.png"), tf.io.encode_png(gallery[i]))
    model = tmp_path / "m.keras"
    nested_like_model().save(model)
    common = ["export", "--model", str(model), "--name", "m", "--base-dir", str(tmp_path / "out")]
    assert cli.main([*common, "--gallery-dir", str(tmp_path / "gallery"), "--search-dims", "4", "--top-k", "5"]) == 0
    out = capsys.readouterr().out
    assert "index: 4-d prefix searched, shortlist of" in out and "re-ranked with the full 16-d vector" in out
    assert "search signature: 4-d prefix searched" in out and "against exact full-vector search, target 0.95" in out
    metadata = E.load_metadata(str(tmp_path / "out" / "m" / "1"))
    assert metadata["index"]["search_dims"] == 4 and metadata["search"]["prefix"]["search_dims"] == 4
    assert cli.main([*common, "--gallery-dir", str(tmp_path / "gallery"), "--search-dims", "16"]) == 2
    assert "search_dims must be a prefix shorter than the 16-d embedding" in capsys.readouterr().err
