"""`tfdml_metadata.json` of an exported version: what it takes and returns, how it searches and matches,
and how the model was trained; a field that is not known is left out."""

import dataclasses
import datetime
import json

import keras
import numpy as np
import tensorflow as tf

from tfdml.export.layout import (
    EMBEDDING_OUTPUT,
    IMAGE_INPUT,
    PREPROCESSED_INPUT,
    PREPROCESSED_SIGNATURE,
    SEARCH_SIGNATURE,
    SERVING_SIGNATURE,
)
from tfdml.export.search import search_signature_info


def _json_safe(value):
    """JSON-compatible copy (dataclasses, e.g. a typed job configuration, become dicts; arrays lists)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    return json.loads(
        json.dumps(
            value,
            default=lambda v: (
                v.tolist()
                if hasattr(v, "tolist")
                else (dataclasses.asdict(v) if dataclasses.is_dataclass(v) else str(v))
            ),
        )
    )


def _compile_info(model):
    try:
        config = model.get_compile_config() if getattr(model, "compiled", False) else None
    except (AttributeError, TypeError, ValueError):
        config = None
    return _json_safe(config) if config else None


def version_metadata(model, name, version, outputs, serving, searcher, calibration, embedded, training_config, metrics):
    """`tfdml_metadata.json` of a version (the index summary is added when the index is written): `serving`
    is its `tfdml.export.serving.ServingInput`, `searcher` the `GallerySearch` of its `search` signature (or
    None)."""
    metadata = {
        "format": "tfdml.export/2",
        "name": name,
        "version": version,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "embedding_dim": outputs[EMBEDDING_OUTPUT],
        "outputs": outputs,
        "embedding_normalized": True,
        "distance": "dot_product",
        **input_metadata(serving, outputs),
        "search": None if searcher is None else search_info(searcher, calibration, embedded),
        "calibration": None if searcher is None or calibration is None else calibration.to_dict(),
        "model": {"class": type(model).__name__, "name": model.name},
        "compile_config": _compile_info(model),
        "training_config": _json_safe(training_config) if training_config else None,
        "metrics": _json_safe(metrics) if metrics else None,
        "versions": {"tensorflow": tf.__version__, "keras": keras.__version__},
    }
    metadata = {key: value for key, value in metadata.items() if value is not None}
    if searcher is not None:
        metadata["signatures"][SEARCH_SIGNATURE] = search_signature_info(searcher.k, outputs[EMBEDDING_OUTPUT])
    return metadata


def input_metadata(serving, outputs):
    """The metadata of what the version takes (`serving`, a `tfdml.export.serving.ServingInput`): input,
    geometry, preprocessing and the two embedding signatures."""
    height, width = serving.size
    return {
        "input": {
            "signature": SERVING_SIGNATURE,
            "name": IMAGE_INPUT,
            "dtype": "uint8",
            "shape": [None, None, None, serving.channels],
            "channels": serving.channels,
            "channel_conversion": "1 <-> 3 channels converted in the graph (RGB -> luma "
            "0.299 R + 0.587 G + 0.114 B; gray -> repeated)",
        },
        "image_size": [height, width],
        "eval_image": serving.geometry(),  # tfdml.data.eval_image(image_size, center_crop, resize)
        "preprocessing": serving.preprocess_name,
        "preprocessing_in_model": serving.in_model,  # else applied by the serving graph before the model
        "signatures": {
            SERVING_SIGNATURE: {
                "inputs": {IMAGE_INPUT: "uint8 [batch, height, width, 1 or 3]"},
                "outputs": sorted(outputs),
            },
            PREPROCESSED_SIGNATURE: {
                "inputs": {PREPROCESSED_INPUT: f"float32 [batch, {height}, {width}, {serving.channels}]"},
                "outputs": sorted(outputs),
            },
        },
    }


def search_info(searcher, calibration, embedded):
    """The metadata's `search` entry: what the signature returns and how `match` is decided."""
    if calibration is None:
        match = "uncalibrated: the gallery has no labels, so match is always false"
    else:
        match = calibration.promise()
    return {
        "signature": SEARCH_SIGNATURE,
        "top_k": searcher.k,
        "gallery_size": searcher.size,
        "gallery_dtype": searcher.gallery_dtype,
        "gallery_bytes": searcher.memory_bytes(),
        "block_rows": searcher.block_rows,
        "prefix": searcher.prefix_record,
        "query_expansion": searcher.query_expansion,
        "database_augmentation": searcher.database_augmentation,
        "expansion_alpha": searcher.expansion_alpha,
        "score": "cosine similarity, descending",
        "match_threshold": calibration.threshold if calibration is not None and calibration.reached else None,
        "match_precision": None if calibration is None else calibration.target_precision,
        "match_mode": None if calibration is None else calibration.mode,
        "match": match,
        "ids": "file paths"
        if embedded.ids is not None and np.asarray(embedded.ids).dtype.kind in "UO"
        else "<source>:<item number>"
        if embedded.source
        else "item numbers",
    }
