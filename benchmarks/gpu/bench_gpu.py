"""tfdml's losses on one GPU under Keras' JAX backend, side by side with pytorch-metric-learning on PyTorch.

Writes `results.json` and `table.md` to `--out`:

1. `environment`: the GPU and its driver, the JAX, PyTorch, Keras and PML versions, the Keras backend, and whether
   TensorFlow was imported (it must not be: the GPU machine has none);
2. `in_step`: ms per jit-compiled training step of a ResNet-50 (bf16 mixed precision, 32 classes x 4 images of
   224 px) with a softmax classifier, with a zero-cost loss on the embedding head, and with each metric loss,
   and each loss's share of the step (defined in `in_step.py`);
3. `loss_calls.accelerator`: forward + backward of each loss at B = 256 and 1024 on random L2-normalised
   512-d embeddings, tfdml on JAX (jit) against PML on PyTorch, both on the GPU, with PML's time over tfdml's;
4. `loss_calls.cpu`: the same calls on the machine's CPU backends (JAX CPU, PyTorch CPU), to read the GPU figures
   against `benchmarks/losses`.

A loss that fails on a backend records its error in place of a time, and the others go on. The results file is
rewritten after each section, so a run stopped early keeps what it measured. The sections past `--budget-s`
seconds are recorded as skipped.

Usage (KERAS_BACKEND=jax; see README.md for the GPU machine's command):
    python benchmarks/gpu/bench_gpu.py --out DIR            # on a GPU, under 8 minutes
    python benchmarks/gpu/bench_gpu.py --out DIR --small    # the same code paths on a CPU, in under a minute
"""

import argparse
import json
import math
import os
import platform
import signal
import subprocess
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "jax")
# JAX takes 60 % of the GPU's memory up front, leaving the rest to PyTorch in the same process.
os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.6")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import in_step  # noqa: E402
import loss_calls  # noqa: E402
import loss_table  # noqa: E402
import numpy as np  # noqa: E402
import report  # noqa: E402

# The full run (on a GPU) and `--small` (the same code paths on a CPU): options left unset take these values.
PRESETS = {
    "full": {
        "backbone": "resnet50",
        "image_size": 224,
        "classes_per_batch": 32,
        "num_classes": 100,
        "embedding_dim": 512,
        "steps": 10,
        "rounds": 3,
        "batch_sizes": "256,1024",
        "budget_s": 450.0,
        "timing": {"min_calls": 10, "min_seconds": 0.5, "max_seconds": 3.0},
        "cpu_timing": {"min_calls": 3, "min_seconds": 0.3, "max_seconds": 2.0},
    },
    "small": {
        "backbone": "tiny",
        "image_size": 32,
        "classes_per_batch": 4,
        "num_classes": 8,
        "embedding_dim": 32,
        "steps": 1,
        "rounds": 2,
        "batch_sizes": "16,32",
        "budget_s": 1800.0,  # no limit in practice: the test checks every section
        "timing": {"min_calls": 2, "min_seconds": 0.0, "max_seconds": 0.5},
        "cpu_timing": {"min_calls": 2, "min_seconds": 0.0, "max_seconds": 0.5},
    },
}
# Left for the CPU loss calls when the in-step rounds stop early for the time budget.
CPU_RESERVE_S = 90.0


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for results.json and table.md (created)")
    parser.add_argument("--small", action="store_true", help="tiny backbone, images and batches, on any device")
    parser.add_argument("--losses", default=",".join(loss_table.CASE_NAMES), help="comma-separated subset")
    parser.add_argument("--backbone", choices=["resnet50", "tiny"], help="resnet50 (full) or tiny (--small)")
    parser.add_argument("--image-size", type=int, help="image side in pixels (224; --small 32)")
    parser.add_argument("--classes-per-batch", type=int, help="classes per training batch of 4 images each (32)")
    parser.add_argument("--num-classes", type=int, help="training classes the batches are drawn from (100)")
    parser.add_argument("--embedding-dim", type=int, help="embedding size, in the step and the loss calls (512)")
    parser.add_argument("--steps", type=int, help="training steps per timed round (10)")
    parser.add_argument("--rounds", type=int, help="timed rounds, round-robin over the configurations (3)")
    parser.add_argument("--batch-sizes", help="comma-separated batch sizes of the loss calls (256,1024)")
    parser.add_argument("--budget-s", type=float, help="seconds after which the remaining sections are skipped")
    threads = max(1, min(8, (os.cpu_count() or 1) // 2))
    parser.add_argument("--compile-threads", type=int, default=threads, help="XLA compiles at a time (cores / 2, <= 8)")
    parser.add_argument("--learning-rate", type=float, default=1e-4, help="Adam's learning rate in the step")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-peer", action="store_true", help="tfdml alone (without torch and PML)")
    parser.add_argument("--skip-in-step", action="store_true", help="the loss calls only")
    parser.add_argument("--skip-cpu", action="store_true", help="no loss calls on the CPU backends")
    parser.add_argument("--allow-cpu", action="store_true", help="run the full sizes although JAX has no GPU")
    args = parser.parse_args(argv)
    preset = PRESETS["small" if args.small else "full"]
    for key, value in preset.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    args.batch_sizes = [int(b) for b in str(args.batch_sizes).split(",") if b.strip()]
    args.losses = [name.strip() for name in args.losses.split(",") if name.strip()]
    args.timing, args.cpu_timing = preset["timing"], preset["cpu_timing"]
    return args


def nvidia_smi():
    """The GPU's name, driver, memory and maximum SM clock as nvidia-smi reports them (None without it)."""
    query = "name,driver_version,memory.total,clocks.max.sm"
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    gpus = [dict(zip(query.split(","), (v.strip() for v in line.split(",")))) for line in out.strip().splitlines()]
    return {**gpus[0], "count": len(gpus)} if gpus else None


def environment(args):
    import jax
    import jaxlib
    import keras

    env = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "keras_backend": keras.backend.backend(),
        "keras": keras.__version__,
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "numpy": np.__version__,
        "jax_default_backend": jax.default_backend(),
        "jax_devices": [f"{d.platform}:{d.device_kind}" for d in jax.devices()],
        "xla_python_client_mem_fraction": os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION"),
        "xla_flags": os.environ.get("XLA_FLAGS"),
        "gpu": nvidia_smi(),
    }
    if not args.no_peer:
        import pytorch_metric_learning
        import torch

        env.update(
            torch=torch.__version__,
            pytorch_metric_learning=pytorch_metric_learning.__version__,
            torch_cuda=torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            torch_cpu_threads=torch.get_num_threads(),
        )
    return env


def loss_call_rows(cases, args, jax_device, torch_device, timing, deadline):
    """One row per loss and batch size; the rows past `deadline` are recorded as skipped."""
    rows = []
    for case in cases:
        for batch_size in args.batch_sizes:
            if time.monotonic() > deadline:
                rows.append({"loss": case.name, "B": batch_size, "skipped": "time budget (--budget-s) spent"})
                continue
            row = loss_calls.compare(case, batch_size, args.embedding_dim, jax_device, torch_device, timing)
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def _clean(value):
    """JSON without NaN or infinity: a non-finite float (which no field should hold) becomes its text."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def write(results, out):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(_clean(results), f, indent=1, allow_nan=False)
    with open(os.path.join(out, "table.md"), "w") as f:
        f.write(report.markdown(results))


def check_backends(args):
    """Keras on JAX, and JAX on the GPU unless `--small` or `--allow-cpu`; else a clear exit."""
    import jax
    import keras

    if keras.backend.backend() != "jax":
        sys.exit(f"bench_gpu.py runs on Keras' JAX backend; KERAS_BACKEND is {keras.backend.backend()!r}.")
    if not (args.small or args.allow_cpu) and jax.default_backend() != "gpu":
        sys.exit(
            f"JAX sees no GPU (default backend {jax.default_backend()!r}, devices {jax.devices()}): the full sizes "
            "are meant for a GPU. Check the CUDA plugin (jax-cuda*-plugin), or pass --small or --allow-cpu."
        )


def _config(args):
    keys = ("small", "backbone", "image_size", "classes_per_batch", "num_classes", "embedding_dim", "steps")
    keys += ("rounds", "batch_sizes", "budget_s", "compile_threads", "learning_rate", "seed", "losses")
    return {key: getattr(args, key) for key in keys} | {"timing": args.timing, "cpu_timing": args.cpu_timing}


def run_sections(args, results, deadline):
    import jax

    import tfdml.losses  # noqa: F401  (imported here so that the environment records whether TensorFlow came with it)

    results["environment"]["tensorflow_imported_with_tfdml_losses"] = "tensorflow" in sys.modules
    cases = loss_table.cases(args.losses)
    torch_accelerator = torch_cpu = None
    if not args.no_peer:
        import torch

        torch_accelerator = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        torch_cpu = torch.device("cpu")
    accelerator = jax.devices()[0]
    results["loss_call_devices"] = {"accelerator": f"JAX {accelerator.platform}, PyTorch {torch_accelerator}"}
    calls = results["loss_calls"]
    calls["accelerator"] = loss_call_rows(cases, args, accelerator, torch_accelerator, args.timing, deadline)
    write(results, args.out)
    if not args.skip_in_step:
        options = _config(args)
        if time.monotonic() < deadline:
            results["in_step"] = in_step.measure(cases, options, deadline - CPU_RESERVE_S)
        else:
            results["in_step_skipped"] = "time budget (--budget-s) spent"
        write(results, args.out)
    if not args.skip_cpu:
        cpu = jax.devices("cpu")[0]
        results["loss_call_devices"]["cpu"] = f"JAX cpu, PyTorch {torch_cpu}"
        with jax.default_device(cpu):
            calls["cpu"] = loss_call_rows(cases, args, cpu, torch_cpu, args.cpu_timing, deadline)


def main(argv=None):
    args = parse_args(argv)
    if args.small:  # before JAX starts: --small's times mean nothing, and unoptimised code without XLA's CPU
        # fusion emitters, as one LLVM module (no split for parallel code generation), compiles several times faster
        os.environ.setdefault(
            "XLA_FLAGS",
            "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"
            " --xla_cpu_parallel_codegen_split_count=1",
        )
    # `timeout` stops a run with SIGTERM: exit through the `finally` below, which writes what was measured.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    start = time.monotonic()
    deadline = start + args.budget_s
    check_backends(args)
    results = {"config": _config(args), "environment": environment(args), "loss_calls": {}}
    print(json.dumps(results["environment"]), flush=True)
    try:
        run_sections(args, results, deadline)
    finally:
        results["wall_s"] = time.monotonic() - start
        results["environment"]["tensorflow_imported"] = "tensorflow" in sys.modules  # at any point of the run
        write(results, args.out)
    print(report.markdown(results), flush=True)


if __name__ == "__main__":
    main()
