"""DML-ALA (`tfdml.models.ALAModel`) on the base loss as users compile it: the real step at uniform weights is
`model.fit` of the plain loss, the meta-gradient equals central finite differences, the weights' form, the
LSTM state, saving, errors.

References are written independently of the implementation: the plain loss trained by Keras' own
`train_step` (`MetricModel.fit`), `theta'` from a plain `GradientTape` on the embedder's variables and the
validation loss evaluated with the loss's `compute` after assigning `theta'` to the embedder (no
`stateless_call`, no forward-mode products, no `term_coefficients`).
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfdml.losses import ContrastiveLoss, MarginLoss, RankedListLoss, TripletLoss
from tfdml.models import ALAModel, Embedder, MetricModel
from tfdml.models.ala import resolve_base_loss
from tfdml.models.ala.episode import EpisodeDerivatives
from tfdml.ops import reduce_terms
from tfdml.optimizers import MultiOptimizer, learning_rate_multipliers

BASE_RATE, HEAD_MULTIPLIER = 0.25, 8.0

# The base losses as the reality check tunes them (contrastive, semi-hard triplets, distance-weighted margin),
# and the all-triplet form. Sampled losses are seeded so that two instances draw the same tuples.
LOSSES = {
    "contrastive": lambda: ContrastiveLoss(pos_margin=0.05, neg_margin=0.9),
    "triplet_semi_hard": lambda: TripletLoss(margin=0.5, mining="semi_hard"),
    "triplet_all": lambda: TripletLoss(margin=0.3),
    "margin_distance_weighted": lambda: MarginLoss(alpha=0.2, beta=1.0, seed=3, nu=0.01),
}


def _layers(dtype):
    return [
        keras.layers.Dense(4, activation="tanh", dtype=dtype),
        keras.layers.Dense(3, dtype=dtype),
        keras.layers.UnitNormalization(dtype=dtype),
    ]


def _embedder(dtype="float32", in_dim=5, seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((in_dim,), dtype=dtype), *_layers(dtype)])


def _metric_model(embedder, dtype="float32"):
    """A `MetricModel` with the same layers' weights as `embedder`: what a user compiles with the plain loss."""
    inputs = keras.Input(embedder.input_shape[1:], dtype=dtype)
    outputs = inputs
    for layer in _layers(dtype):
        outputs = layer(outputs)
    model = MetricModel(inputs, outputs)
    model.set_weights(embedder.get_weights())
    return model


def _episode(seed=0, dtype="float32", in_dim=5, train_classes=3, val_classes=2, per_class=3):
    rng = np.random.default_rng(seed)
    train_y = np.repeat(np.arange(train_classes), per_class).astype("int32")
    val_y = np.repeat(np.arange(train_classes, train_classes + val_classes), per_class).astype("int32")
    return (
        rng.normal(size=(len(train_y), in_dim)).astype(dtype),
        train_y,
        rng.normal(size=(len(val_y), in_dim)).astype(dtype),
        val_y,
    )


def _uniform_assessor(model):
    """Every tuple gets the same output: the assessor's head reads nothing."""
    model.assessor.output_kernel.assign(np.zeros(model.assessor.output_kernel.shape))


# ------------------------------------------------------------------ the real step is the plain loss's step
@pytest.mark.slow
@pytest.mark.parametrize(
    "name,weighting,assessor_steps",
    [
        *[(name, "uniform", 0) for name in LOSSES],
        ("contrastive", "assessor", 2),
        ("margin_distance_weighted", "assessor", 0),
    ],
)
def test_real_step_at_uniform_weights_is_model_fit_of_the_plain_loss(name, weighting, assessor_steps):
    """Weights all 1 (uniform weighting, or an assessor that cannot tell tuples apart and does not learn):
    two ALA steps move the embedder (and the margin loss's beta) exactly as two `model.fit` steps of the
    plain loss on the training subsets, Adam for the network and the loss's own SGD for beta.

    Both run eagerly: tracing costs several times the two steps, and the traced step is
    `test_train_step_is_algorithm_1_with_the_updated_assessor`'s and `test_fit_and_evaluate_with_each_base_loss`'s."""
    episodes = [_episode(seed=s, train_classes=4, per_class=3) for s in (1, 2)]
    ala = ALAModel(
        _embedder(seed=4),
        base_loss=LOSSES[name](),
        weighting=weighting,
        assessor_units=3,
        assessor_steps=assessor_steps,
        assessor_learning_rate=0.0 if assessor_steps else None,
    )
    if weighting == "assessor":
        _uniform_assessor(ala)
    ala.compile(optimizer=keras.optimizers.Adam(0.05), run_eagerly=True)
    plain = _metric_model(_embedder(seed=4))
    plain_loss = LOSSES[name]()
    plain.compile(optimizer=keras.optimizers.Adam(0.05), loss=plain_loss, run_eagerly=True)

    ala.fit(_dataset(episodes), verbose=0)
    for x, y, _, _ in episodes:
        plain.fit(x, y, batch_size=len(x), epochs=1, shuffle=False, verbose=0)  # the draw follows the order
    start = _embedder(seed=4).get_weights()
    moved = 0.0
    plain_weights = [w for layer in plain.layers for w in layer.get_weights()]  # without the loss's beta
    for got, expected, initial in zip(ala.embedder.get_weights(), plain_weights, start, strict=True):
        np.testing.assert_allclose(got, expected, rtol=2e-5, atol=2e-7)
        moved = max(moved, np.abs(expected - initial).max())
    assert moved > 1e-3
    if isinstance(plain_loss, MarginLoss):
        np.testing.assert_allclose(ala.base_loss.beta.numpy(), plain_loss.beta.numpy(), rtol=1e-6)
        assert abs(float(plain_loss.beta.numpy()) - 1.0) > 1e-4


def test_weights_reweight_the_terms_through_the_losses_own_reduction():
    """One SGD step with the assessor's weights: the gradient of `reduce_terms(loss.terms, w)` (the weighted
    mean of the module docstring), for the weights `tuple_weights` reports."""
    lr = 0.5
    model = ALAModel(_embedder("float64"), base_loss=LOSSES["contrastive"](), assessor_units=3, dtype="float64")
    model.compile(optimizer=keras.optimizers.SGD(lr))
    model.assessor.output_kernel.assign(np.random.default_rng(0).normal(size=model.assessor.output_kernel.shape))
    x, y, vx, vy = _episode(dtype="float64", seed=8)
    model.options.assessor_steps = 0
    tuples, weights = model.tuple_weights(x, y)
    assert np.std(weights.numpy()) > 1e-3  # not uniform
    with tf.GradientTape() as tape:
        terms = model.base_loss.terms(tf.constant(y), model.embedder(x))
        np.testing.assert_array_equal(terms.indices.numpy(), tuples.numpy())
        loss = reduce_terms(terms, weights)
    grads = tape.gradient(loss, model.embedder.trainable_variables)
    expected = [v.numpy() - lr * g.numpy() for v, g in zip(model.embedder.trainable_variables, grads)]
    logs = model.train_step((x, y, vx, vy))
    for variable, value in zip(model.embedder.trainable_variables, expected):
        np.testing.assert_allclose(variable.numpy(), value, rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(logs["loss"].numpy(), loss.numpy(), rtol=1e-6)


# ------------------------------------------------------------------------------------ the weights' form
def test_softmax_weights_of_centred_outputs_with_temperature_and_floor():
    """`w = n softmax(z / T)` of the centred outputs `z`, mixed with 1 by the floor; mean 1; a tuple whose output
    is far below the others' goes to ~0 without a floor."""
    unbounded = {"weight_range": float("inf")}
    model = ALAModel(
        _embedder("float64"), assessor_units=3, dtype="float64", temperature=0.5, weight_floor=0.2, **unbounded
    )
    z = np.array([0.3, -0.1, 0.5, -0.7])
    softmax = np.exp(z / 0.5) / np.exp(z / 0.5).sum()
    np.testing.assert_allclose(model.weights_from_outputs(tf.constant(z)).numpy(), 0.2 + 0.8 * 4 * softmax, rtol=1e-12)
    silencing = ALAModel(_embedder("float64"), assessor_units=3, dtype="float64", **unbounded)
    weights = silencing.weights_from_outputs(tf.constant([4.0, 4.0, 4.0, -12.0], tf.float64)).numpy()
    assert weights[-1] < 1e-6 and np.isclose(weights.mean(), 1.0)
    bounded = ALAModel(_embedder("float64"), assessor_units=3, dtype="float64", weight_range=1.5, temperature=0.5)
    z = np.array([4.0, 4.0, 4.0, -12.0])
    expected = np.exp(1.5 * np.tanh(z / 1.5) / 0.5)
    weights = bounded.weights_from_outputs(tf.constant(z)).numpy()
    np.testing.assert_allclose(weights, 4 * expected / expected.sum(), rtol=1e-12)
    assert weights.max() / weights.min() < np.exp(2 * 1.5 / 0.5)


def test_a_model_saved_with_the_dropped_distance_prior_loads_at_its_default_and_names_it_otherwise():
    config = ALAModel(_embedder(), base_loss="contrastive").get_config()
    assert "distance_prior" not in config
    restored = ALAModel.from_config({**config, "distance_prior": 0.0})  # what a file saved with the switch holds
    assert restored.get_config() == config
    with pytest.raises(ValueError, match=r"^this ALAModel was saved with distance_prior=2.0, a DML-ALA switch"):
        ALAModel.from_config({**config, "distance_prior": 2.0})


def test_assessor_outputs_have_no_common_shift():
    """The centred outputs' mean is 0 whatever the head's bias: the common shift that drifted does not exist."""
    model = ALAModel(_embedder("float64"), assessor_units=3, dtype="float64")
    model.compile(optimizer="adam")
    x, y = _episode(dtype="float64", seed=3)[:2]
    episode = EpisodeDerivatives(model, x, y)
    before, raw, _ = episode.weights()
    np.testing.assert_allclose(np.mean(raw.numpy()), 0.0, atol=1e-12)
    model.assessor.output_bias.assign([5.0])
    after, raw_shifted, _ = episode.weights()
    np.testing.assert_allclose(raw_shifted.numpy(), raw.numpy(), atol=1e-12)
    np.testing.assert_allclose(after.numpy(), before.numpy(), rtol=1e-12)


@pytest.mark.parametrize(
    "loss", [LOSSES["contrastive"](), LOSSES["triplet_all"](), MarginLoss(alpha=0.1, beta=0.9, sampling="all")]
)
def test_only_tuples_whose_weight_can_change_the_loss_are_assessed(loss):
    """A zero term with a zero divisor adds nothing whatever its weight: it is not assessed (weight 1), and
    any weight on it leaves the loss unchanged."""
    model = ALAModel(_embedder("float64"), base_loss=loss, assessor_units=3, dtype="float64", assessed="all")
    x, y = _episode(dtype="float64", seed=4, train_classes=4)[:2]
    episode = EpisodeDerivatives(model, x, y)
    values, divisors = episode.values.numpy(), episode.terms.term_divisors().numpy()
    idle = (values == 0) & (divisors == 0)
    assert idle.any() and (~idle).any()
    np.testing.assert_array_equal(np.sort(episode.assessed.numpy()), np.flatnonzero(~idle))
    weights = np.random.default_rng(0).uniform(0.5, 2.0, values.size)
    changed = np.where(idle, 100.0, weights)
    np.testing.assert_allclose(
        reduce_terms(episode.terms, changed).numpy(), reduce_terms(episode.terms, weights).numpy(), rtol=1e-12
    )


# ------------------------------------------------------------------------------------ meta-gradient
def _float64_model(loss, optimizer=None, variant="default", state="per_tuple", assessed="all", **kwargs):
    """A float64 ALA model, the new layer ("head") at 8x the base rate by default; returns it and the rates.
    Every tuple weighted and read as one sequence (the paper's choices) unless told otherwise."""
    model = ALAModel(
        _embedder("float64"),
        base_loss=loss,
        assessor_units=3,
        state=state,
        assessed=assessed,
        dtype="float64",
        variant=variant,
        **kwargs,
    )
    head = model.embedder.layers[1]
    model.compile(
        optimizer=optimizer or learning_rate_multipliers(keras.optimizers.SGD(BASE_RATE), {head.name: HEAD_MULTIPLIER})
    )
    rng = np.random.default_rng(1)  # a non-zero carried state and a head that tells tuples apart
    model.assessor.state_h.assign(rng.normal(size=model.assessor.state_h.shape) * 0.5)
    model.assessor.state_c.assign(rng.normal(size=model.assessor.state_c.shape) * 0.5)
    model.assessor.output_kernel.assign(rng.normal(size=model.assessor.output_kernel.shape))
    return model


def _sgd_rates(model):
    return [
        float(np.asarray(model.optimizer._optimizer_map(v).learning_rate))
        if isinstance(model.optimizer, keras.optimizers.MultiOptimizer)
        else float(np.asarray(model.optimizer.learning_rate))
        for v in model.embedder.trainable_variables
    ]


def _reference_meta_loss(model, episode, rates, validation_loss=None, weights=None):
    """`L_va(theta')` with `theta' = theta - rate * grad_theta L(w)`, `w` the model's weights at the current
    assessor unless given (constants), written with a plain tape; the validation loss (`validation_loss`, default
    the base loss) by the loss's `compute` (or the sum of its terms, `reduction="sum"`) after assigning theta' to
    the embedder."""
    train_x, train_y, val_x, val_y = episode
    if weights is None:
        weights = EpisodeDerivatives(model, train_x, train_y).weights()[0]
    variables = model.embedder.trainable_variables
    loss = model.base_loss
    val_loss = loss if validation_loss is None else validation_loss
    with tf.GradientTape() as tape:
        terms = loss.terms(tf.constant(train_y), model.embedder(train_x, training=True))
        if model.options.reduction == "sum":
            value = tf.reduce_sum(weights * terms.values)
        else:
            value = reduce_terms(terms, weights)
    grads = tape.gradient(value, variables)
    theta = [v.numpy() for v in variables]
    for variable, t, rate, g in zip(variables, theta, rates, grads):
        variable.assign(t - rate * g.numpy())
    val_embeddings = model.embedder(val_x, training=True)
    if model.options.reduction == "sum":
        meta_loss = float(tf.reduce_sum(val_loss.terms(tf.constant(val_y), val_embeddings).values))
    else:
        meta_loss = float(val_loss.compute(tf.constant(val_y), val_embeddings))
    for variable, t in zip(variables, theta):
        variable.assign(t)
    return meta_loss


def _check_meta_gradient(model, episode, rates, validation_loss=None, extra=None):
    """The assessor's gradient against central finite differences of the reference meta-loss (plus `extra()`,
    a further term of the assessor's objective at its current variables)."""
    phi = model.assessor.trainable_variables
    grads, meta_loss = model.meta_gradient(*episode)
    np.testing.assert_allclose(
        meta_loss.numpy(), _reference_meta_loss(model, episode, rates, validation_loss), rtol=1e-10
    )
    flat_grad = np.concatenate([g.numpy().ravel() for g in grads])
    assert np.abs(flat_grad).max() > 1e-7  # a real, non-vanishing signal
    start = [v.numpy() for v in phi]

    def loss_along(direction, step):
        offset = 0
        for variable, value in zip(phi, start):
            variable.assign(value + step * direction[offset : offset + value.size].reshape(value.shape))
            offset += value.size
        return _reference_meta_loss(model, episode, rates, validation_loss) + (extra() if extra else 0.0)

    rng = np.random.default_rng(2)
    eps = 1e-5
    directions = [rng.normal(size=flat_grad.size) for _ in range(3)]
    directions.append(np.eye(flat_grad.size)[int(np.argmax(np.abs(flat_grad)))])  # largest coordinate
    for direction in directions:
        finite_difference = (loss_along(direction, eps) - loss_along(direction, -eps)) / (2 * eps)
        np.testing.assert_allclose(flat_grad @ direction, finite_difference, rtol=1e-6, atol=1e-11)
    for variable, value in zip(phi, start):
        variable.assign(value)


@pytest.mark.slow
@pytest.mark.parametrize(
    "name,kwargs",
    [
        ("contrastive", {}),
        ("triplet_semi_hard", {}),
        ("triplet_all", {"assessor_input": "embeddings+geometry", "temperature": 0.3, "weight_floor": 0.25}),
        ("contrastive", {"weight_range": 0.5}),
        ("margin_distance_weighted", {"state": "per_step"}),
        ("triplet_all", {"variant": "paper"}),
        ("contrastive", {"variant": "paper", "state": "per_step"}),
        ("triplet_all", {"assessed": "positive_pairs"}),
        ("margin_distance_weighted", {"assessed": "positive_pairs", "weights": "sigmoid"}),
        ("contrastive", {"assessed": "positive_pairs", "weights": "sigmoid", "state": "per_step"}),
        ("contrastive", {"assessed": "positive_pairs", "assessor_input": "embeddings"}),
    ],
)
def test_meta_gradient_equals_central_finite_differences(name, kwargs):
    """Through the softmax of centred outputs (or the paper's sigmoid and sums), the loss's own reduction,
    the geometry features, the recurrence over tuples and the per-variable rates of the virtual step."""
    model = _float64_model(LOSSES[name](), **kwargs)
    rates = _sgd_rates(model)
    assert len(set(rates)) == 2  # the head's 8x rate enters the virtual step
    _check_meta_gradient(model, _episode(dtype="float64", train_classes=4), rates)


@pytest.mark.slow
def test_output_penalty_adds_its_pull_to_the_meta_gradient():
    """`output_penalty=lambda`: the assessor's gradient is that of `L_va(theta'(phi)) + lambda s / 2 sum_j o_j(phi)^2`,
    `o` its outputs and `s` (a constant) the root mean square of the meta-loss's gradient in the bounded logits,
    here by central finite differences of the reference meta-loss at the weights of perturbed logits."""
    penalty = 20.0  # the pull a sizeable part of the gradient at these small outputs
    model = _float64_model(
        LOSSES["contrastive"](), state="per_step", assessed="positive_pairs", weight_range=1.0, output_penalty=penalty
    )
    rates = _sgd_rates(model)
    episode = _episode(dtype="float64", train_classes=4)
    derivatives = EpisodeDerivatives(model, *episode[:2])
    logits = derivatives.assess()[3].numpy()

    def meta_loss_at(z):
        weights = derivatives.weights_of_units(model.weights_from_logits(tf.constant(z)))
        return _reference_meta_loss(model, episode, rates, weights=weights)

    eps = 1e-6
    push = [(meta_loss_at(logits + eps * e) - meta_loss_at(logits - eps * e)) / (2 * eps) for e in np.eye(logits.size)]
    scale = np.sqrt(np.mean(np.square(push)))

    def pull():
        outputs = EpisodeDerivatives(model, *episode[:2]).weights()[1].numpy()
        return penalty * scale * 0.5 * np.sum(np.square(outputs))

    _check_meta_gradient(model, episode, rates, extra=pull)
    with_pull = np.concatenate([g.numpy().ravel() for g in model.meta_gradient(*episode)[0]])
    model.options.output_penalty = 0.0
    without = np.concatenate([g.numpy().ravel() for g in model.meta_gradient(*episode)[0]])
    assert np.abs(with_pull - without).max() > 0.1 * np.abs(without).max()


@pytest.mark.slow
@pytest.mark.parametrize(
    "name,validation_loss,kwargs",
    [
        # the base loss with a wider negative margin: the validation subset's negative pairs count
        ("contrastive", lambda: ContrastiveLoss(pos_margin=0.05, neg_margin=1.8), {"assessed": "positive_pairs"}),
        ("triplet_all", lambda: ContrastiveLoss(pos_margin=0.1, neg_margin=1.5), {"lookahead_variables": "head"}),
    ],
)
def test_meta_gradient_with_a_validation_loss_equals_central_finite_differences(name, validation_loss, kwargs):
    """`validation_loss`: the look-ahead scores the virtual step with that loss, not the base loss."""
    val_loss = validation_loss()
    model = _float64_model(LOSSES[name](), validation_loss=val_loss, **kwargs)
    assert model.validation_loss is val_loss
    rates = _sgd_rates(model)
    if kwargs.get("lookahead_variables") == "head":  # the virtual step moves the head alone
        head = set(model.lookahead_positions)
        rates = [rate if i in head else 0.0 for i, rate in enumerate(rates)]
    episode = _episode(dtype="float64", train_classes=4)
    meta_loss = float(model.meta_gradient(*episode)[1])
    assert abs(meta_loss - _reference_meta_loss(model, episode, rates)) > 1e-3  # not the base loss's value
    _check_meta_gradient(model, episode, rates, val_loss)


def test_optimizer_lookahead_at_uniform_weights_is_the_real_step():
    """`lookahead="optimizer"`: with every weight 1 the virtual step (10) is exactly the step Adam then takes."""
    model = _float64_model(LOSSES["triplet_all"](), optimizer=keras.optimizers.Adam(0.05), lookahead="optimizer")
    _uniform_assessor(model)
    model.options.assessor_steps = 0
    for seed in (10, 11):  # Adam with state
        model.train_step(_episode(dtype="float64", seed=seed))
    x, y = _episode(dtype="float64", seed=3)[:2]
    episode = EpisodeDerivatives(model, x, y)
    grads = episode.gradients(tf.ones_like(episode.values))[0]
    preconditioners, offsets = episode.lookahead_terms()
    theta = episode.theta
    virtual = [(t - o - p * g).numpy() for t, p, o, g in zip(theta, preconditioners, offsets, grads)]
    before = [t.numpy().copy() for t in theta]  # a copy: theta may be the variables themselves
    model.optimizer.apply_gradients(zip(grads, model.embedder.trainable_variables))
    for variable, value, start in zip(model.embedder.trainable_variables, virtual, before):
        np.testing.assert_allclose(variable.numpy(), value, rtol=1e-12, atol=1e-15)
        assert np.abs(variable.numpy() - start).max() > 1e-6


# ------------------------------------------------------------------------------ the head-only look-ahead
def _split_model(name, lookahead_variables, body, head, **kwargs):
    """A float64 model whose head (the last Dense layer) is trained by the optimizer `head`, the rest by `body`."""
    model = _float64_model(LOSSES[name](), lookahead_variables=lookahead_variables, **kwargs)
    model.compile(optimizer=MultiOptimizer([(head, model.embedder.layers[1])], default=body))
    return model


@pytest.mark.slow
@pytest.mark.parametrize("lookahead,optimizer", [("sgd", keras.optimizers.SGD), ("optimizer", keras.optimizers.Adam)])
def test_head_lookahead_is_the_full_lookahead_with_the_body_at_rate_zero(lookahead, optimizer):
    """`lookahead_variables="head"` moves the head alone and differentiates through it alone: the full
    look-ahead (pinned to finite differences above) with the body's rate 0 gives the same meta-loss and
    meta-gradient, for the SGD virtual step and for Adam's (its reference gradient taken in the head only),
    whatever the body's rate; with the body at a rate the full look-ahead's differs. The SGD case is also
    checked against central finite differences of the plain-tape reference whose virtual step moves the head
    alone. One model, its switch and its body's rate changed between the evaluations."""
    episode = _episode(dtype="float64", train_classes=4)
    model = _split_model(  # the library's assessor (one state per step, positive pairs): cheap in eager mode
        "contrastive",
        "all",
        optimizer(0.0),
        optimizer(0.5),
        lookahead=lookahead,
        state="per_step",
        assessed="positive_pairs",
    )
    body = model.optimizer._optimizer_map(model.embedder.trainable_variables[0])

    def meta_gradient(variables, body_rate):
        model.options.lookahead_variables = variables
        body.learning_rate.assign(body_rate)
        grads, meta_loss = model.meta_gradient(*episode)
        return np.concatenate([g.numpy().ravel() for g in grads]), float(meta_loss)

    full, full_loss = meta_gradient("all", 0.0)
    for body_rate in (0.0, 0.25):  # the body's rate is not the head look-ahead's
        head, head_loss = meta_gradient("head", body_rate)
        assert np.abs(head).max() > 1e-6
        np.testing.assert_allclose(head_loss, full_loss, rtol=1e-12)
        np.testing.assert_allclose(head, full, rtol=1e-9, atol=1e-15)
    moving_body, moving_body_loss = meta_gradient("all", 0.25)  # not a vacuous equality
    assert abs(moving_body_loss - head_loss) > 1e-6 and np.abs(moving_body - head).max() > 1e-4
    if lookahead == "sgd":
        model.options.lookahead_variables = "head"
        assert model.lookahead_positions == [2, 3]  # the last Dense layer's kernel and bias
        _check_meta_gradient(model, episode, [0.0, 0.0, 0.5, 0.5])


def test_head_lookahead_moves_a_tfdml_embedders_new_layers_else_the_last_layer_with_variables():
    embedder = Embedder("small_cnn", embedding_dim=4, input_shape=(8, 8, 1), weights=None, widths=(2,))
    variables = embedder.trainable_variables
    moved = [variables[i].path for i in ALAModel(embedder, lookahead_variables="head").lookahead_positions]
    assert moved == [v.path for v in embedder.head_variables] and 0 < len(moved) < len(variables)
    sequential = _embedder()  # Dense(4), Dense(3), UnitNormalization: the Dense(3)
    model = ALAModel(sequential, lookahead_variables="head")
    assert [sequential.trainable_variables[i].path for i in model.lookahead_positions] == [
        v.path for v in sequential.layers[1].trainable_variables
    ]
    assert ALAModel(_embedder()).lookahead_positions == [0, 1, 2, 3]  # the default: all of them
    with pytest.raises(ValueError, match='lookahead_variables="head" needs the embedder\'s head'):
        ALAModel(keras.Sequential([keras.Input((5,)), keras.layers.UnitNormalization()]), lookahead_variables="head")


@pytest.mark.slow
def test_train_step_is_algorithm_1_with_the_updated_assessor():
    """One step = K=2 SGD steps of phi on the exact meta-gradient, then theta updated with w(phi*) (eq 13)."""
    b, lr = 0.5, BASE_RATE
    model = _float64_model(LOSSES["contrastive"](), optimizer=keras.optimizers.SGD(lr), assessor_steps=2)
    model.assessor_optimizer = keras.optimizers.SGD(b)
    model.assessor_optimizer.build(model.assessor.trainable_variables)
    episode = _episode(dtype="float64", seed=4, train_classes=4)
    phi0 = [v.numpy() for v in model.assessor.trainable_variables]
    state0 = model.assessor.state_h.numpy()
    phi_star = phi0
    for _ in range(2):
        grads, _ = model.meta_gradient(*episode)
        phi_star = [p - b * g.numpy() for p, g in zip(phi_star, grads)]
        for variable, value in zip(model.assessor.trainable_variables, phi_star):
            variable.assign(value)
    at_phi_star = EpisodeDerivatives(model, *episode[:2])
    weights, assessed = at_phi_star.weights()[0], at_phi_star.assessed.numpy()
    with tf.GradientTape() as tape:
        loss = reduce_terms(model.base_loss.terms(tf.constant(episode[1]), model.embedder(episode[0])), weights)
    expected = [
        v.numpy() - lr * g.numpy()
        for v, g in zip(model.embedder.trainable_variables, tape.gradient(loss, model.embedder.trainable_variables))
    ]
    assert max(np.abs(p - q).max() for p, q in zip(phi_star, phi0)) > 1e-4  # the assessor did move
    for variable, value in zip(model.assessor.trainable_variables, phi0):
        variable.assign(value)
    logs = tf.function(model.train_step)(tuple(tf.constant(t) for t in episode))  # graph-mode ordering
    for variable, value in zip(model.assessor.trainable_variables, phi_star):
        np.testing.assert_allclose(variable.numpy(), value, rtol=1e-9, atol=1e-12)
    for variable, value in zip(model.embedder.trainable_variables, expected):
        np.testing.assert_allclose(variable.numpy(), value, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(logs["weight_mean"].numpy(), 1.0, rtol=1e-6)
    np.testing.assert_allclose(logs["weight_variance"].numpy(), np.var(weights.numpy()[assessed]), rtol=1e-4)
    assert not np.allclose(model.assessor.state_h.numpy(), state0)


# ------------------------------------------------------------------------------ meta_interval, tuples
@pytest.mark.slow
def test_meta_interval_updates_the_assessor_every_nth_step_and_trains_the_embedder_every_step():
    # One assessor update per meta step (K = 1): the interval is what is tested, and the traced tf.cond holds
    # K unrolled meta-gradients.
    model = ALAModel(_embedder(), base_loss="contrastive", assessor_units=3, meta_interval=2, assessor_steps=1)
    model.compile(optimizer=keras.optimizers.Adam(0.01))
    step = tf.function(model.train_step)
    phi, theta = [v.numpy() for v in model.assessor.trainable_variables], model.embedder.get_weights()
    moved = []
    for seed in range(3):
        step(_episode(seed=seed))
        new_phi, new_theta = [v.numpy() for v in model.assessor.trainable_variables], model.embedder.get_weights()
        moved.append(max(np.abs(a - b).max() for a, b in zip(new_phi, phi)) > 0)
        assert max(np.abs(a - b).max() for a, b in zip(new_theta, theta)) > 0
        phi, theta = new_phi, new_theta
    assert moved == [True, False, True]


# ---------------------------------------------------------------------------------------- LSTM state, saving
# Keras' saving converts every variable with np.array, which NumPy 2 flags for Keras variables (any model.save).
@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:__array__ implementation doesn't accept a copy keyword:DeprecationWarning")
def test_state_and_the_losses_beta_survive_save_load(tmp_path):
    model = ALAModel(
        _embedder(),
        base_loss=MarginLoss(beta=1.1, seed=2),
        assessor_units=4,
        temperature=0.7,
        lookahead_variables="head",
        output_penalty=0.2,
        validation_loss="contrastive",
        validation_loss_params={"pos_margin": 0.1, "neg_margin": 1.2},
    )
    model.compile(optimizer=keras.optimizers.Adam(0.02))
    for seed in (0, 1):
        model.train_step(_episode(seed=seed))
    assert abs(float(model.base_loss.beta.numpy()) - 1.1) > 1e-4 and np.abs(model.assessor.state_h.numpy()).max() > 0
    x, y = _episode(seed=2)[:2]
    tuples, weights = model.tuple_weights(x, y)
    path = str(tmp_path / "ala.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded, ALAModel) and isinstance(loaded.base_loss, MarginLoss)
    assert (
        loaded.options.temperature == 0.7
        and loaded.assessor.units == 4
        and loaded.options.lookahead_variables == "head"
    )
    assert model.get_config()["lookahead_variables"] == "head"
    assert loaded.options.output_penalty == 0.2
    assert isinstance(loaded.validation_loss, ContrastiveLoss) and loaded.validation_loss.neg_margin == 1.2
    assert loaded.validation_loss.pos_margin == 0.1
    default = ALAModel(_embedder(), base_loss="contrastive")  # None: the base loss, saved as None
    assert default.get_config()["validation_loss"] is None
    restored = ALAModel.from_config(default.get_config())
    assert restored.validation_loss is restored.base_loss and isinstance(restored.base_loss, ContrastiveLoss)
    np.testing.assert_allclose(loaded.base_loss.beta.numpy(), model.base_loss.beta.numpy())
    for a, b in zip(model.weights, loaded.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    loaded_tuples, loaded_weights = loaded.tuple_weights(x, y)
    np.testing.assert_array_equal(loaded_tuples.numpy(), tuples.numpy())
    np.testing.assert_allclose(loaded_weights.numpy(), weights.numpy(), rtol=1e-6)
    assert int(loaded.optimizer.iterations.numpy()) == 2
    loaded.train_step(_episode(seed=3))  # training resumes
    loaded.reset_assessor_state()
    assert not np.any(loaded.assessor.state_h.numpy())


# ------------------------------------------------------------------------- fit, evaluate, Mirrored
def _dataset(episodes):
    return tf.data.Dataset.from_tensor_slices(tuple(np.stack(parts) for parts in zip(*episodes)))


@pytest.mark.slow
@pytest.mark.parametrize("base_loss", ["triplet", "margin", "contrastive", TripletLoss(mining="semi_hard", margin=0.6)])
def test_fit_and_evaluate_with_each_base_loss(base_loss):
    model = ALAModel(_embedder(), base_loss=base_loss, assessor_units=4, assessor_steps=1)
    model.compile(optimizer=keras.optimizers.SGD(0.2))
    phi0 = [v.numpy() for v in model.assessor.trainable_variables]
    history = model.fit(_dataset([_episode(seed=s) for s in range(3)]), verbose=0).history
    expected = {"loss", "meta_loss", "weight_mean", "weight_variance", "output_std"}
    if model.base_loss.tuple_kind == "triplet":
        expected |= {"hardness", "weighted_hardness", "hardness_ratio"}
    assert set(history) == expected and all(np.isfinite(v[-1]) for v in history.values())
    assert any(np.abs(v.numpy() - p).max() > 0 for v, p in zip(model.assessor.trainable_variables, phi0))
    episodes = [_episode(seed=s) for s in range(2)]
    logs = model.evaluate(_dataset(episodes), verbose=0, return_dict=True)
    if not isinstance(model.base_loss, MarginLoss):  # deterministic tuples: the loss's value on the validation subsets
        plain = [float(model.base_loss.compute(tf.constant(e[3]), model.embedder(e[2]))) for e in episodes]
        np.testing.assert_allclose(logs["meta_loss"], np.mean(plain), rtol=1e-5)
    assert model.predict(_episode()[0], verbose=0).shape == (9, 3)


@pytest.mark.slow
def test_mirrored_strategy_update_equals_single_device_update():
    devices = [d.name for d in tf.config.list_logical_devices("CPU")][:2]
    assert len(devices) == 2
    episode = _episode(seed=7, train_classes=2, val_classes=2, per_class=4)  # halves split the classes

    def make(run_eagerly=False):
        # The paper's SGD assessor: Adam's normalised step would blow float32 summation-order noise in
        # near-zero gradient entries up to full steps.
        model = ALAModel(
            _embedder(seed=3),
            base_loss=MarginLoss(seed=1, sampling="all"),
            assessor_units=4,
            assessor_steps=1,
            inner_learning_rate=0.5,
            assessor_learning_rate=0.5,
            variant="paper",
        )
        model.compile(optimizer=keras.optimizers.SGD(0.5), run_eagerly=run_eagerly)
        return model

    single = make(run_eagerly=True)  # the reference, without tracing; the mirrored step is traced
    start = [w.numpy() for w in single.weights]
    single_logs = single.fit(tf.data.Dataset.from_tensors(episode), verbose=0).history
    with tf.distribute.MirroredStrategy(devices).scope():
        mirrored = make()
    mirrored_logs = mirrored.fit(tf.data.Dataset.from_tensors(episode), verbose=0).history
    moved = 0.0
    # Two replicas sum in another order than one device, and how far that moves a float32 step depends on the
    # CPU's kernels: on an AVX-512 machine up to 2.2e-6 on a weight and 1.4e-5 (relative 4e-5) on the assessor's
    # carried LSTM state, which sums over every tuple. A wrong all-reduce moves a weight by the order of the step
    # itself, over 1e-3 here.
    for a, b, c in zip(single.weights, mirrored.weights, start, strict=True):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-4, atol=1e-5, err_msg=a.path)
        moved = max(moved, np.abs(a.numpy() - c).max())
    assert moved > 1e-3
    for key in single_logs:
        np.testing.assert_allclose(mirrored_logs[key], single_logs[key], rtol=1e-5, atol=1e-7)


# ------------------------------------------------------------------------------ degenerate input, errors
def test_episode_without_tuples_gives_finite_zero_loss_and_keeps_the_state():
    model = ALAModel(_embedder(), base_loss="triplet", assessor_units=4)
    model.compile(optimizer=keras.optimizers.SGD(0.1))
    x = np.random.default_rng(0).normal(size=(4, 5)).astype("float32")
    theta0 = model.embedder.get_weights()
    logs = model.train_step((x, np.arange(4, dtype="int32"), x, np.full(4, 9, dtype="int32")))
    assert all(np.isfinite(v.numpy()) and v.numpy() == 0 for v in logs.values())
    assert not np.any(model.assessor.state_h.numpy())
    for variable, value in zip(model.embedder.get_weights(), theta0):
        np.testing.assert_array_equal(variable, value)


def test_bad_arguments_and_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match="base_loss must be one of"):
        ALAModel(_embedder(), base_loss="hinge")
    with pytest.raises(ValueError, match="Unknown parameters \\['beta'\\] for base_loss 'triplet'"):
        ALAModel(_embedder(), base_loss="triplet", loss_params={"beta": 1.0})
    with pytest.raises(ValueError, match="RankedListLoss has no per-tuple terms"):
        ALAModel(_embedder(), base_loss=RankedListLoss())
    with pytest.raises(ValueError, match="loss_params sets the arguments of a base_loss given by name"):
        ALAModel(_embedder(), base_loss=TripletLoss(), loss_params={"margin": 0.1})
    with pytest.raises(ValueError, match="embedding size"):
        ALAModel(keras.Sequential([keras.layers.Dense(3)]))
    with pytest.raises(ValueError, match="validation_loss must be one of"):
        ALAModel(_embedder(), validation_loss="hinge")
    with pytest.raises(ValueError, match="Unknown parameters \\['beta'\\] for validation_loss 'contrastive'"):
        ALAModel(_embedder(), validation_loss="contrastive", validation_loss_params={"beta": 1.0})
    with pytest.raises(ValueError, match="validation_loss_params sets the arguments of a validation_loss given by"):
        ALAModel(_embedder(), validation_loss_params={"neg_margin": 1.0})
    with pytest.raises(ValueError, match="validation_loss RankedListLoss has no per-tuple terms"):
        ALAModel(_embedder(), validation_loss=RankedListLoss())
    with pytest.raises(ValueError, match="validation_loss MarginLoss has trainable variables, which nothing would"):
        ALAModel(_embedder(), validation_loss=MarginLoss())
    model = ALAModel(_embedder(), assessor_units=2)
    model.compile(optimizer="sgd")
    with pytest.raises(ValueError, match="episodes"):
        model.train_step((np.zeros((4, 5), "float32"), np.zeros(4, "int32")))
    with pytest.raises(TypeError, match="train_labels must be integer"):
        x, _, vx, vy = _episode()
        model.train_step((x, np.zeros(len(x), "float32"), vx, vy))
    with pytest.raises(ValueError, match="do not pass loss"):
        model.compile(optimizer="sgd", loss="mse")
    for bad, message in (
        ({"variant": "literal"}, "variant must be one of"),
        ({"weights": "relu"}, "weights must be one of"),
        ({"reduction": "max"}, "reduction must be one of"),
        ({"lookahead": "adam"}, "lookahead must be one of"),
        ({"lookahead_variables": "body"}, "lookahead_variables must be one of \\['all', 'head'\\]"),
        ({"assessor_input": "pixels"}, "assessor_input must be one of"),
        ({"state": "global"}, "state must be one of"),
        ({"meta_interval": 0}, "meta_interval must be >= 1"),
        ({"assessor_steps": -1}, "assessor_steps must be >= 0"),
        ({"temperature": 0.0}, "temperature must be > 0"),
        ({"inner_learning_rate": 0.1, "lookahead": "optimizer"}, "cannot be combined"),
        ({"weight_floor": 1.0}, "weight_floor must be in"),
        ({"variant": "paper", "weight_floor": 0.5}, 'needs weights="softmax"'),
        ({"weight_range": 0.0}, "weight_range must be > 0"),
        ({"output_penalty": -0.1}, "output_penalty must be >= 0"),
        ({"weights": "sigmoid", "output_penalty": 0.1}, "output_penalty pulls the softmax logits towards 0; it needs"),
    ):
        with pytest.raises(ValueError, match=message):
            ALAModel(_embedder(), **bad)


def test_base_losses_by_name_are_the_library_losses_with_their_arguments():
    loss = resolve_base_loss("contrastive", {"neg_margin": 0.5})
    assert isinstance(loss, ContrastiveLoss) and loss.neg_margin == 0.5 and loss.pos_margin == 0.0
    semi_hard = TripletLoss(mining="semi_hard")
    assert resolve_base_loss(semi_hard) is semi_hard
    assert isinstance(resolve_base_loss("margin"), MarginLoss)
