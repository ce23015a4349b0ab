"""Loop-based NumPy references for the margin loss and the Group Loss, written from SPEC.md (no tfdml)."""

import numpy as np


def distances(embeddings):
    f = np.asarray(embeddings, dtype=np.float64)
    return np.sqrt(np.maximum(((f[:, None, :] - f[None, :, :]) ** 2).sum(-1), 0.0))


def margin_loss_triplets(labels, embeddings, triplets, beta, alpha=0.2, nu=0.0):
    """Margin loss over explicit (a, p, n) triplets; `beta` scalar or per-class array.

    Regulariser: `nu * beta` for a scalar beta, `nu * sum_t beta_{y_a} / #active` per class (official code,
    pytorch-metric-learning)."""
    d = distances(embeddings)
    beta = np.asarray(beta, dtype=np.float64)
    total, active, beta_sum = 0.0, 0, 0.0
    for a, p, n in triplets:
        b = float(beta) if beta.ndim == 0 else float(beta[labels[a]])
        pos = max(d[a, p] - b + alpha, 0.0)
        neg = max(b - d[a, n] + alpha, 0.0)
        total += pos + neg
        active += int(pos > 0) + int(neg > 0)
        beta_sum += b
    loss = total / active if active else 0.0
    if not len(triplets):
        return 0.0
    if beta.ndim == 0:
        return loss + nu * float(beta)
    return loss + (nu * beta_sum / active if active else 0.0)


def all_triplets(labels):
    labels = np.asarray(labels)
    out = []
    for a in range(len(labels)):
        for p in range(len(labels)):
            if p == a or labels[p] != labels[a]:
                continue
            for n in range(len(labels)):
                if labels[n] != labels[a]:
                    out.append((a, p, n))
    return out


def margin_loss_all(labels, embeddings, beta, alpha=0.2, nu=0.0):
    return margin_loss_triplets(labels, embeddings, all_triplets(labels), beta, alpha, nu)


def distance_weighted_probabilities(labels, embeddings, anchor, cutoff=0.5, nonzero_loss_cutoff=1.4):
    """Sampling distribution over the batch for one anchor: proportional to 1/q(max(d, cutoff)) on negatives
    closer than nonzero_loss_cutoff; uniform over negatives when none is."""
    d = distances(embeddings)[anchor]
    n = np.asarray(embeddings).shape[1]
    labels = np.asarray(labels)
    w = np.zeros(len(labels))
    for j in range(len(labels)):
        if labels[j] != labels[anchor] and d[j] < nonzero_loss_cutoff:
            dc = max(d[j], cutoff)
            # q(d) ~ d^(n-2) (1 - d^2/4)^((n-3)/2) is the density of distances on the unit sphere; w = 1/q.
            log_q = (n - 2.0) * np.log(dc) + ((n - 3.0) / 2.0) * np.log(1.0 - dc * dc / 4.0)
            w[j] = np.exp(-log_q)
    if w.sum() == 0:
        w = (labels != labels[anchor]).astype(float)
    return w / w.sum()


def group_loss(
    labels, embeddings, logits, temperature, num_iterations=1, num_anchors=2, ce_weight=1.0, zero_diagonal=False
):
    labels = np.asarray(labels)
    f = np.asarray(embeddings, dtype=np.float64)
    z = np.asarray(logits, dtype=np.float64)
    b, m = z.shape
    w = np.zeros((b, b))
    for i in range(b):
        for j in range(b):
            if i == j:
                w[i, j] = 0.0 if zero_diagonal else 1.0
                continue
            ci, cj = f[i] - f[i].mean(), f[j] - f[j].mean()
            ni, nj = np.linalg.norm(ci), np.linalg.norm(cj)
            w[i, j] = max(ci @ cj / (ni * nj), 0.0) if ni > 0 and nj > 0 else 0.0
    x = np.zeros((b, m))
    seen = {}
    for i in range(b):
        seen[labels[i]] = seen.get(labels[i], 0) + 1
        if seen[labels[i]] <= num_anchors:
            x[i, labels[i]] = 1.0
        else:
            e = np.exp(z[i] / temperature - np.max(z[i] / temperature))
            x[i] = e / e.sum()
    for _ in range(num_iterations):
        new = x * (w @ x)
        s = new.sum(axis=1, keepdims=True)
        x = np.where(s > 0, new / np.where(s > 0, s, 1.0), x)  # a row with no support keeps its values
    propagation = np.mean([-np.log(x[i, labels[i]] + 1e-12) for i in range(b)])
    ce = 0.0
    for i in range(b):
        zi = z[i] - z[i].max()
        ce += -(zi[labels[i]] - np.log(np.exp(zi).sum()))
    return propagation + ce_weight * ce / b
