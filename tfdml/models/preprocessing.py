"""Pixel preprocessing of an embedder, as a layer inside the model: one preprocessing, in one place.

Every tfdml embedder starts with `PixelPreprocessing(spec)`, so it takes raw pixels (uint8, or floats in
[0, 255]) wherever it is called: `model(images)`, `model.predict(images)`, `RetrievalEvaluation((x, y))`,
the `tfdml.data` pipelines (which resize, crop and augment but leave the values alone) and the exported
serving graph (which resizes and crops, then calls the model). The model's output on raw pixels is
therefore the served output for the same pixels.

A preprocessing spec is:

- `None` or `"none"`: the pixels as they come (0-255 floats);
- `"unit"`: `pixels / 255` (the small CNN);
- `"symmetric"`: `pixels / 127.5 - 1`;
- the dotted name of a function of 0-255 float images, e.g.
  `"keras.applications.resnet50.preprocess_input"` (what `tfdml.models.backbones.preprocessing_name` gives
  for a `keras.applications` backbone);
- a callable (recorded by its dotted name; a layer can hold it only when that name imports back, so that
  a saved model reloads with it).
"""

import importlib

import keras


def _divide(x, divisor):
    # An exact division: inside a tf.function Grappler turns `x / constant` into `x * (1 / constant)`, which
    # rounds differently (1 ulp), so the same pixels would give other embeddings in and outside a graph.
    # divide_no_nan is an exact division for a non-zero divisor that Grappler leaves alone.
    return keras.ops.divide_no_nan(x, keras.ops.cast(divisor, x.dtype)) if keras.ops.is_tensor(x) else x / divisor


NAMED_PREPROCESSING = {
    "none": lambda x: x,
    "unit": lambda x: _divide(x, 255.0),
    "symmetric": lambda x: _divide(x, 127.5) - 1.0,
}


def resolve_preprocessing(spec):
    """`(function, name)` for a preprocessing spec (see the module docstring); `name` is what is recorded
    (in a model's config, in export metadata)."""
    if spec is None:
        spec = "none"
    if callable(spec):
        return spec, f"{getattr(spec, '__module__', '?')}.{getattr(spec, '__qualname__', repr(spec))}"
    if not isinstance(spec, str):
        raise TypeError(f"preprocess must be None, a string or a callable, got {type(spec).__name__}.")
    if spec in NAMED_PREPROCESSING:
        return NAMED_PREPROCESSING[spec], spec
    module_name, _, function_name = spec.rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), function_name), spec
    except (ImportError, AttributeError, ValueError) as error:
        raise ValueError(
            f"unknown preprocessing {spec!r}: use one of {sorted(NAMED_PREPROCESSING)}, a "
            f"dotted function name such as 'keras.applications.resnet50.preprocess_input', "
            f"or a callable."
        ) from error


def preprocessing_spec(spec):
    """The storable name of `spec` (None for no preprocessing); a `ValueError` when it cannot be stored."""
    function, name = resolve_preprocessing(spec)
    if callable(spec):
        try:
            stored = resolve_preprocessing(name)[0]
        except ValueError:
            stored = None
        if stored is not function:
            raise ValueError(
                f"preprocessing {name!r} cannot be saved with the model: pass a spec string "
                f"({sorted(NAMED_PREPROCESSING)}) or a module-level function, which is stored "
                "by its dotted name."
            )
    return None if name == "none" else name


@keras.saving.register_keras_serializable(package="tfdml")
class PixelPreprocessing(keras.layers.Layer):
    """`pixels -> preprocess(float(pixels))`: the first layer of every tfdml embedder.

    Takes raw pixels (uint8, or floats in [0, 255]) and applies the spec's function to them as floats of the
    layer's compute dtype. It has no weights; its config is the spec's name.

    Args:
      spec: a preprocessing spec (module docstring): None, "none", "unit", "symmetric", a dotted function
        name such as "keras.applications.resnet50.preprocess_input", or a module-level function.

    Example:
      >>> layer = PixelPreprocessing("unit")
      >>> layer(np.full((1, 2, 2, 1), 255, np.uint8))   # ones
    """

    def __init__(self, spec=None, **kwargs):
        super().__init__(**kwargs)
        self.spec = preprocessing_spec(spec)
        self._function = resolve_preprocessing(self.spec)[0]

    def call(self, inputs):
        return self._function(keras.ops.cast(inputs, self.compute_dtype))

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        return {**super().get_config(), "spec": self.spec}
