"""One vocabulary of distances (`tfdml.ops.DISTANCES`: "euclidean", "squared_euclidean", "cosine"): a loss
whose formula takes any distance has a declared `distance` argument, and a non-default one gives the formula's
value on that distance (the NumPy references in `tests/references`); an unknown name fails with the valid ones,
in the loss and in the configuration; the tensorflow-addons drop-ins take the vocabulary's names beside tfa's
spellings, which are aliases of them, and the neighbour search ranks by "squared_euclidean" or "dot_product"
("squared_l2", ScaNN's and faiss' name, an alias)."""

import numpy as np
import pytest

from tests import loss_checks as checks
from tests.references import numpy_losses as ref
from tfdml.config import ConfigError, load_config
from tfdml.losses import (
    ContrastiveLoss,
    LiftedStructureLoss,
    ProxyNCALoss,
    RankedListLoss,
    TripletHardLoss,
    TripletLoss,
    TripletSemiHardLoss,
    contrastive_loss,
    lifted_structure_loss,
    proxy_nca_loss,
    ranked_list_loss,
    triplet_loss,
)
from tfdml.ops import DISTANCE_ALIASES, distance_name
from tfdml.ops.neighbours import exact_search, validate_distance

OTHER_DISTANCES = ("squared_euclidean", "cosine")
TRIPLET_REFERENCES = {"all": ref.triplet_all, "semi_hard": ref.triplet_semi_hard, "hard": ref.triplet_batch_hard}


@pytest.mark.parametrize("distance", OTHER_DISTANCES)
def test_contrastive_loss_on_another_distance_is_the_formula_on_it(distance):
    labels, x = checks.random_batch(0, 12, 3)
    expected = ref.contrastive(labels, x, 0.1, 0.8, metric=distance)
    assert abs(expected - ref.contrastive(labels, x, 0.1, 0.8)) > 1e-3  # the distance matters on this batch
    loss = ContrastiveLoss(0.1, 0.8, distance=distance)
    np.testing.assert_allclose(float(loss(labels, x)), expected, rtol=1e-6)
    np.testing.assert_allclose(float(contrastive_loss(labels, x, 0.1, 0.8, distance=distance)), expected, rtol=1e-6)
    assert ContrastiveLoss.from_config(loss.get_config()).distance == distance


@pytest.mark.parametrize("mining", sorted(TRIPLET_REFERENCES))
@pytest.mark.parametrize("distance", OTHER_DISTANCES)
def test_triplet_loss_on_another_distance_is_the_formula_on_it(distance, mining):
    labels, x = checks.random_batch(1, 12, 3)
    reference = TRIPLET_REFERENCES[mining]
    expected = reference(labels, x, 0.3, metric=distance)
    assert abs(expected - reference(labels, x, 0.3)) > 1e-3
    loss = TripletLoss(margin=0.3, mining=mining, distance=distance)
    np.testing.assert_allclose(float(loss(labels, x)), expected, rtol=1e-6)
    np.testing.assert_allclose(float(triplet_loss(labels, x, 0.3, mining, distance=distance)), expected, rtol=1e-6)
    assert TripletLoss.from_config(loss.get_config()).distance == distance


@pytest.mark.parametrize("distance", OTHER_DISTANCES)
def test_ranked_list_loss_on_another_distance_is_the_formula_on_it(distance):
    labels, x = checks.random_batch(2, 12, 3)
    x = x / np.linalg.norm(x, axis=1, keepdims=True)  # RLL's boundaries are on the unit sphere's scale
    params = {"margin": 0.3, "alpha": 0.8, "tn": 5.0}
    expected = ref.ranked_list_loss(labels, x, **params, metric=distance)
    assert abs(expected - ref.ranked_list_loss(labels, x, **params)) > 1e-3
    loss = RankedListLoss(**params, query_weighting="uniform", distance=distance)
    np.testing.assert_allclose(float(loss(labels, x)), expected, rtol=1e-6)
    value = ranked_list_loss(labels, x, **params, query_weighting="uniform", distance=distance)
    np.testing.assert_allclose(float(value), expected, rtol=1e-6)
    assert RankedListLoss.from_config(loss.get_config()).distance == distance


@pytest.mark.parametrize("distance", ("euclidean", *OTHER_DISTANCES))
def test_lifted_structure_loss_on_another_distance_is_the_formula_on_it(distance):
    labels, x = checks.random_batch(3, 12, 3)
    expected = ref.lifted_structure(labels, x, 1.0, 0.1, metric=distance)
    if distance != "euclidean":
        assert abs(expected - ref.lifted_structure(labels, x, 1.0, 0.1)) > 1e-3
    loss = LiftedStructureLoss(1.0, 0.1, distance=distance)
    np.testing.assert_allclose(float(loss(labels, x)), expected, rtol=1e-6)
    np.testing.assert_allclose(
        float(lifted_structure_loss(labels, x, 1.0, 0.1, distance=distance)), expected, rtol=1e-6
    )


@pytest.mark.parametrize("distance", ("squared_euclidean", "euclidean", "cosine"))
def test_proxy_nca_loss_on_another_distance_is_the_formula_on_it(distance):
    labels, x = checks.random_batch(4, 12, 3)
    proxies = np.random.default_rng(4).normal(size=(3, x.shape[1])).astype(np.float32)
    expected = ref.proxy_nca(labels, x, proxies, 2.0, metric=distance)
    if distance != "squared_euclidean":
        assert abs(expected - ref.proxy_nca(labels, x, proxies, 2.0)) > 1e-3
    value = proxy_nca_loss(labels, x, proxies, softmax_scale=2.0, distance=distance)
    np.testing.assert_allclose(float(value), expected, rtol=1e-5)
    loss = ProxyNCALoss(3, x.shape[1], softmax_scale=2.0, distance=distance)
    loss.proxies.assign(proxies)
    np.testing.assert_allclose(float(loss(labels, x)), expected, rtol=1e-5)
    assert ProxyNCALoss.from_config(loss.get_config()).distance == distance


def test_an_unknown_distance_names_the_valid_ones():
    valid = r"\('euclidean', 'squared_euclidean', 'cosine'\), got 'manhattan'"
    for cls in (ContrastiveLoss, TripletLoss, RankedListLoss, LiftedStructureLoss):
        with pytest.raises(ValueError, match=rf"^{cls.__name__}: distance must be one of {valid}\.$"):
            cls(distance="manhattan")
    with pytest.raises(ValueError, match=rf"^ProxyNCALoss: distance must be one of {valid}\.$"):
        ProxyNCALoss(3, 5, distance="manhattan")
    with pytest.raises(
        ConfigError,
        match=r"^loss.params.distance: must be one of euclidean, squared_euclidean, cosine, got 'manhattan'$",
    ):
        load_config(overrides=["loss.name=contrastive", "loss.params.distance=manhattan"])
    with pytest.raises(ValueError, match=r"squared applies to the euclidean distance only, got distance='cosine'"):
        TripletLoss(squared=True, distance="cosine")
    with pytest.raises(ValueError, match=r"^distance must be one of 'euclidean', 'squared_euclidean', 'cosine', 'L2'"):
        distance_name("manhattan", aliases=("L2",))


@pytest.mark.parametrize("alias, name", sorted(DISTANCE_ALIASES.items()))
def test_other_libraries_spellings_are_aliases_of_the_vocabulary(alias, name):
    assert distance_name(alias, aliases=(alias,)) == name
    with pytest.raises(ValueError, match="distance must be one of"):
        distance_name(alias)  # only where the caller accepts it


@pytest.mark.parametrize("tfa, name", [("L2", "euclidean"), ("squared-L2", "squared_euclidean"), ("angular", "cosine")])
def test_the_tfa_drop_ins_take_the_vocabularys_names_as_their_own(tfa, name):
    labels, x = checks.random_batch(2, 12, 3)
    for cls in (TripletSemiHardLoss, TripletHardLoss):
        by_name = cls(distance_metric=name)
        np.testing.assert_allclose(float(by_name(labels, x)), float(cls(distance_metric=tfa)(labels, x)), rtol=1e-7)
        assert cls.from_config(by_name.get_config()).distance_metric == name


def test_the_neighbour_search_ranks_by_the_vocabularys_names():
    rng = np.random.default_rng(3)
    queries, gallery = rng.normal(size=(6, 4)), rng.normal(size=(20, 4))
    squared = ((queries[:, None] - gallery[None]) ** 2).sum(-1)
    found, _ = exact_search(queries, gallery, 5, "squared_euclidean")
    np.testing.assert_array_equal(np.asarray(found), np.argsort(squared, axis=1, kind="stable")[:, :5])
    np.testing.assert_array_equal(np.asarray(exact_search(queries, gallery, 5, "squared_l2")[0]), np.asarray(found))
    assert validate_distance("squared_l2") == "squared_euclidean"
    with pytest.raises(ValueError, match=r"^distance must be one of 'dot_product', 'squared_euclidean', 'squared_l2'"):
        validate_distance("euclidean")
