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
# Read by Ray when it is imported: its nodes and drivers then stay on 127.0.0.1 (tests/ray_cluster.py). Set here,
# before any test module runs, because in the whole suite another file (the registration tests) may import Ray
# first, through tfdml.ray, in the same worker.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

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

from hypothesis import settings  # noqa: E402

settings.register_profile("tfdml", deadline=None, max_examples=25, derandomize=True)
settings.load_profile("tfdml")


# The test files that take longest, longest first. Under pytest-xdist they are handed out first and the many
# short files fill in behind them, so that no worker is left running a long file alone at the end (xdist's
# `--dist loadfile` otherwise hands out the files with the most tests first, which puts these last). The tests
# that take over a second or so are marked `slow` where they are written (`@pytest.mark.slow`): `-m "not slow"`
# is the fast subset of CONTRIBUTING.md, and the whole suite runs them all.
LONGEST_FILES = (
    "test_ray_train.py",
    "test_ray_embed.py",
    "test_beam.py",
    "test_cli_stops.py",
    "test_efficientnet_lite.py",
    "test_distribute_training.py",
    "test_cli_train.py",
    "test_configs.py",
    "test_readme.py",
    "test_fine_tuning.py",
    "test_ala.py",
    "test_data_glyphs.py",
    "test_faults.py",
    "test_backends.py",
    "test_cross_batch_memory.py",
    "test_callbacks.py",
    "test_index_recall.py",
    "test_losses_triplet.py",
    "test_docs_site.py",
    "test_ala_episodes.py",
    "test_cli_retrieval.py",
    "test_models.py",
    "test_ala_noise.py",
    "test_losses_pml.py",
    "test_export.py",
    "test_export_search.py",
    "test_keras_loading.py",
    "test_docs_examples.py",
    "test_gpu_benchmark.py",
    "test_ala_learning.py",
    "test_losses_proxies.py",
    "test_metric_model.py",
    "test_losses_rll.py",
    "test_doctests.py",
    "test_distribute.py",
    "test_config_fuzz.py",
    "test_losses_noise.py",
    "test_public_names.py",
    "test_ala_options.py",
    "test_cli_errors.py",
)


def pytest_configure(config):
    if hasattr(config.option, "loadscopereorder"):  # pytest-xdist: keep the order below
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(items):
    def rank(item):
        name = item.path.name
        return LONGEST_FILES.index(name) if name in LONGEST_FILES else len(LONGEST_FILES)

    items.sort(key=rank)  # stable: each file's tests stay together and in order
