"""The settings of `export_saved_model`, grouped by what they set and checked once, when they are made:
`ServingOptions` (the serving graph's input), `IndexOptions` (the gallery's index) and `SearchOptions` (the
`search` signature). `export_saved_model` takes each field as a keyword argument of the same name.

Example:
  >>> split_options({"preprocess": "unit", "top_k": 5})[2].top_k
  5
"""

import dataclasses

from tfdml.export.search import DEFAULT_BLOCK_ROWS, DEFAULT_TOP_K, GALLERY_DTYPES
from tfdml.retrieval import expansion
from tfdml.retrieval.calibration import MODES as CALIBRATION_MODES


@dataclasses.dataclass(frozen=True)
class ServingOptions:
    """What the serving graph does to uint8 images before the model.

    Args:
      image_size: `(height, width)` the model takes; default from the model (`tfdml.export.serving`).
      preprocess: pixel preprocessing spec of the graph, for a model that does not preprocess its raw input
        itself; default from `model.preprocessing_config()`, else `"none"`. A tfdml embedder applies its own
        (a different spec here is refused rather than applied twice).
      center_crop, resize: the geometry of `tfdml.data.eval_image` (defaults: resize to
        `image_size * 256 / 224`, centre crop `image_size`, as `tfdml.data.eval_dataset` evaluates). Pass
        what the evaluation used, so that the served function is the evaluated one.

    Example:
      >>> ServingOptions(preprocess="unit", center_crop=False).resize is None
      True
    """

    image_size: object = None
    preprocess: object = None
    center_crop: bool = True
    resize: object = None


@dataclasses.dataclass(frozen=True)
class IndexOptions:
    """How the gallery given to `export_saved_model` is read and indexed inside the version.

    Args:
      gallery_ids, gallery_labels, class_names: override what the gallery provides (see `export_index`).
      index_mode, index_settings: the `ScannIndex` mode and settings (see `export_index`).
      batch_size: gallery images embedded per call of the serving function.

    Example:
      >>> IndexOptions(index_mode="exact").batch_size
      64
    """

    gallery_ids: object = None
    gallery_labels: object = None
    class_names: object = None
    index_mode: str = "auto"
    batch_size: int = 64
    index_settings: dict = None


@dataclasses.dataclass(frozen=True)
class SearchOptions:
    """The `search` signature (`tfdml.export.search`), written with a gallery: uint8 images in, the `top_k`
    nearest gallery items out (`scores`, `labels`, `ids`, `match`) with the `embedding`.

    Args:
      search: write the signature (with a gallery).
      top_k: neighbours returned per query.
      gallery_dtype: the gallery held in variables as `"float32"`, `"bfloat16"` or `"int8"`.
      search_block_rows: gallery rows scored per step.
      match_precision, calibration, match_mode: `match` is `score >= threshold`, the threshold of a
        `tfdml.retrieval.Calibration` (default: `calibrate` on the labelled gallery itself at
        `match_precision`, in `match_mode`: `"auto"` is open set, leave-one-class-out, so that the precision
        holds for queries whose class is absent from the gallery too, whenever the gallery has enough
        classes); without gallery labels, or where the calibration cannot be measured (e.g. one class),
        there is no threshold and nothing is a match. The calibration goes to the metadata.
      search_dims: for nested embeddings (`tfdml.losses.NestedLoss`), index the normalised `search_dims` prefix
        and re-rank its shortlist with the full vector (`tfdml.export.PrefixIndex`), and so does the `search`
        signature; each shortlist is sized to meet the index's target recall against exact full-vector search,
        measured and recorded in the metadata (`index.recall`, `search.prefix`).
      query_expansion, database_augmentation, expansion_alpha: alpha-QE of each query in the `search` signature
        (one more search) and DBA of its gallery (once, at export), as `tfdml.retrieval.expansion` (0: off);
        the ScaNN index is left as embedded. The match threshold is calibrated on the gallery as embedded.

    Example:
      >>> SearchOptions(top_k=0)
      Traceback (most recent call last):
      ValueError: top_k must be a positive integer, got 0.
    """

    search: bool = True
    top_k: int = DEFAULT_TOP_K
    gallery_dtype: str = "float32"
    search_block_rows: int = DEFAULT_BLOCK_ROWS
    match_precision: float = 0.9
    calibration: object = None
    match_mode: str = "auto"
    search_dims: int = None
    query_expansion: int = 0
    database_augmentation: int = 0
    expansion_alpha: float = 3.0

    def __post_init__(self):
        _check_search_settings(self.top_k, self.gallery_dtype, self.match_precision, self.search_block_rows)
        if self.match_mode not in CALIBRATION_MODES:
            raise ValueError(f"match_mode must be one of {', '.join(CALIBRATION_MODES)}, got {self.match_mode!r}.")
        query_expansion, alpha = expansion.check_expansion(self.query_expansion, self.expansion_alpha)
        augmentation, _ = expansion.check_expansion(self.database_augmentation, alpha, "database_augmentation")
        checked = {"query_expansion": query_expansion, "database_augmentation": augmentation, "expansion_alpha": alpha}
        for field, value in checked.items():  # frozen: the checked values replace the given ones once, here
            object.__setattr__(self, field, value)


def _check_search_settings(top_k, gallery_dtype, match_precision, block_rows):
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"top_k must be a positive integer, got {top_k!r}.")
    if gallery_dtype not in GALLERY_DTYPES:
        raise ValueError(f"gallery_dtype must be one of {', '.join(GALLERY_DTYPES)}, got {gallery_dtype!r}.")
    if not 0.0 < float(match_precision) <= 1.0:
        raise ValueError(f"match_precision must be in (0, 1], got {match_precision}.")
    if int(block_rows) < 1:
        raise ValueError(f"search_block_rows must be at least 1, got {block_rows}.")


_CLASSES = (ServingOptions, IndexOptions, SearchOptions)


def split_options(keywords):
    """`(ServingOptions, IndexOptions, SearchOptions)` of `export_saved_model`'s keyword settings (each is a
    field of one of them); an unknown keyword is a `TypeError`, as for any function."""
    fields = {field.name: cls for cls in _CLASSES for field in dataclasses.fields(cls)}
    unknown = sorted(set(keywords) - set(fields))
    if unknown:
        raise TypeError(f"export_saved_model() got unexpected keyword arguments: {', '.join(unknown)}.")
    return tuple(cls(**{key: value for key, value in keywords.items() if fields[key] is cls}) for cls in _CLASSES)
