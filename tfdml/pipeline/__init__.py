"""The main job: train an embedder from a configuration, evaluate it, export it, and write a report.

`run(config)` is what `tfdml train` runs. With the default job of `tfdml.config` it trains a small-CNN
embedder with Ranked List Loss on class-balanced batches of half of the glyph classes (`tfdml.data.glyphs`),
evaluates retrieval on the unseen half (exact ScaNN search) beside a raw-pixel baseline, exports a TF Serving
SavedModel with the ScaNN index of the evaluation images inside its version, and writes a report folder:

    <report_dir>/metrics.json          metrics of the model and of the raw-pixel baseline, timings, history
    <report_dir>/config.yaml           the resolved configuration (`load_config` reads it back)
    <report_dir>/recall_at_k.png       Recall@K curves (model vs raw pixels)
    <report_dir>/training_curves.png   loss (and per-level losses) per epoch
    <report_dir>/retrieval_grid.png    query images and their nearest neighbours
    <report_dir>/worst_queries.html    the worst queries, their neighbours and nearest correct item (and .png)
    <report_dir>/summary.md            the retrieval figures and a link to each file of the report
    <report_dir>/tensorboard/          TensorBoard logs; run `projector`: the evaluation items for the projector
    <report_dir>/checkpoints/          an unfinished run's state, where it resumes; cleared with the report

The job runs in stages, each a function of the typed `Config` that returns its result, one module each:

- `folder`: `choose_report_dir` (a finished report is kept), `resolve_paths`, `prepare_report_dir` (resume
  or refuse) and `publish_report`, which moves the report into place in one step and clears the checkpoints;
- `data`: `load_sources`, `fit_to_data`, `make_datasets`; `train`: `build_model` (`tfdml.recipes`) and `train`;
- `evaluate`: `evaluate` (with the raw-pixel baseline and the match calibration) and `export`;
- `report`: `write_report` into a folder beside the report folder, then published;
- `job`: `run`, the stages in order, with the report folder locked for the whole job (`tfdml.locks`).
"""

from tfdml import data as data_lib  # noqa: F401  (the module the data stage reads sources with)
from tfdml import export as export_lib  # noqa: F401  (the module the export stage writes with)
from tfdml.data.sources import class_halves  # noqa: F401
from tfdml.pipeline.data import (
    Datasets,
    augment_setting,
    check_unseen_classes,
    fit_to_data,
    load_sources,
    make_datasets,
    steps_per_epoch,
)
from tfdml.pipeline.evaluate import EXPORT_RECORD, Evaluation, evaluate, export
from tfdml.pipeline.folder import (
    CONFIG_SNAPSHOT,
    check_outputs,
    choose_report_dir,
    finished_report,
    prepare_report_dir,
    publish_report,
    resolve_paths,
)
from tfdml.pipeline.job import Interrupted, JobError, Outcome, run
from tfdml.pipeline.report import process_seconds, write_projector, write_report
from tfdml.pipeline.train import TRAINED_WEIGHTS, Training, build_model, train
from tfdml.recipes import build_loss

__all__ = [
    "CONFIG_SNAPSHOT",
    "EXPORT_RECORD",
    "TRAINED_WEIGHTS",
    "Datasets",
    "Evaluation",
    "Interrupted",
    "JobError",
    "Outcome",
    "Training",
    "augment_setting",
    "build_loss",
    "build_model",
    "check_outputs",
    "check_unseen_classes",
    "choose_report_dir",
    "evaluate",
    "export",
    "finished_report",
    "fit_to_data",
    "load_sources",
    "make_datasets",
    "prepare_report_dir",
    "process_seconds",
    "publish_report",
    "resolve_paths",
    "run",
    "steps_per_epoch",
    "train",
    "write_projector",
    "write_report",
]
