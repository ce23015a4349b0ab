"""Do DML-ALA's assessor outputs drift or saturate over a long run?

    nice -n 5 python -m benchmarks.ala_drift.ala_weight_drift                    # 5,000 steps, 40 % label noise
    nice -n 5 python -m benchmarks.ala_drift.ala_weight_drift --options '{"output_penalty": 0.3}' --tag penalty0.3
    python -m benchmarks.ala_drift.ala_weight_drift --summary                    # the summary of benchmarks/ala_drift/

The problem of `tests/noisy_clusters.py` (Gaussian class clusters in 8 dimensions), a small
MLP embedder, the contrastive loss, episodes of 6 x 4 training and 2 x 4 validation images, trained with `ALAModel`
at the library defaults or the switches of `--options` (the carried LSTM state is part of what could drift). Per
step it records the spread of the assessor's centred outputs (`output_std`), their largest magnitude, the smallest
and largest applied weight, and the LSTM's carried state: its largest magnitude and the fraction of its units
beyond 0.99 in magnitude (tanh saturation). One JSON line per `--every` steps goes to
`benchmarks/ala_drift/drift_noise<level>[_<tag>][_seed<seed>].jsonl`; the summary compares the first and the
last tenth of the run and fits a linear trend to `output_std`, over the whole run and after the first 1,000
steps, with its standard error.
"""

import argparse
import json
import os

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
OUT_DIR = os.path.join(ROOT, "benchmarks", "ala_drift")


def run(steps, noise, seed, every, path, options=None):
    import keras
    import tensorflow as tf

    from tests import noisy_clusters as problem
    from tfdml.losses import ContrastiveLoss
    from tfdml.models import ALAModel
    from tfdml.models.ala.episode import EpisodeDerivatives

    x, true, noisy, rng = problem.noisy_clusters(seed, noise)
    keras.utils.set_random_seed(seed)
    embedder = keras.Sequential(
        [keras.Input((problem.DIM,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(8)]
        + [keras.layers.UnitNormalization()]
    )
    model = ALAModel(embedder, base_loss=ContrastiveLoss(neg_margin=1.0), **dict(options or {}))
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
    for name, start in (("", 0), ("_after_1000", 1000)):
        slope, error = _trend(steps[steps >= start], values[steps >= start])
        out[f"output_std_trend_per_1000_steps{name}"] = round(slope * 1000, 5)
        out[f"output_std_trend_standard_error{name}"] = round(error * 1000, 5)
    return out


def _trend(steps, values, lags=20):
    """Least-squares slope of `values` over `steps` and its standard error, robust to the correlation of
    neighbouring records (Newey-West, `lags` records: 500 steps at the default `--every`)."""
    design = np.stack([np.ones_like(steps, dtype=float), steps.astype(float)], axis=1)
    coefficients, *_ = np.linalg.lstsq(design, values, rcond=None)
    scores = design * (values - design @ coefficients)[:, None]
    meat = scores.T @ scores
    for lag in range(1, lags + 1):
        cross = scores[lag:].T @ scores[:-lag]
        meat += (1 - lag / (lags + 1)) * (cross + cross.T)
    bread = np.linalg.inv(design.T @ design)
    return float(coefficients[1]), float(np.sqrt((bread @ meat @ bread)[1, 1]))


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], epilog=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--noise", type=float, default=0.4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--every", type=int, default=25, help="record every N-th step")
    parser.add_argument("--options", type=json.loads, default={}, help="ALAModel switches, a JSON object")
    parser.add_argument("--tag", default="", help="added to the results file's name (the options it ran with)")
    parser.add_argument("--summary", action="store_true", help="only summarise the recorded runs")
    args = parser.parse_args(argv)
    os.makedirs(OUT_DIR, exist_ok=True)
    suffix = (f"_{args.tag}" if args.tag else "") + (f"_seed{args.seed}" if args.seed else "")
    path = os.path.join(OUT_DIR, f"drift_noise{args.noise:g}{suffix}.jsonl")
    if not args.summary:
        run(args.steps, args.noise, args.seed, args.every, path, args.options)
    for name in sorted(os.listdir(OUT_DIR)):
        if name.endswith(".jsonl"):
            print(json.dumps(summary(os.path.join(OUT_DIR, name))))


if __name__ == "__main__":
    main()
