"""Input pipelines for deep metric learning: image sources, class-balanced `C x K` batches, label-disjoint
episodes for DML-ALA, evaluation batches and the papers' augmentation. See `tfdml.data.sampling` for how
batches are built and why they keep whole classes per replica."""

from tfdml.data.evaluation import eval_dataset
from tfdml.data.glyphs import GlyphRendering, glyphs
from tfdml.data.label_noise import symmetric_label_noise
from tfdml.data.preprocessing import Augment, eval_image, evaluation_center_crop, train_image
from tfdml.data.sampling import StreamOptions, class_balanced_dataset, episode_dataset, steps_per_epoch
from tfdml.data.sources import (
    EMBEDDED_SOURCES,
    Source,
    array_source,
    digits,
    embedded_source,
    image_folder,
    tfds_source,
)

EMBEDDED_SOURCES["glyphs"] = glyphs

__all__ = [
    "EMBEDDED_SOURCES",
    "Augment",
    "GlyphRendering",
    "Source",
    "StreamOptions",
    "array_source",
    "class_balanced_dataset",
    "digits",
    "episode_dataset",
    "embedded_source",
    "eval_dataset",
    "eval_image",
    "evaluation_center_crop",
    "glyphs",
    "image_folder",
    "steps_per_epoch",
    "symmetric_label_noise",
    "tfds_source",
    "train_image",
]
