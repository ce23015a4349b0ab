"""Training configuration: typed, validated once, at the edge.

A job is a `Config` of typed sections (`DataConfig`, `ModelConfig`, `LossConfig`, `ALAConfig`,
`OptimizerConfig`, `TrainingConfig`, `EvaluationConfig`, `ExportConfig`, `ReportConfig`). `load_config` builds
one from the embedded default job (`DEFAULT_JOB`: a small-CNN embedder trained with Ranked List Loss on half
of the font-rendered characters of `tfdml.data.glyphs`, evaluated on the unseen half), a YAML file under
`configs/` that overrides any subset of it, and command-line overrides (`--set optimizer.learning_rate=0.01`)
that override the file.

Every value is checked before anything is built, in two passes: first keys, types, ranges, choices and
paths (no TensorFlow import, so that `tfdml train --set training.epoch=2` answers at once), then what only
the library can tell (`check_with_library`: the loss class's arguments, backbone and metric names, tfds
builders), which imports TensorFlow. unknown keys (also inside `loss.params`, checked against
the loss class's constructor), wrong types, out-of-range numbers and unknown names raise a `ConfigError`
whose message is one line that names the key and what is allowed, e.g.
`optimizer.learning_rate: expected a number, got 'abc'`. `Config.to_dict()` is plain YAML/JSON data and
`Config.from_dict(config.to_dict()) == config`.

The package has four parts: `tfdml.config.schema` (the validation machinery: typed fields and their rules),
`tfdml.config.sections` (the sections and the whole `Config`), `tfdml.config.loading` (the default job,
files and overrides merged over it) and `tfdml.config.descriptions` (what each key means, read from the
sections' field comments: `tfdml train --print-config` prints it). Every public name of the first three is
importable from `tfdml.config`.
"""

from tfdml.config.loading import (
    DEFAULT_JOB,
    default_config,
    differences,
    given_keys,
    load_config,
    parse_override,
)
from tfdml.config.schema import (
    MAX_FLOAT,
    MAX_INT,
    ConfigError,
    output_dir_problem,
    output_file_problem,
    range_text,
)
from tfdml.config.sections import (
    ALA_LOSSES,
    LOSSES,
    MATCH_MODES,
    OPTIMIZERS,
    UNPAIRED_LOSSES,
    ALAConfig,
    ALAParams,
    Config,
    DataConfig,
    EpisodeConfig,
    EvaluationConfig,
    ExportConfig,
    LossConfig,
    MemoryConfig,
    ModelConfig,
    OptimizerConfig,
    ReportConfig,
    TemperatureConfig,
    TrainingConfig,
    default_report_dir,
)

__all__ = [
    "ALA_LOSSES",
    "DEFAULT_JOB",
    "LOSSES",
    "MAX_FLOAT",
    "MAX_INT",
    "MATCH_MODES",
    "OPTIMIZERS",
    "UNPAIRED_LOSSES",
    "ALAConfig",
    "ALAParams",
    "Config",
    "ConfigError",
    "DataConfig",
    "EpisodeConfig",
    "EvaluationConfig",
    "ExportConfig",
    "LossConfig",
    "MemoryConfig",
    "ModelConfig",
    "OptimizerConfig",
    "ReportConfig",
    "TemperatureConfig",
    "TrainingConfig",
    "default_config",
    "default_report_dir",
    "differences",
    "given_keys",
    "load_config",
    "output_dir_problem",
    "output_file_problem",
    "parse_override",
    "range_text",
]
