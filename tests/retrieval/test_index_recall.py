"""`ScannIndex(target_recall=...)`: the recall it records is the recall@k an independent NumPy exact search
measures on held-out queries; a target it cannot meet cheaper than exact search falls back to brute force."""

import numpy as np
import pytest

from tfdml.retrieval import ScannIndex, tuning
from tfdml.retrieval import index as index_module


def unit_clusters(n, dim, clusters, seed, spread=1.0):
    """Unit vectors around random centres; `spread` sets how far items stray (high: hard for a tree)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(clusters, dim))
    x = centres[rng.integers(0, clusters, n)] + spread * rng.normal(size=(n, dim))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def numpy_recall(index, gallery, queries, k, **search):
    """recall@k of the index against exact dot-product search written here (float64 argsort)."""
    exact = np.argsort(-(queries.astype(np.float64) @ gallery.T.astype(np.float64)), axis=1, kind="stable")[:, :k]
    found, _ = index.search(queries, k=k, **search)
    return float(np.mean([len(set(a) & set(b)) / k for a, b in zip(found, exact)]))


@pytest.fixture(scope="module")
def data():
    # 12 draws per cluster on average and noise as large as the centres: a query's neighbours straddle leaves.
    everything = unit_clusters(16000, 64, 1250, seed=3, spread=0.9)
    return everything[:15000], everything[15000:]


@pytest.fixture(scope="module")
def tuned(data):
    return ScannIndex(data[0], mode="approximate", target_recall=0.95)


@pytest.mark.slow
def test_the_index_meets_its_recall_target_on_held_out_queries(data, tuned, tmp_path):
    gallery, held_out = data
    index = tuned
    low = numpy_recall(index, gallery, held_out, 10, leaves_to_search=1, reorder=10)
    record = index.recall
    assert index.mode == "approximate" and record["fallback"] is None and record["tuned"]
    assert record["measured"] >= 0.95 and record["k"] == 10 and record["queries"] == 500
    assert record["leaves_to_search"] == index.settings["leaves_to_search"] > 1
    assert record["reorder"] == index.settings["reorder"]
    assert 0 < record["ms_per_query"] < record["exact_ms_per_query"]
    # The recall on queries the tuning never saw, against an exact search written here.
    measured = numpy_recall(index, gallery, held_out, 10)
    print(f"recall@10: {low:.3f} with 1 leaf; tuned to {record['measured']:.3f}, held out {measured:.3f}")
    assert low < 0.9 and measured >= 0.93
    # Of the fewest leaves reaching the target with each re-ordering step, the fastest single query was kept.
    candidates = record["candidates"]
    assert {"leaves_to_search": record["leaves_to_search"], "reorder": record["reorder"]} in [
        {key: c[key] for key in ("leaves_to_search", "reorder")} for c in candidates
    ]
    assert all(c["lower_bound"] >= 0.95 for c in candidates)
    if len(candidates) > 1:
        fastest = min(candidates, key=lambda c: c["ms_per_single_query"])
        assert (fastest["leaves_to_search"], fastest["reorder"]) == (record["leaves_to_search"], record["reorder"])
    # A higher target searches more leaves or re-orders more, and reaches it.
    before = dict(record)
    higher = index.tune(gallery, 0.99)
    record = before
    assert higher["measured"] >= 0.99
    assert higher["leaves_to_search"] > record["leaves_to_search"] or higher["reorder"] > record["reorder"]
    assert numpy_recall(index, gallery, held_out, 10) >= 0.97
    # Saved and loaded, the index keeps the record and searches with the tuned settings.
    loaded = ScannIndex.load(index.save(tmp_path / "index"))
    assert loaded.recall == index.recall and loaded.settings == index.settings
    np.testing.assert_array_equal(loaded.search(held_out[:50], k=10)[0], index.search(held_out[:50], k=10)[0])


@pytest.mark.slow
def test_given_settings_are_kept_and_their_recall_recorded(data):
    gallery, held_out = data
    index = ScannIndex(gallery, mode="approximate", leaves_to_search=2, recall_queries=held_out)
    record = index.recall
    assert not record["tuned"] and record["leaves_to_search"] == 2 and record["query_source"] == "given queries"
    assert record["measured"] == pytest.approx(numpy_recall(index, gallery, held_out, 10), abs=1e-9)


def per_query_recall(index, gallery, queries, k):
    exact = np.argsort(-(queries.astype(np.float64) @ gallery.T.astype(np.float64)), axis=1, kind="stable")[:, :k]
    found, _ = index.search(queries, k=k)
    return np.array([len(set(a) & set(b)) / k for a, b in zip(found, exact)])


@pytest.mark.slow
def test_the_target_holds_at_the_lower_confidence_bound_of_the_sampled_recall(data, tuned):
    gallery, held_out = data
    record = tuned.recall
    # The mean recall of the 500 sampled queries less 1.645 standard errors of it (one-sided 95%) meets the target.
    assert record["confidence"] == 0.95 and record["queries"] == 500
    assert 0 < record["standard_error"] < 0.02
    assert record["lower_bound"] == pytest.approx(record["measured"] - 1.6448536 * record["standard_error"], abs=1e-6)
    assert record["lower_bound"] >= record["target"]  # 0.95, or 0.99 where an earlier test raised it
    # Measured on given queries, the record's figures are those of a NumPy reading of the same recall.
    index = ScannIndex(gallery, mode="approximate", leaves_to_search=3, recall_queries=held_out, target_recall=0.5)
    recall = per_query_recall(index, gallery, held_out, 10)
    error = recall.std(ddof=1) / np.sqrt(len(recall))
    assert index.recall["measured"] == pytest.approx(recall.mean(), abs=1e-9)
    assert index.recall["standard_error"] == pytest.approx(error, rel=1e-6)
    assert index.recall["lower_bound"] == pytest.approx(recall.mean() - 1.6448536 * error, abs=1e-6)
    # A target between the bound and the mean is not met: the settings fixed here fall back to brute force.
    between = (index.recall["lower_bound"] + index.recall["measured"]) / 2
    strict = ScannIndex(gallery, mode="approximate", leaves_to_search=3, recall_queries=held_out, target_recall=between)
    assert strict.recall["fell_back"] and "lower 95% bound" in strict.recall["fallback"]
    with pytest.raises(ValueError, match=r"confidence must be in \[0.5, 1\), got 1"):
        index.tune(gallery, 0.9, confidence=1.0)


def test_single_query_paths_accept_any_vector_and_refuse_nan(tuned, data):
    query = data[1][7]
    ids, scores = tuned.search(query, k=5)
    assert ids.shape == scores.shape == (5,) and scores.dtype == np.float32
    for same in (query.astype(np.float64), np.repeat(query[:, None], 2, axis=1)[:, 0], query.tolist()):
        np.testing.assert_array_equal(tuned.search(same, k=5)[0], ids)
    for bad in (np.nan, np.inf):
        broken = query.copy()
        broken[3] = bad
        with pytest.raises(ValueError, match="queries contain NaN or Inf"):
            tuned.search(broken)
        with pytest.raises(ValueError, match="queries contain NaN or Inf"):
            tuned.search(np.stack([query, broken]))
    # Finite entries whose squares overflow float32 are accepted (checked entry by entry).
    assert tuned.search(np.full(query.shape, 1e30, np.float32), k=1)[0].shape == (1,)
    with pytest.raises(ValueError, match="the query has dimension 3 but the index holds 64-d"):
        tuned.search(query[:3])


def test_single_query_gives_the_batch_answer(data, tuned):
    held_out = data[1]
    index = tuned
    ids, scores = index.search(held_out[:20], k=5)
    for row, query in enumerate(held_out[:20]):
        one_ids, one_scores = index.search(query, k=5)
        np.testing.assert_array_equal(one_ids, ids[row])
        np.testing.assert_allclose(one_scores, scores[row], rtol=1e-6)


@pytest.mark.slow
def test_a_target_not_met_cheaper_than_exact_search_falls_back_to_brute_force(data, monkeypatch):
    gallery, held_out = data
    calls = []

    def timed(fn):  # exact search (the first call) takes no time: no approximate setting is cheaper
        calls.append(fn)
        return fn(), (0.0 if len(calls) == 1 else 1.0)

    monkeypatch.setattr(tuning, "timed", timed)
    index = ScannIndex(gallery, mode="approximate", target_recall=0.9)
    record = index.recall
    assert index.mode == "exact" and index.settings == {} and record["fell_back"]
    assert "ms for exact search: brute force instead" in record["fallback"] and record["measured"] == 1.0
    assert numpy_recall(index, gallery, held_out, 10) == 1.0


def test_a_target_not_reached_with_every_leaf_falls_back(monkeypatch):
    gallery = unit_clusters(5000, 32, 400, seed=4)
    monkeypatch.setattr(tuning, "REORDER_STEPS", (0.1,))  # re-order 10 candidates, never more
    index = ScannIndex(gallery, mode="approximate", target_recall=1.0, num_leaves=20, reorder_factor=1)
    if index.mode == "approximate":  # every leaf searched but only 11 candidates re-ordered: 1.0 is not met
        pytest.fail(f"expected a fallback, got {index.recall}")
    assert "< target 1 with 20 of 20 leaves searched: brute force instead" in index.recall["fallback"]


def test_bad_target_is_named():
    gallery = unit_clusters(100, 8, 4, seed=5)
    with pytest.raises(ValueError, match=r"target_recall must be in \(0, 1\] or None, got 1.5"):
        ScannIndex(gallery, target_recall=1.5)
    with pytest.raises(ValueError, match="tune applies to an approximate index"):
        ScannIndex(gallery, mode="exact").tune(gallery, 0.9)


def test_an_exported_index_records_its_recall_and_the_cli_prints_it(data, tmp_path):
    import argparse

    from tfdml.cli.export import UNMEASURED, recall_target
    from tfdml.export.gallery import EmbeddedGallery, index_summary, save_index
    from tfdml.retrieval.index import describe_recall

    gallery = data[0]
    embedded = EmbeddedGallery(gallery, None, None, None, None, "synthetic")
    index = save_index(str(tmp_path), embedded, "m", 1, "approximate", {"target_recall": 0.9})
    summary = index_summary(index)
    assert summary["recall"]["target"] == 0.9 and summary["recall"]["measured"] >= 0.9
    assert summary["settings"]["leaves_to_search"] == summary["recall"]["leaves_to_search"]
    line = describe_recall(summary["recall"])
    assert line.startswith("approximate, recall@10 0.9") and "(target 0.9, 500 gallery items" in line
    assert recall_target("none") == UNMEASURED and recall_target("0.99") == 0.99
    for bad in ("1.5", "0", "high"):
        with pytest.raises(argparse.ArgumentTypeError, match=r"expected a recall in \(0, 1\] or 'none'"):
            recall_target(bad)


def low_rank(n, dim, rank, clusters, seed):
    """Unit vectors whose energy lies in a `rank`-d subspace of `dim` (clustered latents through a fixed random
    linear map, plus a little full-rank noise), as real embeddings: PCA keeps them with a few directions."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(clusters, rank))
    latent = centres[rng.integers(0, clusters, n)] + 0.9 * rng.normal(size=(n, rank))
    x = latent @ rng.normal(size=(rank, dim)) + 0.02 * np.sqrt(rank) * rng.normal(size=(n, dim))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def test_principal_dims_keeps_a_low_rank_subspace_and_leaves_full_rank_data_alone():
    from tfdml.retrieval.index import principal_dims

    x = low_rank(3000, 256, 24, 100, seed=6)
    # 24 directions hold ~99.7 % of the energy (98 % are wanted): rounded up to a multiple of 16.
    assert principal_dims(x) == 32
    assert principal_dims(x, energy=0.5) == 16
    assert principal_dims(unit_clusters(3000, 256, 100, seed=7)) == 0  # full rank: more than half the dims
    assert principal_dims(low_rank(3000, 64, 8, 100, seed=8)) == 0  # under 128 dims: never projected


@pytest.mark.slow
def test_a_projected_index_meets_its_target_and_returns_exact_values(tmp_path):
    everything = low_rank(21000, 128, 20, 1500, seed=9)
    gallery, held_out = everything[:20000], everything[20000:]
    index = ScannIndex(gallery, mode="auto", target_recall=0.95)
    record = index.recall
    assert index.mode == "approximate" and record["fallback"] is None
    assert index.settings["projection_dims"] == 32 and index.settings["dimensions_per_block"] == 2
    assert record["lower_bound"] >= 0.95
    measured = numpy_recall(index, gallery, held_out, 10)
    print(f"projected to 32 of 128 dims: recorded recall@10 {record['measured']:.3f}, held out {measured:.3f}")
    assert measured >= 0.93
    # The candidates are re-ordered with the full vectors: the values are the exact dot products.
    ids, scores = index.search(held_out[:50], k=10)
    exact = np.einsum("qd,qkd->qk", held_out[:50].astype(np.float64), gallery[ids].astype(np.float64))
    np.testing.assert_allclose(scores, exact, atol=1e-5)
    loaded = ScannIndex.load(index.save(tmp_path / "index"))
    assert loaded.settings == index.settings and loaded.recall == index.recall
    np.testing.assert_array_equal(loaded.search(held_out[:50], k=10)[0], ids)
    # projection_dims=0 searches the vectors as they are (and is recorded so).
    plain = ScannIndex(gallery, mode="approximate", target_recall=None, projection_dims=0)
    assert plain.settings["projection_dims"] == 0 and plain.settings["dimensions_per_block"] == 2
    with pytest.raises(ValueError, match=r"projection_dims must be in \(0, 128\) or 0 \(none\), got 128"):
        ScannIndex(gallery, mode="approximate", target_recall=None, projection_dims=128)
    # Squared distances are searched unprojected (ScaNN's PCA serves dot products only), and still meet the target.
    scaled = 3.0 * gallery
    l2 = ScannIndex(scaled, distance="squared_l2", mode="approximate", target_recall=0.95)
    assert l2.mode == "approximate" and l2.settings["projection_dims"] == 0 and l2.recall["lower_bound"] >= 0.95
    with pytest.raises(ValueError, match="projection_dims applies to the dot_product distance only"):
        ScannIndex(scaled, distance="squared_l2", mode="approximate", target_recall=None, projection_dims=32)


@pytest.mark.slow
def test_a_projection_that_misses_the_target_is_dropped_before_brute_force(monkeypatch):
    everything = low_rank(21000, 128, 20, 1500, seed=9)
    gallery, held_out = everything[:20000], everything[20000:]
    # Half the energy: 16 of the 20 directions, too few for recall@10 0.99 with every leaf searched.
    monkeypatch.setattr(index_module, "PROJECTION_ENERGY", 0.5)
    index = ScannIndex(gallery, mode="approximate", target_recall=0.99)
    projected = index.recall["projected"]
    assert projected["fell_back"] and "< target 0.99 with 141 of 141 leaves searched" in projected["fallback"]
    assert index.mode == "approximate" and index.settings["projection_dims"] == 0
    assert index.recall["fallback"] is None and index.recall["lower_bound"] >= 0.99
    assert numpy_recall(index, gallery, held_out, 10) >= 0.97
