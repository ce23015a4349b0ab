"""NumPy references of tensorflow-addons' triplet losses, ported from tfa's own test suite
(tensorflow/addons, tensorflow_addons/losses/tests/triplet_test.py: `triplet_semihard_loss_np`,
`triplet_hard_loss_np` and its distance functions), loop by loop. Never imports tfdml."""

import numpy as np


def l2_distances(embeddings):
    f = np.asarray(embeddings, np.float64)
    return np.sqrt(np.maximum(((f[:, None, :] - f[None, :, :]) ** 2).sum(-1), 0.0))


def squared_l2_distances(embeddings):
    return l2_distances(embeddings) ** 2


def angular_distances(embeddings):
    f = np.asarray(embeddings, np.float64)
    unit = f / np.linalg.norm(f, axis=1, keepdims=True)
    return 1.0 - unit @ unit.T


DISTANCES = {"L2": l2_distances, "squared-L2": squared_l2_distances, "angular": angular_distances}


def semihard(labels, embeddings, margin, distances):
    """Per ordered positive pair: the first negative (ascending) farther than the positive, else the
    farthest negative; mean over all positive pairs of [margin + d_ap - d_an]+."""
    d = distances(embeddings)
    total, pairs = 0.0, 0
    for a in range(len(labels)):
        negatives = sorted(d[a, k] for k in range(len(labels)) if labels[k] != labels[a])
        for p in range(len(labels)):
            if p == a or labels[p] != labels[a]:
                continue
            pairs += 1
            chosen = next((v for v in negatives if v > d[a, p]), negatives[-1])
            total += max(0.0, margin + d[a, p] - chosen)
    return total / pairs


def hard(labels, embeddings, margin, distances, soft=False):
    """Mean over anchors of [max positive - min negative + margin]+ (soft: log1p(exp(.))); no positive: 0."""
    d = distances(embeddings)
    total = 0.0
    for a in range(len(labels)):
        positives = [d[a, j] for j in range(len(labels)) if j != a and labels[j] == labels[a]] or [0.0]
        nearest_negative = min(d[a, j] for j in range(len(labels)) if labels[j] != labels[a])
        gap = max(positives) - nearest_negative
        total += np.log1p(np.exp(gap)) if soft else max(0.0, gap + margin)
    return total / len(labels)
