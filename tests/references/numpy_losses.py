"""Loop-based NumPy references for the losses in `tfdml.losses`, written from the formulas in SPEC.md.

Deliberately naive (explicit loops over queries, pairs and triplets) and independent of tfdml, so that
the vectorised TensorFlow code is checked against a different derivation. Inputs: `labels` `[B]` ints,
embeddings `[B, D]` floats; everything is computed in float64.
"""

import math

import numpy as np


def distance(a, b, squared=False, metric="euclidean"):
    """`metric`: "euclidean" (squared if `squared`), "squared_euclidean" or "cosine" (1 - cos; 1 for a zero row)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if metric == "cosine":
        norms = math.sqrt(float(a @ a)) * math.sqrt(float(b @ b))
        return 1.0 - (float(a @ b) / norms if norms > 0 else 0.0)
    sq = float(np.sum((a - b) ** 2))
    return sq if squared or metric == "squared_euclidean" else math.sqrt(sq)


def distance_matrix(queries, gallery=None, squared=False, metric="euclidean"):
    gallery = queries if gallery is None else gallery
    return np.array([[distance(q, g, squared, metric) for g in gallery] for q in queries])


# ----------------------------------------------------------------------------------------- Ranked List Loss


def ranked_list_loss(
    labels,
    embeddings,
    margin=0.4,
    alpha=None,
    tn=10.0,
    tp=0.0,
    lam=0.5,
    gallery=None,
    weights_from=None,
    metric="euclidean",
):
    """RLL, mean over all queries.

    `gallery`: embeddings of the other side of each pair (default: `embeddings`), to hold it fixed in
    finite differences. `weights_from`: embeddings that define the mined sets and weights (default: the
    same as the loss terms); holding it fixed reproduces the official code's constant weights.
    """
    labels = list(labels)
    alpha = 1.0 + margin / 2.0 if alpha is None else alpha
    gallery = embeddings if gallery is None else gallery
    weights_from = embeddings if weights_from is None else weights_from
    boundary = alpha - margin
    total = 0.0
    for i in range(len(labels)):
        pos_terms, pos_logits, neg_terms, neg_logits = [], [], [], []
        for j in range(len(labels)):
            if j == i:
                continue
            d = distance(embeddings[i], gallery[j], metric=metric)
            d_w = distance(weights_from[i], weights_from[j], metric=metric)
            if labels[j] == labels[i] and d_w > boundary:
                pos_terms.append(d - boundary)
                pos_logits.append(tp * (d_w - boundary))
            elif labels[j] != labels[i] and d_w < alpha:
                neg_terms.append(alpha - d)
                neg_logits.append(tn * (alpha - d_w))
        loss_p = _weighted_sum(pos_terms, pos_logits)
        loss_n = _weighted_sum(neg_terms, neg_logits)
        total += (1.0 - lam) * loss_p + lam * loss_n
    return total / len(labels)


def _weighted_sum(terms, logits):
    if not terms:
        return 0.0
    top = max(logits)
    weights = [math.exp(v - top) for v in logits]
    norm = sum(weights)
    return sum(w / norm * t for w, t in zip(weights, terms))


def linear_temperature(t1, t2, max_steps, step):
    step = min(max(step, 0), max_steps)
    return t1 - step * (t1 - t2) / max_steps


# ----------------------------------------------------------------------------------------- triplets


def _softplus(x):
    return max(x, 0.0) + math.log1p(math.exp(-abs(x)))


def _triplets(labels):
    n = len(labels)
    for a in range(n):
        for p in range(n):
            if p == a or labels[p] != labels[a]:
                continue
            for q in range(n):
                if labels[q] != labels[a]:
                    yield a, p, q


def triplet_all(labels, embeddings, margin=0.2, soft=False, squared=False, metric="euclidean"):
    """Mean over the triplets with a positive loss (every triplet when soft); 0 if none."""
    d = distance_matrix(embeddings, squared=squared, metric=metric)
    values = []
    for a, p, n in _triplets(list(labels)):
        v = _softplus(d[a, p] - d[a, n]) if soft else max(margin + d[a, p] - d[a, n], 0.0)
        if v > 0:
            values.append(v)
    return sum(values) / len(values) if values else 0.0


def triplet_semi_hard(labels, embeddings, margin=0.2, soft=False, squared=False, metric="euclidean"):
    """FaceNet semi-hard: the triplets with d_ap < d_an < d_ap + margin, mean over them; 0 if none."""
    d = distance_matrix(embeddings, squared=squared, metric=metric)
    values = []
    for a, p, n in _triplets(list(labels)):
        if d[a, p] < d[a, n] < d[a, p] + margin:
            values.append(_softplus(d[a, p] - d[a, n]) if soft else margin + d[a, p] - d[a, n])
    return sum(values) / len(values) if values else 0.0


def triplet_batch_hard(labels, embeddings, margin=0.2, soft=False, squared=False, metric="euclidean"):
    """Per anchor farthest positive and nearest negative; mean over anchors having both; 0 if none."""
    labels = list(labels)
    d = distance_matrix(embeddings, squared=squared, metric=metric)
    values = []
    for a in range(len(labels)):
        pos = [d[a, j] for j in range(len(labels)) if j != a and labels[j] == labels[a]]
        neg = [d[a, j] for j in range(len(labels)) if labels[j] != labels[a]]
        if pos and neg:
            gap = max(pos) - min(neg)
            values.append(_softplus(gap) if soft else max(gap + margin, 0.0))
    return sum(values) / len(values) if values else 0.0


def tfa_triplet_semihard(labels, embeddings, margin=1.0):
    """tensorflow-addons semantics: per positive pair the nearest negative farther than the positive, else
    the farthest negative (0 when the anchor has none); mean over all positive pairs; 0 without pairs."""
    labels = list(labels)
    d = distance_matrix(embeddings)
    values = []
    for a in range(len(labels)):
        negs = [d[a, j] for j in range(len(labels)) if labels[j] != labels[a]]
        for p in range(len(labels)):
            if p == a or labels[p] != labels[a]:
                continue
            farther = [v for v in negs if v > d[a, p]]
            if farther:
                d_an = min(farther)
            else:
                d_an = max(negs) if negs else 0.0
            values.append(max(margin + d[a, p] - d_an, 0.0))
    return sum(values) / len(values) if values else 0.0


def tfa_triplet_hard(labels, embeddings, margin=1.0, soft=False):
    """tensorflow-addons semantics: mean over all anchors; no positive -> hardest positive 0; no negative ->
    hardest negative = the anchor's largest distance; 0 for a batch without positive pairs."""
    labels = list(labels)
    n = len(labels)
    d = distance_matrix(embeddings)
    if not any(labels[i] == labels[j] for i in range(n) for j in range(n) if i != j):
        return 0.0
    values = []
    for a in range(n):
        pos = [d[a, j] for j in range(n) if j != a and labels[j] == labels[a]]
        neg = [d[a, j] for j in range(n) if labels[j] != labels[a]]
        hardest_pos = max(pos) if pos else 0.0
        hardest_neg = min(neg) if neg else max(d[a])
        gap = hardest_pos - hardest_neg
        values.append(_softplus(gap) if soft else max(gap + margin, 0.0))
    return sum(values) / n


# ----------------------------------------------------------------------------------------- lifted structure


def lifted_structure(labels, embeddings, neg_margin=1.0, pos_margin=0.0, metric="euclidean"):
    """Oh Song et al.: per positive pair J_ij = log(sum over i's and j's negatives of exp(neg_margin - D))
    + D_ij - pos_margin; mean over ordered positive pairs of [J_ij]+^2 / 2, D on the L2-normalised rows; 0
    without a positive or a negative pair."""
    labels = list(labels)
    x = np.asarray(embeddings, np.float64)
    x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-6)
    d = distance_matrix(x, metric=metric)
    n = len(labels)
    pairs = [(i, j) for i in range(n) for j in range(n) if i != j and labels[i] == labels[j]]
    if not pairs or all(labels[i] == labels[j] for i in range(n) for j in range(n)):
        return 0.0
    values = []
    for i, j in pairs:
        negatives = [math.exp(neg_margin - d[a, k]) for a in (i, j) for k in range(n) if labels[k] != labels[a]]
        values.append(max(math.log(sum(negatives)) + d[i, j] - pos_margin, 0.0) ** 2 / 2.0)
    return sum(values) / len(values)


# ----------------------------------------------------------------------------------------- contrastive


def contrastive(labels, embeddings, pos_margin=0.0, neg_margin=1.0, metric="euclidean"):
    """Mean of the non-zero [d - pos_margin]+ over positive pairs + mean of the non-zero
    [neg_margin - d]+ over negative pairs (pytorch-metric-learning's AvgNonZeroReducer)."""
    labels = list(labels)
    pos_values, neg_values = [], []
    for i in range(len(labels)):
        for j in range(len(labels)):
            if i == j:
                continue
            d = distance(embeddings[i], embeddings[j], metric=metric)
            if labels[i] == labels[j]:
                v = max(d - pos_margin, 0.0)
                if v > 0:
                    pos_values.append(v)
            else:
                v = max(neg_margin - d, 0.0)
                if v > 0:
                    neg_values.append(v)
    mean = lambda vs: sum(vs) / len(vs) if vs else 0.0  # noqa: E731
    return mean(pos_values) + mean(neg_values)


# ----------------------------------------------------------------------------------------- ProxyNCA


def proxy_nca(labels, embeddings, proxies, softmax_scale=1.0, metric="squared_euclidean"):
    """Mean over samples of -log softmax_c(-softmax_scale d(x_i, p_c))[y_i], x and p L2-normalised (the
    paper's NCA over proxies, PML's `ProxyNCALoss` for the squared Euclidean distance)."""
    unit = lambda m: m / np.linalg.norm(m, axis=1, keepdims=True)  # noqa: E731
    x, p = unit(np.asarray(embeddings, np.float64)), unit(np.asarray(proxies, np.float64))
    losses = []
    for i, label in enumerate(labels):
        logits = [-softmax_scale * distance(x[i], p[c], metric=metric) for c in range(len(p))]
        top = max(logits)
        losses.append(top + math.log(sum(math.exp(v - top) for v in logits)) - logits[label])
    return sum(losses) / len(losses)


# ----------------------------------------------------------------------------------------- gradients


def numerical_gradient(fn, x, step=1e-6):
    """Central finite differences of a scalar function of an array."""
    x = np.array(x, np.float64)
    grad = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        plus, minus = x.copy(), x.copy()
        plus[idx] += step
        minus[idx] -= step
        grad[idx] = (fn(plus) - fn(minus)) / (2 * step)
    return grad
