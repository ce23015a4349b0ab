"""tfdml.retrieval and tfdml.ops.neighbours against independent NumPy references written from the formulas."""

import itertools
import math
import shutil

import numpy as np
import pytest

from tfdml.ops import exact_search, ranking_scores
from tfdml.ops.neighbours import search_block_size
from tfdml.retrieval import ScannIndex, auto_settings, evaluate
from tfdml.retrieval import metrics as M

# ---------------------------------------------------------------- references (loops, float64, stable sort)


def ref_neighbours(queries, gallery=None, distance="squared_l2"):
    same = gallery is None
    gallery = queries if same else gallery
    q, g = np.asarray(queries, np.float64), np.asarray(gallery, np.float64)
    if distance == "squared_l2":
        key = ((q[:, None, :] - g[None, :, :]) ** 2).sum(-1)
    else:
        key = -(q @ g.T)
    if same:
        np.fill_diagonal(key, np.inf)
    order = np.argsort(key, axis=1, kind="stable")
    return order[:, : g.shape[0] - same]


def ref_metrics(queries, q_labels, gallery=None, g_labels=None, ks=(1, 2, 4, 8)):
    same = gallery is None
    order = ref_neighbours(queries, gallery)
    g_labels = q_labels if same else g_labels
    recall = {k: [] for k in ks}
    aps, rps = [], []
    for i, y in enumerate(q_labels):
        r = sum(1 for j, lab in enumerate(g_labels) if lab == y and not (same and j == i))
        if r == 0:
            continue
        ranked = [g_labels[j] == y for j in order[i]]
        for k in ks:
            recall[k].append(any(ranked[:k]))
        found, total = 0, 0.0
        for pos in range(r):
            if ranked[pos]:
                found += 1
                total += found / (pos + 1)
        aps.append(total / r)
        rps.append(sum(ranked[:r]) / r)
    out = {f"recall@{k}": float(np.mean(v)) for k, v in recall.items()}
    out["map@r"] = float(np.mean(aps))
    out["r_precision"] = float(np.mean(rps))
    return out


def ref_pair_f1(clusters, labels):
    tp = fp = fn = 0
    for i, j in itertools.combinations(range(len(labels)), 2):
        same_cluster, same_class = clusters[i] == clusters[j], labels[i] == labels[j]
        tp += same_cluster and same_class
        fp += same_cluster and not same_class
        fn += same_class and not same_cluster
    p, r = tp / (tp + fp), tp / (tp + fn)
    return 2 * p * r / (p + r)


def ref_nmi(clusters, labels):
    n = len(labels)

    def entropy(x):
        _, c = np.unique(x, return_counts=True)
        p = c / n
        return -np.sum(p * np.log(p))

    mi = 0.0
    for a in np.unique(clusters):
        for b in np.unique(labels):
            n_ab = np.sum((clusters == a) & (labels == b))
            if n_ab:
                mi += n_ab / n * math.log(n * n_ab / (np.sum(clusters == a) * np.sum(labels == b)))
    return mi / ((entropy(clusters) + entropy(labels)) / 2)


def clustered(n, dim, classes, seed, spread=0.6, sizes=None):
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(classes, dim))
    labels = rng.integers(0, classes, n) if sizes is None else np.repeat(np.arange(classes), sizes)
    x = centres[labels] + spread * rng.normal(size=(len(labels), dim))
    return x.astype(np.float32), labels


# ---------------------------------------------------------------- exact search


@pytest.mark.parametrize("distance", ["squared_l2", "dot_product"])
@pytest.mark.parametrize("same_set", [True, False])
def test_exact_search_matches_reference(distance, same_set):
    rng = np.random.default_rng(1)
    q = rng.normal(size=(37, 6)).astype(np.float32)
    g = None if same_set else rng.normal(size=(53, 6)).astype(np.float32)
    idx, values = exact_search(q, g, k=9, distance=distance, chunk_size=7)
    expected = ref_neighbours(q, g, distance)[:, :9]
    np.testing.assert_array_equal(idx, expected)
    gal = q if same_set else g
    picked = gal[idx]
    ref_values = (
        ((q[:, None] - picked) ** 2).sum(-1) if distance == "squared_l2" else np.einsum("qd,qkd->qk", q, picked)
    )
    np.testing.assert_allclose(values, ref_values, rtol=1e-4, atol=1e-4)


def test_exact_search_excludes_only_own_row_and_breaks_ties_by_index():
    # Integer data: distances are exact in float32, so ties are real ties.
    x = np.array([[0, 0], [0, 0], [1, 0], [0, 1], [0, 0], [2, 2]], np.float32)
    idx, dist = exact_search(x, k=5)
    np.testing.assert_array_equal(idx[0], [1, 4, 2, 3, 5])  # duplicates 1 and 4 kept, self (0) not
    np.testing.assert_array_equal(idx[1], [0, 4, 2, 3, 5])
    np.testing.assert_array_equal(dist[0], [0, 0, 1, 1, 8])
    np.testing.assert_array_equal(idx, ref_neighbours(x)[:, :5])
    # Query/gallery mode excludes nothing: the identical gallery row comes first.
    gidx, _ = exact_search(x[:1], x, k=2)
    np.testing.assert_array_equal(gidx[0], [0, 1])


def test_ranking_scores_formula():
    rng = np.random.default_rng(16)
    q, g = rng.normal(size=(4, 3)), rng.normal(size=(5, 3))
    expected = q @ g.T - 0.5 * (g**2).sum(1)[None, :]
    np.testing.assert_allclose(ranking_scores(q, g, "squared_l2").numpy(), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ranking_scores(q, g, "dot_product").numpy(), q @ g.T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("distance", ["squared_l2", "dot_product"])
def test_blocked_top_k_is_exact_including_ties(distance):
    rng = np.random.default_rng(17)
    g = rng.normal(size=(3000, 8)).astype(np.float32)
    q = rng.normal(size=(50, 8)).astype(np.float32)
    plain, plain_values = exact_search(q, g, k=10, distance=distance, block_size=0)
    blocked, blocked_values = exact_search(q, g, k=10, distance=distance, block_size=32)
    np.testing.assert_array_equal(blocked, plain)
    np.testing.assert_array_equal(blocked, ref_neighbours(q, g, distance)[:, :10])
    np.testing.assert_allclose(blocked_values, plain_values, rtol=1e-6)
    # Integer data: many exact ties, also across blocks; same-set mode (own row dropped).
    ints = rng.integers(0, 3, size=(2000, 2)).astype(np.float32)
    tied, _ = exact_search(ints, k=12, distance=distance, block_size=16)
    np.testing.assert_array_equal(tied, ref_neighbours(ints, None, distance)[:, :12])
    assert search_block_size(60000, 102) == 64 and search_block_size(900, 180) == 0


def test_exact_search_chunking_is_invisible():
    x, _ = clustered(300, 8, 10, seed=2)
    whole, _ = exact_search(x, k=20)
    tiny, _ = exact_search(x, k=20, memory_budget=4 * 300 * 3)  # a handful of queries per block
    np.testing.assert_array_equal(whole, tiny)


def test_exact_search_errors():
    x = np.zeros((4, 3), np.float32)
    with pytest.raises(ValueError, match="k must be between 1 and 3"):
        exact_search(x, k=4)
    with pytest.raises(ValueError, match="distance must be one of"):
        exact_search(x, k=1, distance="cosine")
    with pytest.raises(ValueError, match="dimension"):
        exact_search(x, np.zeros((4, 2)), k=1)
    with pytest.raises(ValueError, match="NaN or Inf"):
        exact_search(np.full((4, 3), np.nan), k=1)


# ---------------------------------------------------------------- metrics


def test_evaluate_matches_reference_unequal_classes_and_singletons():
    # Classes of sizes 1 (no positive: excluded), 2, 5, 12 and 30.
    x, y = clustered(50, 5, 5, seed=3, spread=1.5, sizes=[1, 2, 5, 12, 30])
    got = evaluate(x, y, ks=(1, 2, 4, 8), metrics=("recall", "map@r", "r_precision"))
    expected = ref_metrics(x, y)
    assert got.keys() == expected.keys()
    for key in expected:
        assert got[key] == pytest.approx(expected[key], abs=1e-12), key


def test_evaluate_with_ties_matches_stable_reference():
    rng = np.random.default_rng(4)
    x = rng.integers(0, 3, size=(60, 2)).astype(np.float32)  # many exact duplicates and distance ties
    y = rng.integers(0, 4, size=60)
    got = evaluate(x, y, ks=(1, 3), metrics=("recall", "map@r", "r_precision"))
    expected = ref_metrics(x, y, ks=(1, 3))
    for key in expected:
        assert got[key] == pytest.approx(expected[key], abs=1e-12), key


def test_evaluate_query_gallery_mode():
    g, gy = clustered(80, 6, 6, seed=5, spread=1.2)
    q, qy = clustered(30, 6, 6, seed=6, spread=1.2)
    q[0] = g[0]  # an exact copy of a gallery item must be retrieved, not excluded
    qy[0] = gy[0]
    got = evaluate(g, gy, ks=(1, 5), query_embeddings=q, query_labels=qy, metrics=("recall", "map@r", "r_precision"))
    expected = ref_metrics(q, qy, g, gy, ks=(1, 5))
    for key in expected:
        assert got[key] == pytest.approx(expected[key], abs=1e-12), key
    idx, _ = exact_search(q[:1], g, k=1)
    assert idx[0, 0] == 0


def test_map_at_r_hand_example():
    # R = 3, relevant at ranks 1 and 3: (1/1 + 2/3) / 3; R-precision = 2/3.
    hits = np.array([[True, False, True, True]])
    assert M.map_at_r(hits, np.array([3])) == pytest.approx((1 + 2 / 3) / 3)
    assert M.r_precision(hits, np.array([3])) == pytest.approx(2 / 3)
    assert M.recall_at_k(np.array([[False, True]]), (1, 2)) == {1: 0.0, 2: 1.0}


def test_nmi_and_f1_match_references():
    rng = np.random.default_rng(7)
    clusters = rng.integers(0, 4, 40)
    labels = np.where(rng.random(40) < 0.7, clusters, rng.integers(0, 5, 40))
    assert M.nmi(clusters, labels) == pytest.approx(ref_nmi(clusters, labels), abs=1e-10)
    assert M.clustering_f1(clusters, labels) == pytest.approx(ref_pair_f1(clusters, labels), abs=1e-12)


def test_clustering_metrics_in_evaluate():
    x, y = clustered(120, 4, 4, seed=8, spread=0.05)  # well separated: k-means recovers the classes
    res = evaluate(x, y, metrics=("nmi", "f1"))
    assert res == {"nmi": pytest.approx(1.0), "f1": pytest.approx(1.0)}
    x2, y2 = clustered(120, 4, 4, seed=9, spread=3.0)
    res2 = evaluate(x2, y2, metrics=("nmi", "f1"))
    clusters = M.cluster_embeddings(x2, 4, seed=0)
    assert res2["nmi"] == pytest.approx(ref_nmi(clusters, y2), abs=1e-10)
    assert res2["f1"] == pytest.approx(ref_pair_f1(clusters, y2), abs=1e-12)
    assert res2["nmi"] < 0.9


def test_evaluate_errors():
    x, y = clustered(20, 3, 2, seed=10)
    with pytest.raises(ValueError, match="unknown metrics"):
        evaluate(x, y, metrics=("recall", "auc"))
    with pytest.raises(ValueError, match="one label per embedding"):
        evaluate(x, y[:-1])
    with pytest.raises(TypeError, match="integer class ids"):
        evaluate(x, y.astype(float))
    with pytest.raises(ValueError, match="exceeds"):
        evaluate(x, y, ks=(50,), metrics=("recall",))
    with pytest.raises(ValueError, match="together"):
        evaluate(x, y, query_embeddings=x)
    with pytest.raises(ValueError, match="no query has a same-class item"):
        evaluate(x[:2], np.array([0, 1]), ks=(1,), metrics=("recall",))


# ---------------------------------------------------------------- ScaNN index


@pytest.mark.parametrize("distance", ["squared_l2", "dot_product"])
def test_scann_exact_mode_matches_exact_search(distance):
    g, _ = clustered(500, 8, 10, seed=11)
    q, _ = clustered(40, 8, 10, seed=12)
    index = ScannIndex(g, distance=distance, mode="exact")
    ids, values = index.search(q, k=10)
    expected, ref_values = exact_search(q, g, k=10, distance=distance)
    np.testing.assert_array_equal(ids, expected)
    np.testing.assert_allclose(values, ref_values, rtol=1e-4, atol=1e-3)


def test_scann_save_load_after_move_with_string_ids(tmp_path):
    g, y = clustered(300, 8, 5, seed=13)
    g /= np.linalg.norm(g, axis=1, keepdims=True)  # dot product (the default) ranks like L2 on the sphere
    ids = np.array([f"img_{i:04d}.jpg" for i in range(300)])
    index = ScannIndex(g, ids=ids, labels=y, metadata={"model_version": 3})
    assert index.mode == "exact"
    found, values = index.search(g[:5], k=3)
    assert found[:, 0].tolist() == ids[:5].tolist()
    index.save(tmp_path / "a" / "index")
    shutil.move(str(tmp_path / "a"), str(tmp_path / "b"))
    loaded = ScannIndex.load(tmp_path / "b" / "index")
    found2, values2 = loaded.search(g[:5], k=3)
    np.testing.assert_array_equal(found2, found)
    np.testing.assert_allclose(values2, values, rtol=1e-6)
    np.testing.assert_array_equal(loaded.labels, y)
    assert loaded.metadata == {"model_version": 3}
    single_ids, _ = loaded.search(g[7], k=2)
    assert single_ids.shape == (2,) and single_ids[0] == ids[7]


def test_scann_class_names_and_extra_arrays_round_trip(tmp_path):
    g, y = clustered(60, 4, 3, seed=15)
    index = ScannIndex(g, labels=y, class_names=["ant", "bee", "cat"])
    assert [index.class_name(i) for i in range(3)] == [["ant", "bee", "cat"][c] for c in y[:3]]
    pixels = np.arange(60 * 4, dtype=np.uint8).reshape(60, 2, 2, 1)
    index.save(tmp_path / "i", arrays={"gallery_images.npy": pixels})
    loaded = ScannIndex.load(tmp_path / "i")
    assert loaded.class_names == ["ant", "bee", "cat"] and loaded.class_name(5) == index.class_name(5)
    np.testing.assert_array_equal(loaded.load_array("gallery_images.npy"), pixels)
    assert loaded.load_array("absent.npy") is None
    assert ScannIndex(g).class_name(0) is None  # no labels, no class
    with pytest.raises(ValueError, match="class_names has 2 names but the labels go from 0 to 2"):
        ScannIndex(g, labels=y, class_names=["ant", "bee"])


def test_scann_auto_mode_switches_to_approximate_and_agrees_with_exact():
    g, _ = clustered(20000, 16, 200, seed=14, spread=0.5)
    index = ScannIndex(g, distance="squared_l2", mode="auto", target_recall=None)  # the automatic settings as they are
    assert index.mode == "approximate"
    assert index.settings == auto_settings(20000, 16, "squared_l2") | {
        "anisotropic_quantization_threshold": index.settings["anisotropic_quantization_threshold"]
    }
    q = g[:300] + 0.01
    found, _ = index.search(q, k=10)
    exact, _ = exact_search(q, g, k=10)
    agreement = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(found, exact)])
    print(f"approximate vs exact recall@10 on 20k x 16: {agreement:.4f}")
    assert agreement >= 0.95


def test_auto_settings_scale_with_size():
    small, large = auto_settings(60000, 512), auto_settings(1000000, 128)
    assert small["num_leaves"] == round(math.sqrt(60000))
    assert large["num_leaves"] == 1000
    assert small["leaves_to_search"] <= small["num_leaves"]
    assert ScannIndex(np.eye(4, dtype=np.float32)).mode == "exact"


def test_evaluate_approximate_close_to_exact():
    x, y = clustered(3000, 16, 60, seed=15, spread=0.8)
    exact = evaluate(x, y, ks=(1, 10), metrics=("recall", "map@r"))
    approx = evaluate(x, y, ks=(1, 10), metrics=("recall", "map@r"), exact=False)
    print("exact", exact, "approximate", approx)
    index = ScannIndex(x, distance="squared_l2", mode="approximate")
    found, _ = index.search(x[:500], k=60)
    expected, _ = exact_search(x[:500], x, k=60)
    agreement = np.mean([len(set(a) & set(b)) / 60 for a, b in zip(found, expected)])
    print(f"approximate vs exact neighbour recall@60 on 3k x 16: {agreement:.4f}")
    assert agreement >= 0.98
    for key in exact:
        assert abs(exact[key] - approx[key]) < 0.01, key


def test_scann_index_errors(tmp_path):
    g = np.zeros((5, 3), np.float32)
    with pytest.raises(ValueError, match="mode must be one of"):
        ScannIndex(g, mode="fast")
    with pytest.raises(ValueError, match="one entry per embedding"):
        ScannIndex(g, ids=[1, 2])
    with pytest.raises(TypeError, match="unknown ScannIndex settings"):
        ScannIndex(g, num_leafs=3)
    index = ScannIndex(g)
    with pytest.raises(ValueError, match="dimension 2"):
        index.search(np.zeros((1, 2)), k=1)
    with pytest.raises(ValueError, match="k must be between"):
        index.search(np.zeros((1, 3)), k=6)
    with pytest.raises(FileNotFoundError, match="not a saved ScannIndex"):
        ScannIndex.load(tmp_path)
