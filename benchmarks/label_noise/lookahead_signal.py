"""Where the look-ahead's signal on a mislabelled positive pair comes from, warm-started or from scratch: per
positive pair of a seed's first batches, the meta-gradient `-d L_va(theta'(w)) / d w_pair` at uniform weights
(the push the assessor's update gives the pair's weight) through the head alone, through every variable, and
through every variable with the body's rate 0 (which must equal the head alone), at the embedder of the
benchmark's row (warm start or scratch, on the base loss `--base`) and after some of its real steps.

    nice -n 10 python -m benchmarks.label_noise.lookahead_signal --regime pretrained --seed 0
    nice -n 10 python -m benchmarks.label_noise.lookahead_signal --regime scratch --noise 0.2 --base margin \
        --at 0 150 400
    # a validation loss whose negative pairs are active (ALAModel's validation_loss):
    nice -n 10 python -m benchmarks.label_noise.lookahead_signal --regime pretrained --seed 0 --options \
        '{"trusted": [30, 3], "validation_loss": "contrastive",
          "validation_loss_params": {"pos_margin": 0.0468, "neg_margin": 1.0}}'
"""

import argparse
import json
import os
import sys
import time

import numpy as np

from benchmarks.glyph_methods import benchmark_methods as bm
from benchmarks.label_noise import label_noise as ln
from benchmarks.label_noise.noisy_labels import noisy_data
from benchmarks.reality_check import reality_check as rc

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "results_lookahead_signal.jsonl")
PROBE_BATCHES = 20


def setup(regime, noise, seed, options, steps, base="contrastive"):
    """The data, batches and compiled `ALAModel` of a benchmark row (`label_noise.ala_model`) on base loss `base`,
    warm-started in the pretrained regime. The first `steps` batches are those of a run of any length."""
    ln.REGIME = regime
    full = bm.load_data(ln.CONFIG)
    data = noisy_data(full, noise, seed)
    spec, lr = ln.method_spec(base, "ala", options)
    config = dict(ln.CONFIG, steps=steps, learning_rate=lr)
    batches = bm.index_batches(data["train_y"], config["classes_per_batch"], config["samples_per_class"], steps, seed)
    warm, pretrain_cpu = None, None
    if regime == "pretrained":
        cpu = time.process_time()
        warm = rc.Pretrained(ln.CONFIG, os.path.join(HERE, "cache", f"noise{round(1000 * noise)}")).get(
            "final", data, seed
        )
        pretrain_cpu = time.process_time() - cpu
    model, _, dataset, val_labels, extra = ln.ala_model(spec, data, batches, config, seed, warm)
    return data, batches, extra, val_labels, model, dataset, pretrain_cpu


def pair_push(model, episode, body_rate_zero=False):
    """Per assessed unit: `-d L_va / d w` at uniform weights, and `L_va(theta')`, `L_va(theta)`."""
    import tensorflow as tf

    from tfdml.models.ala.lookahead import moved_positions

    if body_rate_zero:
        rates, offsets = episode.lookahead_terms()
        head = set(moved_positions(model.embedder, "head"))
        episode._lookahead = ([p if i in head else 0.0 * p for i, p in enumerate(rates)], offsets)
    unit_w = tf.ones([tf.shape(episode.units)[0]], episode.values.dtype)
    with tf.GradientTape() as tape:
        tape.watch(unit_w)
        coefficients = model.coefficients(episode.terms, episode.weights_of_units(unit_w))
    alignment, meta_loss = episode.alignment(coefficients)
    with tape:
        surrogate = -tf.reduce_sum(coefficients * tf.stop_gradient(alignment))
    push = -tf.convert_to_tensor(tape.gradient(surrogate, unit_w))
    before, _ = episode.validation([tf.zeros_like(v) for v in episode.moved])
    return push.numpy(), float(meta_loss), float(before)


def auc(positives, negatives):
    from sklearn.metrics import roc_auc_score

    if not len(positives) or not len(negatives):
        return float("nan")
    truth = np.r_[np.ones(len(positives)), np.zeros(len(negatives))]
    return float(roc_auc_score(truth, np.r_[positives, negatives]))


def validation_terms(model, vx, vy):
    """`(mean positive-pair term, fraction of negative pairs with a non-zero term, the negative pairs'
    distances)` of a validation subset, in the validation loss (the base loss unless the options give a
    `validation_loss`). Triplet terms (margin, triplet losses): the mean triplet term, the fraction of triplets
    whose term moves with their negative, and the distances of every negative pair of the subset."""
    import tensorflow as tf

    embeddings = model.embedder(vx, training=True)
    with tf.GradientTape() as tape:
        tape.watch(embeddings)
        terms = model.validation_loss.terms(vy, embeddings)
    if terms.kind == "triplet":
        return _triplet_validation_terms(tape, terms, vy, embeddings)
    pairs = tf.gather(vy, terms.indices).numpy()
    positive, values = pairs[:, 0] == pairs[:, 1], terms.values.numpy()
    emb = embeddings.numpy()
    distances = np.linalg.norm(emb[terms.indices.numpy()[:, 0]] - emb[terms.indices.numpy()[:, 1]], axis=1)
    return float(values[positive].mean()), float((values[~positive] > 0).mean()), distances[~positive]


def _triplet_validation_terms(tape, terms, vy, embeddings):
    jacobian = tape.jacobian(terms.values, embeddings).numpy()  # [T, B, D]
    negatives = terms.indices.numpy()[:, 2]
    moves = np.linalg.norm(jacobian[np.arange(len(negatives)), negatives], axis=1) > 0
    emb, labels = embeddings.numpy(), vy.numpy()
    i, j = np.triu_indices(len(labels), 1)
    different = labels[i] != labels[j]
    distances = np.linalg.norm(emb[i[different]] - emb[j[different]], axis=1)
    return float(terms.values.numpy().mean()), float(moves.mean()), distances


def probe(model, data, batches, extra, val_labels, modes=("head", "all", "all_body0")):
    """The pair pushes of the first `PROBE_BATCHES` episodes, summarised per look-ahead."""
    import tensorflow as tf

    from tfdml.models.ala.episode import EpisodeDerivatives

    rows = {mode: {"push": [], "clean": [], "wrong": [], "val_change": [], "d": []} for mode in modes}
    geometry = {
        key: []
        for key in (
            "correct",
            "d_clean",
            "d_wrong",
            "zero_clean",
            "zero_wrong",
            "val_pos",
            "val_neg_active",
            "val_neg_d",
        )
    }
    saved = model.options.lookahead_variables
    for batch, val in zip(batches[:PROBE_BATCHES], extra[:PROBE_BATCHES]):
        tx, ty = tf.constant(data["train_x"][batch]), tf.constant(data["train_y"][batch])
        vx, vy = tf.constant(data["train_x"][val]), tf.constant(val_labels[val])
        for mode in rows:
            model.options.lookahead_variables = "head" if mode == "head" else "all"
            episode = EpisodeDerivatives(model, tx, ty, vx, vy)
            push, after, before = pair_push(model, episode, body_rate_zero=mode == "all_body0")
            if mode == modes[0]:  # the pairs and the embeddings are the same whatever the look-ahead
                units, emb = episode.units.numpy(), episode.embeddings.numpy()
                correct = data["true_y"][batch[units[:, 0]]] == data["true_y"][batch[units[:, 1]]]
                d = np.linalg.norm(emb[units[:, 0]] - emb[units[:, 1]], axis=1)
                values = np.asarray(tf.gather(episode.values, episode.assessed))
            rows[mode]["push"].append(push)
            rows[mode]["clean"].append(push[correct])
            rows[mode]["wrong"].append(push[~correct])
            rows[mode]["val_change"].append(after - before)
            rows[mode]["d"].append(d)
        val_pos, val_neg, val_neg_d = validation_terms(model, vx, vy)
        geometry["val_pos"].append(val_pos)
        geometry["val_neg_active"].append(val_neg)
        geometry["val_neg_d"].append(val_neg_d)
        geometry["correct"].append(correct)
        geometry["d_clean"].append(d[correct])
        geometry["d_wrong"].append(d[~correct])
        geometry["zero_clean"].append(values[correct] == 0)
        geometry["zero_wrong"].append(values[~correct] == 0)
    model.options.lookahead_variables = saved
    return summary(rows, geometry)


def summary(rows, geometry):
    """Per look-ahead, the pushes of the correct and the mislabelled pairs; the pairs' geometry."""
    from scipy.stats import spearmanr

    out = {}
    correct_all = np.concatenate(geometry["correct"])
    for mode, r in rows.items():
        clean, wrong = np.concatenate(r["clean"]), np.concatenate(r["wrong"])
        out[mode] = {
            "push_auc": round(auc(clean, wrong), 4),  # correct pairs pushed up more than mislabelled ones
            "push_clean_mean": float(clean.mean()),
            "push_wrong_mean": float(wrong.mean()),
            "push_clean_positive": round(float((clean > 0).mean()), 3),
            "push_wrong_positive": round(float((wrong > 0).mean()), 3),
            "push_abs_mean": float(np.abs(np.r_[clean, wrong]).mean()),
            "val_change_mean": float(np.mean(r["val_change"])),
            "val_change_falls": round(float(np.mean(np.asarray(r["val_change"]) < 0)), 3),
            # does a pair's push grow with its distance (a farther pair pulled harder helps more)?
            "push_distance_spearman": round(
                float(spearmanr(np.concatenate(r["d"]), np.concatenate(r["push"])).statistic), 3
            ),
            # the same within the correct and within the mislabelled pairs: the distance, not the label
            **{
                f"push_distance_spearman_{name}": round(
                    float(spearmanr(np.concatenate(r["d"])[kept], np.concatenate(r["push"])[kept]).statistic), 3
                )
                for name, kept in (("clean", correct_all), ("wrong", ~correct_all))
            },
        }
    if "all_body0" in rows:
        head, body0 = np.concatenate(rows["head"]["clean"]), np.concatenate(rows["all_body0"]["clean"])
        out["head_vs_body0_max_rel"] = float(np.max(np.abs(head - body0)) / (np.max(np.abs(head)) + 1e-30))
    dc, dw = np.concatenate(geometry["d_clean"]), np.concatenate(geometry["d_wrong"])
    out["geometry"] = {
        "pairs_clean": int(len(dc)),
        "pairs_wrong": int(len(dw)),
        "d_clean_mean": float(dc.mean()),
        "d_wrong_mean": float(dw.mean()),
        "distance_auc": round(auc(-dc, -dw), 4),
        "zero_term_clean": round(float(np.concatenate(geometry["zero_clean"]).mean()), 3),
        "zero_term_wrong": round(float(np.concatenate(geometry["zero_wrong"]).mean()), 3),
        "val_positive_term_mean": float(np.mean(geometry["val_pos"])),
        "val_negative_active": round(float(np.mean(geometry["val_neg_active"])), 3),
        # the validation subsets' negative-pair distances (10 %, 50 %, 90 %): where a margin makes them active
        "val_negative_distance_q10_50_90": [
            round(float(q), 3) for q in np.quantile(np.concatenate(geometry["val_neg_d"]), [0.1, 0.5, 0.9])
        ],
    }
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--regime", choices=("scratch", "pretrained"), default="pretrained")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--noise", type=float, default=0.4)
    parser.add_argument("--base", choices=tuple(ln.BASES), default="contrastive", help="the row's base loss")
    parser.add_argument("--train", default="head", help="the look-ahead of the real steps between probes")
    parser.add_argument(
        "--at", type=int, nargs="+", default=[0, 50, 150], help="steps at which to probe the next 20 batches"
    )
    parser.add_argument("--options", type=json.loads, default={"trusted": [30, 3]})
    parser.add_argument("--out", default=OUT)
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    options = dict(args.options, lookahead_variables=args.train)
    data, batches, extra, val_labels, model, dataset, pretrain_cpu = setup(
        args.regime, args.noise, args.seed, options, max(args.at) + PROBE_BATCHES, args.base
    )
    print("pretrain CPU s", pretrain_cpu, flush=True)
    iterator, done = iter(dataset), 0
    for at in sorted(args.at):
        for _ in range(at - done):
            model.train_step(next(iterator))
        done = at
        cpu = time.process_time()
        # Probe the batches still ahead of the run: the next PROBE_BATCHES of its own episodes.
        modes = ("head", "all", "all_body0") if at == 0 else ("head", "all")
        summary = probe(model, data, batches[at:], extra[at:], val_labels, modes)
        record = {
            "regime": args.regime,
            "seed": args.seed,
            "noise": args.noise,
            "base": args.base,
            "train_lookahead": args.train,
            "options": args.options,
            "step": at,
            "probe_cpu_s": round(time.process_time() - cpu, 1),
            "pretrain_cpu_s": None if pretrain_cpu is None else round(pretrain_cpu, 1),
            **summary,
        }
        print(json.dumps(record), flush=True)
        with open(args.out, "a") as f:
            f.write(json.dumps(record) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
