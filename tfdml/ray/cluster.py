"""Connecting a driver to a Ray cluster: `connect(address)` joins a running cluster (or starts a local
one-node Ray when `address` is None) and disconnects on exit, leaving the cluster running.

Nodes on one machine at 127.0.0.1: Ray rewrites a loopback address to the machine's network address unless
`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0` is set before Ray is imported, in the driver and in every `ray start`
(with `--node-ip-address 127.0.0.1`); `connect` refuses, with that advice, to join such a cluster without it
rather than wait for a head it cannot reach.
"""

import contextlib
import logging
import os

import ray

from tfdml.embed_job import RayCluster

LOOPBACK_VARIABLE = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


@contextlib.contextmanager
def connect(address=None, logs=False):
    """Joins the cluster at `address` for the `with` block (an already connected driver stays connected);
    `logs`: the workers' output is printed by the driver.

    The driver's current folder goes on the workers' `sys.path` (Ray's default), so a source checkout of tfdml
    run from its top folder is the one the workers import.
    """
    if ray.is_initialized():
        yield
        return
    if RayCluster(address=address).on_loopback and os.environ.get(LOOPBACK_VARIABLE) != "0":
        raise ValueError(
            f"a Ray cluster at {address} (this machine's loopback address) needs {LOOPBACK_VARIABLE}=0 in the "
            "environment of the driver and of every node, set before they start (else Ray rewrites 127.0.0.1 to "
            "this machine's network address and cannot reach the head)."
        )
    local = {} if address else {"include_dashboard": False}  # Ray refuses it when joining a running cluster
    ray.init(address=address, logging_level=logging.WARNING, log_to_driver=logs, **local)
    try:
        yield
    finally:
        ray.shutdown()


def quiet_data():
    """Ray Data without progress bars and per-operator logs (the driver prints its own summary)."""
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    context.enable_operator_progress_bars = False
    context.print_on_execution_start = False
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    return context
