"""TensorBoard's embedding projector: the files `tfdml.projector.write_projector` and `tfdml evaluate --projector`
write are read back through TensorBoard's own projector plugin (its HTTP handlers over an event multiplexer, as
`tensorboard --logdir` serves them): the run, the tensor's name and shape and values, the metadata rows and the
sprite's size and thumbnails."""

import io
import json
import math

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from tfdml import cli
from tfdml.projector import sprite_image, write_projector


def read_projector(log_dir):
    """What TensorBoard's projector plugin serves for `log_dir`: `{run: {"config", "tensor", "metadata",
    "sprite"}}` (sprite as a uint8 array, or None)."""
    from tensorboard.backend.event_processing import (
        data_provider,
        plugin_event_multiplexer,
    )
    from tensorboard.plugins import base_plugin
    from tensorboard.plugins.projector import projector_plugin
    from werkzeug.test import Client

    multiplexer = plugin_event_multiplexer.EventMultiplexer()
    multiplexer.AddRunsFromDirectory(str(log_dir))
    multiplexer.Reload()
    context = base_plugin.TBContext(
        logdir=str(log_dir), data_provider=data_provider.MultiplexerDataProvider(multiplexer, str(log_dir))
    )
    plugin = projector_plugin.ProjectorPlugin(context)
    apps = plugin.get_plugin_apps()

    def get(route, **query):
        response = Client(apps[route]).get("/", query_string=query)
        assert response.status_code == 200, response.get_data(as_text=True)
        return response.get_data()

    served = {}
    for run in json.loads(get("/runs")):
        config = json.loads(get("/info", run=run))
        [embedding] = config["embeddings"]
        name = embedding["tensorName"]
        shape = [int(v) for v in embedding["tensorShape"]]
        tensor = np.frombuffer(get("/tensor", run=run, name=name), np.float32).reshape(shape)
        metadata = get("/metadata", run=run, name=name).decode("utf-8").splitlines()
        sprite = None
        if embedding.get("sprite", {}).get("imagePath"):
            sprite = np.asarray(Image.open(io.BytesIO(get("/sprite_image", run=run, name=name))))
        served[run] = {"config": config, "tensor": tensor, "metadata": metadata, "sprite": sprite}
    return served


def _data(count=50, dim=8, classes=5, side=8, seed=0):
    rng = np.random.default_rng(seed)
    labels = np.arange(count) % classes
    return (
        rng.normal(size=(count, dim)).astype(np.float32),
        labels,
        [f"class {c}" for c in range(classes)],
        rng.uniform(size=(count, side, side, 1)).astype(np.float32),
    )


def test_written_files_load_in_tensorboards_projector_beside_training_runs(tmp_path):
    embeddings, labels, names, images = _data()
    writer = tf.summary.create_file_writer(str(tmp_path / "train"))  # a Keras TensorBoard run beside it
    with writer.as_default():
        tf.summary.scalar("loss", 1.0, step=0)
    writer.close()
    written = write_projector(tmp_path, embeddings, labels, names, images)
    served = read_projector(tmp_path)
    assert list(served) == ["projector"]  # the training run gets no copy of the embeddings
    projector = served["projector"]
    [embedding] = projector["config"]["embeddings"]
    assert embedding["tensorName"] == written["tensor_name"] == "embeddings/.ATTRIBUTES/VARIABLE_VALUE"
    np.testing.assert_array_equal(projector["tensor"], embeddings)
    assert projector["metadata"][0] == "class\tlabel"
    assert projector["metadata"][1:] == [f"class {c}\t{c}" for c in labels]
    assert embedding["sprite"]["singleImageDim"] == [8, 8]
    columns = math.ceil(math.sqrt(50))
    assert projector["sprite"].shape == (columns * 8, columns * 8, 3)
    for i in (0, 7, 49):  # thumbnail i sits at row i // columns, column i % columns
        row, column = divmod(i, columns)
        thumbnail = projector["sprite"][row * 8 : (row + 1) * 8, column * 8 : (column + 1) * 8, 0]
        np.testing.assert_array_equal(thumbnail, np.round(images[i, ..., 0] * 255).astype(np.uint8))


def test_subset_rewrite_and_no_images(tmp_path):
    embeddings, labels, _, _ = _data(count=30)
    write_projector(tmp_path, embeddings + 1.0, labels)  # an earlier evaluation, overwritten below
    written = write_projector(tmp_path, embeddings, labels, max_points=10)
    assert written["points"] == 10 and written["sprite_side"] is None
    served = read_projector(tmp_path)["projector"]
    keep = np.linspace(0, 29, 10).round().astype(int)
    np.testing.assert_array_equal(served["tensor"], embeddings[keep])
    assert served["metadata"][1:] == [f"{c}\t{c}" for c in labels[keep]]  # ids where no names are given
    assert served["sprite"] is None and "sprite" not in served["config"]["embeddings"][0]
    assert len(tf.io.gfile.glob(str(tmp_path / "projector" / "embeddings.ckpt-*.index"))) == 1


def test_sprite_fits_the_projectors_size_limit_and_takes_images_of_any_size():
    images = [np.full((32, 20, 3), 255, np.uint8)] * 399 + [np.zeros((9, 9), np.uint8)]
    sprite, side = sprite_image(images, max_side=256)
    assert side == 256 // 20 and sprite.shape == (20 * side, 20 * side, 3)
    assert sprite[:side, :side].min() == 255 and sprite[19 * side :, 19 * side :].max() == 0  # the last, black


def test_bad_inputs_raise_clear_errors(tmp_path):
    embeddings, labels, _, images = _data(count=6)
    with pytest.raises(ValueError, match="NaN or Inf"):
        write_projector(tmp_path, np.full((6, 3), np.nan), labels)
    with pytest.raises(ValueError, match="5 labels for 6 embeddings"):
        write_projector(tmp_path, embeddings, labels[:5])
    with pytest.raises(ValueError, match="4 images for 6 embeddings"):
        write_projector(tmp_path, embeddings, labels, images=images[:4])
    with pytest.raises(ValueError, match="non-empty"):
        write_projector(tmp_path, np.zeros((0, 3)), [])


def test_evaluate_command_writes_the_projector_from_an_npz(tmp_path, capsys):
    embeddings, labels, names, images = _data(count=12, classes=3)
    path = tmp_path / "emb.npz"
    np.savez(path, embeddings=embeddings, labels=labels, class_names=np.array(names), images=images)
    rc = cli.main(["evaluate", "--embeddings", str(path), "--metrics", "recall", "--projector", str(tmp_path / "tb")])
    assert rc == 0, capsys.readouterr().err
    assert "projector: 12 embeddings written" in capsys.readouterr().out
    served = read_projector(tmp_path / "tb")["projector"]
    np.testing.assert_array_equal(served["tensor"], embeddings)
    assert served["metadata"][1:] == [f"class {c}\t{c}" for c in labels]
    assert served["sprite"].shape == (4 * 8, 4 * 8, 3)


def test_evaluate_command_refuses_a_file_as_projector_folder(tmp_path, capsys):
    embeddings, labels, _, _ = _data(count=6, classes=3)
    path, taken = tmp_path / "emb.npz", tmp_path / "taken"
    np.savez(path, embeddings=embeddings, labels=labels)
    taken.write_text("")
    rc = cli.main(["evaluate", "--embeddings", str(path), "--projector", str(taken)])
    assert rc == 2
    assert f"--projector: {taken} is a file, not a folder" in capsys.readouterr().err
