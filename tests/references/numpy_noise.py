"""Loop-based NumPy readings of the label-noise selections of `tfdml.losses.noise` (never imports tfdml).

- The small-loss heuristic: of the unordered positive pairs of a batch, the `round(rate * P)` with the
  largest Euclidean distance (halves up).
- DML-ALA's verified cut: the positive pairs farther apart than the nearest-rank quantile of another batch's
  positive-pair distances.
- PRISM (Liu et al., CVPR 2021), read from the paper's official code (`losses/PRISM.py`): per sample the
  softmax over the memory's class centres of `f . c_k`, the centre of a class the mean of its stored
  embeddings; the sliding window of the `floor(rate * B)`-th lowest score and the keep rule.
"""

import math

import numpy as np


def farthest_positive_pairs(labels, embeddings, drop_rate):
    """Set of `(i, j)`, `i < j`, of the dropped positive pairs."""
    pairs = []
    for i in range(len(labels)):
        for j in range(i + 1, len(labels)):
            if labels[i] == labels[j]:
                pairs.append((float(np.linalg.norm(np.subtract(embeddings[i], embeddings[j]))), i, j))
    count = math.floor(drop_rate * len(pairs) + 0.5)
    pairs.sort(key=lambda p: -p[0])
    return {(i, j) for _, i, j in pairs[:count]}


def positive_pair_distances(labels, embeddings):
    """The Euclidean distances of the unordered positive pairs, ascending."""
    distances = []
    for i in range(len(labels)):
        for j in range(i + 1, len(labels)):
            if labels[i] == labels[j]:
                distances.append(float(np.linalg.norm(np.subtract(embeddings[i], embeddings[j]))))
    return sorted(distances)


def distance_cut_threshold(labels, embeddings, quantile):
    """The `ceil(quantile * P)`-th smallest of the `P` positive-pair distances; inf without a positive pair."""
    distances = positive_pair_distances(labels, embeddings)
    return distances[math.ceil(quantile * len(distances)) - 1] if distances else math.inf


def pairs_beyond(labels, embeddings, threshold):
    """bool `[B, B]`, symmetric: the positive pairs (`i != j`) farther apart than `threshold`."""
    size = len(labels)
    beyond = np.zeros((size, size), bool)
    for i in range(size):
        for j in range(size):
            distance = float(np.linalg.norm(np.subtract(embeddings[i], embeddings[j])))
            beyond[i, j] = i != j and labels[i] == labels[j] and distance > threshold
    return beyond


def clean_probability(labels, embeddings, memory_labels, memory_embeddings):
    """PRISM's `p_i` of each sample: 1 for a class with nothing in memory."""
    classes = sorted(set(int(c) for c in memory_labels))
    centres = {c: np.mean([e for e, m in zip(memory_embeddings, memory_labels) if m == c], axis=0) for c in classes}
    out = []
    for label, f in zip(labels, embeddings):
        if int(label) not in centres:
            out.append(1.0)
            continue
        exps = {c: math.exp(float(np.dot(f, centres[c]))) for c in classes}
        out.append(exps[int(label)] / sum(exps.values()))
    return np.array(out)


class Prism:
    """PRISM's stateful selection (memory of kept samples, window of thresholds), one batch per `select`."""

    def __init__(self, noise_rate, window_size, memory_size=None):
        self.noise_rate, self.window_size, self.memory_size = noise_rate, window_size, memory_size
        self.window = []
        self.memory_labels, self.memory_embeddings = [], []
        self.enqueued = 0

    def select(self, labels, embeddings):
        """Bool keep mask of the batch; the kept samples then join the memory, a queue of the last
        `memory_size` (None: unbounded); `enqueued` counts every sample that ever joined it."""
        n = len(labels)
        if not self.memory_labels:
            keep = np.ones(n, bool)
        else:
            scores = clean_probability(labels, embeddings, self.memory_labels, self.memory_embeddings)
            order = sorted(range(n), key=lambda i: scores[i])  # stable
            to_remove = order[: int(self.noise_rate * n)]
            if to_remove:
                q = scores[to_remove[-1]]
                if not math.isnan(q) and q != 1.0:
                    self.window = (self.window + [q])[-self.window_size :]
            fallback = np.ones(n, bool)
            fallback[to_remove] = False
            if self.window:
                keep = scores > sum(self.window) / len(self.window)
                if not keep.any():
                    keep = fallback
                    self.window = self.window[-1:]
            else:
                keep = fallback
        for i in np.flatnonzero(keep):
            self.memory_labels.append(int(labels[i]))
            self.memory_embeddings.append(np.asarray(embeddings[i], np.float64))
            self.enqueued += 1
        if self.memory_size is not None:
            self.memory_labels = self.memory_labels[-self.memory_size :]
            self.memory_embeddings = self.memory_embeddings[-self.memory_size :]
        return keep


def _mean(values):
    return sum(values) / len(values) if values else 0.0


def contrastive_without(labels, embeddings, dropped, pos_margin=0.0, neg_margin=1.0):
    """The contrastive loss (means over the non-zero hinges of positive and of negative pairs) with the positive
    pairs in `dropped` (`(i, j)`, `i < j`) left out of both sums and counts."""
    pos, neg = [], []
    for i in range(len(labels)):
        for j in range(len(labels)):
            if i == j or (min(i, j), max(i, j)) in dropped:
                continue
            d = float(np.linalg.norm(np.subtract(embeddings[i], embeddings[j])))
            v = max(d - pos_margin, 0.0) if labels[i] == labels[j] else max(neg_margin - d, 0.0)
            if v > 0:
                (pos if labels[i] == labels[j] else neg).append(v)
    return _mean(pos) + _mean(neg)


def triplet_all_without(labels, embeddings, dropped, margin=0.2):
    """Mean of the non-zero `[d_ap - d_an + margin]+` over the triplets whose anchor-positive pair is not in
    `dropped`."""
    values = []
    n = len(labels)
    for a in range(n):
        for p in range(n):
            if p == a or labels[p] != labels[a] or (min(a, p), max(a, p)) in dropped:
                continue
            for q in range(n):
                if labels[q] == labels[a]:
                    continue
                d_ap = float(np.linalg.norm(np.subtract(embeddings[a], embeddings[p])))
                d_an = float(np.linalg.norm(np.subtract(embeddings[a], embeddings[q])))
                v = max(d_ap - d_an + margin, 0.0)
                if v > 0:
                    values.append(v)
    return _mean(values)
