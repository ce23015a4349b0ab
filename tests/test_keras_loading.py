"""Every kind of object tfdml saves loads the Keras way in a fresh process that imports `keras` and
`tfdml.models`: each class registers where it is defined, and `keras.models.load_model` and
`keras.saving.deserialize_keras_object` find `tfdml>Embedder` and the rest; `import tfdml` alone imports no
TensorFlow and hooks no import."""

import importlib
import importlib.util
import json
import os
import pkgutil
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest

import tfdml
from tfdml.losses import CrossBatchMemory, MarginLoss, RankedListLoss, TripletSemiHardLoss
from tfdml.losses.contrastive import ContrastiveLoss
from tfdml.models import ALAModel, Embedder, MetricModel
from tfdml.optimizers import MultiOptimizer, ScaledLearningRate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _python(code, *args):
    """Runs `code` in a fresh interpreter with this tree's tfdml first on the path; returns its stdout."""
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args], env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def _registered_names():
    return sorted(name for name in keras.saving.get_custom_objects() if name.startswith("tfdml>"))


def _saved_objects(folder):
    """Saves one of each kind (an embedder, a functional MetricModel with the cross-batch memory, an ALA model,
    losses and a schedule); returns {name: (path, inputs, expected predictions or None)}."""
    rng = np.random.default_rng(0)
    images = rng.uniform(0, 255, size=(4, 32, 32, 1)).astype("float32")
    embedder = Embedder("small_cnn", embedding_dim=8, input_shape=(32, 32, 1), weights=None)
    schedule = ScaledLearningRate(keras.optimizers.schedules.ExponentialDecay(0.01, 10, 0.5), 2.0)
    embedder.compile(
        optimizer=MultiOptimizer([(keras.optimizers.SGD(schedule), "backbone")], default=keras.optimizers.Adam()),
        loss=MarginLoss(num_classes=3),
    )
    vectors = rng.normal(size=(6, 5)).astype("float32")
    inputs = keras.Input((5,))
    metric_model = MetricModel(inputs, keras.layers.UnitNormalization()(keras.layers.Dense(4)(inputs)))
    metric_model.compile(optimizer="sgd", loss=CrossBatchMemory(ContrastiveLoss(), memory_size=8, embedding_dim=4))
    ala = ALAModel(keras.Sequential([keras.Input((5,)), keras.layers.Dense(3), keras.layers.UnitNormalization()]))
    ala.compile(optimizer="sgd")
    saved = {}
    kinds = (("embedder", embedder, images), ("metric_model", metric_model, vectors), ("ala", ala, vectors))
    for name, model, x in kinds:
        path = os.path.join(folder, f"{name}.keras")
        model.save(path)
        np.save(os.path.join(folder, f"{name}_x.npy"), x)
        np.save(os.path.join(folder, f"{name}_y.npy"), model.predict(x, verbose=0))
        saved[name] = path
    objects = {
        "ranked_list": RankedListLoss(),
        "semihard": TripletSemiHardLoss(margin=0.3),
        "schedule": schedule,
    }
    with open(os.path.join(folder, "objects.json"), "w") as f:
        json.dump({name: keras.saving.serialize_keras_object(obj) for name, obj in objects.items()}, f)
    return saved, {name: obj.get_config() for name, obj in objects.items()}


@pytest.mark.slow
def test_saved_objects_load_after_importing_keras_and_tfdml_models(tmp_path):
    saved, configs = _saved_objects(str(tmp_path))
    out = _python(
        """
        import json, os, sys
        import keras
        import numpy as np
        import tfdml.models

        folder = sys.argv[1]
        found = {}
        for name in ("embedder", "metric_model", "ala"):
            model = keras.models.load_model(os.path.join(folder, name + ".keras"))
            x = np.load(os.path.join(folder, name + "_x.npy"))
            expected = np.load(os.path.join(folder, name + "_y.npy"))
            np.testing.assert_allclose(model.predict(x, verbose=0), expected, atol=1e-6)
            found[name] = [type(model).__name__, type(getattr(model, "loss", None)).__name__]
        found["optimizer"] = type(keras.models.load_model(os.path.join(folder, "embedder.keras")).optimizer).__name__
        with open(os.path.join(folder, "objects.json")) as f:
            for name, config in json.load(f).items():
                obj = keras.saving.deserialize_keras_object(config)
                found[name] = [type(obj).__name__, obj.get_config()]
        found["registered"] = sorted(n for n in keras.saving.get_custom_objects() if n.startswith("tfdml>"))
        print(json.dumps(found, default=repr))
        """,
        str(tmp_path),
    )
    found = json.loads(out.strip().splitlines()[-1])
    assert found["embedder"] == ["Embedder", "MarginLoss"]
    assert found["metric_model"] == ["FunctionalMetricModel", "CrossBatchMemory"]
    assert found["ala"][0] == "ALAModel"
    assert found["optimizer"] == "MultiOptimizer"
    assert found["ranked_list"][0] == "RankedListLoss"
    assert found["semihard"] == ["TripletSemiHardLoss", json.loads(json.dumps(configs["semihard"]))]
    assert found["schedule"][0] == "ScaledLearningRate"
    # Every class any tfdml module registers is registered by `import tfdml.models`.
    extras = {"tfdml.beam": "apache_beam", "tfdml.ray": "ray"}  # optional engines, importable with their extra
    for module in pkgutil.walk_packages(tfdml.__path__, "tfdml."):
        if module.name.endswith("__main__"):  # `python -m tfdml` runs the command line
            continue
        engine = next((package for package in extras if module.name.startswith(package)), None)
        if engine and importlib.util.find_spec(extras[engine]) is None:  # that extra is not installed
            continue
        importlib.import_module(module.name)
    assert found["registered"] == _registered_names()


@pytest.mark.slow
def test_import_tfdml_alone_imports_no_framework_and_hooks_no_import():
    out = _python(
        """
        import sys
        finders = list(sys.meta_path)
        import tfdml
        print("tensorflow" in sys.modules, "keras" in sys.modules, sys.meta_path == finders)
        import keras
        print(any(name.startswith("tfdml>") for name in keras.saving.get_custom_objects()))  # nothing imported yet
        import tfdml.losses
        registered = keras.saving.get_custom_objects()
        print("tfdml>TripletLoss" in registered, "tfdml>Embedder" in registered)  # the losses' module only
        print(type(keras.losses.get("ranked_list")).__name__, type(tfdml.models.Embedder).__name__)
        print("tfdml>Embedder" in keras.saving.get_custom_objects())
        """
    )
    assert out.split() == ["False", "False", "True", "False", "True", "False", "RankedListLoss", "type", "True"]
