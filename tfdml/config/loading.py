"""Loading a job: the embedded default job, YAML files and `--set` overrides merged over it, and the keys
that differ between two configurations."""

import copy
import os

import yaml

from tfdml.config.schema import ConfigError, _build
from tfdml.config.sections import Config

# The embedded default job (what `tfdml train` runs with no options; configs/glyphs_rll.yaml writes it out).
DEFAULT_JOB = {
    "name": "glyphs_rll",
    "description": "Embedded default: small-CNN embedder, RLL, 150 font-rendered characters -> 151 unseen ones.",
    # tfdml.data.glyphs: 301 characters (look-alikes removed), 20 images each at 32 px with random face, size,
    # rotation, position, stroke weight and blur; train on one half of the characters, retrieve the other.
    # configs/glyphs_rll.yaml writes this job out with the reasons for each setting.
    "data": {"source": "glyphs", "image_size": 32, "classes_per_batch": 22, "samples_per_class": 3, "augment": False},
    "model": {"type": "single", "embedding_dim": 64, "widths": [16, 32, 64, 128]},
    # Eq. 14's uniform query weighting: on glyphs it beats the authors' Caffe weighting (the library default),
    # MAP@R 0.499 vs 0.436 at seed 0 on the 310-class set (README method table: tuned, over 5 seeds).
    "loss": {"name": "ranked_list", "params": {"margin": 0.4, "alpha": 1.0, "tn": 10.0, "query_weighting": "uniform"}},
    "optimizer": {"name": "adam", "learning_rate": 2e-3},
    "training": {"epochs": 10, "steps_per_epoch": 60},
    # k-means (NMI, F1) over 151 classes would take most of the job's time.
    "evaluation": {"ks": [1, 2, 4, 8], "metrics": ["recall", "map@r", "r_precision"]},
}


def default_config():
    """The embedded default job as a `Config`."""
    return Config.from_dict(copy.deepcopy(DEFAULT_JOB))


def _merge(base, update, path=""):
    """`update` merged into the plain mapping `base` (nested mappings key by key, other values replaced)."""
    if path == "loss." and "name" in update and update["name"] != base.get("name"):
        # Loss parameters belong to the loss they were set for: another loss starts from its own defaults.
        base["params"] = {}
    for key, value in update.items():
        if isinstance(base.get(key), dict) and isinstance(value, dict):
            _merge(base[key], value, f"{path}{key}.")
        else:
            base[key] = copy.deepcopy(value)
    return base


def parse_override(text):
    """`'a.b=value'` -> (`['a', 'b']`, value parsed as YAML: numbers, booleans, null, lists)."""
    if "=" not in text:
        raise ConfigError(f"override '{text}' must look like key.path=value")
    key, raw = text.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw  # not YAML (e.g. an unbalanced bracket): the string itself, checked like any value
    return key.strip().split("."), value


def load_config(path=None, overrides=()):
    """`DEFAULT_JOB` <- YAML file at `path` <- each override, as a validated `Config`. An override is a
    `"key.path=value"` string (the value parsed as YAML) or a `("key.path", value)` pair."""
    # The defaults filled in without the library pass: the merged whole gets it once, at the end.
    config = _build(Config, copy.deepcopy(DEFAULT_JOB)).to_dict()
    for layer in _layers(path, overrides):
        _merge(config, layer)
    return Config.from_dict(config)


def _layers(path=None, overrides=()):
    """The mappings that `load_config` merges over the defaults: the file's, then one per override."""
    layers = []
    if path is not None:
        if os.path.isdir(path):
            raise ConfigError(f"--config {path} is a directory; give a YAML file, e.g. configs/glyphs_rll.yaml")
        if not os.path.exists(path):
            raise ConfigError(f"configuration file not found: {path}")
        try:
            with open(path) as f:
                loaded = yaml.safe_load(f) or {}
        except yaml.YAMLError as error:
            raise ConfigError(f"{path}: not valid YAML ({str(error).splitlines()[0]})") from None
        except OSError as error:
            raise ConfigError(f"cannot read the configuration file {path}: {error.strerror or error}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path} must hold a mapping at the top level")
        layers.append(loaded)
    for override in overrides:
        keys, value = (override[0].split("."), override[1]) if isinstance(override, tuple) else parse_override(override)
        nested = value
        for key in reversed(keys):
            nested = {key: nested}
        layers.append(nested)
    return layers


def given_keys(path=None, overrides=()):
    """The dotted keys that the file at `path` and the `overrides` set (as `load_config` takes them), e.g. to
    tell a value the user chose from a default."""

    def leaves(mapping, prefix):
        for key, value in mapping.items():
            if isinstance(value, dict) and value:
                yield from leaves(value, f"{prefix}{key}.")
            else:
                yield f"{prefix}{key}"

    return {key for layer in _layers(path, overrides) for key in leaves(layer, "")}


def differences(old, new, prefix=""):
    """Dotted keys whose values differ between two plain configuration mappings."""
    keys = []
    for key in sorted(set(old) | set(new), key=str):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            keys += differences(a, b, f"{prefix}{key}.")
        elif a != b:
            keys.append(f"{prefix}{key}")
    return keys
