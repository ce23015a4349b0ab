"""alpha-QE and DBA (`tfdml.retrieval.expansion`): a case computed by hand, the semantics of a peer
implementation written from its description (the Google Landmark Retrieval 2019 winners' `qe_dba`: each
vector replaced by the `sim^alpha`-weighted sum of its top `n + 1` neighbours, itself included, then
L2-normalised), the effect the method claims on clustered classes, isolated points left unchanged, the
options of `tfdml.retrieval.evaluate` and `tfdml evaluate`, and errors."""

import numpy as np
import pytest

from tfdml.cli import main
from tfdml.retrieval import evaluate
from tfdml.retrieval.expansion import database_augmentation, expanded_sets, query_expansion


def _unit(x):
    x = np.asarray(x, np.float64)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _clustered(seed=0, classes=12, per_class=10, dim=16, spread=0.9):
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(classes), per_class)
    x = rng.normal(size=(classes, dim))[labels] + spread * rng.normal(size=(len(labels), dim))
    return _unit(x).astype(np.float32), labels


def test_hand_computed_query_expansion():
    # q = (1, 0); its nearest gallery item (0.6, 0.8) has cosine 0.6, weight 0.6^3 = 0.216:
    # q + 0.216 * (0.6, 0.8) = (1.1296, 0.1728), of norm sqrt(1.305856).
    gallery = np.array([[0.6, 0.8], [0.0, 1.0], [-1.0, 0.0]], np.float32)
    expanded = query_expansion(np.array([[2.0, 0.0]]), gallery, neighbours=1, alpha=3)
    np.testing.assert_allclose(expanded, [[1.1296 / np.sqrt(1.305856), 0.1728 / np.sqrt(1.305856)]], rtol=1e-6)
    # n = 2 adds (0, 1) at cosine 0: weight 0, the same result; alpha = 0 weighs it 1 (average QE).
    np.testing.assert_allclose(query_expansion([[1.0, 0.0]], gallery, 2, 3.0), expanded, rtol=1e-6)
    average = query_expansion([[1.0, 0.0]], gallery, 2, alpha=0.0)
    np.testing.assert_allclose(average, _unit([[1.6, 1.8]]), rtol=1e-6)


def test_negative_similarities_do_not_pull():
    gallery = np.array([[-1.0, 0.0], [0.0, 1.0]], np.float32)  # cosines -1 and 0 to the query
    np.testing.assert_allclose(query_expansion([[1.0, 0.0]], gallery, 2, alpha=2.5), [[1.0, 0.0]], atol=1e-7)


def _peer_qe_dba(vectors, search_against, n, alpha, include_self):
    """The peer's semantics: the `sim^alpha`-weighted sum of the top neighbours (`n + 1` with the vector
    itself when it is in `search_against`, at similarity 1), normalised; written from that description."""
    out = []
    for v in vectors:
        sims = search_against @ v
        order = np.argsort(-sims, kind="stable")
        top = order[: n + 1] if include_self else order[:n]
        summed = (sims[top] ** alpha) @ search_against[top]
        out.append(summed if include_self else v + summed)
    return _unit(out)


def test_dba_and_qe_match_the_peer_semantics():
    x, _ = _clustered(seed=3, classes=6, per_class=5, dim=8, spread=0.3)
    x = x.astype(np.float64)
    for n, alpha in ((1, 3.0), (3, 3.0), (4, 1.5)):
        np.testing.assert_allclose(
            database_augmentation(x, n, alpha), _peer_qe_dba(x, x, n, alpha, include_self=True), atol=1e-5
        )
        queries = _unit(x[:7] + 0.2)
        np.testing.assert_allclose(
            query_expansion(queries, x, n, alpha), _peer_qe_dba(queries, x, n, alpha, include_self=False), atol=1e-5
        )


def test_isolated_points_are_left_unchanged():
    gallery = np.eye(6, dtype=np.float32) * 3.0  # every pair orthogonal: cosine 0, weight 0
    np.testing.assert_allclose(database_augmentation(gallery, 3, 3.0), np.eye(6), atol=1e-7)
    np.testing.assert_allclose(database_augmentation(gallery, 0), np.eye(6), atol=1e-7)


def test_expansion_improves_map_on_clustered_classes():
    x, y = _clustered()
    plain = evaluate(x, y, ks=(1,), metrics=("recall", "map@r"))
    qe = evaluate(x, y, ks=(1,), metrics=("recall", "map@r"), query_expansion=2)
    dba = evaluate(x, y, ks=(1,), metrics=("recall", "map@r"), database_augmentation=2)
    both = evaluate(x, y, ks=(1,), metrics=("recall", "map@r"), query_expansion=2, database_augmentation=2)
    assert 0.2 < plain["map@r"] < 0.8  # neither solved nor hopeless
    for expanded in (qe, dba, both):
        assert expanded["map@r"] > plain["map@r"] + 0.02, (plain, expanded)


def _map_at_r(queries, gallery, q_labels, g_labels, same_set):
    """MAP@R from a full stable ranking by cosine, the query's own row left out in same-set mode."""
    values = []
    for i, q in enumerate(queries):
        order = np.argsort(-(gallery @ q), kind="stable")
        if same_set:
            order = order[order != i]
        hits = g_labels[order] == q_labels[i]
        r = int(hits.sum())
        precision = np.cumsum(hits[:r]) / np.arange(1, r + 1)
        values.append(np.sum(precision * hits[:r]) / r)
    return float(np.mean(values))


@pytest.mark.parametrize("same_set", [True, False])
def test_evaluate_scores_the_expanded_ranking(same_set):
    x, y = _clustered(seed=1)
    queries, q_labels = (None, None) if same_set else (_unit(x[::4] + 0.1).astype(np.float32), y[::4])
    result = evaluate(
        x, y, query_embeddings=queries, query_labels=q_labels, metrics=("map@r",), query_expansion=3,
        database_augmentation=1, expansion_alpha=2.0,
    )  # fmt: skip
    augmented = _peer_qe_dba(x.astype(np.float64), x.astype(np.float64), 1, 2.0, include_self=True)
    if same_set:
        # each query leaves its own (augmented) row out of its expansion and of its ranking
        expanded = []
        for i, q in enumerate(x.astype(np.float64)):
            sims = augmented @ q
            order = [j for j in np.argsort(-sims, kind="stable") if j != i][:3]
            expanded.append(q + (sims[order] ** 2.0) @ augmented[order])
        expected = _map_at_r(_unit(expanded), augmented, y, y, True)
    else:
        expanded = _peer_qe_dba(queries.astype(np.float64), augmented, 3, 2.0, include_self=False)
        expected = _map_at_r(expanded, augmented, q_labels, y, False)
    np.testing.assert_allclose(result["map@r"], expected, atol=1e-6)


def test_off_is_the_plain_evaluation():
    x, y = _clustered(seed=2)
    assert evaluate(x, y, metrics=("recall", "map@r")) == evaluate(
        x, y, metrics=("recall", "map@r"), query_expansion=0, database_augmentation=0, expansion_alpha=7.0
    )
    queries, gallery = expanded_sets(x, x, True)
    assert queries is x and gallery is x


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"query_expansion": -1}, "query_expansion must be a whole number"),
        ({"query_expansion": 1.5}, "query_expansion must be a whole number"),
        ({"query_expansion": True}, "query_expansion must be a whole number"),
        ({"database_augmentation": -2}, "database_augmentation must be a whole number"),
        ({"query_expansion": 1, "expansion_alpha": -1.0}, "expansion_alpha must be a finite number"),
        ({"database_augmentation": 1, "expansion_alpha": float("nan")}, "expansion_alpha must be a finite number"),
        ({"query_expansion": 1, "expansion_alpha": float("inf")}, "expansion_alpha must be a finite number"),
        ({"query_expansion": 120}, "exceeds the 119 gallery items"),
        ({"database_augmentation": 120}, "exceeds the 119 other gallery items"),
    ],
)
def test_bad_options_are_named(kwargs, message):
    x, y = _clustered()
    with pytest.raises(ValueError, match=message):
        evaluate(x, y, metrics=("map@r",), **kwargs)


def test_cli_options(tmp_path, capsys):
    x, y = _clustered()
    npz = tmp_path / "emb.npz"
    np.savez(npz, embeddings=x, labels=y)
    base = ["evaluate", "--embeddings", str(npz), "--metrics", "map@r"]
    assert main(base) == 0
    plain = float(capsys.readouterr().out.split("map@r")[-1].split()[0])
    assert main(base + ["--query-expansion", "2", "--database-augmentation", "2", "--expansion-alpha", "3"]) == 0
    expanded = float(capsys.readouterr().out.split("map@r")[-1].split()[0])
    assert expanded > plain
    assert main(base + ["--query-expansion", "1", "--expansion-alpha", "-1"]) == 2
    assert "expansion_alpha must be a finite number" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(base + ["--database-augmentation", "-1"])
    assert "must be 0 (off) or more" in capsys.readouterr().err
