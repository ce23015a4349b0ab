"""Messages in the command line's words, and warnings about what the figures mean."""

import logging
import os

import keras
import numpy as np

from tfdml import cli, data, pipeline
from tfdml.config import ConfigError, DataConfig


def test_unprepared_tfds_data_set_names_the_settings(tmp_path):
    section = DataConfig.from_dict({"source": "tfds", "name": "caltech_birds2011", "data_dir": str(tmp_path)})
    try:
        pipeline.load_sources(section)
    except ConfigError as error:
        message = str(error)
    else:
        raise AssertionError("an unprepared data set was opened")
    assert message.startswith("data.name: the tfds data set 'caltech_birds2011' (split 'train+test') is not prepared")
    assert "--set data.download=true" in message and "--set data.data_dir=DIR" in message
    assert "\n" not in message and "download=True" not in message  # the CLI's words, not tfds_source's


def test_export_of_a_model_without_an_input_size_names_the_option(tmp_path, capsys):
    inputs = keras.Input((None, None, 3))
    outputs = keras.layers.Dense(4)(keras.layers.GlobalAveragePooling2D()(inputs))
    keras.Model(inputs, outputs).save(tmp_path / "open.keras")
    rc = cli.main(["export", "--model", str(tmp_path / "open.keras"), "--name", "x", "--base-dir", str(tmp_path)])
    assert rc == 2
    err = capsys.readouterr().err
    assert err == (
        f"tfdml export: error: cannot tell the input size of {tmp_path / 'open.keras'} (its input shape leaves "
        "height and width open): give it with --image-size HEIGHT WIDTH\n"
    )


def test_export_names_its_folder_from_the_report_or_asks_for_a_name(tmp_path, monkeypatch, capsys):
    """No folder name the user never gave: outside a report folder --name is asked for before anything is
    written; in one, the job's export name is the folder whose place is checked."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "alone").mkdir()
    keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)]).save(tmp_path / "alone" / "m.keras")
    assert cli.main(["export", "--model", "alone/m.keras", "--base-dir", "out"]) == 2
    assert capsys.readouterr().err == (
        "tfdml export: error: --name is needed: the model is not in a 'tfdml train' report folder that names it.\n"
    )
    assert not (tmp_path / "out").exists()
    report = tmp_path / "reports" / "shop"
    report.mkdir(parents=True)
    (report / "config.yaml").write_text("name: shop\nexport: {name: shop_embedder}\n")
    os.replace(tmp_path / "alone" / "m.keras", report / "model.keras")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "shop_embedder").write_text("a file where the export's folder goes")
    assert cli.main(["export", "--model", "reports/shop/model.keras", "--base-dir", "out"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tfdml export: error: --base-dir: ") and "out/shop_embedder is a file" in err, err


def _source(labels, names=None):
    source = data.array_source(np.zeros((len(labels), 4, 4), np.uint8), np.asarray(labels), name="s")
    source.class_names = names
    return source


def test_evaluation_classes_seen_in_training_are_warned_about(caplog):
    with caplog.at_level(logging.WARNING, logger="tfdml.pipeline"):
        pipeline.check_unseen_classes(_source([0, 1, 2]), _source([2, 3, 3]))  # class ids (no names)
        pipeline.check_unseen_classes(
            _source([0, 1], ["ant", "bee"]),
            _source([0, 1], ["bee", "cat"]),  # names: "bee" in both
        )
        # the default split of one folder or data set: disjoint halves of the classes, no warning
        train, evaluation = pipeline.class_halves(data.glyphs("train", image_size=8, images_per_class=2))
        pipeline.check_unseen_classes(train, evaluation)
    assert [record.getMessage() for record in caplog.records] == [
        "s shares 1 of its 2 classes with the training data (s): 2; the retrieval figures are not on unseen classes",
        "s shares 1 of its 2 classes with the training data (s): bee; the retrieval figures are not on unseen classes",
    ]
