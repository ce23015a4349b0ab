"""Retrieval evaluation on a held-out set during `model.fit` (Recall@K, MAP@R, ...), logged to `History`."""

import keras
import numpy as np
import tensorflow as tf

from tfdml.data.evaluation import eval_dataset
from tfdml.data.sources import Source
from tfdml.retrieval import embed_batches, evaluate


class RetrievalEvaluation(keras.callbacks.Callback):
    """Embeds a held-out set every `every_n_epochs` epochs and adds retrieval metrics to the epoch logs.

    The metrics (`tfdml.retrieval.evaluate`, exact search) appear in `History` as `<prefix>recall@1`,
    `<prefix>map@r`, ... and in TensorBoard when a
    `keras.callbacks.TensorBoard` comes after this callback in the list (or when `log_dir` is given, written
    here under `<log_dir>/retrieval`).

    Args:
      data: `(images, labels)` arrays (raw pixels, e.g. uint8: tfdml embedders preprocess them), a
        `tf.data.Dataset` of `(images, labels)` batches, or a `tfdml.data.Source` (e.g.
        `tfdml.data.glyphs("test")`), embedded through `tfdml.data.eval_dataset` at the model's input size.
        For zero-shot evaluation use classes unseen in training (e.g. digits 5-9).
      every_n_epochs: evaluation period (the last epoch is always evaluated).
      ks: the K of Recall@K.
      metrics: names understood by `tfdml.retrieval.evaluate` ("recall", "map@r", "r_precision", "nmi", "f1").
      prefix: key prefix in the logs.
      batch_size: inference batch size for arrays and sources.
      log_dir: optional TensorBoard directory.
      center_crop: for a `Source`, the evaluation geometry of `tfdml.data.eval_dataset`: resize to 256/224
        of the input size and crop the centre (True, the papers'), or resize the whole image (False, for a
        model trained without crops, as `tfdml train`'s glyph job).

    Example:
      >>> callback = RetrievalEvaluation((x_test, y_test), every_n_epochs=2, ks=(1, 2, 4, 8))
      >>> history = model.fit(train, epochs=10, steps_per_epoch=100, callbacks=[callback])
      >>> history.history["val_recall@1"]
      >>> RetrievalEvaluation(tfdml.data.glyphs("test"), center_crop=False)   # a Source
    """

    def __init__(
        self,
        data,
        every_n_epochs=1,
        ks=(1, 2, 4, 8),
        metrics=("recall", "map@r"),
        prefix="val_",
        batch_size=256,
        log_dir=None,
        center_crop=True,
    ):
        super().__init__()
        if int(every_n_epochs) < 1:
            raise ValueError(f"every_n_epochs must be >= 1, got {every_n_epochs}.")
        if not isinstance(data, (tf.data.Dataset, Source)):
            if not isinstance(data, (tuple, list)) or len(data) != 2:
                raise TypeError(
                    "RetrievalEvaluation takes (images, labels) arrays, a tf.data.Dataset of (images, labels) "
                    f"batches or a tfdml.data.Source; got {type(data).__name__}."
                )
            if len(data[0]) != len(data[1]):
                raise ValueError(f"RetrievalEvaluation: {len(data[0])} images but {len(data[1])} labels.")
        self.data = data
        self.center_crop = bool(center_crop)
        self.every_n_epochs = int(every_n_epochs)
        self.ks = tuple(int(k) for k in ks)
        self.metrics = tuple(metrics)
        self.prefix = prefix
        self.batch_size = int(batch_size)
        self.log_dir = log_dir
        self._writer = None
        self.last_results = {}

    def _embed(self):
        if isinstance(self.data, Source):
            # At the model's input size (tfdml embedders and models with a static input shape).
            config = self.model.preprocessing_config() if hasattr(self.model, "preprocessing_config") else {}
            size = config.get("image_size") or tuple(self.model.input_shape[1:3])
            batches = eval_dataset(self.data, self.batch_size, image_size=size, center_crop=self.center_crop)
            return embed_batches(self.model, batches)
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
