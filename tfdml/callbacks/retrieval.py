"""Retrieval evaluation on a held-out set during `model.fit` (Recall@K, MAP@R, ...), logged to `History`."""

import keras
import numpy as np
import tensorflow as tf

from tfdml.ops import pairwise_squared_distance

_FALLBACK_METRICS = ("recall", "map@r", "r_precision")


def exact_retrieval_metrics(embeddings, labels, ks=(1, 2, 4, 8), metrics=("recall", "map@r")):
    """Exact Recall@K, MAP@R and R-precision, each query against all other samples (itself excluded).

    Recall@K: fraction of queries with a same-class sample among their K nearest neighbours. With R the
    number of other same-class samples and rel(i) whether the i-th neighbour shares the query's class,
    R-precision = (1/R) sum_{i<=R} rel(i) and MAP@R = (1/R) sum_{i<=R} rel(i) * precision@i (Musgrave et al.
    2020). Averages run over queries with R >= 1. Used when `tfdml.retrieval` is unavailable.
    """
    unknown = set(metrics) - set(_FALLBACK_METRICS)
    if unknown:
        raise ValueError(f"The exact fallback computes {_FALLBACK_METRICS}; got {sorted(unknown)}.")
    labels = np.asarray(labels).reshape(-1)
    distances = pairwise_squared_distance(tf.convert_to_tensor(embeddings, tf.float32)).numpy()
    np.fill_diagonal(distances, np.inf)
    order = np.argsort(distances, axis=1, kind="stable")[:, :-1]  # the query itself sorts last
    relevant = labels[order] == labels[:, None]
    counts = relevant.sum(axis=1)
    valid = counts > 0
    results = {}
    if "recall" in metrics:
        for k in ks:
            results[f"recall@{k}"] = float(relevant[valid, :k].any(axis=1).mean()) if valid.any() else 0.0
    if "map@r" in metrics or "r_precision" in metrics:
        ranks = np.arange(1, relevant.shape[1] + 1)
        within_r = ranks[None, :] <= counts[:, None]
        hits = relevant & within_r
        safe_counts = np.maximum(counts, 1)
        if "map@r" in metrics:
            precision_at_i = np.cumsum(relevant, axis=1) / ranks[None, :]
            map_at_r = (precision_at_i * hits).sum(axis=1) / safe_counts
            results["map@r"] = float(map_at_r[valid].mean()) if valid.any() else 0.0
        if "r_precision" in metrics:
            results["r_precision"] = float((hits.sum(axis=1) / safe_counts)[valid].mean()) if valid.any() else 0.0
    return results


def _evaluate(embeddings, labels, ks, metrics):
    try:
        from tfdml.retrieval import evaluate
    except ImportError:
        return exact_retrieval_metrics(embeddings, labels, ks=ks, metrics=metrics)
    return evaluate(embeddings, labels, ks=ks, metrics=metrics)


class RetrievalEvaluation(keras.callbacks.Callback):
    """Embeds a held-out set every `every_n_epochs` epochs and adds retrieval metrics to the epoch logs.

    The metrics (`tfdml.retrieval.evaluate`, exact search; an exact NumPy fallback when that module is
    unavailable) appear in `History` as `<prefix>recall@1`, `<prefix>map@r`, ... and in TensorBoard when a
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
            embeddings, labels = [], []
            for images, batch_labels in self.data:
                embeddings.append(self.model(images, training=False).numpy())
                labels.append(np.asarray(batch_labels).reshape(-1))
            return np.concatenate(embeddings), np.concatenate(labels)
        images, labels = self.data
        embeddings = self.model.predict(images, batch_size=self.batch_size, verbose=0)
        return np.asarray(embeddings), np.asarray(labels).reshape(-1)

    def evaluate(self):
        """The metrics of the current model on the held-out data, as a dict."""
        embeddings, labels = self._embed()
        return _evaluate(embeddings, labels, self.ks, self.metrics)

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
