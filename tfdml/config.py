"""Training configuration: nested dictionaries from YAML files with `key.path=value` overrides.

The defaults below describe the embedded default job (multi-level small-CNN embedder trained with Ranked
List Loss on digits 0-4, evaluated on the unseen digits 5-9). A YAML file under `configs/` overrides any
subset of them, and command-line overrides (`--set optimizer.learning_rate=0.01`) override the file.
Unknown keys are errors, so a typo cannot silently fall back to a default.
"""

import copy
import os

import yaml

DEFAULTS = {
    "name": "digits_rll",
    "description": "Embedded default: multi-level small-CNN embedder, RLL, digits 0-4 -> unseen 5-9.",
    "paper_target": None,
    "seed": 0,
    "data": {
        "source": "digits",          # digits | tfds | folder
        "name": None,                # tfds builder name (caltech_birds2011, cars196, stanford_online_products)
        "path": None,                # image folder (one sub-folder per class)
        "eval_path": None,           # image folder of the evaluation classes
        "data_dir": None,            # tfds data_dir
        "manual_dir": None,          # tfds manual_dir (Cars196)
        "download": False,           # let tfds download and prepare the dataset (needs the network)
        "train_split": "train",
        "eval_split": "test",
        "image_size": 32,
        "classes_per_batch": 5,
        "samples_per_class": 12,
        # Random crops of 70-100 % of the area, no flip (a mirrored digit is another shape): without
        # them the embedder overfits digits 0-4 (see configs/digits_rll.yaml).
        # True: the papers' crop + flip; False: plain resize; a mapping: tfdml.data.Augment fields.
        "augment": {"resize": None, "random_crop": True, "scale": [0.7, 1.0],
                    "aspect_ratio": [0.75, 1.3333333333333333], "flip": False},
        "small_class_policy": "replace",  # replace | drop
    },
    "model": {
        "type": "multilevel",        # multilevel | single
        "backbone": "small_cnn",
        "weights": None,             # imagenet | None | path to a weights file
        "embedding_dim": 128,
        "taps": None,                # {L: layer, M: layer, H: layer} for backbones without defaults
        "levels": ["L", "M", "H"],
        "level_weights": None,
        "freeze_batchnorm": False,
        "num_classes": None,         # classifier head (Group Loss)
        "head_filters": 32,          # auxiliary (L, M) heads: 1x1 conv width (official 128)
        "head_units": 128,           # auxiliary heads: hidden Dense width (official 1024)
        "widths": [16, 32, 64],      # small_cnn block widths (other backbones ignore it)
    },
    "loss": {
        "name": "ranked_list",       # ranked_list | triplet | margin | contrastive | group
        "params": {"margin": 0.05, "alpha": 0.9},  # RLL: a tight margin transfers best to unseen digits
        "dynamic_temperature": None, # {t1: .., t2: ..} for RLL (eq. 15)
    },
    "ala": {
        "enabled": False,
        "params": {},                # ALAModel arguments (assessor_units, assessor_steps, max_tuples, ...)
        "episode": {},               # episode_dataset arguments (train_size, val_size, samples_per_class)
    },
    "optimizer": {
        "name": "adam",              # sgd | adam | adamw | lamb
        "learning_rate": 1e-3,
        "momentum": 0.9,
        "weight_decay": 0.0,
        "head_lr_multiplier": 1.0,   # new layers at this multiple of the backbone learning rate
        "schedule": None,            # None | cosine | step
        "boundaries": [0.5],         # step schedule: fractions of the run (or step numbers)
        "factor": 0.1,               # step schedule: multiplier at each boundary
    },
    "training": {
        "epochs": 16,
        "steps_per_epoch": 30,
        "pretrain_epochs": 0,        # Group Loss classification pre-training
        "checkpoint_dir": None,      # default: <report_dir>/checkpoints
        "eval_every": 0,             # epochs between retrieval evaluations during training (0: never)
        "distribute": "auto",        # auto | none | mirrored | multi_worker (auto: TF_CONFIG -> multi_worker)
    },
    "evaluation": {
        "ks": [1, 2, 4, 8],
        "metrics": ["recall", "map@r", "r_precision", "nmi", "f1"],
        "exact": True,
        "batch_size": 256,
    },
    "export": {
        "enabled": True,
        "base_dir": "exported_models",
        "name": None,                # default: the config name
        "version": None,             # default: next integer version
        "index": True,
    },
    "report": {
        "dir": None,                 # default: reports/<name>
        "grid_queries": 8,
        "grid_neighbours": 5,
    },
}


class ConfigError(ValueError):
    """A configuration file or override that does not fit the schema."""


def _merge(base, update, path=""):
    if path == "loss." and "name" in update and update["name"] != base.get("name"):
        # Loss parameters belong to the loss they were set for: another loss starts from its own defaults.
        base["params"] = {}
    for key, value in update.items():
        where = f"{path}{key}"
        if key not in base:
            valid = ", ".join(sorted(base))
            raise ConfigError(f"unknown configuration key '{where}' (valid keys here: {valid})")
        if isinstance(base[key], dict) and isinstance(value, dict):
            if where in _FREE_FORM:  # keys depend on the chosen loss/model: merged, not checked here
                base[key].update(copy.deepcopy(value))
            else:
                _merge(base[key], value, where + ".")
        else:
            base[key] = copy.deepcopy(value)
    return base


_FREE_FORM = {"loss.params", "ala.params", "ala.episode", "model.taps", "loss.dynamic_temperature"}


def parse_override(text):
    """`'a.b=value'` -> (`['a', 'b']`, value parsed as YAML: numbers, booleans, null, lists)."""
    if "=" not in text:
        raise ConfigError(f"override '{text}' must look like key.path=value")
    key, raw = text.split("=", 1)
    return key.strip().split("."), yaml.safe_load(raw) if raw.strip() else None


def load_config(path=None, overrides=()):
    """Defaults <- YAML file at `path` <- each `key.path=value` override, validated against the schema."""
    config = copy.deepcopy(DEFAULTS)
    if path is not None:
        if not os.path.exists(path):
            raise ConfigError(f"configuration file not found: {path}")
        with open(path) as f:
            loaded = yaml.safe_load(f) or {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path} must hold a mapping at the top level")
        _merge(config, loaded)
    for text in overrides:
        keys, value = parse_override(text)
        nested = value
        for key in reversed(keys):
            nested = {key: nested}
        _merge(config, nested)
    return config
