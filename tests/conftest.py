"""Test-session setup shared by every test module.

Before TensorFlow creates its devices, the one physical CPU is split into 4 logical CPU devices so that
`tf.distribute.MirroredStrategy` can be tested with 2 and 4 replicas on any machine (single-device code
keeps running on /CPU:0 as usual).

Under pytest-xdist (`-n N`, the README's test command) each worker process runs whole test files
(`--dist loadfile`: a module's fixtures are built once) and TensorFlow's op threads are shared out between the
workers (NumPy's BLAS and OpenMP threads as well), so that N workers do not each start one thread per core.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import tensorflow as tf  # noqa: E402

NUM_LOGICAL_CPUS = 4

_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    _SHARE = max(1, (os.cpu_count() or 1) // _WORKERS)
    tf.config.threading.set_intra_op_parallelism_threads(_SHARE)
    # NumPy's BLAS and scikit-learn's OpenMP too, here and in the subprocesses the tests start: their threads
    # wait for each other by spinning, and on cores the other workers keep busy a small k-means or matmul
    # then costs several times its CPU time.
    for _variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_variable, str(_SHARE))
    from threadpoolctl import threadpool_limits

    threadpool_limits(_SHARE)

_cpus = tf.config.list_physical_devices("CPU")
try:
    tf.config.set_logical_device_configuration(
        _cpus[0], [tf.config.LogicalDeviceConfiguration() for _ in range(NUM_LOGICAL_CPUS)]
    )
except RuntimeError:  # devices already initialised by an earlier import; keep what exists
    pass

import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

settings.register_profile("tfdml", deadline=None, max_examples=25, derandomize=True)
settings.load_profile("tfdml")


# The test files that take longest, longest first. Under pytest-xdist they are handed out first and the many
# short files fill in behind them, so that no worker is left running a long file alone at the end (xdist's
# `--dist loadfile` otherwise hands out the files with the most tests first, which puts these last). Their tests
# are marked `slow`: `-m "not slow"` is the fast subset of CONTRIBUTING.md, and the whole suite runs them all.
SLOW_FILES = (
    "test_ray_train.py",
    "test_ray_embed.py",
    "test_fine_tuning.py",
    "test_efficientnet_lite.py",
    "test_configs.py",
    "test_ala.py",
    "test_cli_stops.py",
    "test_faults.py",
    "test_cli_train.py",
    "test_distribute_training.py",
    "test_data_glyphs.py",
    "test_backends.py",
    "test_callbacks.py",
    "test_cross_batch_memory.py",
    "test_losses_triplet.py",
    "test_ala_episodes.py",
    "test_keras_loading.py",
    "test_index_recall.py",
    "test_ala_noise.py",
    "test_losses_pml.py",
    "test_cli_retrieval.py",
    "test_docs_site.py",
    "test_export.py",
    "test_docs_examples.py",
    "test_losses_noise.py",
    "test_gpu_benchmark.py",
    "test_models.py",
)


def pytest_configure(config):
    if hasattr(config.option, "loadscopereorder"):  # pytest-xdist: keep the order below
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(items):
    def rank(item):
        name = item.path.name
        return SLOW_FILES.index(name) if name in SLOW_FILES else len(SLOW_FILES)

    items.sort(key=rank)  # stable: each file's tests stay together and in order
    for item in items:
        if item.path.name in SLOW_FILES:
            item.add_marker(pytest.mark.slow)
