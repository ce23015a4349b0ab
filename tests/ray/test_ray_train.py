"""`tfdml train --ray` on a real two-node Ray cluster on 127.0.0.1 (no mocks): Ray Train's
`TensorflowTrainer` runs the job on 2 workers, one per node, under `MultiWorkerMirroredStrategy`
(`tfdml.training.fit_distributed`); the per-epoch losses equal those of the same job in one process
(`model.fit`) to float rounding, BatchNorm frozen (see JOB). A worker killed mid-run ends the run with a
one-line error, and the same command again resumes from the chief's checkpoint to the losses of an
uninterrupted run. Skips without the ray extra."""

import glob
import json
import os
import threading
import time

import pytest

from tests.ray_cluster import two_node_cluster  # before Ray: it sets what Ray reads when imported

pytest.importorskip("ray", reason='the Ray tests need the ray extra: pip install -e ".[ray]"')

pytestmark = pytest.mark.slow  # each test trains on a two-node Ray cluster

import psutil  # noqa: E402  (a dependency of Ray)

from tfdml.cli import main  # noqa: E402

EPOCHS = 3
# BatchNorm in inference mode: a training-mode BatchNormalization normalises each worker's share of the
# batch by that share's own statistics (Keras' default, unsynchronised), which one process never does; with
# it frozen, every other computation of a step is the single process's.
JOB = ["train", "--epochs", str(EPOCHS), "--steps-per-epoch", "6", "--no-export"] + [
    "--set",
    "model.freeze_batchnorm=true",
    "--set",
    "data.images_per_class=6",
    "--set",
    "report.worst_queries=2",
    "--set",
    "report.grid_queries=2",
    "--set",
    "report.grid_neighbours=2",
]


def _losses(report_dir):
    with open(os.path.join(report_dir, "metrics.json")) as f:
        return json.load(f)["history"]["loss"]


@pytest.fixture(scope="module")
def cluster():
    with two_node_cluster() as running:
        yield running


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    report = str(tmp_path_factory.mktemp("one") / "report")
    assert main([*JOB, "--report-dir", report]) == 0
    return _losses(report)


def _ray_job(cluster, report):
    return [*JOB, "--report-dir", report, "--ray", cluster.address, "--workers", "2"]


@pytest.fixture(scope="module")
def two_workers(cluster, tmp_path_factory):
    report = str(tmp_path_factory.mktemp("two") / "report")
    assert main(_ray_job(cluster, report)) == 0
    return _losses(report)


def test_two_workers_give_the_losses_of_one_process(two_workers, one_process):
    assert len(two_workers) == EPOCHS
    # The first epoch's mean loss to float rounding; after it the workers' float32 gradients, summed across
    # workers in another order than one process sums its batch, round differently, and Adam carries the
    # difference on (5e-4 relative by the third epoch here). A loss computed on each worker's half of the batch
    # instead of the whole one is off by about 1 % from the first epoch on.
    assert two_workers[0] == pytest.approx(one_process[0], rel=1e-5)
    assert two_workers == pytest.approx(one_process, rel=2e-3)


def _kill_a_worker_after_the_first_checkpoint(checkpoints, killed):
    """Waits for the chief's first checkpoint, then SIGKILLs one Ray Train worker process of this cluster."""
    deadline = time.monotonic() + 600
    while not glob.glob(os.path.join(checkpoints, "ckpt-1.index")) and time.monotonic() < deadline:
        time.sleep(0.05)
    for process in psutil.Process().children(recursive=True):
        try:
            if "RayTrainWorker" in " ".join(process.cmdline()):
                process.kill()
                killed.append(process.pid)
                return
        except psutil.NoSuchProcess:
            continue


def test_a_killed_worker_and_the_rerun_resumes_to_the_same_losses(cluster, one_process, tmp_path, capsys):
    report = str(tmp_path / "report")
    killed = []
    watcher = threading.Thread(
        target=_kill_a_worker_after_the_first_checkpoint, args=(os.path.join(report, "checkpoints"), killed)
    )
    watcher.start()
    status = main(_ray_job(cluster, report))
    watcher.join()
    err = capsys.readouterr().err.strip().splitlines()
    assert killed and status == 1
    assert err[-1].startswith("tfdml train: error: a Ray Train worker failed") and "run the same command" in err[-1]
    assert not os.path.exists(os.path.join(report, "metrics.json"))
    assert main(_ray_job(cluster, report)) == 0
    resumed = _losses(report)  # the epochs the rerun trained: those after the checkpoint
    assert 1 <= len(resumed) < EPOCHS
    assert resumed == pytest.approx(one_process[-len(resumed) :], rel=2e-3)  # as in the uninterrupted run
