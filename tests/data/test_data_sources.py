"""Image folders, corrupt files, tfds sources (mocked), augmentation and evaluation batches."""

import logging
import os

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

import tfdml.data as data
from tfdml.data import sources
from tfdml.data.preprocessing import eval_image, train_image


def write_folder(root, classes=4, per_class=3, corrupt=0):
    """Class folders of small PNGs (even classes) and JPEGs (odd classes) of varying sizes, solid colour
    `10 * class + 5` (survives JPEG), plus `corrupt` undecodable `.jpg` files in class 0."""
    for c in range(classes):
        folder = root / f"class_{c}"
        folder.mkdir()
        for i in range(per_class):
            image = np.full((10 + i, 12 + 2 * i, 3), 10 * c + 5, np.uint8)
            encoded = tf.io.encode_png(image) if c % 2 == 0 else tf.io.encode_jpeg(image, quality=100)
            (folder / f"{i}.{'png' if c % 2 == 0 else 'jpg'}").write_bytes(encoded.numpy())
    for i in range(corrupt):
        (root / "class_0" / f"zz_broken_{i}.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    (root / "class_0" / "notes.txt").write_text("not an image: named in a warning, not read")


def test_image_folder_labels_follow_sorted_class_folders(tmp_path):
    write_folder(tmp_path)
    source = data.image_folder(str(tmp_path))
    assert source.class_names == ["class_0", "class_1", "class_2", "class_3"]
    assert len(source) == 12 and source.class_counts == {0: 3, 1: 3, 2: 3, 3: 3}
    assert all(isinstance(p, str) for p in source.paths)  # a file list, no pixels held
    ds = data.class_balanced_dataset(source, 2, 3, image_size=8, seed=0)
    for images, labels in ds.take(4):
        assert images.shape == (6, 8, 8, 3)
        expected = 10 * labels.numpy() + 5  # raw pixels: the model preprocesses
        np.testing.assert_allclose(images.numpy().mean(axis=(1, 2, 3)), expected, atol=2)


def test_image_folder_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="is not a directory"):
        data.image_folder(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="has no class sub-folders"):
        data.image_folder(str(tmp_path))
    (tmp_path / "empty_class").mkdir()
    with pytest.raises(ValueError, match="no image files"):
        data.image_folder(str(tmp_path))


def test_files_without_an_image_extension_are_named_not_ignored(tmp_path, caplog):
    """A photo saved without an extension is not read, and the warning says which file and why; hidden files
    (.DS_Store) are no images of anyone's."""
    write_folder(tmp_path, classes=2, per_class=2)
    png = (tmp_path / "class_0" / "0.png").read_bytes()
    (tmp_path / "class_1" / "IMG_0001").write_bytes(png)
    (tmp_path / "class_1" / ".DS_Store").write_bytes(b"")
    with caplog.at_level(logging.WARNING, logger="tfdml.data"):
        source = data.image_folder(str(tmp_path))
    assert len(source) == 4
    assert [r.getMessage() for r in caplog.records] == [
        f"image_folder({tmp_path}): 2 files (class_0/notes.txt, class_1/IMG_0001) not read: their names do not "
        "end in an image extension (.jpg, .jpeg, .png, .bmp, .gif, .webp, .tif, .tiff); an image among them is "
        "read once its name ends in one"
    ]
    (tmp_path / "class_1" / "IMG_0001").rename(tmp_path / "class_1" / "IMG_0001.png")
    assert len(data.image_folder(str(tmp_path))) == 5
    for folder in ("class_0", "class_1"):
        for file in (tmp_path / folder).glob("*.*g"):
            file.rename(file.with_suffix(""))
    with pytest.raises(ValueError, match=r"no image files \(.*\) in its class sub-folders; they hold 6 files \("):
        data.image_folder(str(tmp_path))


def test_varying_image_sizes_need_image_size(tmp_path):
    write_folder(tmp_path)
    with pytest.raises(ValueError, match=r"images have no fixed size .* pass image_size"):
        data.class_balanced_dataset(data.image_folder(str(tmp_path)), 2, 2)
    with pytest.raises(ValueError, match="pass image_size"):
        data.eval_dataset(data.image_folder(str(tmp_path)), 4)


def test_image_folder_checks_each_file_once_and_names_the_skipped(tmp_path, caplog):
    """Empty, truncated and non-image files are left out when the source is made, named with an accurate
    count; TIFF (which TensorFlow cannot decode) and WebP files are read."""
    from PIL import Image

    write_folder(tmp_path, classes=2, per_class=3)
    Image.fromarray(np.full((9, 7, 3), 5, np.uint8)).save(tmp_path / "class_0" / "t.tif")
    Image.fromarray(np.full((9, 7, 3), 15, np.uint8)).save(tmp_path / "class_1" / "w.webp", lossless=True)
    (tmp_path / "class_0" / "empty.jpg").write_bytes(b"")
    jpeg = tf.io.encode_jpeg(np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)).numpy()
    (tmp_path / "class_1" / "cut.jpg").write_bytes(jpeg[: len(jpeg) // 2])
    (tmp_path / "class_1" / "text.png").write_bytes(b"not a png at all")
    with caplog.at_level(logging.WARNING, logger="tfdml.data"):
        source = data.image_folder(str(tmp_path))
    notes, *warnings = [r.getMessage() for r in caplog.records]
    assert "1 file (class_0/notes.txt) not read" in notes  # write_folder's text file, named apart
    assert len(warnings) == 1 and "skipped 3 of 11 images that cannot be decoded" in warnings[0]
    for name in (
        "empty.jpg (empty file)",
        "cut.jpg (",
        "text.png (not an image file: format not recognised)",
        "cut.jpg (corrupt or truncated: ",
    ):
        assert name in warnings[0], name
    assert sorted(os.path.basename(p) for p, _ in source.skipped_files) == ["cut.jpg", "empty.jpg", "text.png"]
    assert len(source) == 8 and source.class_counts == {0: 4, 1: 4}
    assert not any(os.path.basename(p) in ("cut.jpg", "empty.jpg", "text.png") for p in source.paths)
    batches = list(data.eval_dataset(source, batch_size=8, image_size=6, with_index=True))
    images, labels, indices = (t.numpy() for t in batches[0])
    assert source.skipped_count == 0 and len(indices) == 8  # nothing left to fail at training time
    np.testing.assert_allclose(images.mean(axis=(1, 2, 3)), 10 * labels + 5, atol=2)
    assert {os.path.basename(source.paths[i]) for i in indices} >= {"t.tif", "w.webp"}
    for bad, reason in (
        ("class_0/empty.jpg", "empty file"),
        ("class_1/cut.jpg", "corrupt or truncated"),
        ("class_1/missing.png", "file not found"),
    ):
        with pytest.raises(sources.ImageReadError, match=f"{tmp_path / bad}: {reason}"):
            sources.decode_image_file(tmp_path / bad)
    np.testing.assert_array_equal(
        sources.decode_image_file(tmp_path / "class_0" / "t.tif", channels=1), np.full((9, 7, 1), 5, np.uint8)
    )
    for path in (tmp_path / "class_0").iterdir():
        path.unlink()
    (tmp_path / "class_0" / "empty.png").write_bytes(b"")
    with pytest.raises(ValueError, match=r"none of its 1 image files can be decoded: .*empty.png \(empty file\)"):
        data.image_folder(str(tmp_path / "class_0" / ".."), class_names=["class_0"])


def test_corrupt_jpeg_is_skipped_counted_and_replaced(tmp_path, caplog):
    """Files that fail while training (here: not checked up front) are skipped, named and replaced."""
    write_folder(tmp_path, classes=2, per_class=3, corrupt=1)
    source = data.image_folder(str(tmp_path), validate=False)
    broken = [i for i, p in enumerate(source.paths) if "broken" in p]
    assert len(broken) == 1 and source.class_counts == {0: 4, 1: 3}
    with caplog.at_level(logging.WARNING, logger="tfdml.data"):
        batches = list(data.class_balanced_dataset(source, 2, 4, image_size=8, seed=0, epochs=3))
    assert len(batches) == 3  # no crashed epoch
    for images, labels in batches:
        labels = labels.numpy()
        assert sorted(np.unique(labels, return_counts=True)[1]) == [4, 4]
        expected = 10 * labels + 5  # the corrupt file was replaced by a class-0 image
        np.testing.assert_allclose(images.numpy().mean(axis=(1, 2, 3)), expected, atol=2)
    # K = 4 takes every class-0 file each time: the broken one is met once in each of the 3 batches.
    assert source.skipped_count == 3
    assert source.corrupt_items == broken
    messages = [r.getMessage() for r in caplog.records]
    assert sum("zz_broken_0.jpg" in m for m in messages) == 1  # each corrupt file named once

    evaluated = list(data.eval_dataset(source, batch_size=4, image_size=8, with_index=True))
    indices = np.concatenate([i.numpy() for _, _, i in evaluated])
    labels = np.concatenate([y.numpy() for _, y, _ in evaluated])
    np.testing.assert_array_equal(indices, [i for i in range(len(source)) if i not in broken])
    np.testing.assert_array_equal(labels, source.labels[indices])
    assert source.skipped_count == 4


def test_batch_with_a_class_of_only_corrupt_files_is_dropped(tmp_path, caplog):
    write_folder(tmp_path, classes=3, per_class=2)
    for path in (tmp_path / "class_0").iterdir():
        path.write_bytes(b"garbage")  # class 0: nothing decodes
    source = data.image_folder(str(tmp_path), validate=False)
    with caplog.at_level(logging.WARNING, logger="tfdml.data"):
        batches = list(data.class_balanced_dataset(source, 2, 2, image_size=8, seed=0, epochs=4))
    # 4 epochs x 2 batches; exactly the batches holding class 0 are dropped, the rest stay exact.
    assert 0 < len(batches) < 8
    for _, labels in batches:
        assert sorted(labels.numpy().tolist()) == [1, 1, 2, 2]
    dropped = [r for r in caplog.records if "dropped a batch" in r.getMessage()]
    assert len(dropped) == 8 - len(batches)
    assert source.corrupt_items == [0, 1]


def test_eval_dataset_counts_a_corrupt_last_item(tmp_path):
    write_folder(tmp_path, classes=1, per_class=2, corrupt=1)  # the broken file sorts last
    source = data.image_folder(str(tmp_path), validate=False)
    assert "broken" in source.paths[-1]
    batches = list(data.eval_dataset(source, batch_size=8, image_size=8))
    assert sum(int(x.shape[0]) for x, _ in batches) == 2
    assert source.corrupt_items == [2]


def test_eval_dataset_order_batches_and_determinism():
    source = data.digits("test")
    ds = data.eval_dataset(source, batch_size=300, image_size=12)
    first = [(x.numpy(), y.numpy()) for x, y in ds]
    assert [x.shape[0] for x, _ in first] == [300, 300, 296]
    np.testing.assert_array_equal(np.concatenate([y for _, y in first]), source.labels)
    second = [x.numpy() for x, _ in ds]
    for (x1, _), x2 in zip(first, second):
        np.testing.assert_array_equal(x1, x2)
    native = next(iter(data.eval_dataset(source, batch_size=5)))[0].numpy()
    assert native.shape == (5, 8, 8, 1)
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        data.eval_dataset(source, batch_size=0)


def test_eval_centre_crop_matches_numpy_reference():
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (40, 30, 3)).astype(np.uint8)
    out = eval_image(tf.constant(image), image_size=16, resize=20).numpy()
    resized = tf.image.resize(tf.cast(image, tf.float32), (20, 20)).numpy()
    np.testing.assert_allclose(out, resized[2:18, 2:18], rtol=1e-6)  # values left alone
    plain = eval_image(tf.constant(image), image_size=16, center_crop=False).numpy()
    np.testing.assert_allclose(plain, tf.image.resize(tf.cast(image, tf.float32), (16, 16)).numpy())


def test_train_augmentation_shapes_ranges_and_seeds():
    rng = np.random.default_rng(1)
    image = tf.constant(rng.integers(0, 256, (48, 64, 3)).astype(np.uint8))
    seed = tf.constant([3, 4], tf.int64)
    out = train_image(image, seed, image_size=24, augment=data.Augment()).numpy()
    assert out.shape == (24, 24, 3) and out.dtype == np.float32
    assert 0.0 <= out.min() and out.max() <= 255.0 and out.max() > 128.0  # raw pixels
    np.testing.assert_array_equal(out, train_image(image, seed, 24, data.Augment()).numpy())
    outputs = [train_image(image, tf.constant([s, 0], tf.int64), 24, data.Augment()).numpy() for s in range(6)]
    assert len({o.tobytes() for o in outputs}) > 1  # crops and flips vary with the seed
    # Without the random crop the only randomness left is the flip: centre crop or its mirror.
    flips = data.Augment(random_crop=False, resize=28)
    centre = tf.image.resize(tf.cast(image, tf.float32), (28, 28)).numpy()[2:26, 2:26]
    for s in range(6):
        out = train_image(image, tf.constant([s, 1], tf.int64), 24, flips).numpy()
        assert np.allclose(out, centre) or np.allclose(out, centre[:, ::-1])
    scaled = train_image(image, seed, 24, data.Augment(), preprocess=lambda x: x / 127.5 - 1.0).numpy()
    assert -1.0 <= scaled.min() < 0.0 < scaled.max() <= 1.0
    with pytest.raises(ValueError, match="Augment.scale"):
        data.Augment(scale=(0.0, 1.0))
    with pytest.raises(ValueError, match="resize=20 is smaller than the crop image_size"):
        eval_image(image, image_size=24, resize=20)
    with pytest.raises(ValueError, match="image_size must be a positive int"):
        train_image(image, seed, image_size=(0, 4))


@pytest.mark.parametrize(
    "name, split, low, high",
    [
        ("caltech_birds2011", "train", 0, 100),
        ("caltech_birds2011", "test", 100, 200),
        ("cars196", "train", 0, 98),
        ("cars196", "test", 98, 196),
    ],
)
def test_tfds_class_resplit(name, split, low, high):
    with tfds.testing.mock_data(num_examples=60):
        everything = tfds.data_source(name, split="train+test", decoders=tfds.decode.PartialDecoding({"label": True}))
        all_labels = np.array([int(everything[i]["label"]) for i in range(len(everything))])
        source = data.tfds_source(name, split)
        expected = all_labels[(all_labels >= low) & (all_labels < high)]
        np.testing.assert_array_equal(source.labels, expected)
        assert source.labels.min() >= low and source.labels.max() < high
        assert len(source) > 0
        if split == "train":  # the images load through the random-access reader
            c = min(3, len(source.classes))
            images, labels = next(iter(data.class_balanced_dataset(source, c, 2, image_size=16, seed=0)))
            assert images.shape == (2 * c, 16, 16, 3)
            assert set(labels.numpy()) <= set(expected)


def test_tfds_stanford_online_products_uses_class_id():
    with tfds.testing.mock_data(num_examples=30):
        reference = tfds.data_source(
            "stanford_online_products", split="test", decoders=tfds.decode.PartialDecoding({"class_id": True})
        )
        expected = [int(reference[i]["class_id"]) for i in range(len(reference))]
        source = data.tfds_source("stanford_online_products", "test")
        np.testing.assert_array_equal(source.labels, expected)
        assert source.num_classes == 22634
        images, labels = next(iter(data.eval_dataset(source, batch_size=7, image_size=10)))
        assert images.shape == (7, 10, 10, 3)
        np.testing.assert_array_equal(labels.numpy(), expected[:7])


def test_tfds_errors():
    with tfds.testing.mock_data(num_examples=5):
        with pytest.raises(ValueError, match=r"split must be 'train' \(first 100 classes\)"):
            data.tfds_source("caltech_birds2011", "validation")
    with pytest.raises(RuntimeError, match="cannot open 'cars196'.*manual_dir"):
        data.tfds_source("cars196", "train", data_dir=os.devnull + "_missing", download=False)


def test_class_halves_keep_names_and_files_and_name_what_is_left_out(tmp_path, caplog):
    write_folder(tmp_path, classes=5, per_class=2)
    (tmp_path / "class_5").mkdir()  # no image files
    (tmp_path / "class_6").mkdir()
    (tmp_path / "class_6" / "0.png").write_bytes(b"")  # none decodable
    with caplog.at_level(logging.WARNING, logger="tfdml.data"):
        source = data.image_folder(str(tmp_path))
    left_out = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert len(left_out) == 1
    assert "2 of 7 class folders have no readable image" in left_out[0]
    assert "class_5 (no image files), class_6 (1 file, none decodable)" in left_out[0]
    first, second = sources.class_halves(source)
    # the 5 classes with images, by sorted folder name: 2 train, 3 evaluate
    assert [source.class_name(c) for c in first.classes] == ["class_0", "class_1"]
    assert [source.class_name(c) for c in second.classes] == ["class_2", "class_3", "class_4"]
    assert second.class_names == source.class_names and second.name.endswith("second half of the classes")
    assert [os.path.basename(os.path.dirname(p)) for p in second.paths] == ["class_2"] * 2 + ["class_3"] * 2 + [
        "class_4"
    ] * 2
    assert sources.single_image_classes(second) == []
    one = second.subset([0, 2, 3])
    assert sources.single_image_classes(one) == [2] and one.name_classes([2]) == "class_2"
    with pytest.raises(ValueError, match="has 1 class\\(es\\) with images; the split .* needs at least 2"):
        sources.class_halves(first.subset([0]))


def test_job_evaluation_source_is_the_second_half_without_an_evaluation_folder(tmp_path):
    write_folder(tmp_path, classes=4, per_class=2)
    job = {"data": {"source": "folder", "path": str(tmp_path), "eval_path": None}}
    evaluation = sources.job_evaluation_source(job)
    assert [evaluation.class_name(c) for c in evaluation.classes] == ["class_2", "class_3"]
    assert len(evaluation) == 4 and evaluation.name.endswith("second half of the classes")


def test_small_classes_are_named_by_folder(tmp_path, caplog):
    write_folder(tmp_path, classes=3, per_class=2)
    (tmp_path / "class_1" / "1.jpg").unlink()
    with caplog.at_level(logging.WARNING, logger="tfdml.data"):
        data.class_balanced_dataset(data.image_folder(str(tmp_path)), 2, 2, image_size=8, seed=0)
    assert any(
        "1 class has fewer than samples_per_class=2 images and is sampled with replacement "
        "(images per class in brackets): class_1 (1)" in r.getMessage()
        for r in caplog.records
    )
