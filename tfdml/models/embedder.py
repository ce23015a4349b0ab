"""Single-level embedder: backbone -> global average pool -> Dense(D, no bias) -> L2 normalisation, or
without the Dense (`embedding_dim=None`): the pooled backbone feature is the embedding (Group Loss's
official layout)."""

import keras

from tfdml.models.multilevel import GLOBAL_HEAD_LEVEL, MultiLevelEmbedder


@keras.saving.register_keras_serializable(package="tfdml")
class Embedder(MultiLevelEmbedder):
    """`e = l2_normalize(W . avgpool(backbone(x)))`, the standard metric-learning embedder, or
    `e = l2_normalize(avgpool(backbone(x)))` with `embedding_dim=None`.

    It is the one-level case of `MultiLevelEmbedder` (level "H" on the backbone's own output), so it shares
    its loss handling, classifier option, export outputs and recipes.

    Args:
      backbone: a `keras.applications` name ("resnet50", "inception_v3", "efficientnetv2b0",
        "mobilenetv3small", ...), "small_cnn", or a functional Keras model (see `tfdml.models.backbones`).
      embedding_dim: D (512 by default), or None: no projection, the pooled backbone feature (2048-d for
        ResNet50 and InceptionV3) is the embedding and the classifier (`num_classes`) sits directly on it,
        the Group Loss authors' architecture (their BN-Inception's 1024-d pooled feature, `Linear(1024, m)`).
      input_shape: `(h, w, c)`; default (224, 224, 3), (32, 32, 1) for the small CNN.
      weights: "imagenet" (default; downloaded by Keras, a clear error names the cause when that fails),
        None for random initialisation (offline use, tests), or the path of a local weights file.
      num_classes: adds a classifier head (Dense over the un-normalised embedding, i.e. over the pooled
        feature itself when `embedding_dim=None`) for Group Loss:
        `model(x, training=True)` returns `concat([embedding, logits], -1)`, `model(x, training=False)` the
        embedding only. Combine with `tfdml.callbacks.ClassificationPretraining` for the paper's
        cross-entropy pre-training stage.
      freeze_batchnorm: freeze the backbone's BatchNorm layers.
      frozen_stages: freeze the backbone's stem and first N stages (EfficientNet-Lite 1-7, the small CNN's
        blocks; 0: none). freeze_backbone: freeze the whole backbone (see `MultiLevelEmbedder`).
      widths: the small CNN's block widths (default (8, 16, 32); `tfdml train`'s main job uses
        (16, 32, 64, 128)); only with `backbone="small_cnn"`.
      preprocessing: the pixel preprocessing the model applies to its raw input (default "auto": what the
        backbone expects, e.g. `keras.applications.resnet50.preprocess_input`, pixels / 255 for the small
        CNN; see `MultiLevelEmbedder`).

    The model takes raw pixels (uint8 or floats in [0, 255]) and applies its own preprocessing, so
    `model.predict(images)` equals what the exported SavedModel returns for the same pixels.

    Serving attributes: `preprocessing_config()` (`image_size`, `channels`, `preprocessing` spec, see
    `MultiLevelEmbedder`), `image_shape`, `input_shape_hw`, `export_outputs(x)` -> `{"embedding": ...}`.

    Example:
      >>> model = Embedder("resnet50", embedding_dim=512, weights=None)
      >>> model.compile(optimizer=keras.optimizers.Adam(1e-5), loss=tfdml.losses.MarginLoss())
      >>> model.fit(dataset, epochs=20, steps_per_epoch=100)
      >>> embeddings = model.predict(images)        # uint8 images -> [N, 512], unit norm
      >>> cnn = Embedder("small_cnn", embedding_dim=64, input_shape=(32, 32, 1), widths=(16, 32, 64, 128))
      >>> official = Embedder("inception_v3", embedding_dim=None, num_classes=100)  # Group Loss layout
    """

    def __init__(
        self,
        backbone,
        embedding_dim=512,
        input_shape=None,
        weights="imagenet",
        num_classes=None,
        freeze_batchnorm=False,
        widths=None,
        preprocessing="auto",
        frozen_stages=0,
        freeze_backbone=False,
        name=None,
        **kwargs,
    ):
        super().__init__(
            backbone,
            taps=[None],
            embedding_dim=embedding_dim,
            levels=(GLOBAL_HEAD_LEVEL,),
            input_shape=input_shape,
            weights=weights,
            num_classes=num_classes,
            freeze_batchnorm=freeze_batchnorm,
            widths=widths,
            preprocessing=preprocessing,
            frozen_stages=frozen_stages,
            freeze_backbone=freeze_backbone,
            name=name,
            **kwargs,
        )

    def get_config(self):
        config = super().get_config()
        for key in ("taps", "levels", "level_weights", "head_filters", "head_units"):
            config.pop(key)
        return config
