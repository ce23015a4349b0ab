"""Fashion-MNIST for the label-noise benchmark (`label_noise.py --data fashion_mnist`): a second data set beside
the glyphs, read from the system's IDX files with `tfdml.data.idx`.

Half the classes are held out as unseen: training on `TRAIN_CLASSES` (`images_per_class` of each, drawn once
with a fixed seed from the 6,000 training images; renumbered 0-4), retrieval on the 5,000 test images of
`TEST_CLASSES`. Batches of 3 of the 5 training classes x 12 images, so that DML-ALA's
validation subset (one class, `tfdml.ala_options.episode_sizes`) has classes outside the batch to come from.
"""

import json
import os

import numpy as np

FASHION_DIR = "/usr/share/datasets/fashion-mnist"
# The nested-embeddings benchmark's halves: T-shirt, trouser, pullover, dress, coat to train; sandal, shirt,
# sneaker, bag, ankle boot unseen.
TRAIN_CLASSES, TEST_CLASSES = (0, 1, 2, 3, 4), (5, 6, 7, 8, 9)
# The protocol: the glyph benchmark's CNN, embedding and step count, at Fashion-MNIST's image size and classes.
CONFIG = {
    "image_size": 28,
    "images_per_class": 2000,
    "classes_per_batch": 3,
    "samples_per_class": 12,
    "steps": 300,
    "widths": [16, 32, 64, 128],
    "embedding_dim": 64,
    "learning_rate": 2e-3,
}
SUBSET_SEED = 2024  # which training images of each class the protocol keeps
CAPTION = (
    "Fashion-MNIST, training classes 0-4 ({images} images each), retrieval on the 5,000 test images of the "
    "unseen classes 5-9, symmetric label noise on the training labels; small CNN, {steps} steps of 3 x 12 "
    "batches, the contrastive loss at its tuned glyph setting (reality check, scratch). "
)
SEEN_CAPTION = (
    "The same runs scored on the 5,000 test images of the training classes 0-4 (new images of the classes "
    "trained on; {steps} steps). "
)
# The validation split's wording in the table (the glyphs': 100 of the training characters to train, 50 to score).
VALIDATION_WORDS = "3 of the training classes to train, the other 2 to score"


def read(part):
    """`(images float32 [n, 28, 28, 1] in [0, 1], labels int64 [n])` of `part` ("train" or "t10k")."""
    from tfdml.data.idx import read_idx

    images = read_idx(os.path.join(FASHION_DIR, f"{part}-images-idx3-ubyte.gz"))
    labels = read_idx(os.path.join(FASHION_DIR, f"{part}-labels-idx1-ubyte.gz")).astype(np.int64)
    return images[..., None].astype(np.float32) / 255.0, labels


def load_data(config):
    """`{train_x, train_y, test_x, test_y, num_classes, seen_x, seen_y}` of the protocol `config`."""
    train_x, train_y = read("train")
    test_x, test_y = read("t10k")
    rng = np.random.default_rng(SUBSET_SEED)
    kept = np.sort(
        np.concatenate(
            [rng.choice(np.flatnonzero(train_y == c), config["images_per_class"], replace=False) for c in TRAIN_CLASSES]
        )
    )
    unseen, seen = np.isin(test_y, TEST_CLASSES), np.isin(test_y, TRAIN_CLASSES)
    return {
        "seen_x": test_x[seen],  # the test images of the training classes, scored apart
        "seen_y": test_y[seen],
        "train_x": train_x[kept],
        "train_y": np.searchsorted(TRAIN_CLASSES, train_y[kept]).astype(np.int64),
        "test_x": test_x[unseen],
        "test_y": test_y[unseen],
        "num_classes": len(TRAIN_CLASSES),
    }


REFERENCES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results_fashion_reference.jsonl")


def references(seeds=(0, 1, 2, 3, 4), path=REFERENCES):
    """What the trained rows are measured against, on both test sets (`unseen`: classes 5-9, `seen`: the test
    images of 0-4): the raw pixels (flattened) and the small CNN at its initial weights of each seed, untrained.
    One JSON line each, written to `path`."""
    from benchmarks.glyph_methods import benchmark_methods as bm

    data = load_data(CONFIG)
    lines = []
    for part, (images, labels) in {"unseen": ("test_x", "test_y"), "seen": ("seen_x", "seen_y")}.items():
        images, labels = data[images], data[labels]
        lines.append({"test": part, "embedding": "raw pixels", **bm.evaluate(images.reshape(len(images), -1), labels)})
        for seed in seeds:
            embedder = bm.tfdml_embedder(CONFIG, seed=seed)
            lines.append(
                {
                    "test": part,
                    "embedding": "untrained CNN",
                    "seed": seed,
                    **bm.evaluate(bm.embed(embedder, images), labels),
                }
            )
    with open(path, "w") as f:
        f.writelines(json.dumps(line) + "\n" for line in lines)
    return lines


if __name__ == "__main__":  # python -m benchmarks.label_noise.fashion: the references
    for line in references():
        print(line)
