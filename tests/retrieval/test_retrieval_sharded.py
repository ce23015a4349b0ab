"""tfdml.retrieval.sharded (no Beam needed): per-shard top-k lists merged equal one NumPy brute-force search
over all the data; metric sums of query blocks added equal `evaluate` on the whole set."""

import numpy as np
import pytest

from tfdml.retrieval import ScannIndex, evaluate
from tfdml.retrieval.sharded import (
    ShardedIndex,
    add_sums,
    class_counts,
    merge_top_k,
    metrics_from_sums,
    needed_neighbours,
    retrieval_sums,
)

SPLITS = (0, 130, 131, 400, 700)  # unequal shards, one of a single item


def _data(seed=0, n=700, dim=16, classes=20):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, n)
    centres = rng.normal(size=(classes, dim))
    x = centres[labels] + 0.9 * rng.normal(size=(n, dim))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32), labels


def _shards(x, labels, distance="dot_product"):
    ids = np.array([f"item-{i:04d}" for i in range(len(x))])
    return ids, [
        ScannIndex(x[a:b], ids=ids[a:b], labels=labels[a:b], distance=distance, mode="exact")
        for a, b in zip(SPLITS[:-1], SPLITS[1:])
    ]


@pytest.mark.parametrize("distance", ["dot_product", "squared_l2"])
def test_merged_top_k_equals_one_brute_force_search(distance):
    x, labels = _data()
    ids, shards = _shards(x, labels, distance)
    queries = np.random.default_rng(1).normal(size=(50, x.shape[1])).astype(np.float32)
    found, scores, found_labels = ShardedIndex(shards).search(queries, k=12, labels=True)
    if distance == "dot_product":
        reference = queries.astype(np.float64) @ x.T.astype(np.float64)
    else:
        reference = -((queries[:, None, :].astype(np.float64) - x[None].astype(np.float64)) ** 2).sum(-1)
    rows = np.argsort(-reference, axis=1, kind="stable")[:, :12]
    np.testing.assert_array_equal(found, ids[rows])
    np.testing.assert_array_equal(found_labels, labels[rows])
    np.testing.assert_allclose(np.abs(scores), np.abs(np.take_along_axis(reference, rows, 1)), rtol=1e-4, atol=1e-5)


def test_same_set_search_leaves_out_each_query_itself():
    x, labels = _data(seed=2)
    ids, shards = _shards(x, labels)
    found, _ = ShardedIndex(shards).search(x, k=5, exclude_ids=ids)
    reference = x.astype(np.float64) @ x.T.astype(np.float64)
    np.fill_diagonal(reference, -np.inf)
    np.testing.assert_array_equal(found, ids[np.argsort(-reference, axis=1, kind="stable")[:, :5]])


def test_merge_keeps_the_earlier_list_first_on_ties():
    ids, scores = merge_top_k([np.array([["a", "b"]]), np.array([["c", "d"]])], [[[1.0, 0.5]], [[1.0, 0.7]]], 3)
    assert ids.tolist() == [["a", "c", "d"]] and scores.tolist() == [[1.0, 1.0, 0.699999988079071]]
    with pytest.raises(ValueError, match="exceeds"):
        merge_top_k([np.array([["a"]])], [[[1.0]]], 2)


def test_sums_over_query_blocks_equal_evaluate():
    x, labels = _data(seed=3)
    ids, shards = _shards(x, labels)
    index = ShardedIndex(shards)
    counts = class_counts(labels)
    ks, metrics = (1, 2, 4, 8), ("recall", "map@r", "r_precision")
    k = needed_neighbours(counts, ks, metrics)
    total = {}
    for a, b in zip(SPLITS[:-1], SPLITS[1:]):  # one block of queries at a time, as the Beam pipeline does
        _, _, found = index.search(x[a:b], k, exclude_ids=ids[a:b], labels=True)
        total = add_sums(total, retrieval_sums(found, labels[a:b], counts, ks, metrics))
    expected = evaluate(x, labels, ks=ks, metrics=metrics, distance="dot_product")
    measured = metrics_from_sums(total)
    assert measured.keys() == expected.keys()
    for key, value in expected.items():
        assert measured[key] == pytest.approx(value, abs=1e-12), key
