"""Multi-level embedder of the Ranked List Loss papers: RLL-L, RLL-M, RLL-H and RLL-(L,M,H).

Heads on a low, a mid and a high layer of the backbone (official Caffe code, see `tfdml.models.heads`),
one loss per level, and at inference the L2-normalised concatenation of the un-normalised level outputs.
The taps are those of the authors' GoogLeNet-BN prototxt: L = `inception_3c` and M = `inception_4e`, the
reduction blocks that open stages 4 and 5 (stride 16 and 32: 14x14 and 7x7 at 224 px), and H = `inception_5b`,
the last block. Their defaults on Keras backbones (`tfdml.models.backbones.DEFAULT_TAPS`) are the same
positions: ResNet50/101/152 `conv4_block1_out`, `conv5_block1_out`, `conv5_block3_out`; InceptionV3
`mixed3`, `mixed8`, `mixed10`. The L and M heads pool 5x5/3 with Caffe's rounded-up output size (7x7 -> 2x2,
14x14 -> 4x4).


    u_l = head_l(tap_l(x))                      (un-normalised, D each)
    embedding = l2_normalize(concat(u_L, u_M, u_H))           (the model output, [B, K*D])
    level embedding e_l = l2_normalize(u_l) = l2_normalize(embedding[:, l*D:(l+1)*D])
    training loss = sum_l level_weight_l * loss(y, e_l)       (weights 1 by default)

The second identity (slicing the normalised concatenation and renormalising gives exactly the level's own
normalised embedding) is why one output tensor serves training, evaluation and export alike.
"""

import keras
import tensorflow as tf

from tfdml.distribute import scale_for_replicas, unscale_for_replicas
from tfdml.losses import CrossBatchMemory
from tfdml.models import backbones as backbones_lib
from tfdml.models.base import MetricModel
from tfdml.models.heads import AuxiliaryEmbeddingHead, GlobalEmbeddingHead, L2Normalize
from tfdml.models.preprocessing import PixelPreprocessing, preprocessing_spec

LEVELS = ("L", "M", "H")
GLOBAL_HEAD_LEVEL = "H"


def level_loss_values(loss, y, level_predictions, logits, sample_weight=None):
    """Each level's loss value: `loss(y, prediction)` on the level's training prediction (`e_l`, or
    `concat([e_l, logits_l])` with a classifier head), or with `loss=None` (classification pre-training) the
    sparse softmax cross-entropy of the level's logits. Shared by `MultiLevelEmbedder` and the heads trained on
    cached features (`tfdml.training.FeatureHeads`), which weight and add the values."""
    if loss is None:
        if not logits:
            raise ValueError("classification pre-training needs an embedder built with num_classes")
        cross_entropy = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        return [cross_entropy(tf.reshape(y, [-1]), level_logits) for level_logits in logits]
    return [loss(y, prediction, sample_weight) for prediction in level_predictions]


def _resolve_taps(backbone, levels, taps):
    if taps is None:
        defaults = backbones_lib.default_taps(backbone)
        if defaults is None:
            if tuple(levels) == (GLOBAL_HEAD_LEVEL,):
                return [None]  # the backbone's own output
            raise ValueError(
                f"Backbone {backbone.name!r} has no default taps; pass taps={{level: layer_name}} for the levels "
                f"{list(levels)} (known defaults: {sorted(backbones_lib.DEFAULT_TAPS)})."
            )
        taps = defaults
    if isinstance(taps, dict):
        missing = [level for level in levels if level not in taps]
        if missing:
            raise ValueError(f"taps has no layer for the levels {missing}; got taps={taps}.")
        taps = [taps[level] for level in levels]
    taps = list(taps)
    if len(taps) != len(levels):
        raise ValueError(f"Got {len(taps)} taps for {len(levels)} levels {list(levels)}.")
    names = {layer.name for layer in backbone.layers}
    for tap in taps:
        if tap is not None and tap not in names:
            raise ValueError(f"Backbone {backbone.name!r} has no layer named {tap!r} to tap.")
    return taps


def _checked_levels(levels, level_weights):
    """`(levels, level_weights)` as tuples: distinct names among `LEVELS`, one weight each (default 1)."""
    levels = tuple(levels)
    if not levels or len(set(levels)) != len(levels):
        raise ValueError(f"levels must be distinct names, got {levels!r}.")
    unknown = [level for level in levels if level not in LEVELS]
    if unknown:
        raise ValueError(f"Unknown levels {unknown}; levels are among {LEVELS}.")
    weights = tuple(float(w) for w in (level_weights or [1.0] * len(levels)))
    if len(weights) != len(levels):
        raise ValueError(f"Got {len(weights)} level_weights for levels {levels}.")
    return levels, weights


@keras.saving.register_keras_serializable(package="tfdml")
class MultiLevelEmbedder(MetricModel):
    """Embedder with one head per backbone level; output `l2_normalize(concat(u_L, u_M, u_H))`.

    The "H" level gets the global head (avg pool -> Dense(D, no bias)); every other level gets the auxiliary
    head (avg pool 5x5/3 rounded up as Caffe -> 1x1 conv 128 + BN + ReLU -> Dense 1024 + BN + ReLU ->
    Dense(D, no bias)), as in the official RLL code. Each level output is L2-normalised for its own loss;
    the inference embedding normalises the concatenation of the un-normalised outputs.

    Compile with any tfdml loss: `model.compile(optimizer, loss=RankedListLoss())` applies the loss to each
    level's normalised embedding and sums them with `level_weights`; per-level values are logged as
    `loss_L`, `loss_M`, `loss_H` (with one level, e.g. `levels=("H",)`, the model is a plain single-level
    embedder and logs `loss` alone).

    Args:
      backbone: a `keras.applications` name, "small_cnn", or a functional Keras model (see
        `tfdml.models.backbones`).
      taps: `{level: layer_name}` or a list aligned with `levels`; default taps exist for ResNet50/101/152
        (`conv4_block1_out`, `conv5_block1_out`, `conv5_block3_out`), InceptionV3 (`mixed3`, `mixed8`,
        `mixed10`) and the small CNN: the positions of GoogLeNet-BN's `inception_3c` (opens the stride-16
        stage), `inception_4e` (opens the stride-32 stage) and `inception_5b` (last block) in the official net
        (`tfdml.models.backbones.DEFAULT_TAPS`).
      embedding_dim: D, the size of each level's embedding (output size `len(levels) * D`).
      levels: level names, any of "L", "M", "H" (e.g. `("H",)` for RLL-H alone).
      level_weights: one loss weight per level (default 1 each).
      input_shape: `(h, w, c)` of the images; default (224, 224, 3), (32, 32, 1) for the small CNN.
      weights: backbone weights for a named backbone: "imagenet" (default, needs the network once), None or a
        weights file path.
      head_filters, head_units: widths of the auxiliary heads (official 128 and 1024).
      num_classes: adds a classifier head per level (Dense over the un-normalised level output) for Group
        Loss. Then `model(x, training=True)` returns `concat([embedding, logits_L, logits_M, logits_H])` and
        the loss of level l sees `concat([e_l, logits_l])` (Group Loss's convention: the last `num_classes`
        columns are logits); `model(x, training=False)` returns the embedding only.
      freeze_batchnorm: freeze the backbone's BatchNorm layers (moving statistics and affine parameters), as
        the RLL paper does on CUB and Cars.
      frozen_stages: freeze the backbone's stem and its first N stages (EfficientNet-Lite: 1-7; the small
        CNN: blocks), which fine-tuning then leaves as pretrained and does not back-propagate through (0: none).
      freeze_backbone: freeze the whole backbone: only the heads train (`tfdml.training.fit_heads` trains
        them on features computed once).
      widths: the small CNN's block widths (default (8, 16, 32); the main job's is (16, 32, 64, 128)); only
        with `backbone="small_cnn"`.
      preprocessing: the pixel preprocessing the model applies to its raw 0-255 input, its first layer
        (`tfdml.models.preprocessing`): "auto" (default) is what the backbone expects (the dotted name of
        the `keras.applications` function, "unit" = pixels / 255 for the small CNN, None = as is for other
        models), or any spec ("unit", "symmetric", None, a dotted function name).

    The model takes raw pixels (uint8 or 0-255 floats) and preprocesses them itself, so `model(images)`,
    `model.predict(images)` and the exported serving graph give the same embedding for the same pixels;
    `tfdml.data` pipelines feed raw pixels (resized, cropped, augmented). Attributes used by export and
    serving: `preprocessing` (the spec), `preprocessing_config()` -> `{"image_size": (h, w), "channels": c,
    "preprocessing": spec, "applied_by_model": True}`; `image_shape`, `input_shape_hw`;
    `export_outputs(x)` -> `{"embedding": ..., "L": ..., "M": ..., "H": ...}`.
    `backbone_variables` and `head_variables` (new layers) split the trainable variables for the 10x
    learning-rate recipe (`tfdml.optimizers.build_optimizer`).

    Example:
      >>> model = MultiLevelEmbedder("resnet50", embedding_dim=512, weights=None)
      >>> model.compile(optimizer="adam", loss=tfdml.losses.RankedListLoss())
      >>> model.fit(dataset, epochs=10, steps_per_epoch=100)
      >>> outputs = model.export_outputs(images)   # "embedding" (1536-d), "L", "M", "H" (512-d each)
    """

    embedding_normalized = True  # the output is unit-norm: export serves it as is

    def __init__(
        self,
        backbone,
        taps=None,
        embedding_dim=512,
        levels=LEVELS,
        level_weights=None,
        input_shape=None,
        weights="imagenet",
        head_filters=128,
        head_units=1024,
        num_classes=None,
        freeze_batchnorm=False,
        widths=None,
        preprocessing="auto",
        frozen_stages=0,
        freeze_backbone=False,
        name=None,
        **kwargs,
    ):
        super().__init__(name=name, **kwargs)
        if isinstance(backbone, dict):  # a custom backbone, as stored by get_config
            backbone = keras.saving.deserialize_keras_object(backbone)
        if backbones_lib.is_small_cnn(backbone):
            weights = None  # it has no pretrained weights; the "imagenet" default does not apply
        elif widths is not None:
            raise ValueError(f"widths sets the small CNN's block widths; backbone {backbone!r} does not take it.")
        self.widths = None if widths is None else tuple(int(w) for w in widths)
        self.backbone_name = backbone if isinstance(backbone, str) else None
        # The first layer: raw pixels in, what the backbone expects out (listed first by summary()).
        self.preprocessing = preprocessing_spec(
            backbones_lib.preprocessing_name(backbone) if preprocessing == "auto" else preprocessing
        )
        self.pixel_preprocessing = PixelPreprocessing(self.preprocessing, name="pixel_preprocessing")
        self.backbone = backbones_lib.get_backbone(backbone, input_shape, weights, widths=self.widths)
        self.levels, self.level_weights = _checked_levels(levels, level_weights)
        self.taps = _resolve_taps(self.backbone, self.levels, taps)
        if embedding_dim is None and self.levels != (GLOBAL_HEAD_LEVEL,):
            raise ValueError(
                "embedding_dim=None (the pooled backbone feature is the embedding) needs the single "
                f"level ('H',); got levels {self.levels}. Pass an integer embedding_dim."
            )
        self.projected = embedding_dim is not None
        self.head_filters = int(head_filters)
        self.head_units = int(head_units)
        self.num_classes = None if num_classes is None else int(num_classes)
        self.freeze_batchnorm = bool(freeze_batchnorm)
        self.image_shape = tuple(int(d) if d is not None else None for d in self.backbone.input_shape[1:])
        self.input_shape_hw = self.image_shape[:2]
        self.classification_pretraining = False  # toggled by tfdml.callbacks.ClassificationPretraining

        self._build_heads(embedding_dim)
        self.normalize = L2Normalize(name="l2_normalize")
        # Each level's loss beside their sum (`loss`); one level's would only repeat `loss`.
        self.level_loss_trackers = (
            [keras.metrics.Mean(name=f"loss_{level}") for level in self.levels] if len(self.levels) > 1 else []
        )
        if self.freeze_batchnorm:
            backbones_lib.freeze_batchnorm(self.backbone)
        self.frozen_stages, self.freeze_backbone = int(frozen_stages), bool(freeze_backbone)
        if self.freeze_backbone:
            backbones_lib.freeze_layers(self.backbone)
        elif self.frozen_stages:
            backbones_lib.freeze_layers(self.backbone, backbones_lib.stage_end(self.backbone, self.frozen_stages))
        self.build((None,) + self.image_shape)

    def _build_heads(self, embedding_dim):
        """The backbone read at the taps, one embedding head per level and the optional classifiers."""
        tap_outputs = [
            self.backbone.output if tap is None else self.backbone.get_layer(tap).output for tap in self.taps
        ]
        inputs = self.backbone.inputs[0] if len(self.backbone.inputs) == 1 else self.backbone.inputs
        # The backbone's own layers, read at the taps: not tracked again (the model's layers, summary and
        # variables list the backbone once).
        object.__setattr__(self, "feature_extractor", keras.Model(inputs, tap_outputs, name="taps"))
        # No projection: the embedding is the pooled feature, as wide as the tapped map has channels.
        self.embedding_dim = int(embedding_dim) if self.projected else int(tap_outputs[0].shape[-1])
        self.level_heads = [
            GlobalEmbeddingHead(self.embedding_dim if self.projected else None, name=f"head_{level}")
            if level == GLOBAL_HEAD_LEVEL
            else AuxiliaryEmbeddingHead(
                self.embedding_dim, filters=self.head_filters, units=self.head_units, name=f"head_{level}"
            )
            for level in self.levels
        ]
        self.classifiers = (
            [keras.layers.Dense(self.num_classes, name=f"classifier_{level}") for level in self.levels]
            if self.num_classes
            else []
        )

    # --- structure -----------------------------------------------------------------------------------------
    def build(self, input_shape):
        self.pixel_preprocessing.build(tuple(input_shape))
        shapes = self.feature_extractor.compute_output_shape(tuple(input_shape))
        if len(self.levels) == 1 and not isinstance(shapes, list):
            shapes = [shapes]
        for head, shape in zip(self.level_heads, shapes):
            head.build(shape)
        for classifier in self.classifiers:
            classifier.build((None, self.embedding_dim))
        self.normalize.build((None, self.output_dim))
        self.built = True

    @property
    def head_variables(self):
        """Trainable variables of the new layers (heads and classifiers): the 10x learning-rate group."""
        variables = []
        for layer in self.level_heads + self.classifiers:
            variables.extend(layer.trainable_variables)
        return variables

    @property
    def backbone_variables(self):
        return list(self.backbone.trainable_variables)

    @property
    def output_dim(self):
        return self.embedding_dim * len(self.levels)

    # --- forward -------------------------------------------------------------------------------------------
    def level_outputs(self, inputs, training=None):
        """`(un-normalised level outputs, per-level logits)` of raw pixels; logits is [] without a classifier
        head."""
        features = self.feature_extractor(self.pixel_preprocessing(inputs), training=training)
        if not isinstance(features, (list, tuple)):
            features = [features]
        raw = [head(f, training=training) for head, f in zip(self.level_heads, features)]
        logits = [classifier(u) for classifier, u in zip(self.classifiers, raw)]
        return raw, logits

    def call(self, inputs, training=None):
        raw, logits = self.level_outputs(inputs, training=training)
        embedding = self.normalize(tf.concat(raw, axis=-1) if len(raw) > 1 else raw[0])
        if training and logits:  # the logits in the embedding's float32 (float16 under mixed precision)
            return tf.concat([embedding] + [tf.cast(z, embedding.dtype) for z in logits], axis=-1)
        return embedding

    def split_levels(self, outputs):
        """`{level: unit-norm level embedding}` from the model output (training or inference layout)."""
        d = self.embedding_dim
        return {level: self.normalize(outputs[:, i * d : (i + 1) * d]) for i, level in enumerate(self.levels)}

    def export_outputs(self, inputs):
        """Named inference outputs: `embedding` (the model output) and, with several levels, each level's."""
        embedding = self(inputs, training=False)
        outputs = {"embedding": embedding}
        if len(self.levels) > 1:
            outputs.update(self.split_levels(embedding))
        return outputs

    def preprocessing_config(self):
        """What serving needs to feed raw pixels: `image_size` (h, w), `channels`, the `preprocessing` spec
        and `applied_by_model` (True: the model preprocesses its raw input itself, serving must not)."""
        return {
            "image_size": tuple(self.input_shape_hw),
            "channels": self.image_shape[-1],
            "preprocessing": self.preprocessing,
            "applied_by_model": True,
        }

    # --- loss ----------------------------------------------------------------------------------------------
    def _level_predictions(self, x, y_pred):
        """Per-level loss inputs: `e_l`, or `concat([e_l, logits_l])` with a classifier head."""
        embeddings = self.split_levels(y_pred)
        if not self.classifiers:
            return [embeddings[level] for level in self.levels], []
        width = self.output_dim
        if y_pred.shape[-1] == width:  # inference layout (evaluate): recompute the logits
            _, logits = self.level_outputs(x, training=False)
        else:
            c = self.num_classes
            logits = [y_pred[:, width + i * c : width + (i + 1) * c] for i in range(len(self.levels))]
        logits = [tf.cast(lg, embeddings[self.levels[0]].dtype) for lg in logits]
        return [tf.concat([embeddings[level], lg], axis=-1) for level, lg in zip(self.levels, logits)], logits

    def _compiled_loss(self):
        loss = getattr(self, "loss", None)
        if loss is None:
            raise ValueError(f"{type(self).__name__} has no loss: call compile(optimizer, loss=...) first.")
        if isinstance(loss, (list, tuple, dict)):
            raise ValueError(
                f"{type(self).__name__} applies one loss to every level; got {type(loss).__name__} {loss!r}. "
                "Pass a single loss (weight levels with level_weights)."
            )
        loss = keras.losses.get(loss)
        if isinstance(loss, CrossBatchMemory) and len(self.levels) > 1:
            # One queue cannot hold the embeddings of every level (and would enqueue each batch once per level).
            raise ValueError(
                f"{type(self).__name__} applies its loss to each of its {len(self.levels)} levels; a "
                f"cross-batch memory ({type(loss).__name__}) holds one embedding per sample. Use it "
                "with a single-level embedder (tfdml.models.Embedder)."
            )
        return loss

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        """Sum over levels of `level_weight * loss(y, level prediction)`, plus regularisation losses.

        During classification pre-training (`tfdml.callbacks.ClassificationPretraining`) the per-level loss
        is the sparse softmax cross-entropy of the level's logits instead of the compiled loss.
        """
        self._tell_losses_whether_training(training)
        level_predictions, logits = self._level_predictions(x, y_pred)
        loss = None if self.classification_pretraining else self._compiled_loss()
        values = level_loss_values(loss, y, level_predictions, logits, sample_weight)
        total = tf.constant(0.0, dtype=tf.float32)
        for index, (value, weight) in enumerate(zip(values, self.level_weights)):
            value = tf.cast(value, tf.float32)
            if self.level_loss_trackers:
                self.level_loss_trackers[index].update_state(unscale_for_replicas(value))  # as Keras logs `loss`
            total = total + weight * value
        for extra in self.losses:  # regularisers and add_loss terms, 1/N each so N replicas sum to one
            total = total + scale_for_replicas(tf.cast(tf.reduce_sum(extra), tf.float32))
        return total

    # --- config --------------------------------------------------------------------------------------------
    def get_config(self):
        backbone = (
            self.backbone_name if self.backbone_name is not None else keras.saving.serialize_keras_object(self.backbone)
        )
        return {
            "name": self.name,
            "backbone": backbone,
            "taps": dict(zip(self.levels, self.taps)) if None not in self.taps else None,
            "embedding_dim": self.embedding_dim if self.projected else None,
            "levels": list(self.levels),
            "level_weights": list(self.level_weights),
            "input_shape": list(self.image_shape),
            "weights": None,  # the saved file carries the trained weights; never re-download on load
            "head_filters": self.head_filters,
            "head_units": self.head_units,
            "num_classes": self.num_classes,
            "freeze_batchnorm": self.freeze_batchnorm,
            "frozen_stages": self.frozen_stages,
            "freeze_backbone": self.freeze_backbone,
            "widths": None if self.widths is None else list(self.widths),
            # Files written before the model applied it stored the same derived spec here: they load with it.
            "preprocessing": self.preprocessing,
        }
