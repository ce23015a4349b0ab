"""Training an embedder's heads on cached backbone features: a frozen backbone embeds the data once, and the
heads train in seconds on a CPU.

With the backbone frozen (the embedders' `freeze_backbone=True`) and no augmentation, every epoch feeds the heads the
same backbone outputs, so computing them once is exact: `backbone_features` runs the frozen backbone (in
inference mode) over the images a single time and keeps, per level, what the level's head reads: the pooled
vector for the global (H) head, which pools first anyway, and the tapped feature map for the auxiliary (L, M)
heads. `fit_heads` then trains the embedder's own head layers on class-balanced batches of those features
(C classes x K items, drawn as `tfdml.data.class_balanced_dataset` draws images), so the trained embedder
exports and serves unchanged: `embedder(images)` uses the trained heads.

Example:
  >>> embedder = tfdml.models.Embedder("efficientnet_lite0", embedding_dim=128, input_shape=(128, 128, 3))
  >>> features = tfdml.training.backbone_features(embedder, train_images)
  >>> history = tfdml.training.fit_heads(embedder, features, train_labels, loss=tfdml.losses.MarginLoss(),
  ...                                    optimizer=keras.optimizers.Adam(1e-3), steps=300)
"""

import keras
import numpy as np
import tensorflow as tf

from tfdml.models.base import MetricModel
from tfdml.models.heads import GlobalEmbeddingHead
from tfdml.models.multilevel import level_loss_values


def backbone_features(embedder, images, batch_size=64):
    """Per level of `embedder`, what its head reads from the (frozen) backbone, for every image: a list of
    arrays aligned with `embedder.levels` (`[N, C]` pooled for the global head, `[N, h, w, C]` for the others).

    `images` are raw pixels (uint8 or 0-255 floats, `[N, h, w, c]` at the embedder's input size) or a
    `tf.data.Dataset` of such batches (or of `(images, labels)` batches, whose labels are ignored).
    """
    batches = images
    if not isinstance(images, tf.data.Dataset):
        batches = tf.data.Dataset.from_tensor_slices(images).batch(batch_size)
    return _features_and_labels(embedder, batches)[0]


def dataset_features(embedder, dataset):
    """`(features, labels)`: `backbone_features` of a `tf.data.Dataset` of `(images, labels)` batches, with the
    labels in the same order (the images are read once)."""
    features, labels = _features_and_labels(embedder, dataset)
    return features, np.concatenate(labels)


def _features_and_labels(embedder, batches):
    """`(features per level, [labels of each batch])` in one pass over `batches` (images, or image-label pairs)."""
    pooled = [isinstance(head, GlobalEmbeddingHead) for head in embedder.level_heads]

    @tf.function(reduce_retracing=True)  # a last, smaller batch is not traced again
    def step(batch):
        maps = embedder.feature_extractor(embedder.pixel_preprocessing(batch), training=False)
        maps = list(maps) if isinstance(maps, (list, tuple)) else [maps]
        return [tf.reduce_mean(m, axis=(1, 2)) if pool else m for m, pool in zip(maps, pooled)]

    parts, labels = [[] for _ in pooled], []
    for batch in batches:
        if isinstance(batch, (tuple, list)):
            batch, batch_labels = batch[0], batch[1]
            labels.append(np.asarray(batch_labels).reshape(-1))
        for i, value in enumerate(step(batch)):
            parts[i].append(value.numpy())
    if not parts[0]:
        raise ValueError("backbone_features got no images")
    return [np.concatenate(p) for p in parts], labels


class FeatureHeads(MetricModel):
    """The embedder's heads and normalisation over cached backbone features: `embedder(images)` equals
    `FeatureHeads(embedder)(backbone_features(embedder, images))`. Its variables are the heads' own (and the
    classifiers' of an embedder built with `num_classes`), so training it trains the embedder's heads; the loss
    is applied to each level as the embedder applies it (and, as a `MetricModel`, it trains the loss's own
    variables, such as the margin loss's beta). With classifiers, the training output is
    `concat([embedding, logits per level])` as the embedder's, the layout Group Loss reads, and
    `classification_pretraining = True` trains the logits with softmax cross-entropy instead of the loss."""

    def __init__(self, embedder, **kwargs):
        super().__init__(**kwargs)
        object.__setattr__(self, "embedder", embedder)  # not tracked: the backbone's variables stay out
        self.heads = list(embedder.level_heads)
        self.classifiers = list(getattr(embedder, "classifiers", None) or [])
        self.normalize = embedder.normalize
        self.classification_pretraining = False

    def call(self, features, training=None):
        raw = [head(f, training=training) for head, f in zip(self.heads, features)]
        embedding = self.normalize(keras.ops.concatenate(raw, axis=-1) if len(raw) > 1 else raw[0])
        if training and self.classifiers:
            logits = [keras.ops.cast(classifier(u), embedding.dtype) for classifier, u in zip(self.classifiers, raw)]
            return keras.ops.concatenate([embedding] + logits, axis=-1)
        return embedding

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        self._tell_losses_whether_training(training)
        levels = self.embedder.split_levels(y_pred)
        predictions = [levels[level] for level in self.embedder.levels]
        width, classes = self.embedder.output_dim, self.embedder.num_classes
        logits = []
        if self.classifiers and y_pred.shape[-1] > width:  # the training layout: the logits follow
            logits = [y_pred[:, width + i * classes : width + (i + 1) * classes] for i in range(len(predictions))]
        if logits:
            predictions = [tf.concat([p, lg], axis=-1) for p, lg in zip(predictions, logits)]
        loss = None if self.classification_pretraining else keras.losses.get(self.loss)
        values = level_loss_values(loss, y, predictions, logits, sample_weight)
        total = 0.0
        for weight, value in zip(self.embedder.level_weights, values):
            total = total + weight * tf.cast(value, tf.float32)
        return total


def balanced_batches(labels, classes_per_batch, samples_per_class, steps, seed=0):
    """`[steps, C * K]` item indices: each row C distinct classes (a new random order of the classes each pass)
    with K items each, drawn without replacement within a class while it has enough items."""
    labels = np.asarray(labels).reshape(-1)
    classes = np.unique(labels)
    if len(classes) < classes_per_batch:
        raise ValueError(f"classes_per_batch={classes_per_batch} but the labels hold only {len(classes)} classes")
    members = {c: np.flatnonzero(labels == c) for c in classes}
    rng = np.random.default_rng(seed)
    order, rows = [], []
    for _ in range(steps):
        if len(order) < classes_per_batch:
            order = list(rng.permutation(classes)) + order
        chosen = [order.pop() for _ in range(classes_per_batch)]
        rows.append(
            np.concatenate(
                [rng.choice(members[c], samples_per_class, replace=len(members[c]) < samples_per_class) for c in chosen]
            )
        )
    return np.stack(rows)


def fit_heads(
    embedder,
    features,
    labels,
    *,
    loss,
    optimizer,
    steps,
    pretrain_steps=0,
    classes_per_batch=8,
    samples_per_class=4,
    seed=0,
    verbose=0,
    callbacks=None,
):
    """Trains `embedder`'s heads on cached `features` (from `backbone_features`) for `steps` class-balanced
    batches of `classes_per_batch` x `samples_per_class`; returns the Keras `History`.

    Args:
      embedder: a tfdml `Embedder` or `MultiLevelEmbedder` without classifier heads.
      features: the list `backbone_features(embedder, images)` returned.
      labels: `[N]` integer class of each item.
      loss: a tfdml loss (or its registered name), applied to every level's embedding as in `compile`.
      optimizer: a Keras optimizer (its learning rate is the heads').
      steps: training steps with `loss`; seed: the batches' draw.
      pretrain_steps: softmax cross-entropy steps on the classifier logits first (an embedder built with
        `num_classes`; Group Loss's classification pre-training), with the same optimizer and its state.
    """
    labels = np.asarray(labels).reshape(-1).astype(np.int64)
    if any(len(f) != len(labels) for f in features):
        raise ValueError(f"features hold {[len(f) for f in features]} items for {len(labels)} labels")
    if pretrain_steps and not getattr(embedder, "classifiers", None):
        raise ValueError(
            f"pretrain_steps={pretrain_steps} trains classifier logits: build the embedder with num_classes"
        )
    index = balanced_batches(labels, classes_per_batch, samples_per_class, pretrain_steps + steps, seed)
    tensors = [tf.constant(f) for f in features]
    label_tensor = tf.constant(labels)
    dataset = tf.data.Dataset.from_tensor_slices(index).map(
        lambda rows: (tuple(tf.gather(t, rows) for t in tensors), tf.gather(label_tensor, rows))
    )
    model = FeatureHeads(embedder)
    model.compile(optimizer=optimizer, loss=loss)
    if pretrain_steps:
        model.classification_pretraining = True
        first = dataset.take(pretrain_steps)
        model.fit(first, epochs=1, steps_per_epoch=pretrain_steps, verbose=verbose, shuffle=False)
        model.classification_pretraining = False
        model.make_train_function(force=True)  # the traced step holds the cross-entropy: trace it again
    rest = dataset.skip(pretrain_steps)
    return model.fit(rest, epochs=1, steps_per_epoch=steps, verbose=verbose, callbacks=callbacks, shuffle=False)
