"""Fashion-MNIST for the label-noise benchmark (`label_noise.py --data fashion_mnist`): a second data set beside
the glyphs, read as the nested-embeddings benchmark reads it (the system's IDX files, `tfdml.data.idx`).

Training classes 0-4 (T-shirt, trouser, pullover, dress, coat), `images_per_class` of each drawn once with a
fixed seed from the 6,000 training images; retrieval on the 5,000 test images of the unseen classes 5-9
(sandal, shirt, sneaker, bag, ankle boot). Batches of 3 of the 5 training classes x 22 images (66, the glyph
batch's size), so that DML-ALA's validation subset (one class, `tfdml.ala_options.episode_sizes`) has classes
outside the batch to come from.
"""

import numpy as np

# The protocol: the glyph benchmark's CNN, embedding and step count, at Fashion-MNIST's image size and classes.
CONFIG = {
    "image_size": 28,
    "images_per_class": 2000,
    "classes_per_batch": 3,
    "samples_per_class": 22,
    "steps": 300,
    "widths": [16, 32, 64, 128],
    "embedding_dim": 64,
    "learning_rate": 2e-3,
}
SUBSET_SEED = 2024  # which training images of each class the protocol keeps
CAPTION = (
    "Fashion-MNIST, training classes 0-4 ({images} images each), retrieval on the 5,000 test images of the "
    "unseen classes 5-9, symmetric label noise on the training labels; small CNN, {steps} steps of 3 x 22 "
    "batches, the contrastive loss at its tuned glyph setting (reality check, scratch). "
)
# The validation split's wording in the table (the glyphs': 100 of the training characters to train, 50 to score).
VALIDATION_WORDS = "3 of the training classes to train, the other 2 to score"


def load_data(config):
    """`{train_x, train_y, test_x, test_y, num_classes}` of the protocol `config` (float32 images in [0, 1])."""
    from benchmarks.nested.bench_nested import load

    data = load("fashion_mnist")
    rng = np.random.default_rng(SUBSET_SEED)
    kept = np.sort(
        np.concatenate(
            [
                rng.choice(np.flatnonzero(data["train_y"] == c), config["images_per_class"], replace=False)
                for c in np.unique(data["train_y"])
            ]
        )
    )
    train_y = data["train_y"][kept]
    return {
        "train_x": data["train_x"][kept],
        "train_y": train_y,
        "test_x": data["test_x"],
        "test_y": data["test_y"],
        "num_classes": int(train_y.max()) + 1,
    }
