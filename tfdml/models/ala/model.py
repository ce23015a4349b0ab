"""`ALAModel`, the Keras model that trains an embedder with DML-ALA, and `ala_training` (package docstring)."""

import dataclasses
import inspect
import warnings

import keras
import tensorflow as tf

from tfdml import ala_options as options
from tfdml import data as data_lib
from tfdml.distribute import gather_replicas, num_replicas
from tfdml.losses import MetricLoss
from tfdml.losses.aliases import loss_class
from tfdml.models.ala.episode import EpisodeDerivatives
from tfdml.models.ala.lookahead import moved_positions, unmodelled_optimizers
from tfdml.models.assessor import TupleAssessor
from tfdml.ops import reduce_terms, safe_divide, term_coefficients
from tfdml.optimizers import build_optimizer

NUM_GEOMETRY_FEATURES = 3


def resolve_base_loss(base_loss, loss_params=None, argument="base_loss", params_argument="loss_params"):
    """The tfdml loss ALA weights: a short name of `tfdml.ala_options.BASE_LOSSES` (built with `loss_params`,
    the loss's own arguments) or a tfdml loss instance that lists per-tuple terms (`argument` and
    `params_argument` name them in errors)."""
    if isinstance(base_loss, str):
        if base_loss not in options.BASE_LOSSES:
            raise ValueError(
                f"{argument} must be one of {list(options.BASE_LOSSES)} or a tfdml loss with per-tuple terms "
                f"(TripletLoss, MarginLoss, ContrastiveLoss), got {base_loss!r}."
            )
        cls = loss_class(base_loss)
        params = dict(loss_params or {})
        accepted = set(inspect.signature(cls).parameters) - {"kwargs", "name"}
        unknown = sorted(set(params) - accepted)
        if unknown:
            raise ValueError(
                f"Unknown parameters {unknown} for {argument} {base_loss!r}; expected some of {sorted(accepted)}."
            )
        return cls(**params)
    if loss_params:
        raise ValueError(
            f"{params_argument} sets the arguments of a {argument} given by name; this one is an instance."
        )
    if not isinstance(base_loss, MetricLoss) or base_loss.tuple_kind is None:
        raise ValueError(
            f"{argument} {type(base_loss).__name__} has no per-tuple terms; use one of "
            f"{list(options.BASE_LOSSES)} or a tfdml TripletLoss, MarginLoss or ContrastiveLoss."
        )
    return base_loss


def resolve_validation_loss(validation_loss, params, base_loss):
    """The loss of the validation subset, `L_va`: the base loss (None) or another loss with per-tuple terms and
    no trainable variables (nothing trains them: the validation loss only scores the virtual step)."""
    if validation_loss is None:
        if params:
            raise ValueError("validation_loss_params sets the arguments of a validation_loss given by name; none is.")
        return base_loss
    loss = resolve_base_loss(validation_loss, params, "validation_loss", "validation_loss_params")
    if loss.trainable_variables:
        raise ValueError(
            f"validation_loss {type(loss).__name__} has trainable variables, which nothing would train; "
            "give it fixed values (e.g. MarginLoss(learn_beta=False)) or leave validation_loss None."
        )
    return loss


_SWITCHES = tuple(field.name for field in dataclasses.fields(options.ALAOptions))


def _pair_keys(indices):
    """One int64 key per `(anchor, positive)` of triplet rows `[T, 3]` (rows are below 2**31)."""
    return tf.cast(indices[:, 0], tf.int64) * (2**31) + tf.cast(indices[:, 1], tf.int64)


def _embedding_size(embedder):
    """The embedder's output size: a tfdml embedder's `output_dim`, else its built output shape."""
    size = getattr(embedder, "output_dim", None)
    if size is None:
        try:
            size = embedder.output_shape[-1]
        except (AttributeError, ValueError):
            size = None
    return size


@keras.saving.register_keras_serializable(package="tfdml")
class ALAModel(keras.Model):
    """Metric model trained with DML-ALA (package docstring: formulas, variants, exactness, logs, distribution).

    Args:
        embedder: Keras model mapping images to (L2-normalised) embeddings `[B, D]` (a tfdml `Embedder` or any
            built Keras model). `predict` and calls return its embeddings.
        base_loss: the loss whose tuples are weighted, as a user compiles it: "triplet", "margin",
            "contrastive" (built with `loss_params`) or a `TripletLoss` / `MarginLoss` / `ContrastiveLoss`
            instance. With every weight 1 the real step is exactly that loss's step; its variables (the margin
            loss's `beta`) are trained by its own optimizer.
        loss_params: arguments of a base loss given by name.
        validation_loss: the loss `L_va` of the validation subset, which the look-ahead scores (eq 11): None
            (default: the base loss), a name of `tfdml.ala_options.BASE_LOSSES` (built with
            `validation_loss_params`) or a tfdml loss with per-tuple terms and no trainable variables, for
            example the base loss with a wider negative margin, so that the validation loss also pays for
            classes coming closer (the label-noise benchmark's finding).
        validation_loss_params: arguments of a validation loss given by name.
        embedding_dim: embedding size, when the embedder does not tell it.
        **kwargs: DML-ALA's switches (`variant`, `weights`, `temperature`, ..., `assessed`), each declared (type,
            default, range) and described once, in `tfdml.ala_options.ALAOptions` (the configuration reference's
            `ala.params` lists them with their descriptions); None takes the variant's choice. The other keywords
            go to `keras.Model`.

    Example:
        >>> model = ALAModel(tfdml.models.Embedder("small_cnn", embedding_dim=64), base_loss="contrastive")
        >>> model.compile(optimizer=keras.optimizers.Adam(1e-3))
        >>> model.fit(tfdml.data.episode_dataset(source, **tfdml.ala_options.episode_sizes(22, 3)).take(600))
        >>> tuples, weights = model.tuple_weights(images[:66], labels[:66])   # what the assessor learnt
    """

    def __init__(
        self,
        embedder,
        base_loss="triplet",
        loss_params=None,
        embedding_dim=None,
        validation_loss=None,
        validation_loss_params=None,
        **kwargs,
    ):
        # The switches are declared once, in tfdml.ala_options.ALAOptions; the rest of kwargs go to keras.Model.
        switches = {name: kwargs.pop(name) for name in _SWITCHES if name in kwargs}
        super().__init__(**kwargs)
        if not isinstance(embedder, (keras.Model, keras.layers.Layer)):
            raise TypeError(f"embedder must be a Keras model or layer, got {type(embedder).__name__}.")
        self.embedder = embedder
        self.base_loss = resolve_base_loss(base_loss, loss_params)
        self.validation_loss = resolve_validation_loss(validation_loss, validation_loss_params, self.base_loss)
        # Read where they are used (`self.options.X`), never copied: one place holds each switch's value.
        self.options = chosen = options.ALAOptions(**switches).resolved()
        if embedder.built and self.options.weighting == "assessor":
            moved_positions(embedder, self.options.lookahead_variables)  # a "head" it lacks fails here, not in fit
        embedding_dim = embedding_dim if embedding_dim is not None else _embedding_size(embedder)
        if embedding_dim is None:
            raise ValueError(
                "The embedding size of the embedder is unknown: build the embedder (give it an Input), use a "
                "tfdml embedder, or pass embedding_dim=..."
            )
        self.embedding_dim = int(embedding_dim)
        assessor_optimizer = options.VARIANTS[self.options.variant]["assessor_optimizer"]
        self._init_assessor(assessor_optimizer, chosen.assessor_units, chosen.assessor_layers, chosen.state)
        self._init_loss_variables()
        names = ["loss"]
        if self.options.weighting == "assessor":
            names += ["meta_loss", "weight_mean", "weight_variance"]
            if self.options.weights == "softmax":
                names += ["output_std"]
        if self.options.distance_cut is not None:
            names += ["cut_fraction"]
        if self.base_loss.tuple_kind == "triplet":
            names += ["hardness"] + (
                ["weighted_hardness", "hardness_ratio"] if self.options.weighting == "assessor" else []
            )
        self.trackers = {name: keras.metrics.Mean(name=name) for name in names}
        # Every weight exists now (the embedder is built): Keras' symbolic build, which assumes
        # (x, y, sample_weight) batches rather than episodes, is never needed.
        self.built = True

    def _init_assessor(self, optimizer_name, units, num_layers, state):
        geometry = self.options.assessor_input != "embeddings"
        self.assessor = TupleAssessor(
            tuple_size=2 if self.base_loss.tuple_kind == "pair" or self.options.assessed == "positive_pairs" else 3,
            units=units,
            num_layers=num_layers,
            state=state,
            num_features=NUM_GEOMETRY_FEATURES if geometry else 0,
            use_embeddings=self.options.assessor_input != "geometry",
            activation="sigmoid" if self.options.weights == "sigmoid" else "centred",
            dtype=self.dtype_policy,
            name="assessor",
        )
        self.assessor.build((None, self.embedding_dim))
        if optimizer_name == "adam":
            self.assessor_optimizer = keras.optimizers.Adam(self.options.assessor_learning_rate, name="assessor_adam")
        else:
            self.assessor_optimizer = keras.optimizers.SGD(self.options.assessor_learning_rate, name="assessor_sgd")

    def _init_loss_variables(self):
        """The base loss's variables (the margin loss's `beta`) become the model's (saved, checkpointed) and
        are trained by the loss's own optimizer, as `MetricModel` does."""
        loss = self.base_loss
        self.loss_variables = list(loss.trainable_variables)
        for variable in self.loss_variables + list(loss.non_trainable_variables):
            self._track_variable(variable)
        self.loss_optimizer = loss.variable_optimizer if self.loss_variables else None
        if self.loss_variables and self.loss_optimizer is None:
            raise ValueError(f"base_loss {type(loss).__name__} has variables but no variable_optimizer to train them.")
        if self.loss_optimizer is not None:
            self.loss_optimizer.build(self.loss_variables)

    @property
    def lookahead_positions(self):
        """Positions, in the embedder's trainable variables, of those the virtual step moves
        (`lookahead_variables`: all, or the embedder's head, `tfdml.models.ala.lookahead.moved_positions`)."""
        return moved_positions(self.embedder, self.options.lookahead_variables)

    # ------------------------------------------------------------------------------- weights, reduction
    def weights_from_outputs(self, outputs):
        """The applied weights of the assessed tuples from the assessor's outputs (package docstring)."""
        return self.weights_from_logits(self.bounded_logits(outputs))

    def bounded_logits(self, outputs):
        """The softmax logits within `weight_range` (the outputs themselves for sigmoid weights or no bound)."""
        if self.options.weights == "sigmoid" or self.options.weight_range is None:
            return outputs
        return self.options.weight_range * tf.tanh(
            outputs / self.options.weight_range
        )  # no weight beyond exp(2 r / T) x another

    def weights_from_logits(self, logits):
        """The applied weights from the bounded logits (centred): `n softmax(z / T)`, floored; sigmoid: themselves."""
        if self.options.weights == "sigmoid":
            return logits
        weights = tf.cast(tf.size(logits), logits.dtype) * tf.nn.softmax(logits / self.options.temperature)
        return (
            self.options.weight_floor + (1.0 - self.options.weight_floor) * weights
            if self.options.weight_floor
            else weights
        )

    def assessed_tuples(self, terms, labels):
        """Positions of the terms the assessor weights: with the loss's reduction, those whose weight can
        change it (a zero term with a zero divisor adds nothing to the sum or to the count); all with sums;
        of those, for a pair loss with `assessed="positive_pairs"`, the positive pairs only."""
        if self.options.reduction == "sum":
            matters = tf.ones_like(terms.values, tf.bool)
        else:
            matters = tf.logical_or(terms.term_divisors() > 0, tf.not_equal(tf.stop_gradient(terms.values), 0))
        if self.options.assessed == "positive_pairs" and terms.kind == "pair":
            pairs = tf.gather(labels, terms.indices)
            matters = tf.logical_and(matters, tf.equal(pairs[:, 0], pairs[:, 1]))
        elif (
            self.options.assessed == "positive_pairs"
        ):  # every triplet of an anchor-positive pair with one that matters
            keys, pair_of = tf.unique(_pair_keys(terms.indices))
            pair_matters = tf.math.unsorted_segment_max(tf.cast(matters, tf.int32), pair_of, tf.size(keys))
            matters = tf.gather(pair_matters, pair_of) > 0
        return tf.cast(tf.where(matters)[:, 0], tf.int32)

    def assessed_units(self, terms, assessed):
        """`(units, unit_of)`: what the assessor gives one weight each, as rows of the batch (`[U, 2]` pairs or
        `[U, 3]` triplets), and the unit of each assessed term (`[A]`). One unit per assessed term, except for
        a triplet loss with `assessed="positive_pairs"`: its units are the anchor-positive pairs, and every
        triplet of a pair shares the pair's weight (under label noise a mislabelled positive pair is what
        is wrong, whatever the negative)."""
        indices = tf.gather(terms.indices, assessed)
        if self.options.assessed != "positive_pairs" or terms.kind == "pair":
            return indices, tf.range(tf.shape(indices)[0], dtype=tf.int32)
        keys, unit_of = tf.unique(_pair_keys(indices))
        first = tf.math.unsorted_segment_min(tf.range(tf.shape(indices)[0]), unit_of, tf.size(keys))
        return tf.gather(indices[:, :2], first), unit_of

    def coefficients(self, terms, weights):
        """`d L(w) / d term_i`, differentiable in the weights: the loss's reduction, or the weights (sums)."""
        if self.options.reduction == "sum":
            return tf.cast(weights, terms.values.dtype)
        return term_coefficients(terms, weights)

    def reduce(self, terms, weights=None):
        """The loss of `terms` with `weights` (None: every weight 1; with the loss's reduction, its value)."""
        if self.options.reduction == "loss":
            return reduce_terms(terms, weights)
        return tf.reduce_sum(terms.values if weights is None else tf.cast(weights, terms.values.dtype) * terms.values)

    def loss_log(self, terms, weights):
        """The logged `loss`: the weighted loss (with sums, per tuple)."""
        value = self.reduce(terms, weights)
        if self.options.reduction == "sum":
            value = safe_divide(value, tf.cast(tf.size(terms.values), value.dtype))
        return tf.stop_gradient(value)

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
        if self.options.weighting == "assessor" and self.options.lookahead == "optimizer":
            unmodelled = unmodelled_optimizers(self.optimizer, self.embedder.trainable_variables)
            if unmodelled:
                warnings.warn(
                    f"ALAModel(lookahead='optimizer') models SGD, Adam and AdamW; the look-ahead treats "
                    f"{unmodelled} as SGD at its learning rate.",
                    stacklevel=2,
                )

    def fit(self, x=None, y=None, *args, shuffle=False, **kwargs):
        """Keras `fit` on episodes; `shuffle` defaults to False: the episodes come drawn from their sampler
        (a `tf.data` pipeline, which Keras would not shuffle anyway and warns about)."""
        return super().fit(x, y, *args, shuffle=shuffle, **kwargs)

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
        config.update(
            embedder=keras.saving.serialize_keras_object(self.embedder),
            base_loss=keras.saving.serialize_keras_object(self.base_loss),
            validation_loss=None
            if self.validation_loss is self.base_loss
            else keras.saving.serialize_keras_object(self.validation_loss),
            **self.options.saved(),
            embedding_dim=self.embedding_dim,
        )
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        # A model saved with the distance prior at its default (0: none) is this model; one that used the prior is not.
        prior = config.pop("distance_prior", 0.0)
        if prior:
            raise ValueError(
                f"this ALAModel was saved with distance_prior={prior}, a DML-ALA switch this version of tfdml no "
                "longer has (it was measured of no use: the label-noise benchmark)."
            )
        config["embedder"] = keras.saving.deserialize_keras_object(config["embedder"])
        config["base_loss"] = keras.saving.deserialize_keras_object(config["base_loss"])
        if config.get("validation_loss") is not None:
            config["validation_loss"] = keras.saving.deserialize_keras_object(config["validation_loss"])
        return cls(**config)

    # ------------------------------------------------------------------------------------- Algorithm 1
    # Not converted by AutoGraph: the step has no Python control flow on tensors (meta_interval's is a tf.cond),
    # and converting it and everything it calls took most of the time of tracing it.
    @tf.autograph.experimental.do_not_convert
    def train_step(self, data):
        (train_x, train_y, val_x, val_y), replicas = _whole_episode(data)
        logs = self.ala_update(train_x, train_y, val_x, val_y, gradient_scale=1.0 / replicas)
        meta_step = logs.pop("meta_step", None)
        for name, tracker in self.trackers.items():
            tracker.update_state(logs[name], sample_weight=meta_step if name == "meta_loss" else None)
        return {name: tracker.result() for name, tracker in self.trackers.items()}

    @tf.autograph.experimental.do_not_convert
    def test_step(self, data):
        (_, _, val_x, val_y), _ = _whole_episode(data)
        embeddings = self.embedder(val_x, training=False)
        value = self.reduce(self.validation_loss.terms(tf.cast(val_y, tf.int32), embeddings))
        name = "meta_loss" if "meta_loss" in self.trackers else "loss"
        self.trackers[name].update_state(value)
        return {name: self.trackers[name].result()}

    def ala_update(self, train_x, train_y, val_x, val_y, gradient_scale=1.0):
        """One DML-ALA step on one episode: K assessor updates (12) (on every `meta_interval`-th step), then
        the real update (13). Returns the logs of the package docstring and `meta_step` (1.0 when the assessor
        was updated and `meta_loss` is this step's, else 0.0) for `weighting="assessor"`."""
        episode = EpisodeDerivatives(self, train_x, train_y, val_x, val_y)
        logs, raw = {}, None
        if self.options.weighting == "assessor":

            def meta_updates():
                meta_loss = None
                for _ in range(self.options.assessor_steps):
                    phi_grads, meta_loss = episode.assessor_gradients()
                    self.assessor_optimizer.apply_gradients(
                        zip([g * gradient_scale for g in phi_grads], self.assessor.trainable_variables)
                    )
                if meta_loss is None:  # K = 0: the look-ahead's loss at the current weights, for the log
                    meta_loss = episode.lookahead(episode.weights()[0])[0]
                return meta_loss

            if self.options.meta_interval == 1:
                meta_loss, meta_step = meta_updates(), tf.constant(1.0)
            else:
                due = tf.equal(
                    tf.math.floormod(tf.cast(self.optimizer.iterations, tf.int64), self.options.meta_interval), 0
                )
                meta_loss = tf.cond(due, meta_updates, lambda: tf.zeros([], episode.values.dtype))
                meta_step = tf.cast(due, tf.float32)
            weights, raw, new_state = episode.weights()
            logs["meta_loss"] = self.loss_log_scale(meta_loss, val_y)
            logs["meta_step"] = meta_step
        else:
            weights = tf.ones_like(episode.values)
        theta_grads, loss_grads = episode.gradients(weights)
        theta_grads = [g * gradient_scale for g in theta_grads]
        self.optimizer.apply_gradients(zip(theta_grads, self.embedder.trainable_variables))
        if self.loss_variables:
            grads = [tf.cast(g * gradient_scale, v.dtype) for g, v in zip(loss_grads, self.loss_variables)]
            self.loss_optimizer.apply_gradients(zip(grads, self.loss_variables))
        for variable, value in zip(self.embedder.non_trainable_variables, episode.new_non_trainable):
            variable.assign(value)
        if self.options.weighting == "assessor":
            self.assessor.advance_state(*new_state)
        logs.update(episode.logs(weights, raw))
        return {name: value for name, value in logs.items() if name in self.trackers or name == "meta_step"}

    def loss_log_scale(self, meta_loss, val_y):
        """The logged validation loss: the validation loss's value, or with sums the sum per validation image."""
        if self.options.reduction == "loss":
            return meta_loss
        return safe_divide(meta_loss, tf.cast(tf.shape(val_y)[0], meta_loss.dtype))

    def meta_gradient(self, train_x, train_y, val_x, val_y):
        """`(d L_va(theta'(phi)) / d phi, L_va(theta'(phi)))` at the current assessor, exact (eqs 10-12)."""
        return EpisodeDerivatives(self, train_x, train_y, val_x, val_y).assessor_gradients()

    def tuple_weights(self, images, labels):
        """`(tuples, weights)`: the base loss's tuples of one training subset (int32 `[T, 3]`, `[T, 2]` pairs)
        and the weights the real step (13) would give them now (1 where a weight cannot change the loss).
        The embedder runs in training mode as in the step, without updating its statistics; the assessor
        reads them from its carried state, which is left as it is."""
        episode = EpisodeDerivatives(self, tf.convert_to_tensor(images), tf.convert_to_tensor(labels))
        return episode.terms.indices, episode.weights()[0]


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


def _paper_optimizer(embedder):
    """The paper's rates: Adam 1e-4, the new layers of a tfdml embedder at 10x."""
    head = 10.0 if hasattr(embedder, "head_variables") else 1.0
    return build_optimizer("adam", 1e-4, head_lr_multiplier=head, model=embedder)


def ala_training(
    embedder,
    source,
    steps,
    base_loss="triplet",
    weighting="assessor",
    optimizer=None,
    classes_per_batch=20,
    samples_per_class=5,
    val_classes=None,
    val_source=None,
    episode=None,
    image_size=None,
    augment=False,
    preprocess=None,
    seed=0,
    **ala_kwargs,
):
    """A compiled `ALAModel` and its episodes, ready for `model.fit(dataset)`: DML-ALA, or its baseline.

    The training subset of each episode is the batch the base loss would train on, `classes_per_batch x
    samples_per_class` images; the validation subset is drawn in addition (`val_classes`, default one class
    per 5 training classes, labels disjoint from the training subset): `tfdml.ala_options.episode_sizes`.
    `weighting="uniform"` is the base loss itself on the same batches (the validation images unused).

    Args:
        embedder: a tfdml embedder (e.g. `Embedder("resnet50", embedding_dim=512)`) or a built Keras model.
        source: a `tfdml.data.Source` of the training classes.
        steps: step budget; the dataset holds exactly `steps` episodes (one epoch).
        base_loss: a name or tfdml loss instance, see `ALAModel`.
        weighting: "assessor" (DML-ALA) or "uniform" (the base loss).
        optimizer: the embedder's optimizer (None: the paper's rates, Adam 1e-4 with the new layers at 10x for
            a tfdml embedder).
        classes_per_batch, samples_per_class, val_classes: the episode's sizes (defaults: the paper's 20 x 5
            training images and 4 x 5 validation images).
        val_source: a `tfdml.data.Source` of images whose labels were verified, the validation subsets' source
            (default None: `source` itself). Under label noise this is what makes the assessor's signal
            trustworthy (the DML-ALA guide's label-noise section).
        episode: further `episode_dataset` arguments (they override the sizes; `disjoint_labels=False` for
            Table 1's random episodes).
        image_size, augment, preprocess: as for `episode_dataset`.
        seed: seed of the episodes.
        **ala_kwargs: further `ALAModel` arguments.

    Returns:
        `(model, dataset)`.

    Example:
        >>> model, episodes = ala_training(Embedder("small_cnn", embedding_dim=64), source, 600,
        ...                                base_loss="contrastive", classes_per_batch=22, samples_per_class=3)
        >>> model.fit(episodes)
    """
    model = ALAModel(embedder, base_loss=base_loss, weighting=weighting, **ala_kwargs)
    model.compile(optimizer=_paper_optimizer(embedder) if optimizer is None else optimizer)
    arguments = {**options.episode_sizes(classes_per_batch, samples_per_class, val_classes), **dict(episode or {})}
    loading = dict(image_size=image_size, augment=augment, preprocess=preprocess)
    dataset = data_lib.episode_dataset(source, seed=seed, val_source=val_source, **loading, **arguments)
    # The sampler is endless: exactly `steps` episodes, a size Keras can read (else it warns that the input ran out).
    return model, dataset.take(int(steps)).apply(tf.data.experimental.assert_cardinality(int(steps)))
