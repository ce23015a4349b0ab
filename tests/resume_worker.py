"""Training job for the kill-and-resume test in test_callbacks.py (not a test module).

Usage: python tests/resume_worker.py BACKUP_DIR OUT_NPZ KILL_EPOCH [REFERENCE_BACKUP_DIR REFERENCE_OUT_NPZ]
Trains a multi-level small-CNN embedder with RLL (dynamic temperature, SGD momentum, cosine schedule, heads
at 10x) on an endless batch stream under `keras.callbacks.BackupAndRestore` and `resume_stream`; with
KILL_EPOCH >= 0 the process SIGKILLs itself in the middle of that epoch. Writes the final weights, the step
counter and the first epoch it ran to OUT_NPZ. Given a reference, first trains the same model uninterrupted
into REFERENCE_BACKUP_DIR and REFERENCE_OUT_NPZ, in the same process (one TensorFlow import for both).
"""

import os
import signal
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tfdml.callbacks import resume_stream  # noqa: E402
from tfdml.losses import LinearTemperature, RankedListLoss  # noqa: E402
from tfdml.models import MultiLevelEmbedder  # noqa: E402
from tfdml.recipes import make_optimizer  # noqa: E402

EPOCHS, STEPS = 5, 2


class KillMidEpoch(keras.callbacks.Callback):
    def __init__(self, epoch):
        super().__init__()
        self.kill_epoch = epoch
        self.epoch = None
        self.first_epoch = None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch
        if self.first_epoch is None:
            self.first_epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if self.epoch == self.kill_epoch and batch == 0:
            os.kill(os.getpid(), signal.SIGKILL)


def main(backup_dir, out, kill_epoch):
    tf.config.experimental.enable_op_determinism()
    keras.utils.set_random_seed(0)
    rng = np.random.RandomState(0)
    # an endless stream with a different batch at every step (like class_balanced_dataset(seed=...))
    labels = np.tile(np.repeat(np.arange(4), 6), EPOCHS * STEPS).astype(np.int32)
    images = (rng.rand(len(labels), 16, 16, 1) + 0.2 * labels[:, None, None, None]).astype("float32")
    stream = tf.data.Dataset.from_tensor_slices((images, labels)).batch(24).repeat()
    data = resume_stream(stream, backup_dir, STEPS)
    model = MultiLevelEmbedder("small_cnn", embedding_dim=8, input_shape=(16, 16, 1), head_filters=8, head_units=16)
    optimizer = make_optimizer(
        {
            "name": "sgd",
            "learning_rate": 0.05,
            "momentum": 0.9,
            "weight_decay": 1e-4,
            "head_lr_multiplier": 10,
            "schedule": "cosine",
        },
        model,
        total_steps=EPOCHS * STEPS,
    )
    model.compile(optimizer, loss=RankedListLoss(tn=LinearTemperature(20.0, 5.0, max_steps=EPOCHS * STEPS)))
    killer = KillMidEpoch(kill_epoch)
    model.fit(
        data,
        epochs=EPOCHS,
        steps_per_epoch=STEPS,
        verbose=0,
        callbacks=[keras.callbacks.BackupAndRestore(backup_dir), killer],
    )
    np.savez(
        out,
        iterations=int(model.optimizer.iterations.numpy()),
        first_epoch=killer.first_epoch,
        **{f"w{i}": w for i, w in enumerate(model.get_weights())},
    )


if __name__ == "__main__":
    if len(sys.argv) == 6:
        main(sys.argv[4], sys.argv[5], -1)
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
