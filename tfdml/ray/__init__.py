"""Beyond one machine on Ray: `tfdml embed --engine ray` on Ray Data and `tfdml train --ray` on Ray Train (the
ray extra: `pip install -e ".[ray]"` in the top folder of tfdml's source).

Modules: `cluster` (connecting to a cluster, or starting a local one), `embed` (the `tfdml embed` steps of
`tfdml.catalogue.steps` on Ray Data: one SavedModel per actor, sharded files and indexes, the evaluation over
query shards as Ray tasks), `train` (the `tfdml train` job on N Ray Train workers under
`MultiWorkerMirroredStrategy`).

Ray is an optional dependency: it is imported by this package only, and importing the package without it
raises an `ImportError` that says how to install it.
"""

from tfdml.embed_job import RAY_INSTALL

try:  # the optional dependency, checked before anything else loads: Ray Core, Ray Data and Ray Train
    import ray  # noqa: F401
    import ray.data  # noqa: F401
    import ray.train  # noqa: F401
except ImportError as error:  # exercised in a subprocess by tests/ray/test_ray_optional.py
    raise ImportError(
        f"tfdml.ray needs Ray: {RAY_INSTALL} in the top folder of tfdml's source (missing: {error.name})"
    ) from error

from tfdml.ray.cluster import connect
from tfdml.ray.embed import evaluate_output, run_embed
from tfdml.ray.train import RayTraining, WorkerLost, run_job

__all__ = ["RayTraining", "WorkerLost", "connect", "evaluate_output", "run_embed", "run_job"]
