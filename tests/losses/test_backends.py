"""The reference cases of the stateless losses (`tests/backend_neutral`) on every Keras 3 backend: TensorFlow
in this process, JAX and PyTorch each in a subprocess (Keras fixes its backend per process), with the
equivalences (a tuple loss's fast path and its dense terms; `NestedLoss` and its wrapped loss on each prefix),
plus a `model.fit` per listed loss (`NestedLoss` among them) on each. A backend that is not installed is skipped
with the reason."""

import importlib.util
import os
import subprocess
import sys

import keras
import pytest

from tests import ROOT
from tests.backend_neutral import run


@pytest.mark.slow
def test_reference_cases_on_tensorflow():
    assert keras.backend.backend() == "tensorflow"
    failures = run.check_cases_and_equivalences(run.CASES, run.equivalence_pairs())
    assert not failures, "\n".join(failures)


@pytest.mark.slow
@pytest.mark.parametrize("backend, module", [("jax", "jax"), ("torch", "torch")])
def test_reference_cases_and_fit_on_other_backends(backend, module):
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed (pip install tfdml[test])")
    env = dict(os.environ, KERAS_BACKEND=backend, JAX_ENABLE_X64="1", JAX_PLATFORMS="cpu")
    # The cases are tiny and compiling them is most of the run: XLA's unoptimised code without its fusion
    # emitters compiles in about a third of the time of its default and runs as well here, and as one LLVM
    # module rather than split for parallel code generation it costs a fifth less CPU time still.
    env.setdefault(
        "XLA_FLAGS",
        "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"
        " --xla_cpu_parallel_codegen_split_count=1",
    )
    env["PYTHONPATH"] = os.pathsep.join([ROOT, env.get("PYTHONPATH", "")])
    result = subprocess.run(
        [sys.executable, "-m", "tests.backend_neutral.run"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert run.summary(backend, 0) in result.stdout
