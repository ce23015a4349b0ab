"""What a trained DML-ALA assessor does with mislabelled tuples (the label-noise benchmark's weight AUC)."""

import numpy as np

WEIGHT_AUC_BATCHES = 20


def weight_auc(model, data, batches):
    """What the trained assessor does with mislabelled tuples, over the positive pairs (triplets: their
    anchor-positive pairs) of `batches`: `weight_auc`, the probability that a correctly labelled one (both
    images truly of the class) gets a larger weight than a mislabelled one (ties half; 0.5: no preference),
    and `weight_ratio`, the mean weight of the mislabelled ones over that of the correct ones; `distance_auc`,
    the same AUC for the small-loss heuristic's ranking (the smaller anchor-positive distance, the more
    trusted) under the same trained embedder and batches. None without label noise."""
    true = data.get("true_y")
    if true is None or not np.any(true != data["train_y"]):
        return None
    clean, wrong, near_clean, near_wrong = [], [], [], []
    for batch in batches:
        tuples, weights = model.tuple_weights(data["train_x"][batch], data["train_y"][batch])
        tuples, weights = np.asarray(tuples), np.asarray(weights)
        embeddings = np.asarray(model.embedder(data["train_x"][batch], training=False))
        # One entry per anchor-positive pair (a triplet loss's pairs share their weight, or have one per
        # triplet with assessed="all": their mean).
        pairs, inverse = np.unique(tuples[:, :2], axis=0, return_inverse=True)
        weights = np.bincount(inverse.ravel(), weights) / np.bincount(inverse.ravel())
        anchor, positive = batch[pairs[:, 0]], batch[pairs[:, 1]]
        same = data["train_y"][anchor] == data["train_y"][positive]
        correct = true[anchor] == true[positive]
        nearness = -np.linalg.norm(embeddings[pairs[:, 0]] - embeddings[pairs[:, 1]], axis=1)
        clean.append(weights[same & correct])
        wrong.append(weights[same & ~correct])
        near_clean.append(nearness[same & correct])
        near_wrong.append(nearness[same & ~correct])
    clean, wrong = np.concatenate(clean), np.concatenate(wrong)
    from sklearn.metrics import roc_auc_score  # ties count one half

    truth = np.r_[np.ones(len(clean)), np.zeros(len(wrong))]

    def auc(positives, negatives):
        return round(float(roc_auc_score(truth, np.concatenate([positives, negatives]))), 4)

    return {
        "weight_auc": auc(clean, wrong),
        "weight_ratio": round(float(wrong.mean() / clean.mean()), 4),
        "distance_auc": auc(np.concatenate(near_clean), np.concatenate(near_wrong)),
    }
