"""A real two-node Ray cluster on 127.0.0.1 for the Ray tests and the Ray benchmark (`ray.cluster_utils.Cluster`:
a head node and a second node, each its own raylet and object store, `cpus` CPUs each), always shut down.

Ray rewrites 127.0.0.1 to the machine's address unless every node is started with `node_ip_address` and
`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`; its temporary files go to a short folder under /tmp (the Unix socket
paths inside it are limited to 107 characters).
"""

import contextlib
import os
import shutil
import tempfile

# Read by Ray when it is imported, in this process (the driver) and in the nodes it starts: import this module
# before Ray.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"


@contextlib.contextmanager
def two_node_cluster(object_store_mb=80, cpus=1):
    import ray
    from ray.cluster_utils import Cluster

    tmp = tempfile.mkdtemp(prefix="tfdml-ray-", dir="/tmp")
    saved = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = tmp
    node = {"num_cpus": cpus, "node_ip_address": "127.0.0.1", "object_store_memory": object_store_mb * 2**20}
    cluster = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
    try:
        cluster.add_node(**node)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
        if saved is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = saved
        shutil.rmtree(tmp, ignore_errors=True)
