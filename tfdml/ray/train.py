"""`tfdml train --ray ADDRESS --workers N`: the `tfdml train` job (`tfdml.pipeline.run`) on N Ray Train
workers under `MultiWorkerMirroredStrategy`.

Ray Train's `TensorflowTrainer` starts the workers (one per `RayTraining.cpus` share of a node) and sets each
one's `TF_CONFIG`; every worker runs the same job, whose strategy (`training.distribute: multi_worker`)
trains with `tfdml.training.fit_distributed` (Keras' `model.fit` fails under that strategy,
keras-team/keras#20585). Worker 0 is the chief: it writes the checkpoints (each epoch, into
`training.checkpoint_dir`), evaluates, exports and writes the report, once; the other workers train and stop.
The report and checkpoint folders are resolved to absolute paths by the driver and must be storage every node
reads and writes (one folder, on one machine; a shared file system across machines).

A worker that dies ends the run with an error (`WorkerLost`); the same command again resumes from the
chief's last checkpoint, as a stopped `tfdml train` does, and ends with the weights and losses of an
uninterrupted run.
"""

import dataclasses
import json
import os
import shutil
import tempfile

from ray.train import FailureConfig, RunConfig, ScalingConfig
from ray.train.tensorflow import TensorflowTrainer

from tfdml import pipeline
from tfdml.ray.cluster import connect


@dataclasses.dataclass(frozen=True)
class RayTraining:
    """Where and how wide `tfdml train --ray` runs, checked once when made (`ValueError` naming the field)."""

    address: str = None  # the cluster's head, HOST:PORT or auto; None starts a local one-node Ray
    workers: int = 2  # Ray Train workers, one MultiWorkerMirroredStrategy task each
    cpus: float = 1.0  # CPUs each worker asks of Ray

    def __post_init__(self):
        if int(self.workers) < 1:
            raise ValueError(f"workers must be a positive integer, got {self.workers}.")
        if not 0.0 < float(self.cpus) <= 256:
            raise ValueError(f"cpus must be in (0, 256], got {self.cpus}.")


class WorkerLost(RuntimeError):
    """A Ray Train worker died or failed; the message says how to resume."""


def cluster_config(config, overwrite=False, say=print):
    """`config` as every worker runs it: `training.distribute: multi_worker`, the report folder chosen once
    (here, by the driver) and every path absolute (Ray Train runs the workers in folders of its own)."""
    report_dir = os.path.abspath(pipeline.choose_report_dir(config, overwrite, say))
    config = pipeline.resolve_paths(config.replace(report=config.report.replace(dir=report_dir)))
    return config.replace(
        training=config.training.replace(
            distribute="multi_worker", checkpoint_dir=os.path.abspath(config.training.checkpoint_dir)
        ),
        export=config.export.replace(base_dir=os.path.abspath(config.export.base_dir)),
    )


def _worker(loop):
    """One Ray Train worker: the job; the chief writes its summary where the driver reads it."""
    summary = pipeline.run(
        loop["config"], verbose=loop["verbose"], fit_classes_per_batch=loop["fit"], overwrite=loop["overwrite"]
    )
    if summary.get("chief", True):
        partial = loop["summary"] + ".partial"
        with open(partial, "w") as f:
            json.dump(summary, f, default=str)
        os.replace(partial, loop["summary"])


def run_job(config, training=None, verbose=2, fit_classes_per_batch=False, overwrite=False, say=print):
    """Runs the `tfdml train` job `config` on the Ray cluster of `training` (a `RayTraining`); returns the
    chief's summary (what `tfdml.pipeline.run` returns). `WorkerLost` when a worker dies."""
    training = training or RayTraining()
    config = cluster_config(config, overwrite, say)
    # The chief's summary comes back as a file beside the report folder (storage the driver and chief share).
    exchange = tempfile.mkdtemp(prefix=".ray-summary-", dir=os.path.dirname(config.report.dir))
    summary_file = os.path.join(exchange, "summary.json")
    loop = {"config": config, "verbose": verbose, "fit": fit_classes_per_batch, "overwrite": overwrite}
    trainer = TensorflowTrainer(
        _worker,
        train_loop_config={**loop, "summary": summary_file},
        scaling_config=ScalingConfig(num_workers=int(training.workers), resources_per_worker={"CPU": training.cpus}),
        run_config=RunConfig(
            name=os.path.basename(config.report.dir),
            failure_config=FailureConfig(max_failures=0),  # a rerun resumes from tfdml's own checkpoints
        ),
    )
    try:
        with connect(training.address, logs=bool(verbose)):
            try:
                trainer.fit()
            except Exception as error:  # Ray Train's failure types differ between its versions
                raise WorkerLost(
                    f"a Ray Train worker failed ({type(error).__name__}: {_first_line(error)}); run the same "
                    f"command again to resume from the last checkpoint in {config.training.checkpoint_dir}"
                ) from error
        with open(summary_file) as f:
            return json.load(f)
    finally:
        shutil.rmtree(exchange, ignore_errors=True)


def _first_line(error):
    lines = [line for line in str(error).splitlines() if line.strip()]
    return lines[0][:300] if lines else "no message"
