"""DML-ALA: deep metric learning via adaptive learnable assessment (Zheng et al., CVPR 2020, §3).

Each training step takes one episode `(train_images, train_labels, val_images, val_labels)` whose two
subsets have disjoint labels (or not: `episode_dataset(disjoint_labels=False)`, Table 1's ablation), forms
the tuples inside each subset (triplets for the triplet and margin losses, pairs for contrastive) and runs
Algorithm 1:

    theta'(phi) = theta - U(grad_theta sum_{T in tr} w(T; phi) L(T; theta))               (10)
    K times:  phi <- phi - b * grad_phi sum_{T' in va} L(T'; theta'(phi))                 (11, 12)
    theta <- optimizer step on grad_theta sum_{T in tr} w(T; phi*) L(T; theta)            (13)

Two variants (`ALAModel(variant=...)`), each a set of defaults for the switches below:

- `variant="paper"`, the paper-literal algorithm: `w = A(T; phi)` (the assessor's sigmoid output), `U` is
  plain SGD, `U(g) = a (.) g` with, per variable, the current learning rate its optimizer uses in (13)
  (`inner_learning_rate` replaces them by one rate), the assessor reads the concatenated tuple embeddings
  and is trained by SGD(4e-4).
- `variant="default"` (the library default; measured in the README): the weights only redistribute,
  `w_i = f + (1 - f) A_i / mean_j A_j` (`normalize_weights=True`, `weight_floor=f` = 0.8: every tuple keeps
  80 % of a uniform weight, the assessor moves the rest; `normalize_over="active"` takes the mean over the
  tuples with `L_j > 0` only): the mean weight of a step is 1, a common scale of
  the assessor's outputs changes neither (10) nor (13), and the meta-gradient has no component along a
  common scale, so the assessor cannot learn a step size; what remains of one (moving weight onto tuples
  with zero loss, which do not move theta) shrinks the step by at most `1 - f`, 20 %. The
  assessor reads the tuples' geometry (`assessor_input="geometry"`) and is trained by Adam(1e-3); the
  look-ahead is the paper's (`lookahead="sgd"`): with label noise it is the look-ahead whose meta-gradient
  separates mislabelled tuples, while the optimizer-modelled one below does not (README, DML-ALA).

The look-ahead `U` with `lookahead="optimizer"` (an option) is the real optimizer's update, linearised in
the new gradient with the optimizer's state held constant (a per-coordinate preconditioner `P` and an offset `o`
that do not depend on `phi`): `theta' = theta - o - P (.) g(phi)`, with `g(phi)` the gradient of
`sum_i w_i(phi) L_i` (the same sum, the same scale, as the real step (13)):

    SGD:            P = lr,                               o = -mu v          (v: its velocity, mu: momentum;
                                                                              Nesterov: P = lr (1 + mu),
                                                                              o = -mu^2 v)
    Adam / AdamW:   P = alpha_t (1 - beta_1) / (sqrt(v_t) + eps),  o = alpha_t beta_1 m / (sqrt(v_t) + eps),
                    alpha_t = lr sqrt(1 - beta_2^t) / (1 - beta_1^t),  t = iterations + 1,
                    v_t = beta_2 v + (1 - beta_2) g_1^2   (m, v: its moment estimates before this step;
                    g_1: this episode's gradient with every weight 1, so that P does not depend on phi;
                    amsgrad: max(v_hat, v_t))
    weight decay (any optimizer): o += lr * weight_decay * theta for the decayed variables.

This is Adam's own step for this episode except that the new gradient enters the second moment as `g_1`
(uniform weights) rather than `g(phi)`: Adam's update is scale-invariant, `P` carries that scale. With
normalised weights `g(phi)` and `g_1` are on the same scale (both sums with mean weight 1), so (10) moves
theta by what (13) will; at uniform weights it is exactly Keras' step (`tests/test_ala.py`).
Other optimizers are modelled as SGD at their learning rate (a warning says so). Gradient clipping and
EMA are not modelled.

The meta-gradient is exact, without a Hessian. Writing `E = f_theta(X_tr)` (`[B, D]`), `J = dE/dtheta`,
`w_i(phi)` the weights (normalised or not), and `g_va = grad_theta sum_va L(theta')`:

    theta' = theta - o - P J^T G(phi),   G(phi) = dE-gradient of sum_i w_i L_i(E)
    dL_va/dphi = -sum_i (dw_i/dphi) * c_i,   c_i = <grad_theta L_i, P g_va> = <dL_i/dE, J (P g_va)>

so each assessor step costs one vector-Jacobian product (theta'), a forward and backward pass on the
validation subset at theta' (`stateless_call` at substituted weights) and one Jacobian-vector product
`J (P g_va)` (`tf.autodiff.ForwardAccumulator`); then `phi` takes a gradient step on `-sum_i w_i(phi) c_i`
(constants `c_i`), which has exactly the gradient above, through the normalisation and the assessor's
recurrence over the tuples (`state="per_tuple"`). `tests/test_ala.py` checks both variants against central
finite differences in float64. The sums are literal (no division by the number of tuples) in (10), (11)
and (13): with the paper's SGD look-ahead at the paper's rates means would shrink the assessor's step by
(training tuples) x (validation tuples), 10^6-10^7, and it would never move.

`meta_interval=N` runs the K assessor updates (and the look-ahead) only every N-th step; between them the
assessor weights the tuples with its latest parameters (the step then costs about a plain step plus the
assessor's forward pass).

`assessor_input`: "embeddings" (the paper: concatenated tuple embeddings), "embeddings+geometry" (also the
tuple's anchor-positive and anchor-negative distances and its loss; for pairs the distance, the loss and
+-1 for positive/negative) or "geometry" (those three numbers only). The geometry features are
standardised over the step's tuples (zero mean, unit variance per feature), so that they say how a tuple
compares with the others of its step. The assessor's input has gradients stopped: eq (10) differentiates
`L` only.

Base losses: triplet `[d_ap^2 - d_an^2 + m]+` (eq 4, squared distances by default), margin
`[d_ap - beta + alpha]+ + [beta - d_an + alpha]+` with a learnable `beta` trained by its own
SGD(0.1, momentum 0.9) as in `tfdml.losses.MarginLoss` (on the weighted margin loss normalised like
`MarginLoss`, by the weighted number of active terms, so that its step depends neither on the number of
tuples nor on the mean weight; `beta` is a constant of the virtual step), contrastive pairs.

Logged per step (Keras metrics, epoch means in `History` and TensorBoard; paper Fig. 4): `loss` (weighted
training loss per tuple at `phi*`, `sum_i w_i L_i / n`, with the weights of (13)), `meta_loss` (validation
loss per tuple at `theta'`, on the steps that update the assessor), `weight_mean`, `weight_variance` (of
the assessor's outputs `A_i` in (0, 1), before any normalisation), and for triplet-type tuples the hardness
`r_i = d(a,p) / d(a,n)`: `hardness` (`mean_i r_i`, the average weighted hardness of uniform weights 1),
`weighted_hardness` (the paper's AWH, `mean_i A_i r_i`) and `hardness_ratio = weighted_hardness /
(weight_mean * hardness)` (> 1 when the assessor puts more weight on harder tuples than uniform weights of
the same mean). `tfdml.plots.plot_ala_weights` draws them; `ALAModel.tuple_weights` reads the weights of the
tuples of any training subset.

Distribution: under `MirroredStrategy` each replica receives a share of the episode; ALA first gathers the
whole episode on every replica (tuples span the whole subset), every replica computes the same update on
it and the gradients are divided by the number of replicas before the optimizers sum them. The update
therefore equals the single-device update on the same episode (the compute is duplicated, the episode is
small).
"""

import warnings

import keras
import tensorflow as tf

from tfdml import data as data_lib
from tfdml.distribute import gather_replicas, num_replicas
from tfdml.models.assessor import STATE_MODES, TupleAssessor
from tfdml.ops import pairwise_distance, safe_divide, validate_labels
from tfdml.ops.tuples import (
    contrastive_tuple_losses,
    margin_tuple_losses,
    pair_indices_with_targets,
    triplet_distances,
    triplet_hardness,
    triplet_indices,
    triplet_tuple_losses,
)
from tfdml.optimizers import build_optimizer

_BASE_LOSSES = {
    "triplet": {"margin": 0.2},
    "margin": {"alpha": 0.2, "beta": 1.2},
    "contrastive": {"pos_margin": 0.0, "neg_margin": 1.0},
}
DEFAULT_MAX_TUPLES = 1024
WEIGHTINGS = ("assessor", "uniform")
LOOKAHEADS = ("optimizer", "sgd")
ASSESSOR_INPUTS = ("embeddings", "embeddings+geometry", "geometry")
# What each variant sets when the switch itself is None (module docstring).
VARIANTS = {
    "default": {
        "normalize_weights": True,
        "weight_floor": 0.8,
        "normalize_over": "all",
        "lookahead": "sgd",
        "assessor_input": "geometry",
        "assessor_optimizer": "adam",
        "assessor_learning_rate": 1e-3,
    },
    "paper": {
        "normalize_weights": False,
        "weight_floor": 0.0,
        "normalize_over": "all",
        "lookahead": "sgd",
        "assessor_input": "embeddings",
        "assessor_optimizer": "sgd",
        "assessor_learning_rate": 4e-4,
    },
}
NORMALIZE_OVER = ("active", "all")
NUM_GEOMETRY_FEATURES = 3


def resolve_base_loss(base_loss, loss_params=None):
    """`(kind, params)` for a base-loss name or a tfdml loss instance (Triplet/Margin/ContrastiveLoss)."""
    if isinstance(base_loss, str):
        kind = base_loss.lower()
        if kind not in _BASE_LOSSES:
            raise ValueError(
                f"base_loss must be one of {sorted(_BASE_LOSSES)} or a tfdml TripletLoss, "
                f"MarginLoss or ContrastiveLoss instance, got {base_loss!r}."
            )
        params = dict(_BASE_LOSSES[kind])
        unknown = set(loss_params or {}) - set(params)
        if unknown:
            raise ValueError(
                f"Unknown parameters {sorted(unknown)} for base_loss {kind!r}; expected some of {sorted(params)}."
            )
        params.update({key: float(value) for key, value in (loss_params or {}).items()})
        return kind, params
    class_name = type(base_loss).__name__.lower()
    config = base_loss.get_config() if hasattr(base_loss, "get_config") else {}
    for kind in ("contrastive", "margin", "triplet"):
        if class_name.startswith(kind):
            if config.get("soft"):
                raise ValueError(
                    f"ALA weights hinge losses; {type(base_loss).__name__} with soft=True is not supported."
                )
            if config.get("num_classes"):
                raise ValueError(
                    "ALA's margin loss has one beta; a MarginLoss with num_classes (one beta per "
                    "class) is not supported."
                )
            params = {
                key: float(_scalar(config.get(key, getattr(base_loss, key, default))))
                for key, default in _BASE_LOSSES[kind].items()
            }
            return kind, params
    raise ValueError(
        f"base_loss {type(base_loss).__name__} has no per-tuple form; use 'triplet', 'margin', "
        f"'contrastive' or one of the corresponding tfdml losses."
    )


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
    """Metric model trained with DML-ALA (module docstring: formulas, variants, exactness, logs, distribution).

    Args:
        embedder: Keras model mapping images to (L2-normalised) embeddings `[B, D]` (a tfdml `Embedder`
            or any built Keras model). `predict` and calls return its embeddings.
        base_loss: "triplet" (`[d_ap^2 - d_an^2 + margin]+`, eq 4), "margin" (`[d_ap - beta + alpha]+ +
            [beta - d_an + alpha]+`, learnable `beta`), "contrastive" (pairs) or a tfdml TripletLoss /
            MarginLoss / ContrastiveLoss whose margins (and initial beta) are used (its `mining` is replaced
            by the assessor, which weights every tuple).
        loss_params: overrides of the base loss's margins for a string `base_loss`.
        variant: "default" (weights that only redistribute, geometry input, Adam(1e-3) assessor, SGD
            look-ahead) or "paper" (Algorithm 1 literally: raw sigmoid weights, SGD look-ahead at the real
            step's rates, embeddings input, SGD(4e-4) assessor). The switches below override single
            choices; None takes the variant's.
        normalize_weights: divide the step's weights by their mean over the active tuples (`L_i > 0`; mean
            weight 1: the assessor decides relative weights, the optimizer keeps the step size).
        normalize_over: "all" (default: every tuple of the step) or "active" (the tuples with `L_i > 0`,
            the only ones that move theta: the assessor then cannot shrink the step by moving weight onto
            inactive tuples; on glyphs and under label noise it measured worse, README).
        weight_floor: with `normalize_weights`, the applied weights are `f + (1 - f) A_i / mean_j A_j`
            (still mean 1): every tuple keeps at least the fraction `f` of a uniform weight, so that the
            assessor cannot concentrate the step on a few tuples (default variant 0.8; 0: plain normalised).
        lookahead: "optimizer" (the virtual step (10) is the compiled optimizer's step with its state held
            constant, module docstring) or "sgd" (plain SGD at the real step's per-variable rates).
        assessor_input: "embeddings" (paper), "embeddings+geometry" or "geometry" (default; module docstring).
        assessor_units, assessor_layers: LSTM assessor size (paper: 64 units, 2 layers).
        state: "per_tuple" (paper's eq 8: the LSTM reads the step's tuples in order as one sequence, its
            final state starts the next step) or "per_step" (all tuples of a step from one shared state;
            cheaper). See `tfdml.models.assessor`.
        inner_learning_rate: one rate `a` for every variable in an SGD virtual step (10) (implies
            `lookahead="sgd"`); None (default) uses, per variable, the current learning rate of the optimizer
            that trains it in the real step (13).
        assessor_learning_rate: the assessor optimizer's rate (`b` of eq (12); paper: SGD 4e-4; default
            variant: Adam 1e-3).
        assessor_steps: `K`, assessor updates per episode (paper: 3); 0 only weights the tuples.
        meta_interval: update the assessor (K steps) every `meta_interval`-th training step only; the steps
            between reuse it (default 1: every step, as the paper).
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
        >>> model.compile(optimizer=keras.optimizers.Adam(1e-3))
        >>> model.fit(tfdml.data.episode_dataset(...), epochs=10)
        >>> embeddings = model.predict(images)
        >>> tuples, weights = model.tuple_weights(images[:24], labels[:24])   # what the assessor learnt
        >>> paper = ALAModel(embedder, base_loss="triplet", variant="paper")  # Algorithm 1 literally
    """

    def __init__(
        self,
        embedder,
        base_loss="triplet",
        loss_params=None,
        variant="default",
        normalize_weights=None,
        weight_floor=None,
        normalize_over=None,
        lookahead=None,
        assessor_input=None,
        assessor_units=64,
        assessor_layers=2,
        state="per_tuple",
        inner_learning_rate=None,
        assessor_learning_rate=None,
        assessor_steps=3,
        meta_interval=1,
        max_tuples=DEFAULT_MAX_TUPLES,
        squared=True,
        learn_beta=None,
        beta_learning_rate=None,
        weighting="assessor",
        embedding_dim=None,
        seed=0,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if not isinstance(embedder, keras.Model) and not isinstance(embedder, keras.layers.Layer):
            raise TypeError(f"embedder must be a Keras model or layer, got {type(embedder).__name__}.")
        self.embedder = embedder
        self.base_loss = base_loss
        self.loss_kind, self.loss_params = resolve_base_loss(base_loss, loss_params)
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {sorted(VARIANTS)}, got {variant!r}.")
        self.variant = variant
        defaults = VARIANTS[variant]
        self._init_weighting(
            defaults, normalize_weights, weight_floor, normalize_over, lookahead, assessor_input, inner_learning_rate
        )
        self.assessor_steps = int(assessor_steps)
        if self.assessor_steps < 0:
            raise ValueError(f"assessor_steps must be >= 0, got {assessor_steps}.")
        self.meta_interval = int(meta_interval)
        if self.meta_interval < 1:
            raise ValueError(f"meta_interval must be >= 1, got {meta_interval}.")
        if inner_learning_rate is not None and float(inner_learning_rate) < 0:
            raise ValueError(f"inner_learning_rate must be >= 0, got {inner_learning_rate}.")
        if state not in STATE_MODES:
            raise ValueError(f"state must be one of {STATE_MODES}, got {state!r}.")
        if weighting not in WEIGHTINGS:
            raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {weighting!r}.")
        self.weighting = weighting
        self.inner_learning_rate = None if inner_learning_rate is None else float(inner_learning_rate)
        self.assessor_learning_rate = float(
            defaults["assessor_learning_rate"] if assessor_learning_rate is None else assessor_learning_rate
        )
        self.max_tuples = None if max_tuples is None else int(max_tuples)
        self.squared = bool(squared)
        self.seed = int(seed)
        embedding_dim = embedding_dim if embedding_dim is not None else _embedding_size(embedder)
        if embedding_dim is None:
            raise ValueError(
                "The embedding size of the embedder is unknown: build the embedder (give it an "
                "Input), use a tfdml embedder, or pass embedding_dim=..."
            )
        self.embedding_dim = int(embedding_dim)
        self._init_assessor(defaults["assessor_optimizer"], assessor_units, assessor_layers, state)
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

    def _init_weighting(
        self, defaults, normalize_weights, weight_floor, normalize_over, lookahead, assessor_input, inner_learning_rate
    ):
        """The variant's choices (normalisation, floor, look-ahead, assessor input), each overridable."""
        if inner_learning_rate is not None and lookahead is None:
            lookahead = "sgd"  # one rate only means something for a plain SGD look-ahead
        self.normalize_weights = bool(defaults["normalize_weights"] if normalize_weights is None else normalize_weights)
        self.weight_floor = float(defaults["weight_floor"] if weight_floor is None else weight_floor)
        if not 0.0 <= self.weight_floor < 1.0:
            raise ValueError(f"weight_floor must be in [0, 1), got {weight_floor}.")
        if self.weight_floor and not self.normalize_weights:
            raise ValueError(
                "weight_floor mixes normalised weights with uniform ones; it needs normalize_weights=True."
            )
        self.normalize_over = defaults["normalize_over"] if normalize_over is None else normalize_over
        if self.normalize_over not in NORMALIZE_OVER:
            raise ValueError(f"normalize_over must be one of {NORMALIZE_OVER}, got {normalize_over!r}.")
        self.lookahead = defaults["lookahead"] if lookahead is None else lookahead
        self.assessor_input = defaults["assessor_input"] if assessor_input is None else assessor_input
        if self.lookahead not in LOOKAHEADS:
            raise ValueError(f"lookahead must be one of {LOOKAHEADS}, got {lookahead!r}.")
        if self.assessor_input not in ASSESSOR_INPUTS:
            raise ValueError(f"assessor_input must be one of {ASSESSOR_INPUTS}, got {assessor_input!r}.")
        if inner_learning_rate is not None and self.lookahead != "sgd":
            raise ValueError(
                "inner_learning_rate sets the rate of an SGD look-ahead; it cannot be combined "
                f"with lookahead={self.lookahead!r}."
            )

    def _init_assessor(self, optimizer_name, units, num_layers, state):
        """The LSTM assessor (reading embeddings and/or the tuple geometry) and its own optimizer."""
        geometry = self.assessor_input != "embeddings"
        self.assessor = TupleAssessor(
            tuple_size=2 if self.loss_kind == "contrastive" else 3,
            units=units,
            num_layers=num_layers,
            state=state,
            num_features=NUM_GEOMETRY_FEATURES if geometry else 0,
            use_embeddings=self.assessor_input != "geometry",
            dtype=self.dtype_policy,
            name="assessor",
        )
        self.assessor.build((None, self.embedding_dim))
        if optimizer_name == "adam":
            self.assessor_optimizer = keras.optimizers.Adam(self.assessor_learning_rate, name="assessor_adam")
        else:
            self.assessor_optimizer = keras.optimizers.SGD(self.assessor_learning_rate, name="assessor_sgd")

    def _init_margin_beta(self, learn_beta, beta_learning_rate):
        defaults = {"learn_beta": True, "beta_learning_rate": 0.1}
        if not isinstance(self.base_loss, str):
            defaults.update({key: getattr(self.base_loss, key) for key in defaults if hasattr(self.base_loss, key)})
        self.learn_beta = bool(defaults["learn_beta"] if learn_beta is None else learn_beta)
        self.beta_learning_rate = float(
            defaults["beta_learning_rate"] if beta_learning_rate is None else beta_learning_rate
        )
        if self.beta_learning_rate <= 0:
            raise ValueError(f"beta_learning_rate must be > 0, got {beta_learning_rate}.")
        self.margin_beta = None
        if self.loss_kind == "margin" and self.learn_beta:
            self.margin_beta = self.add_weight(
                shape=(), initializer="zeros", name="margin_beta", dtype=self.dtype_policy.variable_dtype
            )
            self.margin_beta.assign(self.loss_params["beta"])  # no float32 round trip in float64
            self.beta_optimizer = keras.optimizers.SGD(self.beta_learning_rate, momentum=0.9, name="margin_beta_sgd")
            self.beta_optimizer.build([self.margin_beta])

    # ----------------------------------------------------------------------------------------- Keras API
    def call(self, inputs, training=False):
        return self.embedder(inputs, training=training)

    def build(self, input_shape):
        if not self.embedder.built:
            self.embedder.build(input_shape)
        self.built = True

    def compile(self, optimizer="sgd", assessor_optimizer=None, **kwargs):
        """Keras `compile`; `assessor_optimizer` replaces the variant's assessor optimizer of eq (12)."""
        if kwargs.get("loss") is not None:
            raise ValueError("ALAModel trains with its base_loss; do not pass loss= to compile().")
        super().compile(optimizer=optimizer, **kwargs)
        if assessor_optimizer is not None:
            self.assessor_optimizer = keras.optimizers.get(assessor_optimizer)
        if not self.assessor_optimizer.built:
            self.assessor_optimizer.build(self.assessor.trainable_variables)
        # Built now (only ever on the embedder's variables): the look-ahead reads its state from step 1.
        if not self.optimizer.built:
            self.optimizer.build(self.embedder.trainable_variables)
        if self.weighting == "assessor" and self.lookahead == "optimizer":
            unmodelled = {
                type(o).__name__
                for o in _variable_optimizers(self.optimizer, self.embedder.trainable_variables)
                if not isinstance(o, (keras.optimizers.SGD, keras.optimizers.Adam))
            }
            if unmodelled:
                warnings.warn(
                    f"ALAModel(lookahead='optimizer') models SGD, Adam and AdamW; the look-ahead treats "
                    f"{sorted(unmodelled)} as SGD at its learning rate.",
                    stacklevel=2,
                )

    def get_compile_config(self):
        config = super().get_compile_config()
        if config is not None:
            config["assessor_optimizer"] = keras.saving.serialize_keras_object(self.assessor_optimizer)
        return config

    def compile_from_config(self, config):
        self.compile(**keras.saving.deserialize_keras_object(config))

    @property
    def metrics(self):
        return list(self.trackers.values())

    def reset_assessor_state(self):
        """Zeroes the assessor's carried LSTM state (for example between training phases)."""
        self.assessor.reset_state()

    def get_config(self):
        config = super().get_config()
        base_loss = (
            self.base_loss if isinstance(self.base_loss, str) else keras.saving.serialize_keras_object(self.base_loss)
        )
        config.update(
            embedder=keras.saving.serialize_keras_object(self.embedder),
            base_loss=base_loss,
            loss_params=self.loss_params if isinstance(self.base_loss, str) else None,
            variant=self.variant,
            normalize_weights=self.normalize_weights,
            weight_floor=self.weight_floor,
            normalize_over=self.normalize_over,
            lookahead=self.lookahead,
            assessor_input=self.assessor_input,
            assessor_units=self.assessor.units,
            assessor_layers=self.assessor.num_layers,
            state=self.assessor.state,
            inner_learning_rate=self.inner_learning_rate,
            assessor_learning_rate=self.assessor_learning_rate,
            assessor_steps=self.assessor_steps,
            meta_interval=self.meta_interval,
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
        config.setdefault("variant", "paper")  # saved before the variants existed: the paper's algorithm
        return cls(**config)

    # ------------------------------------------------------------------------------------- Algorithm 1
    def train_step(self, data):
        (train_x, train_y, val_x, val_y), replicas = _whole_episode(data)
        logs = self.ala_update(train_x, train_y, val_x, val_y, gradient_scale=1.0 / replicas)
        meta_step = logs.pop("meta_step", None)
        for name, tracker in self.trackers.items():
            tracker.update_state(logs[name], sample_weight=meta_step if name == "meta_loss" else None)
        return {name: tracker.result() for name, tracker in self.trackers.items()}

    def test_step(self, data):
        (_, _, val_x, val_y), _ = _whole_episode(data)
        embeddings = self.embedder(val_x, training=False)
        tuples, targets = self._make_tuples(validate_labels(val_y, "val_labels"), self._step_seed() + [0, 1])
        losses = self._tuple_losses(embeddings, tuples, targets)
        name = "meta_loss" if "meta_loss" in self.trackers else "loss"
        self.trackers[name].update_state(safe_divide(tf.reduce_sum(losses), tf.cast(tf.size(losses), losses.dtype)))
        return {name: self.trackers[name].result()}

    def ala_update(self, train_x, train_y, val_x, val_y, gradient_scale=1.0):
        """One DML-ALA step on one episode: K assessor updates (12) (on every `meta_interval`-th step),
        then the metric update (13).

        Returns a dict of scalars: the logs of the module docstring, and `meta_step` (1.0 when the
        assessor was updated and `meta_loss` is this step's, else 0.0) for an `ALAModel(weighting="assessor")`.
        """
        step = self._step_seed()
        trainer = _EpisodeDerivatives(self, train_x, train_y, val_x, val_y, step)
        logs = {}
        if self.weighting == "assessor":

            def meta_updates():
                meta_loss = None
                for _ in range(self.assessor_steps):
                    phi_grads, meta_loss = trainer.assessor_gradients()
                    self.assessor_optimizer.apply_gradients(
                        zip([g * gradient_scale for g in phi_grads], self.assessor.trainable_variables)
                    )
                if meta_loss is None:  # K = 0: the look-ahead's loss at the current weights, for the log
                    meta_loss = trainer.lookahead(trainer.applied(trainer.weights()[0]))[0]
                return meta_loss

            if self.meta_interval == 1:
                meta_loss, meta_step = meta_updates(), tf.constant(1.0)
            else:
                due = tf.equal(tf.math.floormod(tf.cast(self.optimizer.iterations, tf.int64), self.meta_interval), 0)
                meta_loss = tf.cond(due, meta_updates, lambda: tf.zeros([], trainer.losses.dtype))
                meta_step = tf.cast(due, tf.float32)
            assessed, new_state = trainer.weights()
            weights = trainer.applied(assessed)
            logs["meta_loss"] = meta_loss / tf.maximum(trainer.val_count, 1.0)
            logs["meta_step"] = meta_step
        else:
            assessed = weights = tf.ones_like(trainer.losses)
        theta_grads = trainer.theta_gradients(weights)
        self.optimizer.apply_gradients(
            zip([g * gradient_scale for g in theta_grads], self.embedder.trainable_variables)
        )
        if self.margin_beta is not None:
            beta_grad = trainer.beta_gradient(weights)
            self.beta_optimizer.apply_gradients([(beta_grad * gradient_scale, self.margin_beta)])
        for variable, value in zip(self.embedder.non_trainable_variables, trainer.new_non_trainable):
            variable.assign(value)
        if self.weighting == "assessor":
            self.assessor.advance_state(*new_state)
        logs.update(
            trainer.weight_logs(tf.cast(assessed, trainer.losses.dtype), tf.cast(weights, trainer.losses.dtype))
        )
        return logs

    def meta_gradient(self, train_x, train_y, val_x, val_y):
        """`(d L_va(theta'(phi)) / d phi, L_va(theta'(phi)))` at the current assessor, exact (eqs 10-12);
        `L_va` is the sum over the validation tuples."""
        trainer = _EpisodeDerivatives(self, train_x, train_y, val_x, val_y, self._step_seed())
        return trainer.assessor_gradients()

    def tuple_weights(self, images, labels, seed=0):
        """The weights the assessor gives now to the tuples of one training subset.

        The subset's tuples are formed as in training (triplets `(anchor, positive, negative)`, or pairs for
        the contrastive loss; at most `max_tuples`, a subset drawn with `(model seed, seed)`), the embedder
        runs in training mode as in the step (without updating its statistics) and the assessor reads them
        from its carried state, which is left as it is. The weights are those the real step (13) would use
        (divided by their mean over the active tuples with `normalize_weights`, mixed by `weight_floor`).

        Args:
            images: a training subset, `[B, ...]`.
            labels: its int labels `[B]` (the labels the assessor sees, noisy or not).
            seed: seed of the tuple subset when there are more than `max_tuples` tuples.

        Returns:
            `(tuples, weights)`: int32 `[T, 3]` (`[T, 2]` pairs for contrastive) and float `[T]`.
        """
        labels = validate_labels(tf.convert_to_tensor(labels), "labels")
        embedder = self.embedder
        embeddings, _ = embedder.stateless_call(
            [v.value for v in embedder.trainable_variables],
            [v.value for v in embedder.non_trainable_variables],
            tf.convert_to_tensor(images),
            training=True,
        )
        embeddings = tf.stop_gradient(embeddings)
        tuples, targets = self._make_tuples(labels, tf.constant([self.seed, int(seed)], tf.int64))
        losses = self._tuple_losses(embeddings, tuples, targets)
        assessed, _ = self._assess(embeddings, tuples, targets, losses)
        return tuples, self._applied_weights(assessed, losses)

    def inner_rates(self):
        """Per embedder variable, `a` of an SGD look-ahead (10): `inner_learning_rate`, else the current
        learning rate of the optimizer (or, for a multi-optimizer, of the inner optimizer) that trains it."""
        variables = self.embedder.trainable_variables
        if self.inner_learning_rate is not None:
            return [tf.constant(self.inner_learning_rate)] * len(variables)
        if getattr(self, "optimizer", None) is None:
            raise ValueError(
                "inner_learning_rate is None and the model is not compiled: compile it or set inner_learning_rate."
            )
        return [_learning_rate(o) for o in _variable_optimizers(self.optimizer, variables)]

    def lookahead_terms(self, theta, uniform_gradients):
        """`(P, o)` per embedder variable: the virtual step (10) is `theta' = theta - o - P (.) g` (module
        docstring). `theta`: the variables' values; `uniform_gradients()`: the episode's gradient with every
        weight 1 (called only for Adam-type optimizers)."""
        if self.lookahead == "sgd":
            return [tf.cast(r, t.dtype) for r, t in zip(self.inner_rates(), theta)], [None] * len(theta)
        variables = self.embedder.trainable_variables
        reference = None
        preconditioners, offsets = [], []
        for index, (variable, value, optimizer) in enumerate(
            zip(variables, theta, _variable_optimizers(self.optimizer, variables))
        ):
            dtype = value.dtype
            lr = tf.cast(_learning_rate(optimizer), dtype)
            offset = None
            if isinstance(optimizer, keras.optimizers.Adam):
                if reference is None:
                    reference = uniform_gradients()
                # Constants rounded as Keras' update_step rounds them (it casts the betas' powers and adds
                # the Python floats 1 - beta and epsilon): the virtual step is the real one to the last bit.
                slot = optimizer._get_variable_index(variable)
                t = tf.cast(optimizer.iterations + 1, dtype)
                alpha = (
                    lr
                    * tf.sqrt(1 - tf.pow(tf.cast(optimizer.beta_2, dtype), t))
                    / (1 - tf.pow(tf.cast(optimizer.beta_1, dtype), t))
                )
                new_m = tf.constant(1 - optimizer.beta_1, dtype)  # m_t = m + (g - m) (1 - beta_1)
                m = tf.cast(optimizer._momentums[slot], dtype)
                v = tf.cast(optimizer._velocities[slot], dtype)
                v = v + (tf.square(reference[index]) - v) * tf.constant(1 - optimizer.beta_2, dtype)
                if optimizer.amsgrad:
                    v = tf.maximum(tf.cast(optimizer._velocity_hats[slot], dtype), v)
                denominator = tf.sqrt(v) + tf.constant(optimizer.epsilon, dtype)
                preconditioner = alpha * new_m / denominator
                offset = alpha * (m - m * new_m) / denominator
            elif isinstance(optimizer, keras.optimizers.SGD) and optimizer.momentum:
                momentum = tf.cast(optimizer.momentum, dtype)
                velocity = tf.cast(optimizer.momentums[optimizer._get_variable_index(variable)], dtype)
                if optimizer.nesterov:
                    preconditioner, offset = lr * (1 + momentum), -momentum * momentum * velocity
                else:
                    preconditioner, offset = lr, -momentum * velocity
            else:
                preconditioner = lr
            if optimizer.weight_decay and optimizer._use_weight_decay(variable):
                decay = lr * tf.cast(optimizer.weight_decay, dtype) * value
                offset = decay if offset is None else offset + decay
            preconditioners.append(preconditioner)
            offsets.append(offset)
        return preconditioners, offsets

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

    def _tuple_features(self, embeddings, tuples, targets, losses):
        """Geometry of each tuple, `[T, 3]`, standardised over the step's tuples: `(d_ap, d_an, loss)`, for
        pairs `(d, loss, +-1)`. Constants (gradients stopped), like the embeddings the assessor reads."""
        embeddings, losses = tf.stop_gradient(embeddings), tf.stop_gradient(losses)
        distances = pairwise_distance(embeddings)
        if self.loss_kind == "contrastive":
            d = tf.gather_nd(distances, tuples)
            features = tf.stack([d, losses, tf.cast(tf.where(targets, 1, -1), d.dtype)], axis=1)
        else:
            d_ap, d_an = triplet_distances(distances, tuples)
            features = tf.stack([d_ap, d_an, losses], axis=1)
        count = tf.maximum(tf.cast(tf.shape(features)[0], features.dtype), 1.0)
        mean = tf.reduce_sum(features, axis=0) / count
        std = tf.sqrt(tf.reduce_sum(tf.square(features - mean), axis=0) / count)
        return (features - mean) / (std + 1e-6)

    def _assess(self, embeddings, tuples, targets, losses):
        """The assessor's outputs `A_i` in (0, 1) and its new state, from the input `assessor_input` names."""
        embeddings = tf.stop_gradient(embeddings)
        features = None
        if self.assessor_input != "embeddings":
            features = self._tuple_features(embeddings, tuples, targets, losses)
        return self.assessor(embeddings, tuples, features)

    def _applied_weights(self, assessed, losses):
        """The weights of (10) and (13): the assessor's outputs, with `normalize_weights` divided by their
        mean over the active tuples (`L_i > 0`; the normalisation is differentiable: the meta-gradient goes
        through it), then mixed with uniform weights by `weight_floor`."""
        if not self.normalize_weights:
            return assessed
        # Only tuples with a loss move theta: normalising over all of them would let the assessor shrink the
        # step by parking weight on tuples whose hinge is inactive (a step size again, in disguise).
        active = tf.cast(tf.stop_gradient(losses) > 0, assessed.dtype)
        if self.normalize_over == "all":
            active = tf.ones_like(active)
        count = tf.reduce_sum(active)
        normalised = safe_divide(assessed * count, tf.reduce_sum(assessed * active))
        if not self.weight_floor:
            return normalised
        return self.weight_floor + (1.0 - self.weight_floor) * normalised


class _EpisodeDerivatives:
    """The quantities of one episode that eqs (10)-(13) share: the training forward pass at theta (kept on
    a persistent tape for the repeated vector-Jacobian products), tuples and per-tuple losses, and the
    look-ahead's preconditioner and offset (computed once, constants in phi)."""

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
                self.theta, self.non_trainable, train_x, training=True
            )
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
        self._lookahead = None

    def weights(self):
        """The assessor's outputs `A_i` for this episode's tuples and its new state."""
        return self.model._assess(self.embeddings, self.tuples, self.targets, self.losses)

    def applied(self, assessed):
        return self.model._applied_weights(assessed, self.losses)

    def lookahead_terms(self):
        """`(P, o)` of the virtual step (module docstring), computed on first use."""
        if self._lookahead is None:
            self._lookahead = self.model.lookahead_terms(
                self.theta, lambda: self.theta_gradients(tf.ones_like(self.losses))
            )
        return self._lookahead

    def theta_gradients(self, weights):
        """`grad_theta sum_i w_i L_i(theta)` with `w` constant (eqs 10 and 13), as one VJP."""
        upstream = tf.cast(tf.stop_gradient(weights), self.losses.dtype)
        embedding_grad = self.loss_tape.gradient(
            self.losses, self.embeddings, output_gradients=upstream, unconnected_gradients=tf.UnconnectedGradients.ZERO
        )
        return self.theta_tape.gradient(
            self.embeddings,
            self.theta,
            output_gradients=embedding_grad,
            unconnected_gradients=tf.UnconnectedGradients.ZERO,
        )

    def beta_gradient(self, weights):
        """Gradient in `beta` of the weighted margin loss normalised like `MarginLoss`, by the (weighted)
        number of active terms `sum_i w_i (#(pos_i > 0) + #(neg_i > 0))`: beta's own SGD(0.1, 0.9) takes
        steps of the usual size whatever the number of tuples and whatever the mean weight (weights all c
        give `MarginLoss`'s step, as weights 1 do)."""
        upstream = tf.cast(tf.stop_gradient(weights), self.losses.dtype)
        grad = self.loss_tape.gradient(
            self.losses, self.beta, output_gradients=upstream, unconnected_gradients=tf.UnconnectedGradients.ZERO
        )
        d_ap, d_an = triplet_distances(pairwise_distance(self.embeddings), self.tuples)
        alpha = self.model.loss_params["alpha"]
        active = tf.cast(d_ap - self.beta + alpha > 0, grad.dtype) + tf.cast(self.beta - d_an + alpha > 0, grad.dtype)
        return tf.cast(safe_divide(grad, tf.reduce_sum(upstream * active)), self.model.margin_beta.dtype)

    def lookahead(self, weights):
        """Validation loss (sum over tuples) at `theta' = theta - o - P (.) grad(...)` (eqs 10-11) and its
        gradient w.r.t. theta'."""
        grads = self.theta_gradients(weights)
        preconditioners, offsets = self.lookahead_terms()
        theta_prime = [
            t - p * g if o is None else t - o - p * g for t, p, o, g in zip(self.theta, preconditioners, offsets, grads)
        ]
        with tf.GradientTape() as tape:
            tape.watch(theta_prime)
            val_embeddings, _ = self.model.embedder.stateless_call(
                theta_prime, self.non_trainable, self.val_x, training=True
            )
            val_losses = self.model._tuple_losses(val_embeddings, self.val_tuples, self.val_targets, self.beta)
            meta_loss = tf.reduce_sum(val_losses)
        val_grads = tape.gradient(meta_loss, theta_prime, unconnected_gradients=tf.UnconnectedGradients.ZERO)
        return meta_loss, val_grads

    def assessor_gradients(self):
        """Exact `d L_va(theta'(phi)) / d phi` (module docstring) and `L_va(theta'(phi))`."""
        assessor = self.model.assessor
        with tf.GradientTape() as tape:
            weights = self.applied(self.weights()[0])
        meta_loss, val_grads = self.lookahead(weights)
        # J (P g): how the training embeddings move along the preconditioned validation gradient.
        tangents = [p * g for p, g in zip(self.lookahead_terms()[0], val_grads)]
        with tf.autodiff.ForwardAccumulator(self.theta, tangents) as accumulator:
            embeddings, _ = self.model.embedder.stateless_call(
                self.theta, self.non_trainable, self.train_x, training=True
            )
        embedding_tangent = accumulator.jvp(embeddings, unconnected_gradients=tf.UnconnectedGradients.ZERO)
        # c_i = <dL_i/dE, J P g> = <grad_theta L_i, P g>.
        with tf.autodiff.ForwardAccumulator(self.embeddings, embedding_tangent) as accumulator:
            losses = self.model._tuple_losses(self.embeddings, self.tuples, self.targets, self.beta)
        alignment = tf.stop_gradient(accumulator.jvp(losses, unconnected_gradients=tf.UnconnectedGradients.ZERO))
        with tape:
            surrogate = -tf.reduce_sum(tf.cast(weights, alignment.dtype) * alignment)
        phi_grads = tape.gradient(
            surrogate, assessor.trainable_variables, unconnected_gradients=tf.UnconnectedGradients.ZERO
        )
        return phi_grads, meta_loss

    def weight_logs(self, assessed, weights):
        """Per-tuple means of the step (module docstring): loss (with the applied weights), the assessor's
        output mean/variance, hardness."""
        count = self.count
        mean = safe_divide(tf.reduce_sum(assessed), count)
        logs = {
            "loss": safe_divide(tf.reduce_sum(weights * self.losses), count),
            "weight_mean": mean,
            "weight_variance": safe_divide(tf.reduce_sum(tf.square(assessed - mean)), count),
        }
        if self.model.loss_kind != "contrastive":
            ratio = tf.stop_gradient(triplet_hardness(self.embeddings, self.tuples))
            logs["hardness"] = safe_divide(tf.reduce_sum(ratio), count)
            logs["weighted_hardness"] = safe_divide(tf.reduce_sum(assessed * ratio), count)
            logs["hardness_ratio"] = safe_divide(logs["weighted_hardness"], mean * logs["hardness"])
        return logs


def _variable_optimizers(optimizer, variables):
    """The plain optimizer that updates each variable (through loss-scale wrappers and multi-optimizers)."""
    while isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        optimizer = optimizer.inner_optimizer
    if isinstance(optimizer, keras.optimizers.MultiOptimizer):
        return [optimizer._optimizer_map(v) for v in variables]
    return [optimizer] * len(variables)


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
        raise ValueError(
            "ALAModel trains on episodes (train_images, train_labels, val_images, val_labels) "
            "from tfdml.data.episode_dataset; got "
            f"{type(data).__name__} of length {len(data) if hasattr(data, '__len__') else '?'}."
        )
    return tuple(data)


def ala_training(
    embedder,
    source,
    steps,
    base_loss="triplet",
    weighting="assessor",
    optimizer=None,
    episode=None,
    image_size=None,
    augment=False,
    preprocess=None,
    seed=0,
    **ala_kwargs,
):
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
    dataset = data_lib.episode_dataset(
        source, image_size=image_size, augment=augment, preprocess=preprocess, seed=seed, **episode
    ).take(int(steps))
    return model, dataset
