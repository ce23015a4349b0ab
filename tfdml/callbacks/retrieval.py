"""Retrieval evaluation on a held-out set during `model.fit` (Recall@K, MAP@R, ...), logged to `History`."""

import keras
import numpy as np
import tensorflow as tf

from tfdml.retrieval import embed_batches, evaluate


class RetrievalEvaluation(keras.callbacks.Callback):
    """Embeds a held-out set every `every_n_epochs` epochs and adds retrieval metrics to the epoch logs.

    The metrics (`tfdml.retrieval.evaluate`, exact search) appear in `History` as `<prefix>recall@1`, `<prefix>map@r`, ... and in TensorBoard when a
    `keras.callbacks.TensorBoard` comes after this callback in the list (or when `log_dir` is given, written
    here under `<log_dir>/retrieval`).

    Args:
      data: `(images, labels)` arrays or a `tf.data.Dataset` of `(images, labels)` batches. For zero-shot
        evaluation use classes unseen in training (e.g. digits 5-9).
      every_n_epochs: evaluation period (the last epoch is always evaluated).
      ks: the K of Recall@K.
      metrics: names understood by `tfdml.retrieval.evaluate` ("recall", "map@r", "r_precision", "nmi", "f1").
      prefix: key prefix in the logs.
      batch_size: inference batch size for array data.
      log_dir: optional TensorBoard directory.

    Example:
      >>> callback = RetrievalEvaluation((x_test, y_test), every_n_epochs=2, ks=(1, 2, 4, 8))
      >>> history = model.fit(train, epochs=10, callbacks=[callback])
      >>> history.history["val_recall@1"]
    """

    def __init__(self, data, every_n_epochs=1, ks=(1, 2, 4, 8), metrics=("recall", "map@r"), prefix="val_",
                 batch_size=256, log_dir=None):
        super().__init__()
        if int(every_n_epochs) < 1:
            raise ValueError(f"every_n_epochs must be >= 1, got {every_n_epochs}.")
        self.data = data
        self.every_n_epochs = int(every_n_epochs)
        self.ks = tuple(int(k) for k in ks)
        self.metrics = tuple(metrics)
        self.prefix = prefix
        self.batch_size = int(batch_size)
        self.log_dir = log_dir
        self._writer = None
        self.last_results = {}

    def _embed(self):
        if isinstance(self.data, tf.data.Dataset):
            return embed_batches(self.model, self.data)
        images, labels = self.data
        embeddings = self.model.predict(images, batch_size=self.batch_size, verbose=0)
        return np.asarray(embeddings), np.asarray(labels).reshape(-1)

    def evaluate(self):
        """The metrics of the current model on the held-out data, as a dict."""
        embeddings, labels = self._embed()
        return evaluate(embeddings, labels, ks=self.ks, metrics=self.metrics)

    def on_epoch_end(self, epoch, logs=None):
        last = self.params.get("epochs") if self.params else None
        if (epoch + 1) % self.every_n_epochs and (last is None or epoch + 1 != last):
            return
        self.last_results = self.evaluate()
        if logs is not None:
            logs.update({self.prefix + key: value for key, value in self.last_results.items()})
        if self.log_dir is not None:
            if self._writer is None:
                self._writer = tf.summary.create_file_writer(f"{self.log_dir}/retrieval")
            with self._writer.as_default():
                for key, value in self.last_results.items():
                    tf.summary.scalar(self.prefix + key, value, step=epoch)
            self._writer.flush()
