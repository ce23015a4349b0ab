"""DML-ALA's choices as plain values, without TensorFlow: read by `tfdml.models.ala` (which validates its
arguments against them) and by the configuration (`tfdml.config`'s `ala` section), which is parsed before
TensorFlow is imported. One table, so that a choice is never typed twice.
"""

from tfdml.loss_names import TUPLE_KINDS

# Base losses DML-ALA can weight: the tfdml losses that list per-tuple terms (`loss.terms`).
BASE_LOSSES = tuple(TUPLE_KINDS)
WEIGHTINGS = ("assessor", "uniform")
LOOKAHEADS = ("sgd", "optimizer")
ASSESSOR_INPUTS = ("embeddings", "embeddings+geometry", "geometry")
STATE_MODES = ("per_tuple", "per_step")
# Which tuples the assessor weighs: "all" (the paper) or "positive_pairs" (a pair loss's positive pairs only, the
# negative pairs keep weight 1; a triplet loss's anchor-positive pairs, one weight shared by the pair's
# triplets): under label noise the mislabelled tuples are the positive pairs, and weighting the negatives only
# adds the meta-gradient's noise.
ASSESSED = ("all", "positive_pairs")
# How the assessor's outputs become weights: "softmax" (centred logits, softmax over the step's tuples at a
# temperature, mean 1) or "sigmoid" (the paper's A in (0, 1), used as it is).
WEIGHT_FORMS = ("softmax", "sigmoid")
# How the weighted terms are reduced: "loss" (the base loss's own reduction, `tfdml.ops.reduce_terms`) or
# "sum" (the paper's literal sums over tuples, eqs 10-13).
REDUCTIONS = ("loss", "sum")

# What each variant sets when the switch itself is None (`tfdml.models.ala`'s module docstring).
VARIANTS = {
    "default": {
        "weights": "softmax",
        "reduction": "loss",
        "lookahead": "sgd",
        "assessor_input": "geometry",
        "assessor_optimizer": "adam",
        "assessor_learning_rate": 1e-3,
        # One shared state per step over the positive pairs (a triplet loss's anchor-positive pairs, each weight
        # shared by the pair's triplets), measured on glyphs (benchmarks/label_noise, 600 steps, 5 seeds): clean,
        # within a point of the plain loss or above it (contrastive +5.6, margin and all triplets level; warm
        # start level for all three), at 40 % label noise with a verified validation set +4.5 to +7.7 R@1 for
        # all three; the paper's recurrence over every pair was 22 R@1 points below the plain contrastive loss
        # on clean data.
        "state": "per_step",
        "assessed": "positive_pairs",
        # Softmax logits bounded, r tanh(z / r): unbounded, one clean contrastive run of five collapsed (42.5
        # R@1) with the weight on a few pairs, and all-triplets training collapsed under noise; r = 1 gave 76.7
        # there, and no collapse since (r = 2 was level on the validation split).
        "weight_range": 1.0,
    },
    "paper": {
        "weights": "sigmoid",
        "reduction": "sum",
        "lookahead": "sgd",
        "assessor_input": "embeddings",
        "assessor_optimizer": "sgd",
        "assessor_learning_rate": 4e-4,
        "state": "per_tuple",
        "assessed": "all",
        "weight_range": None,
    },
}


DEFAULT_TEMPERATURE = 1.0
DEFAULT_WEIGHT_FLOOR = 0.0

# Episodes: the training subset is the base loss's whole batch, the validation subset is drawn in addition,
# one validation class per this many training classes (the paper's 100 : 20 images).
VALIDATION_RATIO = 5


def episode_sizes(classes_per_batch, samples_per_class, val_classes=None):
    """`episode_dataset` arguments for an episode at the base loss's batch: `classes_per_batch x
    samples_per_class` training images and `val_classes` more classes (default `classes_per_batch / 5`
    rounded, at least 1) of as many images each for the validation subset.

    Example:
        >>> episode_sizes(22, 3)
        {'train_size': 66, 'val_size': 12, 'samples_per_class': 3}
    """
    for name, value in (("classes_per_batch", classes_per_batch), ("samples_per_class", samples_per_class)):
        if int(value) < 1:
            raise ValueError(f"{name} must be a positive integer, got {value}.")
    if val_classes is None:
        val_classes = max(1, round(classes_per_batch / VALIDATION_RATIO))
    if int(val_classes) < 1:
        raise ValueError(f"val_classes must be a positive integer, got {val_classes}.")
    k = int(samples_per_class)
    return {"train_size": int(classes_per_batch) * k, "val_size": int(val_classes) * k, "samples_per_class": k}
