"""The report: metrics.json, config.yaml, plots, the worst queries' page, the projector's embeddings and
summary.md (what is where), written beside the report folder and published in one step."""

import json
import os
import shutil
import time

import numpy as np
import yaml

from tfdml import interrupts, plots, projector, report_pages
from tfdml.ops.neighbours import exact_search
from tfdml.pipeline.folder import publish_report, staging_dir
from tfdml.retrieval import worst_queries


def write_report(folder, config, summary, history, evaluation, class_names=None, files=None):
    """The report in `folder`: config.yaml, the plots and metrics.json (the one place it is written); `files`,
    the evaluation items' files as the worst queries' page shows them (`evaluated_files`), or None."""

    with open(os.path.join(folder, "config.yaml"), "w") as f:
        yaml.safe_dump(config.to_dict(), f, sort_keys=False)
    plots.plot_recall_curve(
        {"tfdml": evaluation.results, "raw pixels": evaluation.baseline}, os.path.join(folder, "recall_at_k.png")
    )
    plots.plot_training_curves(history, os.path.join(folder, "training_curves.png"))
    if evaluation.calibration is not None:
        plots.plot_match_calibration(evaluation.calibration, os.path.join(folder, "match_calibration.png"))
    _retrieval_grid(evaluation, config.report, os.path.join(folder, "retrieval_grid.png"), class_names)
    _worst_queries_page(folder, evaluation, config, class_names, files)
    with open(os.path.join(folder, "metrics.json"), "w") as f:
        json.dump(summary, f, indent=2)
    write_summary(folder, summary)


def _worst_queries_page(folder, evaluation, config, class_names=None, files=None):
    """worst_queries.html (its images in a folder beside it) and worst_queries.png of the evaluation items."""
    worst = worst_queries(
        evaluation.embeddings,
        evaluation.labels,
        count=config.report.worst_queries,
        neighbours=config.report.grid_neighbours,
        by=config.report.worst_order,
    )
    title = f"Worst queries of {config.name} on its evaluation items"
    report_pages.write_worst_queries_page(
        folder, worst, _evaluated_pixels(evaluation), class_names=class_names, title=title, files=files
    )


def evaluated_files(source, evaluation):
    """The evaluation items' files relative to their image folder (`report_pages.item_files`), or None: for a
    source without files (an embedded data set), or one whose items the evaluation did not meet in order."""
    paths = getattr(source, "paths", None)
    if paths is None or not np.array_equal(np.asarray(source.labels), evaluation.labels):
        return None
    return report_pages.item_files(paths)


def _evaluated_pixels(evaluation):
    """The evaluation items' images, or None: the pixels come from their own pass over the evaluation data, used
    only when it met the items in the same order."""
    same_items = np.array_equal(evaluation.pixel_labels, evaluation.labels)
    return evaluation.pixels if same_items else None


def write_summary(folder, summary):
    """summary.md: the job's retrieval figures beside raw pixels, and a link to each file of the report."""
    lines = [f"# {summary.get('name', 'job')}", ""]
    model, pixels = summary.get("model") or {}, summary.get("raw_pixels") or {}
    if model:
        items = f"{summary.get('eval_items')} items of {summary.get('eval_classes')} classes"
        lines += [
            f"Retrieval on the evaluation data ({items}):",
            "",
            "| metric | model | raw pixels |",
            "|---|---|---|",
        ]
        lines += [f"| {key} | {value:.4f} | {_figure(pixels.get(key))} |" for key, value in model.items()]
        lines.append("")
    files = [
        ("worst_queries.html", "the worst queries: each with its top neighbours and its nearest correct item"),
        ("worst_queries.png", "the same queries as a figure"),
        ("retrieval_grid.png", "queries and their nearest neighbours"),
        ("recall_at_k.png", "Recall@K of the model and of raw pixels"),
        ("training_curves.png", "loss per epoch"),
        ("match_calibration.png", "precision and recall of the served match decision"),
        ("metrics.json", "every figure, the timings and the training history"),
        ("config.yaml", "the resolved configuration"),
        ("model.keras", "the trained embedder"),
    ]
    lines += [f"- [{name}]({name}): {what}" for name, what in files if os.path.exists(os.path.join(folder, name))]
    if summary.get("export_dir"):
        lines.append(f"- export: `{summary['export_dir']}`")
    with open(os.path.join(folder, "summary.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def _figure(value):
    return "" if value is None else f"{value:.4f}"


def write_projector(folder, evaluation, class_names=None):
    """The evaluation embeddings with class names and images for TensorBoard's projector
    (`<folder>/tensorboard`, run `projector`, see `tfdml.projector`)."""
    return projector.write_projector(
        os.path.join(folder, "tensorboard"),
        evaluation.embeddings,
        evaluation.labels,
        class_names,
        _evaluated_pixels(evaluation),
    )


def _retrieval_grid(evaluation, report_cfg, path, class_names=None):
    """Nearest neighbours of one query per class (then more), for `plot_retrieval_grid`."""

    labels, images = evaluation.labels, evaluation.pixels
    first_of_class = [int(np.flatnonzero(labels == c)[0]) for c in np.unique(labels)]
    rest = [i for i in range(len(labels)) if i not in set(first_of_class)]
    queries = (first_of_class + rest)[: report_cfg.grid_queries]
    k = report_cfg.grid_neighbours
    neighbours, distances = exact_search(
        evaluation.embeddings[queries], evaluation.embeddings, k=k + 1, distance="squared_euclidean"
    )
    kept = [
        [(j, d) for j, d in zip(row, drow) if j != q][:k]
        for q, row, drow in zip(queries, np.asarray(neighbours), np.asarray(distances))
    ]
    neighbours = [[j for j, _ in row] for row in kept]

    def name(label):
        if class_names is not None and 0 <= label < len(class_names):
            return plots.drawable_name(str(class_names[label]), label)
        return str(label)

    shown = [labels[i] for i in queries] + [labels[j] for row in neighbours for j in row]
    by_index = class_names is not None and any(name(label) != str(class_names[label]) for label in shown)

    # Scores as the served index reports them: dot products of the unit-norm embeddings (1 - d^2 / 2).
    plots.plot_retrieval_grid(
        [images[q] for q in queries],
        [[images[j] for j in row] for row in neighbours],
        np.array([[labels[j] == labels[q] for j in row] for q, row in zip(queries, neighbours)]),
        path,
        titles=[[name(labels[j]) for j, _ in row] for row in kept],  # a line of its own: any script reads right
        scores=[[f"{1.0 - d / 2.0:.2f}" for _, d in row] for row in kept],
        query_titles=[report_pages.query_title(name(labels[q])) for q in queries],
        note="[n]: a class name no installed font can draw, by its index n in the class list" if by_index else None,
    )


def process_seconds():
    """Wall seconds since this process started (interpreter start-up and imports included): from the
    process start time on Linux, else since `tfdml.pipeline` was imported."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = float(f.read().rsplit(")", 1)[1].split()[19])  # field 22: starttime
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.perf_counter() - _IMPORTED


_IMPORTED = time.perf_counter()


def finish_report(config, outcome, started, stage):
    """Writes the report beside its folder, moves it into place in one step and clears the checkpoints;
    returns the summary written to metrics.json."""
    report_dir, checkpoints = config.report.dir, config.training.checkpoint_dir
    staging = staging_dir(report_dir)
    training_logs = os.path.join(report_dir, "tensorboard")
    if os.path.isdir(training_logs):
        shutil.copytree(training_logs, os.path.join(staging, "tensorboard"))
    outcome.embedder.save(os.path.join(staging, "model.keras"))
    class_names = outcome.eval_source.class_names
    write_projector(staging, outcome.evaluation, class_names)
    summary = dict(outcome.summary)
    summary["job_seconds"] = round(time.perf_counter() - started, 2)  # this call, from configuration to report
    summary["wall_seconds"] = round(process_seconds(), 2)  # this process since it started, imports included
    files = evaluated_files(outcome.eval_source, outcome.evaluation)
    write_report(staging, config, summary, outcome.history, outcome.evaluation, class_names, files)
    with interrupts.holding():  # the move and the clearing are not cut in half
        publish_report(staging, report_dir, checkpoints)
        interrupts.complete(f"the report in {report_dir}")
        stage[0] = "reported"
    return summary
