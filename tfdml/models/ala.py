"""DML-ALA: deep metric learning via adaptive learnable assessment (Zheng et al., CVPR 2020, §3).

Each training step takes one episode `(train_images, train_labels, val_images, val_labels)` whose two
subsets have disjoint labels (or not: `episode_dataset(disjoint_labels=False)`, Table 1's ablation), forms
the tuples inside each subset (triplets for the triplet and margin losses, pairs for contrastive) and runs
Algorithm 1 with the paper's sums over tuples:

    theta'(phi) = theta - a (.) grad_theta sum_{T in tr} A(T; phi) L(T; theta)           (10)
    K times:  phi <- phi - b * grad_phi sum_{T' in va} L(T'; theta'(phi))                 (11, 12)
    theta <- optimizer step on grad_theta sum_{T in tr} A(T; phi*) L(T; theta)            (13)

`a (.)` is per variable: each variable of the embedder takes, in the virtual step (10), the current learning
rate its own optimizer uses in the real step (13) (e.g. the new layers' 10x rate of a
`tfdml.optimizers.learning_rate_multipliers` optimizer); `inner_learning_rate` replaces them by one rate.
The sums are literal (no division by the number of tuples): means would shrink the assessor's step by
(training tuples) x (validation tuples), 10^6-10^7 in the paper's episodes, and the assessor would never move
at the paper's rates (`tests/test_ala.py` checks the update against the sums written out and that the
assessor learns). `A` gets the tuple embeddings with gradients stopped: eq (10) differentiates `L` only.

The meta-gradient is exact, without a Hessian. Writing `E = f_theta(X_tr)` (`[B, D]`), `J = dE/dtheta`,
`w_i = A(T_i; phi)`, `a` the diagonal of per-variable rates and `g = grad_theta sum_va L(theta')`:

    theta' = theta - a J^T G(phi),   G(phi) = dE-gradient of sum_i w_i L_i(E)
    dL_va/dphi = -sum_i (dw_i/dphi) * c_i,   c_i = <grad_theta L_i, a g> = <dL_i/dE, J (a g)>

so each assessor step costs one vector-Jacobian product (theta'), a forward and backward pass on the
validation subset at theta' (`stateless_call` at substituted weights) and one Jacobian-vector product
`J (a g)` (`tf.autodiff.ForwardAccumulator`); then `phi` takes a gradient step on `-sum_i w_i(phi) c_i`
(constants `c_i`), which has exactly the gradient above, through the assessor's recurrence over the tuples
(`state="per_tuple"`). `tests/test_ala.py` checks it against central finite differences in float64.

Base losses: triplet `[d_ap^2 - d_an^2 + m]+` (eq 4, squared distances by default), margin
`[d_ap - beta + alpha]+ + [beta - d_an + alpha]+` with a learnable `beta` trained by its own
SGD(0.1, momentum 0.9) as in `tfdml.losses.MarginLoss` (on the weighted margin loss normalised like
`MarginLoss`, by the weighted number of active terms, so that its step depends neither on the number of
tuples nor on the mean weight; `beta` is a constant of the virtual step), contrastive pairs.

Logged per step (Keras metrics, epoch means in `History` and TensorBoard; paper Fig. 4): `loss` (weighted
training loss per tuple at `phi*`, `sum_i w_i L_i / n`), `meta_loss` (validation loss per tuple at `theta'`),
`weight_mean`, `weight_variance`, and for triplet-type tuples the hardness `r_i = d(a,p) / d(a,n)`:
`hardness` (`mean_i r_i`, the average weighted hardness of uniform weights 1), `weighted_hardness` (the
paper's AWH, `mean_i w_i r_i`) and `hardness_ratio = weighted_hardness / (weight_mean * hardness)` (> 1 when
the assessor puts more weight on harder tuples than uniform weights of the same mean). `tfdml.plots.
plot_ala_weights` draws them.

Distribution: under `MirroredStrategy` each replica receives a share of the episode; ALA first gathers the
whole episode on every replica (tuples span the whole subset), every replica computes the same update on
it and the gradients are divided by the number of replicas before the optimizers sum them. The update
therefore equals the single-device update on the same episode (the compute is duplicated, the episode is
small).
"""

import keras
import tensorflow as tf

from tfdml import data as data_lib
from tfdml.distribute import gather_replicas, num_replicas
from tfdml.models.assessor import STATE_MODES, TupleAssessor
from tfdml.optimizers import build_optimizer
from tfdml.ops import pairwise_distance, safe_divide, validate_labels
from tfdml.ops.tuples import (
    contrastive_tuple_losses,
    margin_tuple_losses,
    pair_indices_with_targets,
    triplet_hardness,
    triplet_distances,
    triplet_indices,
    triplet_tuple_losses,
)

_BASE_LOSSES = {
    "triplet": {"margin": 0.2},
    "margin": {"alpha": 0.2, "beta": 1.2},
    "contrastive": {"pos_margin": 0.0, "neg_margin": 1.0},
}
DEFAULT_MAX_TUPLES = 1024
WEIGHTINGS = ("assessor", "uniform")


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
            if config.get("soft"):
                raise ValueError(f"ALA weights hinge losses; {type(base_loss).__name__} with soft=True is not "
                                 "supported.")
            if config.get("num_classes"):
                raise ValueError("ALA's margin loss has one beta; a MarginLoss with num_classes (one beta per "
                                 "class) is not supported.")
            params = {key: float(_scalar(config.get(key, getattr(base_loss, key, default))))
                      for key, default in _BASE_LOSSES[kind].items()}
            return kind, params
    raise ValueError(f"base_loss {type(base_loss).__name__} has no per-tuple form; use 'triplet', 'margin', "
                     f"'contrastive' or one of the corresponding tfdml losses.")


def _scalar(value):
    if isinstance(value, (tf.Variable, keras.Variable, tf.Tensor)):
        return float(tf.reduce_mean(tf.convert_to_tensor(value)))
    return value


def _embedding_size(embedder):
    """The embedder's output size: a tfdml embedder's `output_dim`, else its built output shape."""
    size = getattr(embedder, "output_dim", None)
    if size is None:
        try:
            size = embedder.output_shape[-1]
        except (AttributeError, ValueError):
            size = None
    return size


def _learning_rate(optimizer):
    return tf.convert_to_tensor(optimizer.learning_rate)


@keras.saving.register_keras_serializable(package="tfdml")
class ALAModel(keras.Model):
    """Metric model trained with DML-ALA (module docstring: formulas, exactness, logs, distribution).

    Args:
        embedder: Keras model mapping images to (L2-normalised) embeddings `[B, D]` (a tfdml `Embedder`
            or any built Keras model). `predict` and calls return its embeddings.
        base_loss: "triplet" (`[d_ap^2 - d_an^2 + margin]+`, eq 4), "margin" (`[d_ap - beta + alpha]+ +
            [beta - d_an + alpha]+`, learnable `beta`), "contrastive" (pairs) or a tfdml TripletLoss /
            MarginLoss / ContrastiveLoss whose margins (and initial beta) are used (its `mining` is replaced
            by the assessor, which weights every tuple).
        loss_params: overrides of the base loss's margins for a string `base_loss`.
        assessor_units, assessor_layers: LSTM assessor size (paper: 64 units, 2 layers).
        state: "per_tuple" (paper's eq 8: the LSTM reads the step's tuples in order as one sequence, its
            final state starts the next step) or "per_step" (all tuples of a step from one shared state;
            cheaper). See `tfdml.models.assessor`.
        inner_learning_rate: one rate `a` for every variable in the virtual step (10); None (default) uses,
            per variable, the current learning rate of the optimizer that trains it in the real step (13).
        assessor_learning_rate: `b` of eq (12) (paper: 4e-4), used by the default SGD assessor optimizer.
        assessor_steps: `K`, assessor updates per episode (paper: 3); 0 only weights the tuples.
        max_tuples: cap on tuples per subset (a random subset in the original order, seeded by `seed` and
            the step); None: all (a 20 x 5 training subset has 38,000 triplets, each one step of the
            assessor's sequential recurrence). Default 1024.
        squared: squared distances in the triplet base loss (eq 4; default True).
        learn_beta, beta_learning_rate: margin base loss: train `beta` with SGD(beta_learning_rate,
            momentum=0.9) (defaults: a MarginLoss's own settings, else True and 0.1).
        weighting: "assessor" (DML-ALA) or "uniform" (every tuple weight 1, no assessor, no validation
            subset): the base loss on the same episodes, tuples and sums, the baseline without confound.
        embedding_dim: embedding size, when the embedder does not tell it.
        seed: seed of the tuple subsets.

    Example:
        >>> model = ALAModel(tfdml.models.Embedder("small_cnn", embedding_dim=16), base_loss="margin")
        >>> model.compile(optimizer=keras.optimizers.SGD(1e-4))
        >>> model.fit(tfdml.data.episode_dataset(...), epochs=10)
        >>> embeddings = model.predict(images)
    """

    def __init__(self, embedder, base_loss="triplet", loss_params=None, assessor_units=64, assessor_layers=2,
                 state="per_tuple", inner_learning_rate=None, assessor_learning_rate=4e-4, assessor_steps=3,
                 max_tuples=DEFAULT_MAX_TUPLES, squared=True, learn_beta=None, beta_learning_rate=None,
                 weighting="assessor", embedding_dim=None, seed=0, **kwargs):
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
        if state not in STATE_MODES:
            raise ValueError(f"state must be one of {STATE_MODES}, got {state!r}.")
        if weighting not in WEIGHTINGS:
            raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {weighting!r}.")
        self.weighting = weighting
        self.inner_learning_rate = None if inner_learning_rate is None else float(inner_learning_rate)
        self.assessor_learning_rate = float(assessor_learning_rate)
        self.max_tuples = None if max_tuples is None else int(max_tuples)
        self.squared = bool(squared)
        self.seed = int(seed)
        embedding_dim = embedding_dim if embedding_dim is not None else _embedding_size(embedder)
        if embedding_dim is None:
            raise ValueError("The embedding size of the embedder is unknown: build the embedder (give it an "
                             "Input), use a tfdml embedder, or pass embedding_dim=...")
        self.embedding_dim = int(embedding_dim)
        self.assessor = TupleAssessor(tuple_size=2 if self.loss_kind == "contrastive" else 3,
                                      units=assessor_units, num_layers=assessor_layers, state=state,
                                      dtype=self.dtype_policy, name="assessor")
        self.assessor.build((None, self.embedding_dim))
        self.assessor_optimizer = keras.optimizers.SGD(self.assessor_learning_rate, name="assessor_sgd")
        self._init_margin_beta(learn_beta, beta_learning_rate)
        names = ["loss", "meta_loss", "weight_mean", "weight_variance"]
        if self.weighting == "uniform":
            names.remove("meta_loss")
        if self.loss_kind != "contrastive":
            names += ["hardness", "weighted_hardness", "hardness_ratio"]
        self.trackers = {name: keras.metrics.Mean(name=name) for name in names}
        # Every weight exists now (the embedder is built): Keras' symbolic build, which assumes
        # (x, y, sample_weight) batches rather than episodes, is never needed.
        self.built = True

    def _init_margin_beta(self, learn_beta, beta_learning_rate):
        defaults = {"learn_beta": True, "beta_learning_rate": 0.1}
        if not isinstance(self.base_loss, str):
            defaults.update({key: getattr(self.base_loss, key) for key in defaults
                             if hasattr(self.base_loss, key)})
        self.learn_beta = bool(defaults["learn_beta"] if learn_beta is None else learn_beta)
        self.beta_learning_rate = float(defaults["beta_learning_rate"] if beta_learning_rate is None
                                        else beta_learning_rate)
        if self.beta_learning_rate <= 0:
            raise ValueError(f"beta_learning_rate must be > 0, got {beta_learning_rate}.")
        self.margin_beta = None
        if self.loss_kind == "margin" and self.learn_beta:
            self.margin_beta = self.add_weight(shape=(), initializer="zeros", name="margin_beta",
                                               dtype=self.dtype_policy.variable_dtype)
            self.margin_beta.assign(self.loss_params["beta"])  # no float32 round trip in float64
            self.beta_optimizer = keras.optimizers.SGD(self.beta_learning_rate, momentum=0.9,
                                                       name="margin_beta_sgd")
            self.beta_optimizer.build([self.margin_beta])

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
        return list(self.trackers.values())

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
            state=self.assessor.state,
            inner_learning_rate=self.inner_learning_rate,
            assessor_learning_rate=self.assessor_learning_rate,
            assessor_steps=self.assessor_steps,
            max_tuples=self.max_tuples,
            squared=self.squared,
            learn_beta=self.learn_beta,
            beta_learning_rate=self.beta_learning_rate,
            weighting=self.weighting,
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
        for name, tracker in self.trackers.items():
            tracker.update_state(logs[name])
        return {name: tracker.result() for name, tracker in self.trackers.items()}

    def test_step(self, data):
        (_, _, val_x, val_y), _ = _whole_episode(data)
        embeddings = self.embedder(val_x, training=False)
        tuples, targets = self._make_tuples(validate_labels(val_y, "val_labels"), self._step_seed() + [0, 1])
        losses = self._tuple_losses(embeddings, tuples, targets)
        name = "meta_loss" if "meta_loss" in self.trackers else "loss"
        self.trackers[name].update_state(safe_divide(tf.reduce_sum(losses), tf.cast(tf.size(losses),
                                                                                     losses.dtype)))
        return {name: self.trackers[name].result()}

    def ala_update(self, train_x, train_y, val_x, val_y, gradient_scale=1.0):
        """One DML-ALA step on one episode: K assessor updates (12), then the metric update (13).

        Returns a dict of scalars: the logs of the module docstring.
        """
        step = self._step_seed()
        trainer = _EpisodeDerivatives(self, train_x, train_y, val_x, val_y, step)
        logs = {}
        if self.weighting == "assessor":
            meta_loss = None
            for _ in range(self.assessor_steps):
                phi_grads, meta_loss = trainer.assessor_gradients()
                self.assessor_optimizer.apply_gradients(
                    zip([g * gradient_scale for g in phi_grads], self.assessor.trainable_variables))
            weights, new_state = trainer.weights()
            if meta_loss is None:
                meta_loss = trainer.lookahead(weights)[0]
            logs["meta_loss"] = meta_loss / tf.maximum(trainer.val_count, 1.0)
        else:
            weights = tf.ones_like(trainer.losses)
        theta_grads = trainer.theta_gradients(weights)
        self.optimizer.apply_gradients(
            zip([g * gradient_scale for g in theta_grads], self.embedder.trainable_variables))
        if self.margin_beta is not None:
            beta_grad = trainer.beta_gradient(weights)
            self.beta_optimizer.apply_gradients([(beta_grad * gradient_scale, self.margin_beta)])
        for variable, value in zip(self.embedder.non_trainable_variables, trainer.new_non_trainable):
            variable.assign(value)
        if self.weighting == "assessor":
            self.assessor.advance_state(*new_state)
        logs.update(trainer.weight_logs(tf.cast(weights, trainer.losses.dtype)))
        return logs

    def meta_gradient(self, train_x, train_y, val_x, val_y):
        """`(d L_va(theta'(phi)) / d phi, L_va(theta'(phi)))` at the current assessor, exact (eqs 10-12);
        `L_va` is the sum over the validation tuples."""
        trainer = _EpisodeDerivatives(self, train_x, train_y, val_x, val_y, self._step_seed())
        return trainer.assessor_gradients()

    def inner_rates(self):
        """Per embedder variable, `a` of eq (10): `inner_learning_rate`, else the current learning rate of
        the optimizer (or, for a multi-optimizer, of the inner optimizer) that trains that variable."""
        variables = self.embedder.trainable_variables
        if self.inner_learning_rate is not None:
            return [tf.constant(self.inner_learning_rate)] * len(variables)
        optimizer = getattr(self, "optimizer", None)
        if optimizer is None:
            raise ValueError("inner_learning_rate is None and the model is not compiled: compile it or set "
                             "inner_learning_rate.")
        while isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
            optimizer = optimizer.inner_optimizer
        if isinstance(optimizer, keras.optimizers.MultiOptimizer):
            return [_learning_rate(optimizer._optimizer_map(v)) for v in variables]
        return [_learning_rate(optimizer)] * len(variables)

    # ------------------------------------------------------------------------------------------ tuples
    def _step_seed(self):
        optimizer = getattr(self, "optimizer", None)
        iterations = optimizer.iterations if optimizer is not None else 0
        return tf.stack([tf.constant(self.seed, tf.int64), tf.cast(iterations, tf.int64)])

    def _make_tuples(self, labels, seed):
        if self.loss_kind == "contrastive":
            return pair_indices_with_targets(labels, self.max_tuples, seed)
        return triplet_indices(labels, self.max_tuples, seed), None

    def _beta(self, dtype):
        if self.margin_beta is None:
            return tf.constant(self.loss_params["beta"], dtype)
        return tf.cast(self.margin_beta, dtype)

    def _tuple_losses(self, embeddings, tuples, targets, beta=None):
        params = self.loss_params
        if self.loss_kind == "triplet":
            return triplet_tuple_losses(embeddings, tuples, params["margin"], squared=self.squared)
        if self.loss_kind == "margin":
            beta = self._beta(embeddings.dtype) if beta is None else beta
            return margin_tuple_losses(embeddings, tuples, params["alpha"], beta)
        return contrastive_tuple_losses(embeddings, tuples, targets, params["pos_margin"], params["neg_margin"])


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
        if model.weighting == "assessor":
            self.val_tuples, self.val_targets = model._make_tuples(val_y, step_seed + [0, 1])
            self.val_count = tf.cast(tf.shape(self.val_tuples)[0], self.embeddings.dtype)
        self.beta = model._beta(self.embeddings.dtype) if model.loss_kind == "margin" else None
        with tf.GradientTape(persistent=True) as self.loss_tape:
            self.loss_tape.watch(self.embeddings)
            if self.beta is not None:
                self.loss_tape.watch(self.beta)
            self.losses = model._tuple_losses(self.embeddings, self.tuples, self.targets, self.beta)
        self.count = tf.cast(tf.size(self.losses), self.losses.dtype)
        self.assessor_input = tf.stop_gradient(self.embeddings)
        self.rates = [tf.cast(rate, t.dtype) for rate, t in zip(model.inner_rates(), self.theta)]

    def weights(self):
        return self.model.assessor(self.assessor_input, self.tuples)

    def theta_gradients(self, weights):
        """`grad_theta sum_i w_i L_i(theta)` with `w` constant (eqs 10 and 13), as one VJP."""
        upstream = tf.cast(tf.stop_gradient(weights), self.losses.dtype)
        embedding_grad = self.loss_tape.gradient(self.losses, self.embeddings, output_gradients=upstream,
                                                 unconnected_gradients=tf.UnconnectedGradients.ZERO)
        return self.theta_tape.gradient(self.embeddings, self.theta, output_gradients=embedding_grad,
                                        unconnected_gradients=tf.UnconnectedGradients.ZERO)

    def beta_gradient(self, weights):
        """Gradient in `beta` of the weighted margin loss normalised like `MarginLoss`, by the (weighted)
        number of active terms `sum_i w_i (#(pos_i > 0) + #(neg_i > 0))`: beta's own SGD(0.1, 0.9) takes
        steps of the usual size whatever the number of tuples and whatever the mean weight (weights all c
        give `MarginLoss`'s step, as weights 1 do)."""
        upstream = tf.cast(tf.stop_gradient(weights), self.losses.dtype)
        grad = self.loss_tape.gradient(self.losses, self.beta, output_gradients=upstream,
                                       unconnected_gradients=tf.UnconnectedGradients.ZERO)
        d_ap, d_an = triplet_distances(pairwise_distance(self.embeddings), self.tuples)
        alpha = self.model.loss_params["alpha"]
        active = (tf.cast(d_ap - self.beta + alpha > 0, grad.dtype)
                  + tf.cast(self.beta - d_an + alpha > 0, grad.dtype))
        return tf.cast(safe_divide(grad, tf.reduce_sum(upstream * active)), self.model.margin_beta.dtype)

    def lookahead(self, weights):
        """Validation loss (sum over tuples) at `theta' = theta - a (.) grad(...)` (eqs 10-11) and its
        gradient w.r.t. theta'."""
        grads = self.theta_gradients(weights)
        theta_prime = [t - rate * g for t, rate, g in zip(self.theta, self.rates, grads)]
        with tf.GradientTape() as tape:
            tape.watch(theta_prime)
            val_embeddings, _ = self.model.embedder.stateless_call(
                theta_prime, self.non_trainable, self.val_x, training=True)
            val_losses = self.model._tuple_losses(val_embeddings, self.val_tuples, self.val_targets, self.beta)
            meta_loss = tf.reduce_sum(val_losses)
        val_grads = tape.gradient(meta_loss, theta_prime, unconnected_gradients=tf.UnconnectedGradients.ZERO)
        return meta_loss, val_grads

    def assessor_gradients(self):
        """Exact `d L_va(theta'(phi)) / d phi` (module docstring) and `L_va(theta'(phi))`."""
        assessor = self.model.assessor
        with tf.GradientTape() as tape:
            weights, _ = self.weights()
        meta_loss, val_grads = self.lookahead(weights)
        # J (a g): how the training embeddings move along the rate-scaled validation gradient.
        tangents = [rate * g for rate, g in zip(self.rates, val_grads)]
        with tf.autodiff.ForwardAccumulator(self.theta, tangents) as accumulator:
            embeddings, _ = self.model.embedder.stateless_call(
                self.theta, self.non_trainable, self.train_x, training=True)
        embedding_tangent = accumulator.jvp(embeddings, unconnected_gradients=tf.UnconnectedGradients.ZERO)
        # c_i = <dL_i/dE, J a g> = <grad_theta L_i, a g>.
        with tf.autodiff.ForwardAccumulator(self.embeddings, embedding_tangent) as accumulator:
            losses = self.model._tuple_losses(self.embeddings, self.tuples, self.targets, self.beta)
        alignment = tf.stop_gradient(accumulator.jvp(losses, unconnected_gradients=tf.UnconnectedGradients.ZERO))
        with tape:
            surrogate = -tf.reduce_sum(tf.cast(weights, alignment.dtype) * alignment)
        phi_grads = tape.gradient(surrogate, assessor.trainable_variables,
                                  unconnected_gradients=tf.UnconnectedGradients.ZERO)
        return phi_grads, meta_loss

    def weight_logs(self, weights):
        """Per-tuple means of the step (module docstring): loss, weight mean/variance, hardness."""
        count = self.count
        mean = safe_divide(tf.reduce_sum(weights), count)
        logs = {
            "loss": safe_divide(tf.reduce_sum(weights * self.losses), count),
            "weight_mean": mean,
            "weight_variance": safe_divide(tf.reduce_sum(tf.square(weights - mean)), count),
        }
        if self.model.loss_kind != "contrastive":
            ratio = tf.stop_gradient(triplet_hardness(self.embeddings, self.tuples))
            logs["hardness"] = safe_divide(tf.reduce_sum(ratio), count)
            logs["weighted_hardness"] = safe_divide(tf.reduce_sum(weights * ratio), count)
            logs["hardness_ratio"] = safe_divide(logs["weighted_hardness"], mean * logs["hardness"])
        return logs


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


def ala_training(embedder, source, steps, base_loss="triplet", weighting="assessor", optimizer=None,
                 episode=None, image_size=None, augment=False, preprocess=None, seed=0, **ala_kwargs):
    """A compiled `ALAModel` and its episodes, ready for `model.fit(dataset)`: DML-ALA, or its baseline.

    The baseline without confound is `weighting="uniform"` with everything else equal: the same episodes
    (same `seed`), the same tuples (same cap and tuple seed), the same sums over tuples and the same
    optimizer and step budget; it only drops the assessor (every weight 1) and never uses the validation
    subset.

    Args:
        embedder: a tfdml embedder (e.g. `Embedder("resnet50", embedding_dim=512)`) or a built Keras model.
        source: a `tfdml.data.Source` of the training classes.
        steps: step budget; the dataset holds exactly `steps` episodes.
        base_loss: "triplet", "margin" or "contrastive" (or a tfdml loss instance), see `ALAModel`.
        weighting: "assessor" (DML-ALA) or "uniform" (the base loss on the same tuples).
        optimizer: the metric's optimizer (None: the paper's rates, Adam 1e-4 with the new layers at 10x for
            a tfdml embedder); a fresh instance per model.
        episode: `episode_dataset` arguments (default the paper's: train_size 100, val_size 20,
            samples_per_class 5; `disjoint_labels=False` for Table 1's random episodes).
        image_size, augment, preprocess: as for `episode_dataset` (`preprocess=None`: raw 0-255 pixels, which
            a tfdml embedder preprocesses itself).
        seed: seed of the episodes and of the tuple subsets.
        **ala_kwargs: further `ALAModel` arguments (state, max_tuples, assessor_steps, ...).

    Returns:
        `(model, dataset)`.

    Example:
        >>> for weighting in ("uniform", "assessor"):
        ...     model, ds = ala_training(Embedder("small_cnn", embedding_dim=64), source, 2000,
        ...                              base_loss="margin", weighting=weighting, image_size=32, seed=0)
        ...     model.fit(ds)
        ...     results[weighting] = tfdml.retrieval.evaluate(model.predict(test_images), test_labels)
    """
    if optimizer is None:
        head = 10.0 if hasattr(embedder, "head_variables") else 1.0
        optimizer = build_optimizer("adam", 1e-4, head_lr_multiplier=head, model=embedder)
    model = ALAModel(embedder, base_loss=base_loss, weighting=weighting, seed=seed, **ala_kwargs)
    model.compile(optimizer=optimizer)
    episode = {"train_size": 100, "val_size": 20, "samples_per_class": 5, **dict(episode or {})}
    dataset = data_lib.episode_dataset(source, image_size=image_size, augment=augment, preprocess=preprocess,
                                       seed=seed, **episode).take(int(steps))
    return model, dataset
