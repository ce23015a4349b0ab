"""DML-ALA: deep metric learning via adaptive learnable assessment (Zheng et al., CVPR 2020, §3).

Each training step takes one episode `(train_images, train_labels, val_images, val_labels)` whose two
subsets have disjoint labels, forms the tuples inside each subset (triplets for the triplet and margin
losses, pairs for contrastive) and runs Algorithm 1:

    theta'(phi) = theta - a * grad_theta sum_{T in tr} A(T; phi) L(T; theta)           (10)
    K times:  phi <- phi - b * grad_phi sum_{T' in va} L(T'; theta'(phi))               (11, 12)
    theta <- optimizer step on sum_{T in tr} A(T; phi*) L(T; theta)                     (13)

Sums over tuples are means here (`sum / number of tuples`, the same up to a rescaled learning rate), so
learning rates do not depend on the episode size. `A` gets the tuple embeddings with gradients stopped:
eq (10) differentiates `L` only, not the assessor's input.

The meta-gradient is exact, without a Hessian. Writing `E = f_theta(X_tr)` (`[B, D]`), `J = dE/dtheta`,
`w_i = A(T_i; phi)` and `g = grad_theta L_va(theta')`:

    theta' = theta - a * J^T G(phi),   G(phi) = dE-gradient of mean_i w_i L_i(E)
    dL_va/dphi = -a * mean_i (dw_i/dphi) * c_i,   c_i = <grad_theta L_i, g> = <dL_i/dE, J g>

so each assessor step costs one vector-Jacobian product (theta'), a forward and backward pass on the
validation subset at theta' (`stateless_call` at substituted weights) and one Jacobian-vector product
`J g` (`tf.autodiff.ForwardAccumulator`); then `phi` takes a gradient step on `-a mean_i w_i(phi) c_i`
(constants `c_i`), which has exactly the gradient above. `tests/test_ala.py` checks it against central finite
differences in float64.

Distribution: under `MirroredStrategy` each replica receives a share of the episode; ALA first gathers the
whole episode on every replica (tuples span the whole subset), every replica computes the same update on
it and the gradients are divided by the number of replicas before the optimizers sum them. The update
therefore equals the single-device update on the same episode (the compute is duplicated, the episode is
small).
"""

import keras
import tensorflow as tf

from tfdml.distribute import gather_replicas, num_replicas
from tfdml.models.assessor import TupleAssessor
from tfdml.ops import safe_divide, validate_labels
from tfdml.ops.tuples import (
    contrastive_tuple_losses,
    margin_tuple_losses,
    pair_indices_with_targets,
    triplet_indices,
    triplet_tuple_losses,
)

_BASE_LOSSES = {
    "triplet": {"margin": 0.2},
    "margin": {"alpha": 0.2, "beta": 1.2},
    "contrastive": {"pos_margin": 0.0, "neg_margin": 1.0},
}


def resolve_base_loss(base_loss, loss_params=None):
    """`(kind, params)` for a base-loss name or a tfdml loss instance (Triplet/Margin/ContrastiveLoss)."""
    if isinstance(base_loss, str):
        kind = base_loss.lower()
        if kind not in _BASE_LOSSES:
            raise ValueError(f"base_loss must be one of {sorted(_BASE_LOSSES)} or a tfdml TripletLoss, "
                             f"MarginLoss or ContrastiveLoss instance, got {base_loss!r}.")
        params = dict(_BASE_LOSSES[kind])
        unknown = set(loss_params or {}) - set(params)
        if unknown:
            raise ValueError(f"Unknown parameters {sorted(unknown)} for base_loss {kind!r}; "
                             f"expected some of {sorted(params)}.")
        params.update({key: float(value) for key, value in (loss_params or {}).items()})
        return kind, params
    class_name = type(base_loss).__name__.lower()
    config = base_loss.get_config() if hasattr(base_loss, "get_config") else {}
    for kind in ("contrastive", "margin", "triplet"):
        if class_name.startswith(kind):
            if config.get("squared") or config.get("soft"):
                raise ValueError(f"ALA weights hinge losses on plain distances; {type(base_loss).__name__} "
                                 f"with squared/soft options is not supported.")
            params = {key: float(_scalar(config.get(key, getattr(base_loss, key, default))))
                      for key, default in _BASE_LOSSES[kind].items()}
            return kind, params
    raise ValueError(f"base_loss {type(base_loss).__name__} has no per-tuple form; use 'triplet', 'margin', "
                     f"'contrastive' or one of the corresponding tfdml losses.")


def _scalar(value):
    if isinstance(value, (tf.Variable, keras.Variable, tf.Tensor)):
        return float(tf.reduce_mean(tf.convert_to_tensor(value)))
    return value


@keras.saving.register_keras_serializable(package="tfdml")
class ALAModel(keras.Model):
    """Metric model trained with DML-ALA (module docstring: formulas, exactness, distribution).

    Args:
        embedder: Keras model mapping images to (L2-normalised) embeddings `[B, D]`. `predict` and calls
            return its embeddings.
        base_loss: "triplet" (`[d_ap - d_an + margin]+`), "margin" (`[d_ap - beta + alpha]+ +
            [beta - d_an + alpha]+`), "contrastive" (pairs) or a tfdml TripletLoss / MarginLoss /
            ContrastiveLoss whose margins are used (its `mining` is replaced by the assessor, which weights
            every tuple; a MarginLoss's learnable `beta` is read as its initial constant).
        loss_params: overrides of the base loss's margins for a string `base_loss`.
        assessor_units, assessor_layers: LSTM assessor size (paper: 64 units, 2 layers).
        inner_learning_rate: `a` of the look-ahead step (10); None uses the compiled optimizer's current
            learning rate (the paper uses the metric's learning rate).
        assessor_learning_rate: `b` of eq (12) (paper: 4e-4), used by the default SGD assessor optimizer.
        assessor_steps: `K`, assessor updates per episode (paper: 3); 0 only weights the tuples.
        max_tuples: cap on tuples per subset (random subset, seeded by `seed` and the step); None: all.
            The assessor runs on every tuple: a 20 x 5 training subset has 38,000 triplets, which
            dominates the step time of small embedders on CPU (`scripts/bench_ala.py`); a cap of a few
            thousand keeps it in proportion.
        embedding_dim: embedding size, when `embedder.output_shape` is not known yet.
        seed: seed of the tuple subsets.

    Metrics per step: `loss` (weighted training loss at `phi*`), `meta_loss` (validation loss at
    `theta'` in the last assessor step), `weight_mean`, `weight_variance` (assessed weights at `phi*`).

    Example:
        >>> model = ALAModel(embedder, base_loss="margin")
        >>> model.compile(optimizer=keras.optimizers.SGD(1e-3))
        >>> model.fit(tfdml.data.episode_dataset(...), epochs=10)
        >>> embeddings = model.predict(images)
    """

    def __init__(self, embedder, base_loss="triplet", loss_params=None, assessor_units=64, assessor_layers=2,
                 inner_learning_rate=None, assessor_learning_rate=4e-4, assessor_steps=3, max_tuples=None,
                 embedding_dim=None, seed=0, **kwargs):
        super().__init__(**kwargs)
        if not isinstance(embedder, keras.Model) and not isinstance(embedder, keras.layers.Layer):
            raise TypeError(f"embedder must be a Keras model or layer, got {type(embedder).__name__}.")
        self.embedder = embedder
        self.base_loss = base_loss
        self.loss_kind, self.loss_params = resolve_base_loss(base_loss, loss_params)
        self.assessor_steps = int(assessor_steps)
        if self.assessor_steps < 0:
            raise ValueError(f"assessor_steps must be >= 0, got {assessor_steps}.")
        if inner_learning_rate is not None and float(inner_learning_rate) < 0:
            raise ValueError(f"inner_learning_rate must be >= 0, got {inner_learning_rate}.")
        self.inner_learning_rate = None if inner_learning_rate is None else float(inner_learning_rate)
        self.assessor_learning_rate = float(assessor_learning_rate)
        self.max_tuples = None if max_tuples is None else int(max_tuples)
        self.seed = int(seed)
        if embedding_dim is None:
            try:
                embedding_dim = embedder.output_shape[-1]
            except (AttributeError, ValueError):
                embedding_dim = None
        if embedding_dim is None:
            raise ValueError("The embedding size of the embedder is unknown: build the embedder (give it an "
                             "Input) or pass embedding_dim=...")
        self.embedding_dim = int(embedding_dim)
        self.assessor = TupleAssessor(tuple_size=2 if self.loss_kind == "contrastive" else 3,
                                      units=assessor_units, num_layers=assessor_layers, dtype=self.dtype_policy,
                                      name="assessor")
        self.assessor.build((None, self.embedding_dim))
        self.assessor_optimizer = keras.optimizers.SGD(self.assessor_learning_rate, name="assessor_sgd")
        self.loss_tracker = keras.metrics.Mean(name="loss")
        self.meta_loss_tracker = keras.metrics.Mean(name="meta_loss")
        self.weight_mean_tracker = keras.metrics.Mean(name="weight_mean")
        self.weight_variance_tracker = keras.metrics.Mean(name="weight_variance")
        # Every weight exists now (the embedder is built): Keras' symbolic build, which assumes
        # (x, y, sample_weight) batches rather than episodes, is never needed.
        self.built = True

    # ----------------------------------------------------------------------------------------- Keras API
    def call(self, inputs, training=False):
        return self.embedder(inputs, training=training)

    def build(self, input_shape):
        if not self.embedder.built:
            self.embedder.build(input_shape)
        self.built = True

    def compile(self, optimizer="sgd", assessor_optimizer=None, **kwargs):
        """Keras `compile`; `assessor_optimizer` replaces the default SGD(assessor_learning_rate) of eq (12)."""
        if kwargs.get("loss") is not None:
            raise ValueError("ALAModel trains with its base_loss; do not pass loss= to compile().")
        super().compile(optimizer=optimizer, **kwargs)
        if assessor_optimizer is not None:
            self.assessor_optimizer = keras.optimizers.get(assessor_optimizer)
        if not self.assessor_optimizer.built:
            self.assessor_optimizer.build(self.assessor.trainable_variables)

    def get_compile_config(self):
        config = super().get_compile_config()
        if config is not None:
            config["assessor_optimizer"] = keras.saving.serialize_keras_object(self.assessor_optimizer)
        return config

    def compile_from_config(self, config):
        self.compile(**keras.saving.deserialize_keras_object(config))
        # Built like in training (the metric optimizer only ever sees the embedder's variables), so that
        # the saved optimizer state loads into it.
        self.optimizer.build(self.embedder.trainable_variables)

    @property
    def metrics(self):
        return [self.loss_tracker, self.meta_loss_tracker, self.weight_mean_tracker,
                self.weight_variance_tracker]

    def reset_assessor_state(self):
        """Zeroes the assessor's carried LSTM state (for example between training phases)."""
        self.assessor.reset_state()

    def get_config(self):
        config = super().get_config()
        base_loss = self.base_loss if isinstance(self.base_loss, str) else keras.saving.serialize_keras_object(
            self.base_loss)
        config.update(
            embedder=keras.saving.serialize_keras_object(self.embedder),
            base_loss=base_loss,
            loss_params=self.loss_params if isinstance(self.base_loss, str) else None,
            assessor_units=self.assessor.units,
            assessor_layers=self.assessor.num_layers,
            inner_learning_rate=self.inner_learning_rate,
            assessor_learning_rate=self.assessor_learning_rate,
            assessor_steps=self.assessor_steps,
            max_tuples=self.max_tuples,
            embedding_dim=self.embedding_dim,
            seed=self.seed,
        )
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["embedder"] = keras.saving.deserialize_keras_object(config["embedder"])
        if isinstance(config.get("base_loss"), dict):
            config["base_loss"] = keras.saving.deserialize_keras_object(config["base_loss"])
        return cls(**config)

    # ------------------------------------------------------------------------------------- Algorithm 1
    def train_step(self, data):
        (train_x, train_y, val_x, val_y), replicas = _whole_episode(data)
        logs = self.ala_update(train_x, train_y, val_x, val_y, gradient_scale=1.0 / replicas)
        self.loss_tracker.update_state(logs["loss"])
        self.meta_loss_tracker.update_state(logs["meta_loss"])
        self.weight_mean_tracker.update_state(logs["weight_mean"])
        self.weight_variance_tracker.update_state(logs["weight_variance"])
        return {m.name: m.result() for m in self.metrics}

    def test_step(self, data):
        (_, _, val_x, val_y), _ = _whole_episode(data)
        loss = self._subset_loss(self.embedder(val_x, training=False), val_y, seed=(self.seed, 0))
        self.meta_loss_tracker.update_state(loss)
        return {"meta_loss": self.meta_loss_tracker.result()}

    def ala_update(self, train_x, train_y, val_x, val_y, gradient_scale=1.0):
        """One DML-ALA step on one episode: K assessor updates (12), then the metric update (13).

        Returns a dict of scalars: loss, meta_loss, weight_mean, weight_variance.
        """
        step = self._step_seed()
        trainer = _EpisodeDerivatives(self, train_x, train_y, val_x, val_y, step)
        meta_loss = None
        for _ in range(self.assessor_steps):
            phi_grads, meta_loss = trainer.assessor_gradients()
            self.assessor_optimizer.apply_gradients(
                zip([g * gradient_scale for g in phi_grads], self.assessor.trainable_variables))
        weights, new_state = trainer.weights()
        if meta_loss is None:
            meta_loss = trainer.lookahead(weights)[0]
        theta_grads = trainer.theta_gradients(weights)
        self.optimizer.apply_gradients(
            zip([g * gradient_scale for g in theta_grads], self.embedder.trainable_variables))
        for variable, value in zip(self.embedder.non_trainable_variables, trainer.new_non_trainable):
            variable.assign(value)
        self.assessor.advance_state(*new_state)
        weights = tf.cast(weights, trainer.losses.dtype)
        return {
            "loss": safe_divide(tf.reduce_sum(weights * trainer.losses), trainer.count),
            "meta_loss": meta_loss,
            "weight_mean": safe_divide(tf.reduce_sum(weights), trainer.count),
            "weight_variance": safe_divide(tf.reduce_sum(tf.square(
                weights - safe_divide(tf.reduce_sum(weights), trainer.count))), trainer.count),
        }

    def meta_gradient(self, train_x, train_y, val_x, val_y):
        """`(d L_va(theta'(phi)) / d phi, L_va(theta'(phi)))` at the current assessor, exact (eqs 10-12)."""
        trainer = _EpisodeDerivatives(self, train_x, train_y, val_x, val_y, self._step_seed())
        return trainer.assessor_gradients()

    def inner_rate(self):
        """`a` of eq (10): `inner_learning_rate`, else the optimizer's current learning rate."""
        if self.inner_learning_rate is not None:
            return self.inner_learning_rate
        if getattr(self, "optimizer", None) is None:
            raise ValueError("inner_learning_rate is None and the model is not compiled: compile it or set "
                             "inner_learning_rate.")
        return tf.convert_to_tensor(self.optimizer.learning_rate)

    # ------------------------------------------------------------------------------------------ tuples
    def _step_seed(self):
        optimizer = getattr(self, "optimizer", None)
        iterations = optimizer.iterations if optimizer is not None else 0
        return tf.stack([tf.constant(self.seed, tf.int64), tf.cast(iterations, tf.int64)])

    def _make_tuples(self, labels, seed):
        if self.loss_kind == "contrastive":
            return pair_indices_with_targets(labels, self.max_tuples, seed)
        return triplet_indices(labels, self.max_tuples, seed), None

    def _tuple_losses(self, embeddings, tuples, targets):
        params = self.loss_params
        if self.loss_kind == "triplet":
            return triplet_tuple_losses(embeddings, tuples, params["margin"])
        if self.loss_kind == "margin":
            return margin_tuple_losses(embeddings, tuples, params["alpha"], params["beta"])
        return contrastive_tuple_losses(embeddings, tuples, targets, params["pos_margin"], params["neg_margin"])

    def _subset_loss(self, embeddings, labels, seed):
        tuples, targets = self._make_tuples(labels, seed)
        losses = self._tuple_losses(embeddings, tuples, targets)
        return safe_divide(tf.reduce_sum(losses), tf.cast(tf.size(losses), losses.dtype))


class _EpisodeDerivatives:
    """The quantities of one episode that eqs (10)-(13) share: the training forward pass at theta (kept on
    a persistent tape for the repeated vector-Jacobian products), tuples and per-tuple losses."""

    def __init__(self, model, train_x, train_y, val_x, val_y, step_seed):
        self.model = model
        embedder = model.embedder
        self.train_x, self.val_x = train_x, val_x
        train_y, val_y = validate_labels(train_y, "train_labels"), validate_labels(val_y, "val_labels")
        self.theta = [v.value for v in embedder.trainable_variables]
        self.non_trainable = [v.value for v in embedder.non_trainable_variables]
        with tf.GradientTape(persistent=True) as self.theta_tape:
            self.theta_tape.watch(self.theta)
            self.embeddings, self.new_non_trainable = embedder.stateless_call(
                self.theta, self.non_trainable, train_x, training=True)
        self.tuples, self.targets = model._make_tuples(train_y, step_seed)
        self.val_tuples, self.val_targets = model._make_tuples(val_y, step_seed + [0, 1])
        with tf.GradientTape(persistent=True) as self.loss_tape:
            self.loss_tape.watch(self.embeddings)
            self.losses = model._tuple_losses(self.embeddings, self.tuples, self.targets)
        self.count = tf.cast(tf.size(self.losses), self.losses.dtype)
        self.assessor_input = tf.stop_gradient(self.embeddings)
        rate = model.inner_rate()
        self.rate = (tf.constant(rate, self.losses.dtype) if isinstance(rate, float)
                     else tf.cast(rate, self.losses.dtype))

    def weights(self):
        weights, new_state = self.model.assessor(self.assessor_input, self.tuples)
        return weights, new_state

    def theta_gradients(self, weights):
        """`grad_theta mean_i w_i L_i(theta)` with `w` constant (eqs 10 and 13), as one VJP."""
        upstream = safe_divide(tf.cast(tf.stop_gradient(weights), self.losses.dtype), self.count)
        embedding_grad = self.loss_tape.gradient(self.losses, self.embeddings, output_gradients=upstream,
                                                 unconnected_gradients=tf.UnconnectedGradients.ZERO)
        return self.theta_tape.gradient(self.embeddings, self.theta, output_gradients=embedding_grad,
                                        unconnected_gradients=tf.UnconnectedGradients.ZERO)

    def lookahead(self, weights):
        """Validation loss at `theta' = theta - a grad(...)` (eqs 10-11) and its gradient w.r.t. theta'."""
        grads = self.theta_gradients(weights)
        theta_prime = [t - tf.cast(self.rate, t.dtype) * g for t, g in zip(self.theta, grads)]
        with tf.GradientTape() as tape:
            tape.watch(theta_prime)
            val_embeddings, _ = self.model.embedder.stateless_call(
                theta_prime, self.non_trainable, self.val_x, training=True)
            val_losses = self.model._tuple_losses(val_embeddings, self.val_tuples, self.val_targets)
            meta_loss = safe_divide(tf.reduce_sum(val_losses), tf.cast(tf.size(val_losses), val_losses.dtype))
        val_grads = tape.gradient(meta_loss, theta_prime, unconnected_gradients=tf.UnconnectedGradients.ZERO)
        return meta_loss, val_grads

    def assessor_gradients(self):
        """Exact `d L_va(theta'(phi)) / d phi` (module docstring) and `L_va(theta'(phi))`."""
        assessor = self.model.assessor
        with tf.GradientTape() as tape:
            weights, _ = self.weights()
        meta_loss, val_grads = self.lookahead(weights)
        # J g: how the training embeddings move along the validation gradient.
        with tf.autodiff.ForwardAccumulator(self.theta, val_grads) as accumulator:
            embeddings, _ = self.model.embedder.stateless_call(
                self.theta, self.non_trainable, self.train_x, training=True)
        embedding_tangent = accumulator.jvp(embeddings, unconnected_gradients=tf.UnconnectedGradients.ZERO)
        # c_i = <dL_i/dE, J g> = <grad_theta L_i, g>.
        with tf.autodiff.ForwardAccumulator(self.embeddings, embedding_tangent) as accumulator:
            losses = self.model._tuple_losses(self.embeddings, self.tuples, self.targets)
        alignment = tf.stop_gradient(accumulator.jvp(losses, unconnected_gradients=tf.UnconnectedGradients.ZERO))
        with tape:
            surrogate = -self.rate * safe_divide(
                tf.reduce_sum(tf.cast(weights, alignment.dtype) * alignment), self.count)
        phi_grads = tape.gradient(surrogate, assessor.trainable_variables,
                                  unconnected_gradients=tf.UnconnectedGradients.ZERO)
        return phi_grads, meta_loss


def _whole_episode(data):
    """The episode and the number of replicas; under a distribution strategy each replica receives a share
    of the episode, and all of it is gathered back (tuples span the whole subset)."""
    return gather_replicas(*_unpack_episode(data)), num_replicas()


def _unpack_episode(data):
    if isinstance(data, dict):
        keys = ("train_images", "train_labels", "val_images", "val_labels")
        if not all(key in data for key in keys):
            raise ValueError(f"An ALA episode dict needs the keys {keys}, got {sorted(data)}.")
        return tuple(data[key] for key in keys)
    if not isinstance(data, (tuple, list)) or len(data) != 4:
        raise ValueError("ALAModel trains on episodes (train_images, train_labels, val_images, val_labels) "
                         "from tfdml.data.episode_dataset; got "
                         f"{type(data).__name__} of length {len(data) if hasattr(data, '__len__') else '?'}.")
    return tuple(data)
