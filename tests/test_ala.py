"""DML-ALA (`tfdml.models.ALAModel`): exact meta-gradient, Algorithm 1 end to end, LSTM state, base losses,
MirroredStrategy, errors.

References are written independently of the implementation: tuples listed with itertools, per-tuple losses
from `np`/`tf.norm` formulas, `theta'` from a plain `GradientTape` and the validation loss evaluated by
assigning `theta'` to the embedder (no `stateless_call`, no forward-mode products).
"""

import itertools

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfdml.losses.contrastive import ContrastiveLoss
from tfdml.models import ALAModel
from tfdml.optimizers import learning_rate_multipliers

MARGINS = {
    "triplet": {"margin": 0.2},
    "margin": {"alpha": 0.2, "beta": 1.2},
    "contrastive": {"pos_margin": 0.0, "neg_margin": 1.0},
}


def _embedder(dtype="float32", in_dim=5, dim=3, seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [
            keras.Input((in_dim,), dtype=dtype),
            keras.layers.Dense(4, activation="tanh", dtype=dtype),
            keras.layers.Dense(dim, dtype=dtype),
            keras.layers.UnitNormalization(dtype=dtype),
        ]
    )


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


# ----------------------------------------------------------------------------- independent reference
def _reference_tuples(kind, labels):
    n = len(labels)
    if kind == "contrastive":
        return [(i, j) for i, j in itertools.combinations(range(n), 2)]
    return [
        (a, p, q)
        for a in range(n)
        for p in range(n)
        for q in range(n)
        if a != p and labels[a] == labels[p] and labels[a] != labels[q]
    ]


def _reference_tuple_losses(kind, embeddings, labels, beta=None):
    """Eq (4) with squared distances for the triplet loss; plain distances for margin and contrastive."""
    tuples = np.array(_reference_tuples(kind, labels))
    dist = lambda i, j: tf.norm(tf.gather(embeddings, i) - tf.gather(embeddings, j), axis=1)  # noqa: E731
    p = MARGINS[kind]
    if kind == "contrastive":
        d = dist(tuples[:, 0], tuples[:, 1])
        positive = labels[tuples[:, 0]] == labels[tuples[:, 1]]
        return tf.where(positive, tf.nn.relu(d - p["pos_margin"]), tf.nn.relu(p["neg_margin"] - d))
    d_ap, d_an = dist(tuples[:, 0], tuples[:, 1]), dist(tuples[:, 0], tuples[:, 2])
    if kind == "triplet":
        return tf.nn.relu(d_ap**2 - d_an**2 + p["margin"])
    beta = p["beta"] if beta is None else beta
    return tf.nn.relu(d_ap - beta + p["alpha"]) + tf.nn.relu(beta - d_an + p["alpha"])


def _beta_of(model):
    """The margin loss's current (learnt) beta, None for other losses."""
    return None if model.margin_beta is None else float(model.margin_beta.numpy())


def _reference_features(kind, embeddings, labels, tuples, beta=None):
    """The geometry the assessor reads (d_ap, d_an, loss; pairs: d, loss, +-1), standardised over the tuples."""
    e = np.asarray(embeddings, np.float64)
    d = lambda i, j: np.linalg.norm(e[i] - e[j], axis=1)  # noqa: E731
    losses = np.asarray(_reference_tuple_losses(kind, tf.constant(e), labels, beta))
    if kind == "contrastive":
        columns = [
            d(tuples[:, 0], tuples[:, 1]),
            losses,
            np.where(labels[tuples[:, 0]] == labels[tuples[:, 1]], 1.0, -1.0),
        ]
    else:
        columns = [d(tuples[:, 0], tuples[:, 1]), d(tuples[:, 0], tuples[:, 2]), losses]
    features = np.stack(columns, axis=1)
    return (features - features.mean(0)) / (features.std(0) + 1e-6)


def _assessed_weights(model, embeddings, labels, normalise=None):
    """The weights of eqs (10) and (13): A(T; phi) from the current state, divided by their mean over the
    active tuples (loss > 0) when the model normalises (or when `normalise`), then mixed with uniform weights
    by the model's `weight_floor`."""
    tuples = np.array(_reference_tuples(model.loss_kind, labels), dtype=np.int32)
    features = None
    if model.assessor.num_features:
        features = _reference_features(model.loss_kind, embeddings, labels, tuples, _beta_of(model)).astype(
            embeddings.dtype.as_numpy_dtype
        )
    weights = model.assessor(tf.stop_gradient(embeddings), tuples, features)[0]
    if model.normalize_weights if normalise is None else normalise:
        active = np.asarray(_reference_tuple_losses(model.loss_kind, embeddings, labels, _beta_of(model))) > 0
        if model.normalize_over == "all":
            active[:] = True
        weights = weights / tf.reduce_mean(tf.boolean_mask(weights, active))
        weights = model.weight_floor + (1 - model.weight_floor) * weights
    return weights


def _reference_theta_grads(model, train_x, train_y, weights):
    """grad_theta sum_i w_i L_i(theta) with a plain tape (w constant): the paper's sum, eqs (10) and (13)."""
    with tf.GradientTape() as tape:
        losses = _reference_tuple_losses(model.loss_kind, model.embedder(train_x), train_y, _beta_of(model))
        objective = tf.reduce_sum(tf.stop_gradient(weights) * losses)
    return tape.gradient(objective, model.embedder.trainable_variables)


def _reference_meta_loss(model, episode, rates, offsets=None):
    """sum_va L(theta'(phi)) at the assessor's current phi, theta' = theta - offset - rate * grad assigned to
    the embedder and restored (`rates` per variable: scalars, or arrays for a preconditioner)."""
    train_x, train_y, val_x, val_y = episode
    theta = [v.numpy() for v in model.embedder.trainable_variables]
    weights = _assessed_weights(model, model.embedder(train_x), train_y)
    grads = _reference_theta_grads(model, train_x, train_y, weights)
    offsets = offsets or [0.0] * len(theta)
    for variable, value, grad, rate, offset in zip(model.embedder.trainable_variables, theta, grads, rates, offsets):
        variable.assign(value - offset - rate * grad.numpy())
    meta_loss = tf.reduce_sum(
        _reference_tuple_losses(model.loss_kind, model.embedder(val_x), val_y, _beta_of(model))
    ).numpy()
    for variable, value in zip(model.embedder.trainable_variables, theta):
        variable.assign(value)
    return meta_loss


BASE_RATE, HEAD_MULTIPLIER = 1 / 64, 8  # exact in float32 (Keras stores learning rates so)


def _float64_model(kind, state="per_tuple", variant="paper", **kwargs):
    """A float64 ALA model compiled with the new layer ("head") at 8x the base rate; returns the model and
    the per-variable rates the virtual step must use (kernel and bias of each Dense)."""
    model = ALAModel(
        _embedder("float64"), base_loss=kind, assessor_units=3, state=state, dtype="float64", variant=variant, **kwargs
    )
    head = model.embedder.layers[1]
    model.compile(optimizer=learning_rate_multipliers(keras.optimizers.SGD(BASE_RATE), {head.name: HEAD_MULTIPLIER}))
    rng = np.random.default_rng(1)  # a non-zero carried state, so the state path is exercised too
    model.assessor.state_h.assign(rng.normal(size=model.assessor.state_h.shape) * 0.5)
    model.assessor.state_c.assign(rng.normal(size=model.assessor.state_c.shape) * 0.5)
    rates = [BASE_RATE, BASE_RATE, BASE_RATE * HEAD_MULTIPLIER, BASE_RATE * HEAD_MULTIPLIER]
    return model, rates


# ------------------------------------------------------------------------------------ meta-gradient
@pytest.mark.parametrize("state", ["per_tuple", "per_step"])
@pytest.mark.parametrize("kind", ["triplet", "margin", "contrastive"])
def test_paper_meta_gradient_equals_central_finite_differences(kind, state):
    """variant="paper": eqs (10)-(12) with sums and per-variable rates; through the recurrence over tuples
    (per_tuple)."""
    model, rates = _float64_model(kind, state)
    np.testing.assert_allclose([float(r) for r in model.inner_rates()], rates, rtol=1e-12)
    _check_meta_gradient(model, _episode(dtype="float64"), rates)


def _check_meta_gradient(model, episode, rates, offsets=None):
    """`model.meta_gradient` against the reference meta-loss at phi and its central finite differences."""
    phi = model.assessor.trainable_variables
    grads, meta_loss = model.meta_gradient(*episode)
    np.testing.assert_allclose(meta_loss.numpy(), _reference_meta_loss(model, episode, rates, offsets), rtol=1e-10)
    flat_grad = np.concatenate([g.numpy().ravel() for g in grads])
    assert np.abs(flat_grad).max() > 1e-6  # a real, non-vanishing signal

    start = [v.numpy() for v in phi]

    def loss_along(direction, step):
        offset = 0
        for variable, value in zip(phi, start):
            variable.assign(value + step * direction[offset : offset + value.size].reshape(value.shape))
            offset += value.size
        return _reference_meta_loss(model, episode, rates, offsets)

    rng = np.random.default_rng(2)
    eps = 1e-5
    directions = [rng.normal(size=flat_grad.size) for _ in range(3)]
    directions.append(np.eye(flat_grad.size)[int(np.argmax(np.abs(flat_grad)))])  # largest coordinate
    for direction in directions:
        finite_difference = (loss_along(direction, eps) - loss_along(direction, -eps)) / (2 * eps)
        np.testing.assert_allclose(flat_grad @ direction, finite_difference, rtol=1e-6, atol=1e-10)
    for variable, value in zip(phi, start):
        variable.assign(value)


# The compiled optimizers the default look-ahead models (the head at 8x in the multi-optimizer cases).
OPTIMIZERS = {
    "sgd_momentum": lambda: keras.optimizers.SGD(BASE_RATE, momentum=0.9),
    "sgd_nesterov": lambda: keras.optimizers.SGD(BASE_RATE, momentum=0.5, nesterov=True),
    "adam": lambda: keras.optimizers.Adam(BASE_RATE),
    "adam_amsgrad": lambda: keras.optimizers.Adam(BASE_RATE, amsgrad=True),
    "adamw_head_8x": lambda: keras.optimizers.AdamW(BASE_RATE, weight_decay=0.25),
}


def _default_model(kind, optimizer_name, **kwargs):
    """A float64 model at the library defaults (normalised weights, geometry input) unless `kwargs` say
    otherwise, whose optimizer has state: two real steps taken on other episodes."""
    model = ALAModel(_embedder("float64"), base_loss=kind, assessor_units=3, dtype="float64", **kwargs)
    optimizer = OPTIMIZERS[optimizer_name]()
    if optimizer_name.endswith("head_8x"):
        optimizer = learning_rate_multipliers(optimizer, {model.embedder.layers[1].name: HEAD_MULTIPLIER})
    model.compile(optimizer=optimizer)
    for seed in (10, 11):
        model.train_step(_episode(dtype="float64", seed=seed))
    return model


def _inner(optimizer, variable):
    return optimizer._optimizer_map(variable) if isinstance(optimizer, keras.optimizers.MultiOptimizer) else optimizer


def _reference_lookahead(model, uniform_grads):
    """`(P, o)` per variable written from the optimizers' update rules and their state (NumPy), with the
    hyperparameters rounded as Keras' update steps use them: `ops.cast` of a Python float goes through float32
    (momentum, weight decay, the betas' powers), while `1 - beta` and epsilon enter as Python floats."""
    f32 = lambda value: float(np.float32(value))  # noqa: E731
    preconditioners, offsets = [], []
    for variable, g in zip(model.embedder.trainable_variables, uniform_grads):
        opt = _inner(model.optimizer, variable)
        lr, theta, g = float(np.asarray(opt.learning_rate)), variable.numpy(), np.asarray(g)
        slot = opt._get_variable_index(variable)
        if isinstance(opt, keras.optimizers.Adam):
            t = int(opt.iterations.numpy()) + 1
            alpha = lr * np.sqrt(1 - f32(opt.beta_2) ** t) / (1 - f32(opt.beta_1) ** t)
            m, v = opt._momentums[slot].numpy(), opt._velocities[slot].numpy()
            m_t = m + (g - m) * (1 - opt.beta_1)  # Adam's new first moment with the uniform gradient ...
            v_t = v + (g**2 - v) * (1 - opt.beta_2)
            if opt.amsgrad:
                v_t = np.maximum(opt._velocity_hats[slot].numpy(), v_t)
            denominator = np.sqrt(v_t) + opt.epsilon
            p = alpha * (1 - opt.beta_1) / denominator  # ... is linear in g: o + p g = alpha m_t / denominator
            o = alpha * m_t / denominator - p * g
        else:
            mu, velocity = f32(opt.momentum), opt.momentums[slot].numpy()
            p, o = (lr * (1 + mu), -mu * mu * velocity) if opt.nesterov else (lr, -mu * velocity)
        if opt.weight_decay:
            o = o + lr * f32(opt.weight_decay) * theta
        preconditioners.append(p)
        offsets.append(o)
    return preconditioners, offsets


@pytest.mark.parametrize(
    "kind,optimizer_name,lookahead,assessor_input,weight_floor",
    [
        *[("triplet", name, "optimizer", "geometry", 0.0) for name in OPTIMIZERS],
        ("margin", "adam", "optimizer", "embeddings+geometry", 0.3),
        ("contrastive", "adamw_head_8x", "optimizer", "embeddings+geometry", 0.0),
        ("triplet", "adamw_head_8x", None, None, None),  # the library defaults
        ("margin", "sgd_momentum", None, None, None),
        ("triplet", "adam", "sgd", "geometry", "active"),  # the mean over the active tuples, default floor
    ],
)
def test_normalised_meta_gradient_equals_central_finite_differences(
    kind, optimizer_name, lookahead, assessor_input, weight_floor
):
    """Weights divided by their mean, the assessor reading the tuples' geometry (and embeddings), the
    virtual step modelled on the compiled optimizer with its state held constant, or (the default) SGD at
    its rates: the meta-gradient through all of it equals finite differences of the reference (written from
    the update rules)."""
    over = "active" if weight_floor == "active" else None if weight_floor is None else "all"
    weight_floor = None if weight_floor == "active" else weight_floor
    model = _default_model(
        kind,
        optimizer_name,
        lookahead=lookahead,
        assessor_input=assessor_input,
        weight_floor=weight_floor,
        normalize_over=over,
    )
    assert model.normalize_weights and model.assessor.num_features == 3
    assert model.normalize_over == (over or "all")
    assert model.weight_floor == (0.8 if weight_floor is None else weight_floor)
    rng = np.random.default_rng(1)  # a non-zero carried state, so the state path is exercised too
    model.assessor.state_h.assign(rng.normal(size=model.assessor.state_h.shape) * 0.5)
    episode = _episode(dtype="float64")
    train_x, train_y = episode[:2]
    if model.lookahead == "optimizer":
        uniform = _reference_theta_grads(model, train_x, train_y, np.ones(len(_reference_tuples(kind, train_y))))
        preconditioners, offsets = _reference_lookahead(model, uniform)
        assert max(np.abs(o).max() for o in offsets) > 1e-6  # the optimizer's state does enter
    else:
        preconditioners = [
            float(np.asarray(_inner(model.optimizer, v).learning_rate)) for v in model.embedder.trainable_variables
        ]
        assert len(set(preconditioners)) == (2 if optimizer_name.endswith("head_8x") else 1)  # the head's 8x rate
        offsets = None
    _check_meta_gradient(model, episode, preconditioners, offsets)


@pytest.mark.parametrize("optimizer_name", list(OPTIMIZERS))
def test_optimizer_lookahead_at_uniform_weights_is_the_real_step(optimizer_name):
    """With every weight 1 the virtual step (10) is exactly the step Keras' optimizer then takes (13)."""
    model = _default_model("triplet", optimizer_name, lookahead="optimizer")
    train_x, train_y = _episode(dtype="float64", seed=3)[:2]
    grads = _reference_theta_grads(model, train_x, train_y, np.ones(len(_reference_tuples("triplet", train_y))))
    theta = [tf.identity(v.value) for v in model.embedder.trainable_variables]
    preconditioners, offsets = model.lookahead_terms(theta, lambda: grads)
    virtual = [(t - o - p * g).numpy() for t, p, o, g in zip(theta, preconditioners, offsets, grads)]
    model.optimizer.apply_gradients(zip(grads, model.embedder.trainable_variables))
    for variable, value, start in zip(model.embedder.trainable_variables, virtual, theta):
        np.testing.assert_allclose(variable.numpy(), value, rtol=1e-12, atol=1e-15)
        assert np.abs(variable.numpy() - start.numpy()).max() > 1e-6


def _scale_assessor_outputs(model, scale):
    """The assessor's outputs multiplied by `scale` (the same LSTM, a common scale of every weight)."""
    original = model.assessor.call

    def scaled(*args, **kwargs):
        weights, state = original(*args, **kwargs)
        return scale * weights, state

    model.assessor.call = scaled


@pytest.mark.parametrize("variant", ["default", "paper"])
def test_training_step_is_invariant_to_a_common_scale_of_the_weights_only_when_normalised(variant):
    """Normalised weights: a common scale of the assessor's outputs changes neither the metric's step (13)
    nor the assessor's (eqs 10-12); the paper's raw weights change both (plain SGD: the step scales)."""
    results = []
    for scale in (1.0, 0.25):
        model = ALAModel(
            _embedder("float64"),
            base_loss="triplet",
            assessor_units=3,
            dtype="float64",
            variant=variant,
            assessor_steps=2,
            assessor_learning_rate=0.5,
        )
        model.compile(optimizer=keras.optimizers.SGD(0.05))
        _scale_assessor_outputs(model, scale)
        model.train_step(_episode(dtype="float64", seed=8))
        results.append([v.numpy() for v in model.embedder.trainable_variables + model.assessor.trainable_variables])
    differences = [np.abs(a - b).max() for a, b in zip(*results)]
    if variant == "default":
        assert max(differences) < 1e-12
    else:
        assert max(differences) > 1e-4


@pytest.mark.parametrize("over", ["active", "all"])
def test_weights_of_inactive_tuples_cannot_change_the_step_when_normalised_over_active_ones(over):
    """Tuples whose hinge is inactive (L_i = 0) do not move theta; normalised over the active tuples, what the
    assessor gives them changes neither the metric's step nor the assessor's. Normalised over all tuples,
    weight moved onto them shrinks the step (the step-size loophole `normalize_over="active"` closes)."""
    results = []
    for scale in (1.0, 5.0):
        model = ALAModel(
            _embedder("float64"),
            base_loss="triplet",
            assessor_units=3,
            dtype="float64",
            assessor_steps=2,
            normalize_over=over,
        )
        model.compile(optimizer=keras.optimizers.SGD(0.05))
        original = model._assess

        def assess(embeddings, tuples, targets, losses, original=original, scale=scale):
            weights, state = original(embeddings, tuples, targets, losses)
            return tf.where(losses > 0, weights, scale * weights), state

        model._assess = assess
        logs = model.train_step(_episode(dtype="float64", seed=8))
        results.append([v.numpy() for v in model.embedder.trainable_variables + model.assessor.trainable_variables])
    assert 0 < float(logs["loss"])
    differences = [np.abs(a - b).max() for a, b in zip(*results)]
    if over == "active":
        assert max(differences) < 1e-12
    else:
        assert max(differences) > 1e-6


def test_train_step_is_algorithm_1_with_the_updated_assessor():
    """One step = K=2 SGD steps of phi on the exact meta-gradient, then theta updated with A(phi*) (eq 13)
    and the margin's beta by its own SGD(0.1, momentum 0.9) on the weighted margin loss / weighted active
    terms."""
    b = 0.5
    model, rates = _float64_model("margin", assessor_learning_rate=b, assessor_steps=2)
    episode = _episode(dtype="float64", seed=4)
    train_x, train_y = episode[0], episode[1]
    theta0 = [v.numpy() for v in model.embedder.trainable_variables]
    phi0 = [v.numpy() for v in model.assessor.trainable_variables]
    state0 = model.assessor.state_h.numpy()

    phi_star = phi0
    for _ in range(2):
        grads, _ = model.meta_gradient(*episode)
        phi_star = [p - b * g.numpy() for p, g in zip(phi_star, grads)]
        for variable, value in zip(model.assessor.trainable_variables, phi_star):
            variable.assign(value)
    weights = _assessed_weights(model, model.embedder(train_x), train_y)
    expected_theta = [
        t - rate * g.numpy()
        for t, rate, g in zip(theta0, rates, _reference_theta_grads(model, train_x, train_y, weights))
    ]
    beta = tf.Variable(1.2, dtype=tf.float64)
    with tf.GradientTape() as tape:
        embeddings = model.embedder(train_x)
        losses = _reference_tuple_losses("margin", embeddings, train_y, beta)
        tuples = np.array(_reference_tuples("margin", train_y))
        d = lambda i, j: tf.norm(tf.gather(embeddings, i) - tf.gather(embeddings, j), axis=1)  # noqa: E731
        active = (d(tuples[:, 0], tuples[:, 1]).numpy() - 1.2 + 0.2 > 0).astype(float) + (
            1.2 - d(tuples[:, 0], tuples[:, 2]).numpy() + 0.2 > 0
        )
        normalised = tf.reduce_sum(tf.stop_gradient(weights) * losses) / np.sum(weights.numpy() * active)
    expected_beta = 1.2 - float(np.float32(0.1)) * tape.gradient(normalised, beta).numpy()
    assert max(np.abs(p - q).max() for p, q in zip(phi_star, phi0)) > 1e-4  # the assessor did move
    for variable, value in zip(model.assessor.trainable_variables, phi0):
        variable.assign(value)

    logs = tf.function(model.train_step)(tuple(tf.constant(t) for t in episode))  # graph-mode ordering
    for variable, value in zip(model.assessor.trainable_variables, phi_star):
        np.testing.assert_allclose(variable.numpy(), value, rtol=1e-9, atol=1e-12)
    for variable, value in zip(model.embedder.trainable_variables, expected_theta):
        np.testing.assert_allclose(variable.numpy(), value, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(model.margin_beta.numpy(), expected_beta, rtol=1e-9)
    assert abs(expected_beta - 1.2) > 1e-4
    # Logged through float32 Keras metrics.
    np.testing.assert_allclose(logs["weight_mean"].numpy(), np.mean(weights), rtol=1e-6)
    np.testing.assert_allclose(logs["weight_variance"].numpy(), np.var(weights), rtol=1e-5)
    ratio = (d(tuples[:, 0], tuples[:, 1]) / d(tuples[:, 0], tuples[:, 2])).numpy()
    np.testing.assert_allclose(logs["hardness"].numpy(), ratio.mean(), rtol=1e-6)
    np.testing.assert_allclose(logs["weighted_hardness"].numpy(), np.mean(weights * ratio), rtol=1e-6)
    assert not np.allclose(model.assessor.state_h.numpy(), state0)


@pytest.mark.parametrize("variant", ["paper", "default"])
@pytest.mark.parametrize("steps", [0, 3])
@pytest.mark.parametrize("kind", ["triplet", "contrastive"])
def test_constant_assessor_equals_plain_training_with_scaled_loss(kind, steps, variant):
    """Every weight c: the paper's step is plain training on c * the sum; the default's (weights divided by
    their mean) is plain training on the sum itself, whatever c."""
    c, lr = 0.3, 0.25
    model = ALAModel(
        _embedder("float64"),
        base_loss=kind,
        assessor_units=3,
        inner_learning_rate=0.5,
        assessor_learning_rate=0.0,
        assessor_steps=steps,
        dtype="float64",
        variant=variant,
    )
    model.assessor.output_kernel.assign(np.zeros(model.assessor.output_kernel.shape))
    model.assessor.output_bias.assign([np.log(c / (1 - c))])  # sigmoid(bias) = c for every tuple
    model.compile(optimizer=keras.optimizers.SGD(lr))
    train_x, train_y, val_x, val_y = _episode(dtype="float64", seed=5)
    with tf.GradientTape() as tape:
        losses = _reference_tuple_losses(kind, model.embedder(train_x), train_y)
        plain = (c if variant == "paper" else 1.0) * tf.reduce_sum(losses)  # the paper's sum over tuples
    expected = [
        v.numpy() - lr * g.numpy()
        for v, g in zip(model.embedder.trainable_variables, tape.gradient(plain, model.embedder.trainable_variables))
    ]
    logs = model.train_step((train_x, train_y, val_x, val_y))
    for variable, value in zip(model.embedder.trainable_variables, expected):
        np.testing.assert_allclose(variable.numpy(), value, rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(logs["loss"].numpy(), plain.numpy() / len(losses), rtol=1e-6)  # per tuple
    np.testing.assert_allclose(logs["weight_mean"].numpy(), c, rtol=1e-6)
    assert logs["weight_variance"].numpy() < 1e-12


def test_uniform_weighting_is_the_base_loss_on_the_same_tuples():
    lr = 0.125
    model = ALAModel(_embedder("float64"), base_loss="triplet", weighting="uniform", dtype="float64")
    model.compile(optimizer=keras.optimizers.SGD(lr))
    train_x, train_y, val_x, val_y = _episode(dtype="float64", seed=6)
    phi0 = [v.numpy() for v in model.assessor.trainable_variables]
    with tf.GradientTape() as tape:
        plain = tf.reduce_sum(_reference_tuple_losses("triplet", model.embedder(train_x), train_y))
    expected = [
        v.numpy() - lr * g.numpy()
        for v, g in zip(model.embedder.trainable_variables, tape.gradient(plain, model.embedder.trainable_variables))
    ]
    logs = model.train_step((train_x, train_y, val_x, val_y))
    for variable, value in zip(model.embedder.trainable_variables, expected):
        np.testing.assert_allclose(variable.numpy(), value, rtol=1e-10, atol=1e-13)
    assert "meta_loss" not in logs and logs["weight_mean"].numpy() == 1.0
    for variable, value in zip(model.assessor.trainable_variables, phi0):
        np.testing.assert_array_equal(variable.numpy(), value)


# ------------------------------------------------------------------------------ tuple_weights, meta_interval
@pytest.mark.parametrize("kind,variant", [("triplet", "default"), ("contrastive", "default"), ("margin", "paper")])
def test_tuple_weights_are_the_weights_of_a_step_on_that_subset(kind, variant):
    model = ALAModel(_embedder("float64"), base_loss=kind, assessor_units=3, dtype="float64", variant=variant)
    model.compile(optimizer=keras.optimizers.Adam(0.01))
    model.train_step(_episode(dtype="float64", seed=1))
    state = model.assessor.state_h.numpy()
    x, y = _episode(dtype="float64", seed=2)[:2]
    tuples, weights = model.tuple_weights(x, y)
    assert tuples.dtype == tf.int32 and tuples.shape[1] == (2 if kind == "contrastive" else 3)
    assert [tuple(t) for t in tuples.numpy()] == _reference_tuples(kind, y)
    np.testing.assert_allclose(weights.numpy(), _assessed_weights(model, model.embedder(x), y).numpy(), rtol=1e-10)
    if variant == "default":
        np.testing.assert_allclose(weights.numpy().mean(), 1.0, rtol=1e-12)
        assert weights.numpy().min() >= model.weight_floor == 0.8  # every tuple keeps 80 % of a uniform weight
    else:
        assert 0 < weights.numpy().min() and weights.numpy().max() < 1
    np.testing.assert_array_equal(model.assessor.state_h.numpy(), state)  # only read
    with pytest.raises(TypeError, match="labels must be integer"):
        model.tuple_weights(x, y.astype("float32"))


def test_meta_interval_updates_the_assessor_every_nth_step_and_trains_the_embedder_every_step():
    model = ALAModel(_embedder(), base_loss="triplet", assessor_units=3, assessor_steps=1, meta_interval=2)
    model.compile(optimizer=keras.optimizers.Adam(0.01))
    step = tf.function(model.train_step)
    moved = []
    for seed in range(4):
        phi = [v.numpy() for v in model.assessor.trainable_variables]
        theta = [v.numpy() for v in model.embedder.trainable_variables]
        logs = step(_episode(seed=seed))
        moved.append(
            (
                max(np.abs(v.numpy() - p).max() for v, p in zip(model.assessor.trainable_variables, phi)),
                max(np.abs(v.numpy() - t).max() for v, t in zip(model.embedder.trainable_variables, theta)),
            )
        )
        assert np.isfinite(logs["meta_loss"].numpy()) and logs["meta_loss"].numpy() > 0
    assert [m[0] > 0 for m in moved] == [True, False, True, False]
    assert all(m[1] > 0 for m in moved)
    assert model.get_config()["meta_interval"] == 2


def test_variant_switches_their_defaults_and_config_round_trip():
    default = ALAModel(_embedder(), assessor_units=2)
    paper = ALAModel(_embedder(), assessor_units=2, variant="paper")
    assert (
        default.normalize_weights,
        default.weight_floor,
        default.normalize_over,
        default.lookahead,
        default.assessor_input,
    ) == (True, 0.8, "all", "sgd", "geometry")
    assert paper.weight_floor == 0.0
    assert (paper.normalize_weights, paper.lookahead, paper.assessor_input) == (False, "sgd", "embeddings")
    assert isinstance(paper.assessor_optimizer, keras.optimizers.SGD) and paper.assessor_learning_rate == 4e-4
    assert paper.assessor.num_features == 0 and default.assessor.num_features == 3
    mixed = ALAModel(
        _embedder(), assessor_units=2, variant="paper", normalize_weights=True, assessor_input="embeddings+geometry"
    )
    config = mixed.get_config()
    again = ALAModel.from_config(config)
    assert again.get_config() == config and again.normalize_weights and again.assessor_input == "embeddings+geometry"
    old = {
        k: v
        for k, v in config.items()
        if k not in ("variant", "normalize_weights", "lookahead", "assessor_input", "meta_interval")
    }
    assert ALAModel.from_config(old).variant == "paper"  # saved before the variants: Algorithm 1 literally


# ---------------------------------------------------------------------------------------- LSTM state
def test_lstm_state_carries_across_steps_survives_save_load_and_resets(tmp_path):
    model = ALAModel(_embedder(), base_loss="triplet", assessor_units=4, inner_learning_rate=0.3)
    model.compile(optimizer=keras.optimizers.SGD(0.1))
    assert not np.any(model.assessor.state_h.numpy())
    states = []
    for seed in (0, 1):
        model.train_step(_episode(seed=seed))
        states.append((model.assessor.state_h.numpy(), model.assessor.state_c.numpy()))
    assert np.abs(states[0][0]).max() > 1e-4
    assert np.abs(states[1][0] - states[0][0]).max() > 1e-6
    assert np.abs(states[1][1] - states[0][1]).max() > 1e-6

    # The state shapes the weights: same tuples, same phi, different state -> different weights.
    train_x, train_y = _episode(seed=2)[:2]
    embeddings = model.embedder(train_x)
    carried = _assessed_weights(model, embeddings, train_y).numpy()

    path = str(tmp_path / "ala.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded, ALAModel) and loaded.loss_kind == "triplet" and loaded.assessor.units == 4
    assert loaded.get_config()["inner_learning_rate"] == 0.3
    assessor_config = model.assessor.get_config()
    assert type(model.assessor).from_config(assessor_config).get_config() == assessor_config
    np.testing.assert_array_equal(loaded.assessor.state_h.numpy(), states[1][0])
    np.testing.assert_array_equal(loaded.assessor.state_c.numpy(), states[1][1])
    for a, b in zip(model.weights, loaded.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    np.testing.assert_allclose(loaded.predict(train_x, verbose=0), embeddings.numpy(), atol=1e-6)
    np.testing.assert_allclose(_assessed_weights(loaded, embeddings, train_y).numpy(), carried, atol=1e-6)

    resumed = keras.saving.load_model(path)  # compiled, training resumes
    assert int(resumed.optimizer.iterations.numpy()) == 2
    resumed.train_step(_episode(seed=3))
    assert np.abs(resumed.assessor.state_h.numpy() - states[1][0]).max() > 1e-6

    loaded.reset_assessor_state()
    assert not np.any(loaded.assessor.state_h.numpy()) and not np.any(loaded.assessor.state_c.numpy())
    reset = _assessed_weights(loaded, embeddings, train_y).numpy()
    assert np.abs(reset - carried).max() > 1e-6
    np.testing.assert_array_equal(model.assessor.state_h.numpy(), states[1][0])  # the original is untouched


# ------------------------------------------------------------------------- base losses, fit, Mirrored
def _dataset(episodes):
    return tf.data.Dataset.from_tensor_slices(tuple(np.stack(parts) for parts in zip(*episodes)))


@pytest.mark.parametrize(
    "base_loss", ["triplet", "margin", "contrastive", ContrastiveLoss(pos_margin=0.1, neg_margin=0.9)]
)
def test_fit_trains_with_each_base_loss(base_loss):
    model = ALAModel(_embedder(), base_loss=base_loss, assessor_units=4, assessor_steps=1, max_tuples=40)
    model.compile(optimizer=keras.optimizers.SGD(0.2))
    theta0 = [v.numpy() for v in model.embedder.trainable_variables]
    phi0 = [v.numpy() for v in model.assessor.trainable_variables]
    history = model.fit(_dataset([_episode(seed=s) for s in range(3)]), epochs=1, verbose=0).history
    expected_logs = {"loss", "meta_loss", "weight_mean", "weight_variance"}
    if model.loss_kind != "contrastive":
        expected_logs |= {"hardness", "weighted_hardness", "hardness_ratio"}
    assert set(history) == expected_logs
    assert all(np.isfinite(v[-1]) for v in history.values())
    assert 0 < history["weight_mean"][-1] < 1 and history["weight_variance"][-1] >= 0
    assert any(np.abs(v.numpy() - t).max() > 0 for v, t in zip(model.embedder.trainable_variables, theta0))
    assert any(np.abs(v.numpy() - p).max() > 0 for v, p in zip(model.assessor.trainable_variables, phi0))
    if base_loss == "triplet":  # evaluate: the validation subsets' mean tuple loss
        episodes = [_episode(seed=s) for s in range(2)]
        logs = model.evaluate(_dataset(episodes), verbose=0, return_dict=True)
        expected = np.mean(
            [tf.reduce_mean(_reference_tuple_losses("triplet", model.embedder(e[2]), e[3])) for e in episodes]
        )
        np.testing.assert_allclose(logs["meta_loss"], expected, rtol=1e-5)
    if not isinstance(base_loss, str):
        assert model.loss_params == {"pos_margin": 0.1, "neg_margin": pytest.approx(0.9)}
    assert model.predict(_episode()[0], verbose=0).shape == (9, 3)


def test_mirrored_strategy_update_equals_single_device_update():
    devices = [d.name for d in tf.config.list_logical_devices("CPU")][:2]
    assert len(devices) == 2
    episode = _episode(seed=7, train_classes=2, val_classes=2, per_class=4)  # halves split the classes

    def make():
        # The paper's SGD assessor: Adam's normalised step would blow float32 summation-order noise in
        # near-zero gradient entries up to full steps.
        model = ALAModel(
            _embedder(seed=3),
            base_loss="margin",
            assessor_units=4,
            assessor_steps=1,
            inner_learning_rate=0.5,
            assessor_learning_rate=0.5,
            seed=1,
            variant="paper",
        )
        model.compile(optimizer=keras.optimizers.SGD(0.5))
        return model

    single = make()
    single_logs = single.fit(tf.data.Dataset.from_tensors(episode), verbose=0).history
    with tf.distribute.MirroredStrategy(devices).scope():
        mirrored = make()
    mirrored_logs = mirrored.fit(tf.data.Dataset.from_tensors(episode), verbose=0).history
    start = make()
    moved = 0.0
    for a, b, c in zip(single.weights, mirrored.weights, start.weights):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-6, err_msg=a.path)
        moved = max(moved, np.abs(np.asarray(a) - np.asarray(c)).max())
    assert moved > 1e-3
    for key in single_logs:
        np.testing.assert_allclose(mirrored_logs[key], single_logs[key], rtol=1e-5, atol=1e-7)


# ------------------------------------------------------------------------------ degenerate input, errors
def test_episode_without_tuples_gives_finite_zero_loss_and_keeps_the_state():
    model = ALAModel(_embedder(), base_loss="triplet", assessor_units=4, inner_learning_rate=0.3)
    model.compile(optimizer=keras.optimizers.SGD(0.1))
    x = np.random.default_rng(0).normal(size=(4, 5)).astype("float32")
    theta0 = [v.numpy() for v in model.embedder.trainable_variables]
    logs = model.train_step((x, np.arange(4, dtype="int32"), x, np.full(4, 9, dtype="int32")))
    assert all(np.isfinite(v.numpy()) and v.numpy() == 0 for v in logs.values())
    assert not np.any(model.assessor.state_h.numpy())
    for variable, value in zip(model.embedder.trainable_variables, theta0):
        np.testing.assert_array_equal(variable.numpy(), value)


def test_bad_arguments_and_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match="base_loss must be one of"):
        ALAModel(_embedder(), base_loss="hinge")
    with pytest.raises(ValueError, match="Unknown parameters"):
        ALAModel(_embedder(), base_loss="triplet", loss_params={"beta": 1.0})
    with pytest.raises(ValueError, match="assessor_steps"):
        ALAModel(_embedder(), assessor_steps=-1)
    with pytest.raises(ValueError, match="embedding size"):
        ALAModel(keras.Sequential([keras.layers.Dense(3)]))
    model = ALAModel(_embedder(), inner_learning_rate=0.1, assessor_units=2)
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
        ({"lookahead": "adam"}, "lookahead"),
        ({"assessor_input": "pixels"}, "assessor_input"),
        ({"meta_interval": 0}, "meta_interval"),
        ({"inner_learning_rate": 0.1, "lookahead": "optimizer"}, "cannot be combined"),
        ({"weight_floor": 1.0}, "weight_floor must be in"),
        ({"normalize_over": "some"}, "normalize_over must be one of"),
        ({"variant": "paper", "weight_floor": 0.5}, "needs normalize_weights"),
    ):
        with pytest.raises(ValueError, match=message):
            ALAModel(_embedder(), **bad)


def test_tfdml_loss_instances_give_their_margins():
    from tfdml.losses.margin import MarginLoss
    from tfdml.losses.triplet import TripletLoss
    from tfdml.models.ala import resolve_base_loss

    assert resolve_base_loss(TripletLoss(margin=0.3)) == ("triplet", {"margin": pytest.approx(0.3)})
    assert resolve_base_loss(MarginLoss(alpha=0.1, beta=1.0)) == (
        "margin",
        {"alpha": pytest.approx(0.1), "beta": pytest.approx(1.0)},
    )
    assert resolve_base_loss("contrastive", {"neg_margin": 0.5}) == (
        "contrastive",
        {"pos_margin": 0.0, "neg_margin": 0.5},
    )
    with pytest.raises(ValueError, match="soft=True"):
        resolve_base_loss(TripletLoss(soft=True))
    with pytest.raises(ValueError, match="one beta per class"):
        resolve_base_loss(MarginLoss(num_classes=4))
    with pytest.raises(ValueError, match="no per-tuple form"):
        resolve_base_loss(keras.losses.MeanSquaredError())
