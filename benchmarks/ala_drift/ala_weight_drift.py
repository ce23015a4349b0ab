"""Do DML-ALA's assessor outputs drift or saturate over a long run?

    nice -n 5 python -m benchmarks.ala_drift.ala_weight_drift                    # 5,000 steps, 40 % label noise
    nice -n 5 python -m benchmarks.ala_drift.ala_weight_drift --steps 500 --noise 0.0
    python -m benchmarks.ala_drift.ala_weight_drift --summary                    # the summary of benchmarks/ala_drift/

The problem of `benchmarks/label_noise/noisy_clusters.py` (Gaussian class clusters in 8 dimensions), a small
MLP embedder, the contrastive loss, episodes of 6 x 4 training and 2 x 4 validation images, trained with `ALAModel`
at the library defaults (`state="per_tuple"`: the carried LSTM state is part of what could drift). Per step it records
the spread of the assessor's centred outputs (`output_std`), their largest magnitude, the smallest and largest
applied weight, and the LSTM's carried state: its largest magnitude and the fraction of its units beyond
0.99 in magnitude (tanh saturation). One JSON line per `--every` steps goes to
`benchmarks/ala_drift/drift_noise<level>.jsonl`; the summary compares the first and the last tenth of the run
and fits a linear trend to `output_std`.
"""

import argparse
import json
import os

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
OUT_DIR = os.path.join(ROOT, "benchmarks", "ala_drift")


def run(steps, noise, seed, every, path, weight_range=None, choices=None):
    import keras
    import tensorflow as tf

    from benchmarks.label_noise import noisy_clusters as problem
    from tfdml.losses import ContrastiveLoss
    from tfdml.models import ALAModel
    from tfdml.models.ala.episode import EpisodeDerivatives

    x, true, noisy, rng = problem.noisy_clusters(seed, noise)
    keras.utils.set_random_seed(seed)
    embedder = keras.Sequential(
        [keras.Input((problem.DIM,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(8)]
        + [keras.layers.UnitNormalization()]
    )
    model = ALAModel(
        embedder, base_loss=ContrastiveLoss(neg_margin=1.0), weight_range=weight_range, **dict(choices or {})
    )
    model.compile(optimizer=keras.optimizers.Adam(3e-3))
    update = tf.function(model.ala_update)
    probe_index = problem.subset(rng, noisy, np.arange(problem.TRAIN_CLASSES))

    @tf.function
    def probe():
        weights, outputs, _ = EpisodeDerivatives(model, x[probe_index], noisy[probe_index]).weights()
        return weights, outputs

    with open(path, "w") as f:
        for step, episode in enumerate(problem.episodes(x, noisy, rng, steps)):
            logs = update(*episode)
            if step % every and step != steps - 1:
                continue
            weights, outputs = (t.numpy() for t in probe())
            state = np.concatenate([model.assessor.state_h.numpy().ravel(), model.assessor.state_c.numpy().ravel()])
            record = {
                "step": step,
                "output_std": float(logs["output_std"]),
                "probe_output_std": float(outputs.std()),
                "probe_output_max_abs": float(np.abs(outputs).max()),
                "probe_weight_min": float(weights.min()),
                "probe_weight_max": float(weights.max()),
                "state_h_max_abs": float(np.abs(model.assessor.state_h.numpy()).max()),
                "state_h_saturated": float(np.mean(np.abs(model.assessor.state_h.numpy()) > 0.99)),
                "finite": bool(np.isfinite(outputs).all() and np.isfinite(state).all()),
                "meta_loss": float(logs["meta_loss"]),
            }
            f.write(json.dumps(record) + "\n")
            f.flush()


def summary(path):
    records = [json.loads(line) for line in open(path) if line.strip()]
    steps = np.array([r["step"] for r in records])
    tenth = max(1, len(records) // 10)
    first, last = records[:tenth], records[-tenth:]
    out = {
        "file": os.path.relpath(path, ROOT),
        "steps": int(steps.max()) + 1,
        "all_finite": all(r["finite"] for r in records),
    }
    for key in (
        "output_std",
        "probe_output_max_abs",
        "probe_weight_min",
        "probe_weight_max",
        "state_h_max_abs",
        "state_h_saturated",
    ):
        out[key] = {
            "first_tenth": round(float(np.mean([r[key] for r in first])), 4),
            "last_tenth": round(float(np.mean([r[key] for r in last])), 4),
            "max": round(float(np.max([r[key] for r in records])), 4),
        }
    values = np.array([r["output_std"] for r in records])
    slope = np.polyfit(steps, values, 1)[0]
    out["output_std_trend_per_1000_steps"] = round(float(slope * 1000), 5)
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], epilog=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--noise", type=float, default=0.4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--every", type=int, default=25, help="record every N-th step")
    parser.add_argument("--weight-range", type=float, default=None, help="ALAModel(weight_range=...)")
    parser.add_argument("--state", default=None, help="ALAModel(state=...) (default: the library's)")
    parser.add_argument("--assessed", default=None, help="ALAModel(assessed=...) (default: the library's)")
    parser.add_argument("--summary", action="store_true", help="only summarise the recorded runs")
    args = parser.parse_args(argv)
    os.makedirs(OUT_DIR, exist_ok=True)
    suffix = "" if args.weight_range is None else f"_range{args.weight_range:g}"
    choices = {name: getattr(args, name) for name in ("state", "assessed") if getattr(args, name) is not None}
    suffix += "".join(f"_{value}" for value in choices.values())
    path = os.path.join(OUT_DIR, f"drift_noise{args.noise:g}{suffix}.jsonl")
    if not args.summary:
        run(args.steps, args.noise, args.seed, args.every, path, args.weight_range, choices)
    for name in sorted(os.listdir(OUT_DIR)):
        if name.endswith(".jsonl"):
            print(json.dumps(summary(os.path.join(OUT_DIR, name))))


if __name__ == "__main__":
    main()
