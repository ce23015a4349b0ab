"""DML-ALA learns (the effect, beside the exactness tests of `test_ala.py`).

`variant="paper"` at the paper's rates:

Digits episodes (sklearn's 8x8 digits, a tiny CNN embedder), the paper's rates: SGD 1e-4 for the CNN, 10x for
the new embedding layer, assessor SGD 4e-4, K = 3, sums over tuples. A twin with a frozen assessor (rate 0)
is not needed: the change of the weights is measured on the same tuples and embeddings, learnt vs initial
assessor.

What it shows (and what it does not): at these rates the assessor's parameters move (relative change ~4e-3
after 100 steps here; ~1e-9 with means instead of sums), but what it learns is mostly a common shift of all
weights (a learnt step size: the training and validation gradients align, so the meta-gradient of every
weight has the same sign); the part of the change that differs between tuples is ~1000x smaller (std ~3e-5
against a shift of ~2e-2), so the spread of the weights across tuples (Fig. 4a) does not grow beyond what a
frozen assessor shows (~1e-3) on this tiny problem. The test asserts the former, and that the change is not
a pure shift.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfdml.losses import TripletLoss
from tfdml.models import ALAModel, Embedder
from tfdml.models.ala.lookahead import inner_rates
from tfdml.ops.tuples import triplet_indices
from tfdml.optimizers import learning_rate_multipliers

sklearn_datasets = pytest.importorskip("sklearn.datasets")


def _digits_episodes(steps, train_classes=6, val_classes=3, per_class=5, seed=0):
    digits = sklearn_datasets.load_digits()
    # Raw 0-255 pixels, as the pipelines give them: the embedder divides by 255 itself.
    x, y = (digits.images * (255.0 / 16.0)).astype("float32")[..., None], digits.target.astype("int32")
    rng = np.random.default_rng(seed)
    by_class = {c: np.flatnonzero(y == c) for c in range(10)}
    episodes = []
    for _ in range(steps):
        classes = rng.permutation(10)
        pick = lambda cs: np.concatenate([rng.choice(by_class[c], per_class, replace=False) for c in cs])  # noqa
        train, val = pick(classes[:train_classes]), pick(classes[train_classes : train_classes + val_classes])
        episodes.append(tuple(tf.constant(a) for a in (x[train], y[train], x[val], y[val])))
    return episodes


def _train(episodes, assessor_learning_rate):
    keras.utils.set_random_seed(0)
    model = ALAModel(
        Embedder("small_cnn", embedding_dim=16, input_shape=(8, 8, 1)),
        base_loss=TripletLoss(squared=True),  # eq 4
        variant="paper",
        state="per_step",
        assessor_learning_rate=assessor_learning_rate,
    )
    model.compile(optimizer=learning_rate_multipliers(keras.optimizers.SGD(1e-4), {"head_H": 10}))
    phi0 = [v.numpy() for v in model.assessor.trainable_variables]
    step = tf.function(model.train_step)
    for episode in episodes:
        logs = step(episode)
    return model, phi0, {k: float(v) for k, v in logs.items()}


@pytest.mark.slow
def test_assessor_learns_at_the_papers_rates():
    episodes = _digits_episodes(60)
    model, phi0, logs = _train(episodes, 4e-4)
    phi = [v.numpy() for v in model.assessor.trainable_variables]
    flat = lambda values: np.concatenate([v.ravel() for v in values])  # noqa: E731
    relative_change = np.linalg.norm(flat(phi) - flat(phi0)) / np.linalg.norm(flat(phi0))
    assert relative_change >= 1e-3  # means instead of sums: ~1e-9

    # On the same tuples and embeddings, the learnt assessor weights differently from the initial one, and
    # not just by a common shift: the change varies across tuples.
    train_x, train_y = episodes[-1][:2]
    embeddings = model.embedder(train_x, training=False)
    tuples = triplet_indices(train_y)
    learnt = model.assessor(embeddings, tuples)[0].numpy()
    for variable, value in zip(model.assessor.trainable_variables, phi0):
        variable.assign(value)
    initial = model.assessor(embeddings, tuples)[0].numpy()
    change = learnt - initial
    assert np.abs(change.mean()) > 1e-3
    assert change.std() > 1e-5
    assert 0.05 < learnt.min() and learnt.max() < 0.95  # not saturated
    assert 0.05 < logs["weight_mean"] < 0.95


@pytest.mark.slow
def test_ala_training_builds_the_method_and_its_baseline_on_the_same_episodes():
    from tfdml import data
    from tfdml.models.ala import ala_training

    source = data.digits("train")
    runs = {}
    for weighting in ("uniform", "assessor"):
        keras.utils.set_random_seed(0)
        embedder = Embedder("small_cnn", embedding_dim=16, input_shape=(8, 8, 1))  # no Input: size from it
        runs[weighting] = ala_training(
            embedder,
            source,
            2,
            base_loss="margin",
            weighting=weighting,
            seed=3,
            state="per_step",  # no XLA compilation: a cheaper test
            classes_per_batch=3,
            samples_per_class=3,
            val_classes=2,
        )
    model, ds = runs["assessor"]
    assert model.embedding_dim == 16 and model.options.weighting == "assessor" and model.loss_variables
    variables = model.embedder.trainable_variables
    rates = {v.path: float(r) for v, r in zip(variables, inner_rates(model.optimizer, variables))}
    assert [r for p, r in rates.items() if "head_H" in p] == [pytest.approx(1e-3)]  # the new layer's 10x rate
    np.testing.assert_allclose([r for p, r in rates.items() if "head_H" not in p], 1e-4, rtol=1e-6)
    episodes = [list(runs[w][1]) for w in ("uniform", "assessor")]
    assert len(episodes[0]) == 2 and int(ds.cardinality()) == 2
    for a, b in zip(*episodes):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x.numpy(), y.numpy())
    # The training subset is the base loss's 3 x 3 batch; 2 x 3 validation images come in addition.
    train_x, train_y, val_x, val_y = episodes[0][0]
    assert train_x.shape[0] == 9 and val_x.shape[0] == 6
    assert len(set(train_y.numpy())) == 3 and not set(train_y.numpy()) & set(val_y.numpy())
    logs = model.train_step(episodes[1][0])
    assert np.isfinite(float(logs["loss"])) and float(logs["weight_mean"]) == pytest.approx(1.0)
    assert "meta_loss" not in runs["uniform"][0].train_step(episodes[0][0])
