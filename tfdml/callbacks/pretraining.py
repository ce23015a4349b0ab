"""Group Loss' classification pre-training stage inside one `model.fit` call."""

import keras


class ClassificationPretraining(keras.callbacks.Callback):
    """Trains with plain softmax cross-entropy on the classifier logits for the first `epochs` epochs, then
    with the compiled loss (Group Loss: "we train all networks in the classification task for 10 epochs").

    Needs a tfdml embedder built with `num_classes` (its classifier head gives the logits). During the
    pre-training epochs every level's loss is `sparse_categorical_crossentropy(y, logits, from_logits=True)`;
    the optimizer, its state and the learning-rate schedule carry over. The epoch logs get `pretraining`
    (1.0 during the stage, else 0.0).

    Args:
      epochs: number of cross-entropy epochs (official: 10).

    Example:
      >>> model = Embedder("resnet50", num_classes=100, weights=None)
      >>> model.compile(keras.optimizers.Adam(2e-4), loss=GroupLoss(num_classes=100, temperature=24.0))
      >>> model.fit(train, epochs=70, steps_per_epoch=100, callbacks=[ClassificationPretraining(epochs=10)])
    """

    def __init__(self, epochs=10):
        super().__init__()
        if int(epochs) < 0:
            raise ValueError(f"epochs must be >= 0, got {epochs}.")
        self.epochs = int(epochs)

    def _set_stage(self, pretraining):
        if self.model.classification_pretraining == pretraining:
            return
        self.model.classification_pretraining = pretraining
        # The traced step functions hold the previous loss: retrace them.
        self.model.make_train_function(force=True)
        self.model.make_test_function(force=True)

    def on_train_begin(self, logs=None):
        if not getattr(self.model, "classifiers", None):
            raise ValueError(
                "ClassificationPretraining needs a tfdml Embedder / MultiLevelEmbedder built with num_classes "
                f"(a classifier head); {type(self.model).__name__} has none."
            )

    def on_epoch_begin(self, epoch, logs=None):
        self._set_stage(epoch < self.epochs)

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["pretraining"] = 1.0 if self.model.classification_pretraining else 0.0

    def on_train_end(self, logs=None):
        if self.model.classification_pretraining:
            self.model.classification_pretraining = False
            # rebuilt lazily by the next fit / evaluate
            self.model.train_function = None
            self.model.test_function = None
