"""The derivatives of one DML-ALA episode (eqs 10-13): what the assessor updates and the real step share.

The training forward pass at theta is kept on a persistent tape (`theta_tape`) for repeated vector-Jacobian
products, and the base loss's terms on another (`loss_tape`): `loss.terms(labels, embeddings)` lists the
tuples and their unreduced values once per episode, and every weighted loss of the episode is the base loss's
own reduction of those terms (`weighted_loss`). The look-ahead's `(P, o)` is computed once (constants in phi),
and so are the assessor's geometry features. The meta-gradient's Jacobian-vector product is the transpose of
the look-ahead's vector-Jacobian product (`assessor_gradients`): the embedder runs forward on the training
subset once per episode.

The virtual step moves the variables at `model.lookahead_positions` (all of them, or with
`lookahead_variables="head"` the embedder's head only): every vector-Jacobian product of the look-ahead takes
those as its sources (`moved`), so that with the head alone the tape backpropagates through the head alone.
"""

import tensorflow as tf

from tfdml.losses.noise import positive_distance_quantile, positive_pairs_beyond, terms_without_pairs
from tfdml.models.ala.lookahead import lookahead_terms
from tfdml.ops import pairwise_distance, positive_mask, safe_divide, triplet_distances, validate_labels

ZERO = tf.UnconnectedGradients.ZERO


class EpisodeDerivatives:
    """One episode `(train_x, train_y, val_x, val_y)` of an `ALAModel` (package docstring)."""

    def __init__(self, model, train_x, train_y, val_x=None, val_y=None):
        self.model = model
        embedder = model.embedder
        self.train_x, self.val_x = train_x, val_x
        self.train_y = validate_labels(train_y, "train_labels")
        self.val_y = None if val_y is None else validate_labels(val_y, "val_labels")
        self.theta = [v.value for v in embedder.trainable_variables]
        self.positions = list(model.lookahead_positions)
        self.moved = [self.theta[i] for i in self.positions]  # what the virtual step moves
        self.non_trainable = [v.value for v in embedder.non_trainable_variables]
        with tf.GradientTape(persistent=True) as self.theta_tape:
            self.theta_tape.watch(self.theta)
            self.embeddings, self.new_non_trainable = embedder.stateless_call(
                self.theta, self.non_trainable, train_x, training=True
            )
        self.cut = self.cut_pairs() if model.options.distance_cut is not None and val_x is not None else None
        with tf.GradientTape(persistent=True) as self.loss_tape:
            self.loss_tape.watch(self.embeddings)
            self.terms = model.base_loss.terms(self.train_y, self.embeddings)
            if self.cut is not None:
                self.terms = terms_without_pairs(self.terms, self.cut)
        self.values = self.terms.values
        self.assessed = model.assessed_tuples(self.terms, self.train_y)
        self.units, self.unit_of = model.assessed_units(self.terms, self.assessed)
        self._lookahead = self._geometry = None
        # The assessor's input features are constants of the episode: computed once for its K + 1 assessments
        # (here, outside the conditional meta-update of meta_interval > 1, whose branch could not share them).
        # Read by the assessor's geometry input.
        self._needs_features = model.options.assessor_input != "embeddings"
        self._features = self.features() if model.options.weighting == "assessor" and self._needs_features else None

    def cut_pairs(self):
        """bool `[B, B]`: the training subset's positive pairs beyond `distance_cut`'s quantile of the validation
        subset's positive-pair distances, both embedded at theta as the step and the look-ahead embed them
        (the validation pass's statistics are not kept)."""
        val_embeddings, _ = self.model.embedder.stateless_call(
            self.theta, self.non_trainable, self.val_x, training=True
        )
        threshold = positive_distance_quantile(self.val_y, val_embeddings, self.model.options.distance_cut)
        return positive_pairs_beyond(self.train_y, self.embeddings, threshold)

    # -------------------------------------------------------------------------------- weights and losses
    def weights(self):
        """`(weights [T], raw assessor outputs [U], new assessor state)`: the weights of every listed tuple
        (1 for those whose weight cannot change the loss, module docstring of the package)."""
        return self.assess()[:3]

    def assess(self):
        """`weights()` and the bounded logits `[U]` the weights are the softmax of (the assessor's outputs for
        sigmoid weights)."""
        model = self.model
        embeddings = tf.stop_gradient(self.embeddings)
        features = self._features
        if features is None and self._needs_features:
            features = self.features()  # a uniform model asked for its weights
        raw, new_state = model.assessor(
            embeddings, self.units, None if model.options.assessor_input == "embeddings" else features
        )
        logits = tf.cast(raw, self.values.dtype)
        bounded = model.bounded_logits(logits)
        return self.weights_of_units(model.weights_from_logits(bounded)), raw, new_state, bounded

    def weights_of_units(self, per_unit):
        """The weights `[T]` of every listed tuple from those of the assessed units `[U]` (a unit's tuples share
        its weight; the tuples not assessed keep 1)."""
        assessed = tf.gather(per_unit, self.unit_of)
        return tf.tensor_scatter_nd_update(tf.ones_like(self.values), self.assessed[:, None], assessed)

    def features(self):
        """Geometry of each assessed unit, `[U, 3]`, standardised over them: `(d_ap, d_an, term)` for
        triplets, `(d, term, +-1 for a positive / negative pair)` for pairs, `(d_ap, mean d_an, mean term)`
        over the triplets of an anchor-positive pair. Constants."""
        values = tf.stop_gradient(tf.gather(self.values, self.assessed))
        indices = tf.gather(self.terms.indices, self.assessed)
        if self.terms.kind == "pair":
            d = tf.gather_nd(pairwise_distance(tf.stop_gradient(self.embeddings)), indices)
            same = tf.equal(tf.gather(self.train_y, indices[:, 0]), tf.gather(self.train_y, indices[:, 1]))
            features = tf.stack([d, values, tf.where(same, tf.ones_like(d), -tf.ones_like(d))], axis=1)
        else:
            d_ap, d_an = self.assessed_distances()
            features = tf.stack([d_ap, d_an, values], axis=1)
        # One row per unit, the mean over its terms (a single term, except a triplet loss's anchor-positive pairs).
        features = tf.math.unsorted_segment_mean(features, self.unit_of, tf.shape(self.units)[0])
        count = tf.maximum(tf.cast(tf.shape(features)[0], features.dtype), 1.0)
        mean = tf.reduce_sum(features, axis=0) / count
        std = tf.sqrt(tf.reduce_sum(tf.square(features - mean), axis=0) / count)
        return (features - mean) / (std + 1e-6)

    def assessed_distances(self):
        """`(d_ap, d_an)` of the assessed triplets at the episode's embeddings (constants; computed once, read by
        the features and the logs)."""
        if self._geometry is None:
            distances = pairwise_distance(tf.stop_gradient(self.embeddings))
            self._geometry = triplet_distances(distances, tf.gather(self.terms.indices, self.assessed))
        return self._geometry

    def weighted_loss(self, weights):
        """The training loss with per-tuple `weights` (the base loss's reduction, or the paper's sum)."""
        return self.model.reduce(self.terms, weights)

    # ----------------------------------------------------------------------------------- the real step
    def gradients(self, weights, theta=None):
        """`(grad_theta, grad of the loss's own variables)` of the weighted loss, weights constant (eq 13);
        `theta`: the gradient in those of its values only (default: all of them)."""
        weights = tf.stop_gradient(tf.cast(weights, self.values.dtype))
        with self.loss_tape:
            value = self.weighted_loss(weights)
        sources = [self.embeddings] + list(self.model.loss_variables)
        grads = self.loss_tape.gradient(value, sources, unconnected_gradients=ZERO)
        theta_grads = self.theta_tape.gradient(
            self.embeddings,
            self.theta if theta is None else theta,
            output_gradients=grads[0],
            unconnected_gradients=ZERO,
        )
        return theta_grads, grads[1:]

    # --------------------------------------------------------------------------------- the look-ahead
    def lookahead_terms(self):
        """`(P, o)` of the virtual step over the moved variables, computed on first use."""
        if self._lookahead is None:
            model = self.model
            variables = model.embedder.trainable_variables
            self._lookahead = lookahead_terms(
                model.options.lookahead,
                getattr(model, "optimizer", None),
                [variables[i] for i in self.positions],
                self.moved,
                lambda: self.gradients(tf.ones_like(self.values), self.moved)[0],
                model.options.inner_learning_rate,
            )
        return self._lookahead

    def lookahead(self, weights):
        """Validation loss at `theta' = theta - o - P (.) grad(...)` (eqs 10-11) and its gradient in theta'."""
        return self.validation(self.gradients(weights, self.moved)[0])

    def validation(self, grads):
        """`(L_va(theta'), d L_va / d theta'_moved)` at the virtual step `theta' = theta - o - P (.) grads` of
        the moved variables (`grads` theirs), the others at theta."""
        preconditioners, offsets = self.lookahead_terms()
        moved = [
            t - p * g if o is None else t - o - p * g for t, p, o, g in zip(self.moved, preconditioners, offsets, grads)
        ]
        theta_prime = list(self.theta)
        for position, value in zip(self.positions, moved):
            theta_prime[position] = value
        with tf.GradientTape() as tape:
            tape.watch(moved)
            val_embeddings, _ = self.model.embedder.stateless_call(
                theta_prime, self.non_trainable, self.val_x, training=True
            )
            meta_loss = self.model.reduce(self.model.validation_loss.terms(self.val_y, val_embeddings))
        return meta_loss, tape.gradient(meta_loss, moved, unconnected_gradients=ZERO)

    def term_vjp(self, upstream):
        """`sum_i upstream_i d term_i / d theta_moved` from the recorded passes (with `upstream` the reduction's
        coefficients `u(w)`, the gradient of the weighted loss: its remainder `extra` does not depend on the
        embeddings)."""
        grad = self.loss_tape.gradient(
            self.values, self.embeddings, output_gradients=upstream, unconnected_gradients=ZERO
        )
        return self.theta_tape.gradient(self.embeddings, self.moved, output_gradients=grad, unconnected_gradients=ZERO)

    def assessor_gradients(self):
        """Exact `d L_va(theta'(phi)) / d phi` and `L_va(theta'(phi))` (package docstring): `c_i = <d term_i /
        d theta, P g_va>` for every term, then a gradient step on `-sum_i u_i(w(phi)) c_i` with `u` the
        reduction's coefficients. `c` is the transpose of the look-ahead's own vector-Jacobian product, taken
        by differentiating it in its (linear) upstream: one more pass through the recorded backward pass
        instead of a forward-mode pass that would run the embedder again."""
        model = self.model
        with tf.GradientTape(persistent=bool(model.options.output_penalty)) as tape:
            weights, raw, _, bounded = self.assess()
            coefficients = model.coefficients(self.terms, weights)
        alignment, meta_loss = self.alignment(coefficients)
        with tape:
            surrogate = -tf.reduce_sum(coefficients * tf.stop_gradient(alignment))
        if model.options.output_penalty:
            scale = self.penalty_scale(tape, surrogate, bounded)
            with tape:
                outputs = tf.cast(raw, scale.dtype)
                surrogate += model.options.output_penalty * scale * 0.5 * tf.reduce_sum(tf.square(outputs))
        phi_grads = tape.gradient(surrogate, model.assessor.trainable_variables, unconnected_gradients=ZERO)
        return phi_grads, meta_loss

    def penalty_scale(self, tape, surrogate, bounded):
        """`s` of `output_penalty` (`tfdml.ala_options.ALAOptions`), a constant: the root mean square of the
        meta-gradient on the bounded logits, which puts the penalty in the meta-gradient's units."""
        push = tape.gradient(surrogate, bounded, unconnected_gradients=ZERO)
        return tf.stop_gradient(tf.sqrt(tf.reduce_mean(tf.square(push))))

    def alignment(self, coefficients):
        """`(c, L_va(theta'))` for the reduction's `coefficients`: per term `c_i = <d term_i / d theta, P g_va>`,
        the transpose of the look-ahead's vector-Jacobian product, differentiated in its linear upstream."""
        upstream = tf.stop_gradient(coefficients)
        with tf.GradientTape() as transpose:
            transpose.watch(upstream)
            grads = self.term_vjp(upstream)
        meta_loss, val_grads = self.validation(grads)
        tangents = [p * g for p, g in zip(self.lookahead_terms()[0], val_grads)]
        return transpose.gradient(grads, upstream, output_gradients=tangents, unconnected_gradients=ZERO), meta_loss

    # ------------------------------------------------------------------------------------------ logs
    def logs(self, weights, raw=None):
        """Per-step logs (package docstring): the weights' over the assessed units, the hardness over the
        assessed triplets."""
        dtype = self.values.dtype
        applied = tf.gather(tf.cast(weights, dtype), self.assessed)
        units = tf.shape(self.units)[0]
        per_unit = tf.math.unsorted_segment_max(applied, self.unit_of, units)  # a unit's terms share its weight
        count = tf.cast(units, dtype)
        mean = safe_divide(tf.reduce_sum(per_unit), count)
        logs = {
            "loss": self.model.loss_log(self.terms, weights),
            "weight_mean": mean,
            "weight_variance": safe_divide(tf.reduce_sum(tf.square(per_unit - mean)), count),
        }
        if self.cut is not None:  # the share of the training subset's positive pairs left out
            positives = positive_mask(self.train_y)
            logs["cut_fraction"] = safe_divide(
                tf.reduce_sum(tf.cast(self.cut, dtype)), tf.reduce_sum(tf.cast(positives, dtype))
            )
        if raw is not None:
            raw = tf.cast(raw, dtype)
            logs["output_std"] = tf.sqrt(safe_divide(tf.reduce_sum(tf.square(raw)), count))  # centred outputs
        if self.terms.kind == "triplet":
            d_ap, d_an = self.assessed_distances()
            ratio = safe_divide(d_ap, d_an)
            triplets = tf.cast(tf.size(applied), dtype)
            logs["hardness"] = safe_divide(tf.reduce_sum(ratio), triplets)
            logs["weighted_hardness"] = safe_divide(tf.reduce_sum(applied * ratio), triplets)
            term_mean = safe_divide(tf.reduce_sum(applied), triplets)
            logs["hardness_ratio"] = safe_divide(logs["weighted_hardness"], term_mean * logs["hardness"])
        return logs
