"""DML-ALA's choices as plain values, without TensorFlow: read by `tfdml.models.ala` (which validates its
arguments against them) and by the configuration (`tfdml.config`'s `ala` section), which is parsed before
TensorFlow is imported. One table, so that a choice is never typed twice: `ALAOptions` declares each of
`ALAModel`'s switches once (type, default, range), and the model, its `get_config` and the configuration's
`ala.params` section are all made from it.
"""

import dataclasses
import math

from tfdml.loss_names import TUPLE_KINDS

# Base losses DML-ALA can weight: the tfdml losses that list per-tuple terms (`loss.terms`).
BASE_LOSSES = tuple(TUPLE_KINDS)
WEIGHTINGS = ("assessor", "uniform")
LOOKAHEADS = ("sgd", "optimizer")
# Which variables the virtual step (eq 10) moves: "all" (the paper's exact step) or "head" (the embedder's head
# only, the body held at theta: an exact meta-gradient of a smaller virtual step, far cheaper per assessor update).
LOOKAHEAD_VARIABLES = ("all", "head")
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
        # shared by the pair's triplets): the paper's recurrence over every pair trained far below the plain
        # loss on clean data (the DML-ALA guide says why, and the label-noise benchmark measures both).
        "state": "per_step",
        "assessed": "positive_pairs",
        # Softmax logits bounded, r tanh(z / r): unbounded logits let training collapse onto a few pairs.
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


def _option(default, *, choices=None, minimum=None, above=None, maximum=None):
    """A switch with its default and its valid values (the keys `tfdml.config` validates a field with)."""
    metadata = {"choices": choices, "minimum": minimum, "above": above, "maximum": maximum, "convert": None}
    return dataclasses.field(default=default, metadata=metadata)


def _choice(name, value, choices):
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}.")
    return value


@dataclasses.dataclass
class ALAOptions:
    """`tfdml.models.ALAModel`'s switches, each described once, by the comment on its field (the configuration
    reference's `ala.params` shows them); None takes the variant's choice (`VARIANTS`), or the default declared
    here. The configuration's `ala.params` section is this class."""

    # "default" (softmax weights, the base loss's reduction, geometry input, Adam 1e-3 assessor; the positive pairs
    # weighted from one shared assessor state per step, logits bounded at 1) or "paper" (Algorithm 1 literally:
    # sigmoid weights of every tuple, the recurrence over tuples, sums over tuples, embeddings input, SGD 4e-4
    # assessor); the other switches override single choices
    variant: str | None = _option("default", choices=tuple(VARIANTS))
    # how the assessor's outputs become weights: "softmax" (w = n softmax((z - mean z) / temperature) over the
    # step's assessed tuples, mixed with uniform weights by weight_floor) or "sigmoid" (the paper's A in (0, 1))
    weights: str | None = _option(None, choices=WEIGHT_FORMS)
    temperature: float | None = _option(1.0, above=0.0)  # softmax weights' temperature
    # f in w = f + (1 - f) w_softmax: every assessed tuple keeps at least f of a uniform weight (0: a tuple can be
    # silenced)
    weight_floor: float | None = _option(0.0, minimum=0.0)
    # lambda, pulls the assessor's outputs o towards 0 with
    # lambda s / 2 sum o^2 added to its meta-objective, s the root mean square of the meta-gradient on the bounded
    # logits (so that lambda means the same whatever the losses' and the rates' scale): an output stops growing
    # where the bound's slope at it falls to about lambda |o|, so the outputs' spread cannot grow without end once
    # the weights reach their bound (the weight-drift benchmark; 0: none)
    output_penalty: float | None = _option(0.0, minimum=0.0)
    # q in (0, 1], a cut calibrated on the validation subset, whose labels are verified (val_source): the training
    # subset's positive pairs farther apart than the q-quantile of the validation subset's positive-pair distances
    # (both at theta) are taken for mislabelled and left out of the base loss, as SmallLossWeighting leaves out its
    # farthest pairs, before the assessor weighs the rest; on clean labels about 1 - q of them are. Logged as
    # cut_fraction (null: no cut; tuple_weights, which has no validation subset, lists the tuples before it)
    distance_cut: float | None = _option(None, above=0.0, maximum=1.0)
    # bound r on the logits, r tanh(z / r): no weight exceeds another by more than exp(2 r / temperature) (null: the
    # variant's, 1 for the default variant's softmax weights, none for the paper's; .inf: none)
    weight_range: float | None = _option(None, above=0.0)
    # how the weighted terms are reduced: "loss" (the base loss's own reduction) or "sum" (the paper's sums)
    reduction: str | None = _option(None, choices=REDUCTIONS)
    # the virtual step: "sgd" (the paper's, at the real step's per-variable rates) or "optimizer" (the compiled
    # optimizer's step with its state held constant)
    lookahead: str | None = _option(None, choices=LOOKAHEADS)
    # which variables the virtual step moves: "all" (the paper's: every variable of the embedder) or "head" (a tfdml
    # embedder's head_variables, else the trainable variables of its last layer that has any): the body stays at
    # theta, an exact meta-gradient of a smaller virtual step, much cheaper per assessor update on a deep embedder
    # (the look-ahead step benchmark); the real step still trains every variable
    lookahead_variables: str | None = _option("all", choices=LOOKAHEAD_VARIABLES)
    # what the assessor reads of a tuple: "embeddings" (the paper), "geometry" (its distances and loss) or
    # "embeddings+geometry"
    assessor_input: str | None = _option(None, choices=ASSESSOR_INPUTS)
    assessor_units: int | None = _option(64, minimum=1)  # LSTM units of the assessor (the paper's 64)
    assessor_layers: int | None = _option(2, minimum=1)  # LSTM layers of the assessor (the paper's 2)
    # "per_tuple" (eq 8: one recurrence over the step's tuples, its final state carried to the next step; the
    # paper variant's) or "per_step" (all tuples from one shared state; cheaper; the default variant's)
    state: str | None = _option(None, choices=STATE_MODES)
    # one rate for every variable in an SGD virtual step (eq 10; implies lookahead "sgd")
    inner_learning_rate: float | None = _option(None, above=0.0)
    assessor_learning_rate: float | None = _option(None, above=0.0)  # the assessor optimizer's rate (b of eq 12)
    # K, assessor updates per episode (the paper's 3; 0: the tuples are only weighted)
    assessor_steps: int | None = _option(3, minimum=0)
    meta_interval: int | None = _option(1, minimum=1)  # the assessor updated every N-th step only
    # "assessor" (DML-ALA) or "uniform" (every weight 1: the base loss itself, the baseline)
    weighting: str | None = _option("assessor", choices=WEIGHTINGS)
    # which tuples the assessor weighs: "all" (every tuple whose weight can change the loss; the paper variant's)
    # or "positive_pairs" (a pair loss's positive pairs, the negative pairs keep weight 1; a triplet loss's
    # anchor-positive pairs, one weight shared by the pair's triplets); null: the variant's
    assessed: str | None = _option(None, choices=ASSESSED)

    def arguments(self):
        """The switches set to something other than their declared default (what an `ALAModel` call needs)."""
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(ALAOptions)
            if getattr(self, f.name) is not None and getattr(self, f.name) != f.default
        }

    def resolved(self):
        """Every switch decided (None: the variant's choice or the declared default) and checked, as the model
        runs; `ValueError` naming the switch otherwise. An unbounded `weight_range` is None."""
        declared = {f.name: f.default for f in dataclasses.fields(ALAOptions)}
        given = {name: value for name, value in dataclasses.asdict(self).items() if value is not None}
        variant = _choice("variant", given.get("variant", declared["variant"]), VARIANTS)
        if "inner_learning_rate" in given and "lookahead" not in given:
            given["lookahead"] = "sgd"  # one rate only means something for a plain SGD look-ahead
        chosen = {**declared, **{k: v for k, v in VARIANTS[variant].items() if k in declared}, **given}
        for name, choices in (
            ("weights", WEIGHT_FORMS),
            ("reduction", REDUCTIONS),
            ("lookahead", LOOKAHEADS),
            ("lookahead_variables", LOOKAHEAD_VARIABLES),
            ("assessor_input", ASSESSOR_INPUTS),
            ("state", STATE_MODES),
            ("weighting", WEIGHTINGS),
            ("assessed", ASSESSED),
        ):
            _choice(name, chosen[name], choices)
        chosen.update(_checked_numbers(chosen, given))
        return ALAOptions(**chosen)

    def saved(self):
        """The resolved switches as `get_config` records them: unbounded softmax weights as inf (None would take
        the variant's bound back)."""
        values = dataclasses.asdict(self)
        if values["weight_range"] is None and values["weights"] == "softmax":
            values["weight_range"] = float("inf")
        return values


def _checked_numbers(chosen, given):
    """The numeric switches of `chosen` converted and checked against each other."""
    temperature, weight_floor = float(chosen["temperature"]), float(chosen["weight_floor"])
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {chosen['temperature']}.")
    if not 0.0 <= weight_floor < 1.0:
        raise ValueError(f"weight_floor must be in [0, 1), got {chosen['weight_floor']}.")
    if chosen["weights"] == "sigmoid" and weight_floor:
        raise ValueError('weight_floor mixes softmax weights with uniform ones; it needs weights="softmax".')
    output_penalty = float(chosen["output_penalty"])
    if not output_penalty >= 0:
        raise ValueError(f"output_penalty must be >= 0, got {chosen['output_penalty']}.")
    if output_penalty and chosen["weights"] != "softmax":
        raise ValueError('output_penalty pulls the softmax logits towards 0; it needs weights="softmax".')
    cut = chosen["distance_cut"]
    if cut is not None and not 0.0 < float(cut) <= 1.0:
        raise ValueError(f"distance_cut must be a quantile in (0, 1], got {cut}.")
    requested = given.get("weight_range")
    weight_range = chosen["weight_range"] if chosen["weights"] == "softmax" or requested is not None else None
    weight_range = None if weight_range is None or math.isinf(float(weight_range)) else float(weight_range)
    if weight_range is not None and (weight_range <= 0 or chosen["weights"] != "softmax"):
        raise ValueError(f'weight_range must be > 0 and needs weights="softmax", got {requested}.')
    inner = chosen["inner_learning_rate"]
    if inner is not None and chosen["lookahead"] != "sgd":
        raise ValueError(
            "inner_learning_rate sets the rate of an SGD look-ahead; it cannot be combined with "
            f"lookahead={chosen['lookahead']!r}."
        )
    if inner is not None and float(inner) < 0:
        raise ValueError(f"inner_learning_rate must be >= 0, got {inner}.")
    counts = {
        name: int(chosen[name]) for name in ("assessor_units", "assessor_layers", "assessor_steps", "meta_interval")
    }
    if counts["assessor_steps"] < 0:
        raise ValueError(f"assessor_steps must be >= 0, got {chosen['assessor_steps']}.")
    if counts["meta_interval"] < 1:
        raise ValueError(f"meta_interval must be >= 1, got {chosen['meta_interval']}.")
    return {
        **counts,
        "temperature": temperature,
        "weight_floor": weight_floor,
        "output_penalty": output_penalty,
        "distance_cut": None if cut is None else float(cut),
        "weight_range": weight_range,
        "inner_learning_rate": None if inner is None else float(inner),
        "assessor_learning_rate": float(chosen["assessor_learning_rate"]),
    }


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
