"""`tfdml train` end to end: the default job in a subprocess, its report, its export (reloaded without tfdml),
`tfdml search` / `tfdml evaluate` / `tfdml export` on what it wrote, determinism, and the CLI surface.

The runs are shortened to 2 epochs of 10 steps and 2 worst queries in the report; three of them run once per
module: seed 0 with export and seed 0 killed after its first epoch and started again, in concurrent subprocesses
with TensorFlow's log level left to the CLI and their output in a pipe (so they also show what a redirected log
looks like), and seed 1 in the test process meanwhile.
"""

import json
import math
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import yaml

from tests import cli_process
from tfdml import cli, pipeline
from tfdml.config import default_config, load_config
from tfdml.pipeline import resolve_paths

pytestmark = pytest.mark.slow  # every test shares the default job's runs (a module fixture of about 90 s)

ROOT = cli_process.ROOT
SHORT = ["--epochs", "2", "--steps-per-epoch", "10", "--set", "report.worst_queries=2"]
# What a user did not cause and should not see: TensorFlow's start-up lines on a machine without a GPU,
# Keras warnings about the input, progress-bar escape codes in a redirected log.
NOISE = ("cuInit", "oneDNN", "cpu_feature_guard", "shuffle=True", "ran out of data", "\x1b[", "Traceback")
REPORT_FILES = (
    "metrics.json",
    "config.yaml",
    "recall_at_k.png",
    "training_curves.png",
    "retrieval_grid.png",
    "match_calibration.png",
    "model.keras",
    "worst_queries.html",
    "worst_queries.png",
    "summary.md",
)


def _start(cwd, *extra):
    return cli_process.start(cwd, "train", *SHORT, *extra)


def _interrupt_after_first_epoch(proc, checkpoints):
    """Sends `proc` a SIGINT (Ctrl-C) as soon as its checkpoint manifest records a finished first epoch;
    returns that state and the output, or None when the run ended before."""
    if cli_process.wait_for(proc, cli_process.checkpointed_epoch(checkpoints, 1), timeout=300):
        with open(checkpoints / "training_metadata.json") as f:
            state = json.load(f)
        proc.send_signal(signal.SIGINT)
        return state, proc.communicate()[0]
    return None, proc.communicate()[0]


def _run_other_seed(base):
    """The default job written out as a file (see tests/pipeline/test_configs.py), run from that file with seed 1 and
    the default report directory (reports/<name> under the working directory). In this process: what it
    shows needs no process of its own, and a subprocess would import TensorFlow once more."""
    arguments = ["--config", os.path.join(ROOT, "configs", "glyphs_rll.yaml"), "--no-export", "--seed", "1"]
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(base)
        return cli.main(["train", *SHORT, *arguments])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Three `tfdml train` runs: "main" (seed 0, exported) and "resumed" (seed 0, interrupted with Ctrl-C after
    its first epoch, then started again with the same report directory) in concurrent subprocesses, and
    "other_seed" (configs/glyphs_rll.yaml, seed 1) in this process meanwhile."""
    base = tmp_path_factory.mktemp("train")
    procs = {"main": _start(base, "--report-dir", "report", "--export-dir", "exported")}
    killed = _start(base, "--report-dir", "report_resumed", "--no-export", "--seed", "0")
    kill_state, killed_output = _interrupt_after_first_epoch(killed, base / "report_resumed" / "checkpoints")
    killed_rc = killed.wait()
    procs["resumed"] = _start(base, "--report-dir", "report_resumed", "--no-export", "--seed", "0")
    assert _run_other_seed(base) == 0, "tfdml train (other_seed) failed"
    outputs = {name: proc.communicate(timeout=600)[0] for name, proc in procs.items()}
    for name, proc in procs.items():
        assert proc.returncode == 0, f"tfdml train ({name}) failed:\n{outputs[name][-3000:]}"
    return {
        "base": base,
        "output": outputs["main"],
        "main": base / "report",
        "other_seed": base / "reports" / "glyphs_rll",
        "resumed": base / "report_resumed",
        "kill_state": kill_state,
        "killed_rc": killed_rc,
        "killed_output": killed_output,
        "resumed_output": outputs["resumed"],
    }


def _metrics(report_dir):
    with open(report_dir / "metrics.json") as f:
        return json.load(f)


def _export_dir(runs):
    return runs["base"] / "exported" / "glyphs_rll"


def _eval_images(channels):
    """The first 16 evaluation images (the unseen glyphs): the raw uint8 pixels the export serves, their labels,
    and the batch the job evaluated them as (tfdml.data.eval_dataset: whole images, as the job trains on whole
    images, in [0, 1])."""
    from tfdml import data

    source = data.glyphs("test", image_size=32)
    evaluated, labels = next(iter(data.eval_dataset(source, 16, image_size=32, center_crop=False)))
    pixels = source.images[:16]
    assert pixels.shape[-1] == channels and pixels.dtype == np.uint8
    np.testing.assert_array_equal(labels.numpy(), source.labels[:16])
    return pixels, labels.numpy(), evaluated.numpy()


def test_report_files(runs):
    report = runs["main"]
    for name in REPORT_FILES:
        assert (report / name).stat().st_size > 0, name
    assert any(files for _, _, files in os.walk(report / "tensorboard"))
    assert (
        "](worst_queries.html)" in (report / "summary.md").read_text()
    )  # tests/retrieval/test_worst_queries.py reads it
    summary = _metrics(report)
    assert summary["name"] == "glyphs_rll"
    assert summary["eval_classes"] == 151 and summary["eval_items"] == 3020  # the unseen half of the glyphs
    for key in ("model", "raw_pixels"):
        assert {"recall@1", "recall@8", "map@r", "r_precision"} <= set(summary[key])
        assert all(0.0 <= v <= 1.0 for v in summary[key].values()), summary[key]
    assert len(summary["history"]["loss"]) == 2
    # The served match decision, calibrated on the evaluation items at the default precision.
    calibration = summary["match_calibration"]
    assert calibration["target_precision"] == 0.9 and calibration["queries"] == summary["eval_items"]
    assert summary["search"] == {
        "top_k": 10,
        "gallery_dtype": "float32",
        "match_precision": 0.9,
        "match_threshold": calibration["threshold"],
    }
    with open(report / "config.yaml") as f:
        config = yaml.safe_load(f)
    assert config["training"]["epochs"] == 2 and config["training"]["steps_per_epoch"] == 10
    assert '"recall@1"' in runs["output"] and "exported SavedModel" in runs["output"]


def test_output_is_quiet_and_clean(runs):
    for name in ("output", "resumed_output"):
        for noise in NOISE:
            assert noise not in runs[name], f"{noise!r} in the output of tfdml train:\n{runs[name][-3000:]}"
    # one line per epoch in a redirected log
    progress = [line for line in runs["output"].splitlines() if "/10 " in line]
    assert len(progress) == 2 and all(line.startswith("10/10 - ") for line in progress), progress


def test_export_reloads_without_tfdml(runs, tmp_path):
    import keras

    import tfdml.models  # noqa: F401  (registers the classes model.keras needs)

    export = _export_dir(runs)
    version = export / "1"
    assert (version / "saved_model.pb").exists()
    with open(version / "tfdml_metadata.json") as f:
        metadata = json.load(f)
    assert metadata["name"] == "glyphs_rll" and metadata["version"] == 1
    # The gallery index travels inside its version (assets.extra/ is ignored by TF Serving).
    assert os.listdir(version / "assets.extra" / "tfdml_index")
    assert metadata["index"]["size"] == 3020 and metadata["index"]["ids"] == "indices"
    channels = metadata["input"]["shape"][-1]
    pixels, _, evaluated = _eval_images(channels)
    np.save(tmp_path / "images.npy", pixels)

    script = textwrap.dedent(f"""
        import sys
        import numpy as np
        import tensorflow as tf
        model = tf.saved_model.load({str(version)!r})
        images = tf.constant(np.load({str(tmp_path / "images.npy")!r}))
        outputs = model.signatures["serving_default"](images=images)
        np.save({str(tmp_path / "served.npy")!r}, outputs["embedding"].numpy())
        found = model.signatures["search"](images=images)  # the gallery is the evaluation data
        np.savez({str(tmp_path / "found.npz")!r}, **{{k: v.numpy().astype("S") if v.dtype == tf.string
                                                     else v.numpy() for k, v in found.items()}})
        assert not any(name == "tfdml" or name.startswith("tfdml.") for name in sys.modules)
    """)
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env=dict(cli_process.env(), PYTHONPATH=""),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    served = np.load(tmp_path / "served.npy")

    model = keras.saving.load_model(runs["main"] / "model.keras", compile=False)
    expected = np.asarray(model(evaluated, training=False))  # the images as the job evaluated them
    assert served.shape == expected.shape == (16, metadata["embedding_dim"])
    np.testing.assert_allclose(served, expected, atol=1e-4)
    np.testing.assert_allclose(np.linalg.norm(served, axis=1), 1.0, atol=1e-4)
    # `tfdml train` wrote the search signature: each evaluation image finds itself first, with its class.
    from tfdml import data

    source = data.glyphs("test", image_size=32)
    with np.load(tmp_path / "found.npz") as found:
        assert found["scores"].shape == (16, 10) and found["match"].dtype == bool
        np.testing.assert_allclose(found["scores"][:, 0], 1.0, atol=1e-4)
        np.testing.assert_allclose(found["embedding"], served, atol=1e-6)
        assert [i.decode() for i in found["ids"][:, 0]] == [f"{source.name}:{i}" for i in range(16)]
        assert [c.decode() for c in found["labels"][:, 0]] == [source.class_names[c] for c in source.labels[:16]]


def test_search_and_evaluate_the_export(runs, tmp_path, capsys):
    import tensorflow as tf

    from tfdml import data

    export = _export_dir(runs)
    pixels, labels, _ = _eval_images(channels=1)
    names = [data.glyphs("test", image_size=32).class_name(int(label)) for label in labels]
    queries = []
    for i in (0, 5):
        path = tmp_path / f"query{i}.png"
        tf.io.write_file(str(path), tf.io.encode_png(pixels[i]))
        queries.append(str(path))
    rc = cli.main(
        [
            "search",
            *queries,
            "--model",
            str(export),
            "-k",
            "3",
            "--json",
            str(tmp_path / "s.json"),
            "--query-label",
            names[0],
            "--query-label",
            names[5],
        ]
    )
    assert rc == 0, capsys.readouterr().err
    with open(tmp_path / "s.json") as f:
        found = json.load(f)
    # the gallery is the evaluation set in order: each query finds itself first, with its own class (the
    # index numbers only its gallery's classes, so its label numbers are positions among those)
    for entry, i in zip(found, (0, 5)):
        first = entry["neighbours"][0]
        assert (first["id"], first["class"], first["same_class"]) == (i, names[i], True)
        assert first["score"] == pytest.approx(1.0, abs=1e-4)
        assert len(entry["neighbours"]) == 3

    rc = cli.main(
        [
            "evaluate",
            "--model",
            str(export),
            "--dataset",
            "glyphs",
            "--json",
            str(tmp_path / "e.json"),
            "--metrics",
            "recall",
            "map@r",
            "r_precision",
        ]
    )  # the job's metrics (no k-means)
    assert rc == 0, capsys.readouterr().err
    with open(tmp_path / "e.json") as f:
        evaluated = json.load(f)
    trained = _metrics(runs["main"])["model"]
    # The same model on the same raw images, resized in the serving graph as the job evaluated them and
    # preprocessed by the model itself: the job's figures, reproduced. (The served embeddings equal the Keras
    # model's here; float32 differences of an ulp, e.g. a second L2 normalisation in the graph, reorder a few
    # near-ties among 3,020 barely trained embeddings, one item moving Recall@K by 3e-4; another
    # preprocessing moved MAP@R by ~3e-3.)
    assert evaluated == pytest.approx(trained, abs=1e-4)


def test_report_and_evaluate_write_the_embedding_projector(runs, tmp_path, capsys):
    """The job's `tensorboard/` holds a projector run that TensorBoard's projector plugin serves (every
    evaluation image, its class name, the sprite); `tfdml evaluate --model ... --projector` writes the same
    from the export."""
    from tests.test_projector import read_projector
    from tfdml import data

    served = read_projector(runs["main"] / "tensorboard")
    assert list(served) == ["projector"]  # not attached to the training runs beside it
    job = served["projector"]
    source = data.glyphs("test", image_size=32)
    assert job["tensor"].shape == (len(source), 64)
    np.testing.assert_allclose(np.linalg.norm(job["tensor"], axis=1), 1.0, atol=1e-4)
    assert job["metadata"][1:] == [f"{source.class_names[c]}\t{c}" for c in source.labels]
    assert job["config"]["embeddings"][0]["sprite"]["singleImageDim"] == [32, 32]
    side = math.ceil(math.sqrt(len(source)))  # thumbnails a side
    assert job["sprite"].shape == (side * 32, side * 32, 3)
    np.testing.assert_array_equal(job["sprite"][:32, 32:64, 0], source.images[1][..., 0])

    rc = cli.main(
        [
            "evaluate",
            "--model",
            str(_export_dir(runs)),
            "--metrics",
            "recall",
            "--ks",
            "1",
            "--projector",
            str(tmp_path / "tb"),
        ]
    )
    assert rc == 0, capsys.readouterr().err
    exported = read_projector(tmp_path / "tb")["projector"]
    assert exported["metadata"] == job["metadata"]
    np.testing.assert_allclose(exported["tensor"], job["tensor"], atol=1e-4)
    np.testing.assert_array_equal(exported["sprite"], job["sprite"])


def test_export_command_reexports(runs, tmp_path, capsys):
    import tensorflow as tf

    rc = cli.main(["export", "--model", str(runs["main"] / "model.keras"), "--name", "x", "--base-dir", str(tmp_path)])
    assert rc == 0
    assert "exported SavedModel" in capsys.readouterr().out
    assert (tmp_path / "x" / "1" / "saved_model.pb").exists()
    pixels, _, _ = _eval_images(channels=1)
    original = tf.saved_model.load(str(_export_dir(runs) / "1")).signatures["serving_default"]
    again = tf.saved_model.load(str(tmp_path / "x" / "1")).signatures["serving_default"]
    np.testing.assert_allclose(
        again(images=tf.constant(pixels))["embedding"].numpy(),
        original(images=tf.constant(pixels))["embedding"].numpy(),
        atol=1e-5,
    )


def test_interrupted_run_resumes_to_the_same_result(runs):
    """A run stopped with Ctrl-C after epoch 1 says so in one line (exit 130, no traceback), and started again
    ends exactly where the uninterrupted run (same seed, another process) ends: same epoch-2 loss, same
    metrics. This also shows that a seed fixes the whole run."""
    assert (runs["kill_state"] or {}).get("epoch") == 1, "the run finished before it could be interrupted"
    assert runs["killed_rc"] == 130, runs["killed_output"][-3000:]
    assert "tfdml train: interrupted after epoch 1/2; run the same command to resume" in runs["killed_output"]
    assert "Traceback" not in runs["killed_output"]
    main, resumed = _metrics(runs["main"]), _metrics(runs["resumed"])
    assert "resuming from epoch 2/2 (1 epoch(s) restored from report_resumed/checkpoints)" in runs["resumed_output"]
    assert "Epoch 2/2" in runs["resumed_output"] and "Epoch 1/2" not in runs["resumed_output"]
    # the whole history: the killed run's first epoch and the resumed second one
    assert set(resumed["history"]) == set(main["history"])
    for key, values in main["history"].items():
        np.testing.assert_allclose(resumed["history"][key], values, rtol=1e-5, err_msg=key)
    # the timings say what they count: training summed over both runs, this run's share, the process
    assert resumed["epochs_this_run"] == 1 and 0 < resumed["train_seconds_this_run"] < resumed["train_seconds"]
    assert resumed["train_seconds_this_run"] < resumed["job_seconds"] < resumed["wall_seconds"]
    assert (
        f"training: {resumed['train_seconds']:.1f} s for 2 epochs; "
        f"{resumed['train_seconds_this_run']:.1f} s of it in this run, epochs 2-2" in runs["resumed_output"]
    )
    assert resumed["model"] == main["model"]
    assert not os.path.exists(runs["resumed"] / "checkpoints" / "training_metadata.json")  # done: cleared


def test_other_seed_differs(runs):
    main, other = _metrics(runs["main"]), _metrics(runs["other_seed"])
    assert other["name"] == "glyphs_rll" and len(other["history"]["loss"]) == 2
    assert other["model"] != main["model"]
    assert other["history"]["loss"] != main["history"]["loss"]


def test_help(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for command in ("train", "evaluate", "export", "search"):
        assert command in out
    assert cli.main([]) == 0  # no command: the overview, not an error
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["train", "--help"])
    assert exit_info.value.code == 0
    assert "--print-config" in capsys.readouterr().out


def test_every_option_has_help():
    parser = cli.build_parser()
    subparsers = next(a for a in parser._actions if a.choices and "train" in a.choices)
    for name, sub in subparsers.choices.items():
        for action in sub._actions:
            assert action.help and action.help.strip(), f"tfdml {name} {action.option_strings or action.dest}"


def test_each_shortcut_is_its_configuration_key():
    """`--epochs 3` is `--set training.epochs=3`, and so on for every shortcut, declared once: the option, the
    override and the option an error about the key names."""
    values = {"epochs": "3", "steps_per_epoch": "5", "seed": "7", "export_version": "2"}
    values.update(report_dir="reports/shortcut", export_dir="exported_models/shortcut")
    parser = cli.build_parser()
    for dest, key in cli.train._SHORTCUTS.items():
        option = "--" + dest.replace("_", "-")
        by_option = cli.train.resolve(parser.parse_args(["train", option, values[dest]]))
        by_key = cli.train.resolve(parser.parse_args(["train", "--set", f"{key}={values[dest]}"]))
        assert by_option == by_key != cli.train.resolve(parser.parse_args(["train"])), option
        args = parser.parse_args(["train", option, values[dest]])
        assert cli.train._with_option(f"{key}: a problem", args) == f"{key} ({option}): a problem"


def test_version(capsys):
    from tfdml import __version__

    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--version"])
    assert exit_info.value.code == 0 and capsys.readouterr().out.strip() == f"tfdml {__version__}"


def test_help_states_each_default_once():
    parser = cli.build_parser()
    subparsers = next(a for a in parser._actions if a.choices and "train" in a.choices)
    for name, sub in subparsers.choices.items():
        formatter = sub._get_formatter()
        for action in sub._actions:
            text = formatter._expand_help(action) if action.help else ""
            where = f"tfdml {name} {action.option_strings}: {text}"
            assert text.count("default") <= 1 and "(default: None)" not in text, where
        assert "(default: None)" not in sub.format_help()


def test_print_config_is_the_defaults_with_what_each_key_means(capsys):
    """The YAML of the resolved job, each key's meaning (the comment its section gives it, as on the generated
    page of the keys) in a comment above it; a single-level model's unread keys (levels, auxiliary heads)
    left out."""
    assert cli.main(["train", "--print-config"]) == 0
    out = capsys.readouterr().out
    expected = resolve_paths(default_config()).to_dict()
    for key in ("taps", "levels", "level_weights", "head_filters", "head_units"):
        del expected["model"][key]
    assert yaml.safe_load(out) == expected
    lines = out.splitlines()
    above = {line: lines[i - 1] for i, line in enumerate(lines) if i}
    assert above["  epochs: 10"] == "  # epochs of steps_per_epoch steps"  # TrainingConfig.epochs' comment
    assert above["  name: adam"] == "  # a Keras optimizer"
    assert above["data:"] == "# Where the images come from and how training batches are drawn (`tfdml.data`)."
    assert any(line.startswith('    # "paper" (Algorithm 1 literally') for line in lines)  # ala.params.variant
    keys = [i for i, line in enumerate(lines) if line.strip() and not line.lstrip().startswith("#")]
    assert all(lines[i - 1].lstrip().startswith("# ") for i in keys), "a key without its meaning"
    assert max(map(len, lines)) <= 120 and "levels:" not in out and "type: single" in out
    assert cli.main(["train", "--print-config", "--set", "model.type=multilevel"]) == 0
    out = capsys.readouterr().out
    assert "  levels: [L, M, H]" in out and "  # heads of a multilevel model" in out
    assert (
        cli.main(
            [
                "train",
                "--print-config",
                "--config",
                os.path.join(ROOT, "configs", "digits_rll.yaml"),
                "--epochs",
                "3",
                "--set",
                "training.epochs=3",  # the same value twice: nothing disagrees
                "--set",
                "loss.params.margin=0.5",
            ]
        )
        == 0
    )
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["training"]["epochs"] == 3 and printed["loss"]["params"]["margin"] == 0.5


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--set", "training.epoch=2"], "unknown configuration key 'training.epoch' (did you mean 'epochs'?)"),
        (["--set", "training"], "must look like key.path=value"),
        (["--epochs", "0"], "training.epochs (--epochs): must be an integer in [1, 1000000], got 0"),
        (["--set", "seed=1.5"], "seed: expected an integer, got 1.5"),
        (["--set", "loss.params.margn=0.1"], "unknown configuration key 'loss.params.margn'"),
        (["--eval-image-dir", "x"], "--eval-image-dir needs --image-dir"),
        (["--set", "loss.margin=0.3"], "unknown configuration key 'loss.margin' (did you mean 'loss.params.margin'?)"),
        (["--set", "epochs=3"], "unknown configuration key 'epochs' (did you mean 'training.epochs'?)"),
        (
            ["--epochs", "1", "--set", "training.epochs=-3"],
            "--set training.epochs=-3 and --epochs 1 disagree: give training.epochs once",
        ),
        (
            ["--set", "training={epochs: 4}", "--epochs", "2"],
            "--set training={epochs: 4} and --epochs 2 disagree: give training.epochs once",
        ),
        (["--no-export", "--set", "export.enabled=true"], "--set export.enabled=true and --no-export disagree"),
    ],
)
def test_bad_value_exits_2_with_one_line(arguments, message, capsys):
    assert cli.main(["train", *arguments]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("tfdml train: error: ") and message in captured.err
    assert captured.err.count("\n") == 1 and not captured.out


def test_missing_config_file_fails_clearly(tmp_path, capsys):
    assert cli.main(["train", "--config", str(tmp_path / "nope.yaml")]) == 2
    assert "configuration file not found" in capsys.readouterr().err


def _unfinished_run(report_dir):
    """A report directory holding an unfinished run of the default job, as keras.callbacks.BackupAndRestore
    leaves it after one epoch, resumed unchecked (the decision to resume or refuse comes before anything is
    built, so no weights are needed)."""
    config = resolve_paths(load_config(overrides=[f"report.dir={report_dir}"]))
    assert pipeline.prepare_report_dir(config, say=lambda text: None) == 0
    (report_dir / "checkpoints" / "training_metadata.json").write_text('{"epoch": 1, "batch": 0}')
    return config


def test_changed_configuration_is_refused(tmp_path, capsys):
    _unfinished_run(tmp_path)
    assert (
        cli.main(["train", "--report-dir", str(tmp_path), "--set", "optimizer.learning_rate=0.01", "--epochs", "4"])
        == 2
    )
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert (
        "holds an unfinished run (1 epoch(s) done) with another configuration (optimizer.learning_rate, "
        "training.epochs differ)"
        in err
        and "--restart" in err
    )
    assert cli.main(["train", "--report-dir", str(tmp_path), "--set", "model.embedding_dim=32"]) == 2
    assert "(model.embedding_dim differs)" in capsys.readouterr().err


def test_resume_and_restart_decisions(tmp_path):
    config = _unfinished_run(tmp_path)
    said = []
    assert pipeline.prepare_report_dir(config, say=said.append) == 1
    assert said == [f"resuming from epoch 2/10 (1 epoch(s) restored from {tmp_path}/checkpoints)"]
    # evaluation, export and report settings do not change what is trained
    assert (
        pipeline.prepare_report_dir(config.replace(evaluation=config.evaluation.replace(ks=[1])), say=said.append) == 1
    )
    changed = config.replace(optimizer=config.optimizer.replace(learning_rate=0.5))
    assert pipeline.prepare_report_dir(changed, restart=True, say=said.append) == 0
    assert said[-1].startswith("--restart: removed the unfinished run's checkpoints (1 epoch(s) done)")
    assert not (tmp_path / "checkpoints" / "training_metadata.json").exists()
    with open(tmp_path / "checkpoints" / pipeline.CONFIG_SNAPSHOT) as f:  # what the new run is compared with
        assert yaml.safe_load(f) == changed.to_dict()


def test_history_keeps_the_checkpointed_epochs(tmp_path):
    from tfdml.callbacks import EpochLog, previous_epochs

    log = EpochLog(tmp_path)
    for epoch in range(2):
        log.on_epoch_begin(epoch)
        log.on_epoch_end(epoch, {"loss": float(epoch)})
    # killed after logging epoch 2 but before its checkpoint: only epoch 1 is part of the run
    (tmp_path / "training_metadata.json").write_text('{"epoch": 1, "batch": 0}')
    assert [entry["logs"] for entry in previous_epochs(tmp_path)] == [{"loss": 0.0}]
    resumed = EpochLog(tmp_path)
    resumed.on_epoch_begin(1)
    resumed.on_epoch_end(1, {"loss": 5.0})
    assert resumed.history() == {"loss": [0.0, 5.0]}
    assert resumed.seconds() == pytest.approx(sum(entry["seconds"] for entry in resumed.epochs))


def _class_folders(root, names, per_class=5, size=12):
    import tensorflow as tf

    rng = np.random.default_rng(0)
    for label, name in enumerate(names):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            image = rng.integers(0, 60, size=(size, size, 3)) + 40 * label
            tf.io.write_file(str(root / name / f"{i}.png"), tf.io.encode_png(image.astype(np.uint8)))
    return root


TINY_MODEL = [
    f"--set={item}"
    for item in (
        "model.backbone=small_cnn",  # --image-dir's default is the pretrained EfficientNet-Lite0
        "model.widths=[4,4,4]",
        "model.embedding_dim=4",
        "model.head_filters=2",
        "model.head_units=4",
        "data.image_size=16",
        "data.classes_per_batch=2",
        "data.samples_per_class=2",
        "evaluation.ks=[1]",
        "report.grid_queries=2",
        "report.grid_neighbours=2",
        "report.worst_queries=2",
    )
]


def test_train_on_an_image_folder(tmp_path, capsys):
    """`tfdml train --image-dir DIR`: the first half of the classes (by sorted folder name) trains, the unseen
    second half is evaluated; the job is named after the folder."""
    folder = _class_folders(tmp_path / "photos", ["dog", "ant", "cat", "bee"])
    # 22 classes per batch, chosen, do not fit 2 training classes: said before anything is built
    assert (
        cli.main(
            [
                "train",
                "--image-dir",
                str(folder),
                "--report-dir",
                str(tmp_path / "report"),
                "--set",
                "data.classes_per_batch=22",
            ]
        )
        == 2
    )
    assert "data.classes_per_batch: 22 classes per batch, but the training data" in capsys.readouterr().err
    rc = cli.main(
        [
            "train",
            "--image-dir",
            str(folder),
            "--report-dir",
            str(tmp_path / "report"),
            "--no-export",
            "--epochs",
            "1",
            "--steps-per-epoch",
            "1",
            *TINY_MODEL,
        ]
    )
    assert rc == 0, capsys.readouterr().err
    summary = _metrics(tmp_path / "report")
    assert summary["name"] == "photos" and (summary["eval_classes"], summary["eval_items"]) == (2, 10)
    config = load_config(str(tmp_path / "report" / "config.yaml"))
    train, evaluation = pipeline.load_sources(config.data)
    names = train.class_names
    assert names == ["ant", "bee", "cat", "dog"]
    assert [names[c] for c in train.classes] == ["ant", "bee"] and [names[c] for c in evaluation.classes] == [
        "cat",
        "dog",
    ]
    assert all(os.path.basename(os.path.dirname(p)) in ("cat", "dog") for p in evaluation.paths)
    # with --eval-image-dir every class of --image-dir trains
    other = _class_folders(tmp_path / "other", ["eel", "fox"])
    args = cli.build_parser().parse_args(["train", "--image-dir", str(folder), "--eval-image-dir", str(other)])
    train, evaluation = pipeline.load_sources(cli.train.resolve(args).data)
    assert len(train.classes) == 4 and evaluation.class_names == ["eel", "fox"]


def test_export_match_mode_and_target_recall_reach_the_export_step(tmp_path, monkeypatch):
    """`export.match_mode` calibrates the served `match` (evaluation) and is recorded by the export with
    `export.target_recall`, as `tfdml export --match-mode / --target-recall` would."""
    import keras
    import tensorflow as tf

    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(6), 4)  # 6 classes: "auto" would calibrate open set
    images = (rng.integers(0, 255, (24, 4, 4, 1)) + labels[:, None, None, None] * 40).astype(np.float32)
    batches = tf.data.Dataset.from_tensor_slices((images, labels)).batch(8)
    datasets = pipeline.Datasets(train=None, eval=batches, pixels=batches)
    inputs = keras.Input((4, 4, 1))
    embedder = keras.Model(inputs, keras.layers.UnitNormalization()(keras.layers.Flatten()(inputs)))
    config = load_config(
        overrides=["export.match_mode=closed", "export.target_recall=0.8", f"export.base_dir={tmp_path}"]
    )
    evaluation = pipeline.evaluate(config, embedder, datasets)
    assert evaluation.calibration.mode == "closed"
    assert pipeline.evaluate(load_config(), embedder, datasets).calibration.mode == "open"
    given = {}

    def capture(model, **settings):
        given.update(settings)
        return str(tmp_path / "v")

    monkeypatch.setattr(pipeline.export_lib, "export_saved_model", capture)
    monkeypatch.setattr(pipeline.export_lib, "load_metadata", lambda path: {"index": {"size": 24}})
    pipeline.export(resolve_paths(config), embedder, evaluation, eval_source=None)
    assert given["match_mode"] == "closed" and given["index_settings"] == {"target_recall": 0.8}
    assert given["calibration"] is evaluation.calibration
