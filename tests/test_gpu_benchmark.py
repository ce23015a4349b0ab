"""`benchmarks/gpu/bench_gpu.py --small`: the GPU benchmark's code paths on the CPU, under Keras' JAX backend, so
that the script cannot rot while no GPU is at hand. The script runs once, in a subprocess (its backend is not the
test session's); the tests read its results.json and table.md. The timings of a `--small` run mean nothing: the
tests check the structure, that every time is finite and positive and every value finite, and that the losses
paired with pytorch-metric-learning (PML) are those of `benchmarks/losses` and compute the same values."""

import ast
import importlib.util
import json
import math
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # the tests share one small run of the GPU benchmark (about 25 s)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "benchmarks", "gpu")
HAS_JAX = importlib.util.find_spec("jax") is not None
HAS_PML = all(importlib.util.find_spec(name) is not None for name in ("torch", "pytorch_metric_learning"))
NO_PML_REASON = "pytorch-metric-learning is not installed (pip install -e '.[bench]'): the PML half is not run"
LOSSES = (
    "ranked_list",
    "group",
    "triplet_all",
    "triplet_semi_hard",
    "margin",
    "contrastive",
    "multi_similarity",
    "proxy_anchor",
)
SMALL_BATCH_SIZES = [16, 32]  # PRESETS["small"]

needs_jax = pytest.mark.skipif(not HAS_JAX, reason="jax is not installed: the benchmark runs on Keras' JAX backend")


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_small")
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu")
    env["PYTHONPATH"] = os.pathsep.join([ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    command = [sys.executable, os.path.join(BENCH, "bench_gpu.py"), "--small", "--out", str(out)]
    if not HAS_PML:
        print(f"test_gpu_benchmark: {NO_PML_REASON}; running --no-peer")
        command.append("--no-peer")
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, f"bench_gpu.py --small failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    with open(out / "results.json") as f:
        results = json.load(f)
    return results, (out / "table.md").read_text()


def _positive(value):
    return isinstance(value, int | float) and math.isfinite(value) and value > 0


def _finite(value):
    return isinstance(value, int | float) and math.isfinite(value)


@needs_jax
def test_environment_names_the_jax_backend_and_no_tensorflow(small_run):
    results, _ = small_run
    env = results["environment"]
    assert env["keras_backend"] == "jax" and env["jax_default_backend"] == "cpu"
    assert env["jax"] and env["keras"] and env["jax_devices"]
    # The GPU machine has no TensorFlow: importing tfdml.losses on the JAX backend must not need it.
    assert env["tensorflow_imported"] is False
    assert results["config"]["small"] is True and results["wall_s"] > 0


@needs_jax
def test_in_step_times_every_loss_with_a_finite_share(small_run):
    results, _ = small_run
    section = results["in_step"]
    rows = {row["name"]: row for row in section["rows"]}
    assert list(rows) == ["softmax", "zero_cost", *LOSSES]
    for name, row in rows.items():
        assert "error" not in row, f"{name}: {row['error']}"
        assert _positive(row["ms_per_step"]) and _positive(row["compile_s"]), row
        assert len(row["round_ms"]) == results["config"]["rounds"] and all(map(_positive, row["round_ms"]))
        assert _finite(row["loss_value"]), row
        if name not in ("softmax", "zero_cost"):
            # The share is a difference of two timings: finite, below 1, and near zero (either sign) when tiny.
            assert _finite(row["share"]) and row["share"] < 1 and _positive(row["vs_softmax"]), row
            assert row["loss_ms"] == pytest.approx(row["ms_per_step"] - rows["zero_cost"]["ms_per_step"])
    assert section["batch_size"] == 16 and _finite(section["noise"]) and section["noise"] >= 0


@needs_jax
@pytest.mark.parametrize("backend", ["accelerator", "cpu"])
def test_loss_calls_time_every_tfdml_loss(small_run, backend):
    results, _ = small_run
    rows = results["loss_calls"][backend]
    assert [(row["loss"], row["B"]) for row in rows] == [(n, b) for n in LOSSES for b in SMALL_BATCH_SIZES]
    for row in rows:
        assert "tfdml_error" not in row, row
        assert _positive(row["tfdml_ms"]) and _positive(row["tfdml_median_ms"]) and row["tfdml_calls"] >= 2, row
        assert row["tfdml_ms"] <= row["tfdml_median_ms"] and _finite(row["tfdml_value"]), row
        assert row["jax_device"].startswith("cpu"), row


@needs_jax
@pytest.mark.skipif(not HAS_PML, reason=NO_PML_REASON)
@pytest.mark.parametrize("backend", ["accelerator", "cpu"])
def test_loss_calls_time_pml_beside_tfdml(small_run, backend):
    results, _ = small_run
    for row in results["loss_calls"][backend]:
        if row["loss"] == "group":
            assert row["peer_skipped"] == "pytorch-metric-learning has no such loss"
            continue
        assert "peer_error" not in row, row
        assert row["peer"].startswith("pytorch-metric-learning ") and row["torch_device"] == "cpu", row
        assert _positive(row["peer_ms"]) and _finite(row["peer_value"]), row
        assert row["speedup"] == pytest.approx(row["peer_ms"] / row["tfdml_ms"]) and _positive(row["speedup"])
        # The pairs compute the same thing (PML's RankedListLoss adds 1e-5 to each weight sum: 1e-4 apart here).
        rtol = 1e-3 if row["loss"] == "ranked_list" else 1e-5
        assert row["tfdml_value"] == pytest.approx(row["peer_value"], rel=rtol), row


@needs_jax
def test_table_lists_every_step_and_loss_call(small_run):
    results, table = small_run
    assert table.startswith("Device: cpu") and "| zero_cost |" in table and "| softmax |" in table
    for name in LOSSES:
        assert f"| {name} | 16 |" in table and f"| {name} | 32 |" in table
        assert f"| {name} | " in table.split("Loss calls")[0]  # its in-step row
    assert "failed" not in table


def _pml_descriptions(path, tables):
    """`{loss name: PML description}` from the dict literals `tables` of a benchmark script (read as source: the
    losses benchmark imports TensorFlow, which the GPU benchmark must not need)."""
    with open(path) as f:
        tree = ast.parse(f.read())
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) in tables for t in node.targets):
            for key, value in zip(node.value.keys, node.value.values):
                found[key.value] = value.elts[1].value
    return found


def test_pml_pairs_are_those_of_the_losses_benchmark():
    losses_bench = _pml_descriptions(
        os.path.join(ROOT, "benchmarks", "losses", "bench_losses.py"), {"LOSSES", "PORTED"}
    )
    with open(os.path.join(BENCH, "loss_table.py")) as f:
        tree = ast.parse(f.read())
    ours = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "LossCase" and len(node.args) >= 4:
            ours[node.args[0].value] = node.args[3].value
    assert sorted(ours) == sorted(set(LOSSES) - {"group"})
    shared = set(ours) & set(losses_bench)
    assert shared >= set(ours)
    for name in shared:
        assert ours[name] == losses_bench[name], name
