"""The checks of `loss.nested_dims` (nested embeddings, `tfdml.losses.NestedLoss`): the loss section's own, and
those across sections (the model's width and levels, DML-ALA, the export's `search_dims`). No TensorFlow is
imported here."""

from tfdml.config.schema import ConfigError


def check_section(section, key, one_width_losses):
    """`loss.nested_dims` and `loss.nested_weights` against the rest of the loss section; `one_width_losses`: the
    loss names whose parameters have one embedding width (proxies, a classifier)."""
    dims, weights = section.nested_dims, section.nested_weights
    if dims is None:
        if weights is not None:
            raise ConfigError(f"{key}.nested_weights: applies with {key}.nested_dims only")
        return
    if not dims or any(b <= a for a, b in zip(dims, dims[1:])):
        raise ConfigError(
            f"{key}.nested_dims: expected strictly increasing prefix sizes, e.g. [8, 16, 32, 64], got {dims}"
        )
    if weights is not None and len(weights) != len(dims):
        raise ConfigError(f"{key}.nested_weights: {len(weights)} weights for the {len(dims)} nested_dims {dims}")
    if section.name in one_width_losses:
        raise ConfigError(
            f"{key}.nested_dims: {section.name} learns parameters of one embedding width (proxies, a classifier), "
            "which a shorter prefix does not have; nested embeddings work with the pair-based losses"
        )
    if section.label_noise is not None and section.label_noise.method == "small_loss":
        raise ConfigError(
            f"{key}.nested_dims: the small-loss heuristic weighs the terms of one loss; with nested embeddings "
            f"use {key}.label_noise.method=prism"
        )


def check_job(config):
    """`loss.nested_dims` against the model (one embedding at least as wide as the last prefix) and DML-ALA."""
    key, dims = "loss.nested_dims", config.loss.nested_dims
    if config.ala.enabled:
        raise ConfigError(
            f"{key}: DML-ALA (ala.enabled) weighs the tuples of one loss; train nested embeddings without it"
        )
    model = config.model
    if model.type == "multilevel" and len(model.levels) > 1:
        raise ConfigError(
            f"{key}: prefixes of one embedding; model.levels {model.levels} concatenates {len(model.levels)} "
            "(use model.levels=[H] or model.type=single)"
        )
    if model.embedding_dim is not None and dims[-1] > model.embedding_dim:
        raise ConfigError(
            f"{key}: {dims[-1]} is wider than the embedding (model.embedding_dim = {model.embedding_dim})"
        )


def check_search_dims(config):
    """`export.search_dims` against the export (an index to search) and the embedding: a prefix shorter than the
    embedding, and one the loss trained where it trains prefixes (`loss.nested_dims`)."""
    key, dims = "export.search_dims", config.export.search_dims
    if not config.export.index:
        raise ConfigError(f"{key}: the prefix is what the index searches; it applies with export.index only")
    width = config.model.embedding_dim
    if width is not None and dims >= width:
        raise ConfigError(
            f"{key}: {dims} is not a prefix of the {width}-d embedding (model.embedding_dim); use a shorter one "
            "or leave it null to search the full vector"
        )
    nested_dims = config.loss.nested_dims
    if nested_dims is not None and dims not in nested_dims:
        raise ConfigError(
            f"{key}: {dims} is not one of the prefixes the loss trains (loss.nested_dims = {nested_dims}); a "
            "prefix it did not train ranks worse and needs a longer shortlist"
        )
