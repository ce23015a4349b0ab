"""How much of a batch RLL's official query weighting trains on (issue 23, "explain what trails").

    python scripts/rll_query_weights.py                                   # the default setting
    python scripts/rll_query_weights.py --setting margin=0.59 alpha=0.92 tn=3.8

For the glyph batches of `scripts/benchmark_methods.py` (22 x 3, seed 0, the first `--batches` of them)
embedded by two embedders of that script's CNN, one at its random initialisation (the start of training
from scratch) and one trained 300 steps with softmax cross-entropy (a trained embedding, as the pretrained
regime of `scripts/reality_check.py` starts from), prints one JSON line per embedder and setting:

- `effective_queries`: `1 / sum_i q_i^2` of the official query weights `q` (`tfdml.losses.ranked_list_weights`),
  averaged over the batches; the uniform weighting's is the batch size (66);
- `top5_share`: the share of the batch's gradient weight on its 5 heaviest queries;
- `mined_negatives`, `mined_positives`: mean mined pairs per query; `distance_*`: quantiles of the
  negative-pair distances (the boundary `alpha` decides which are mined).
"""

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import benchmark_methods as bm  # noqa: E402  (after the path insert) data, batches and CNN of the method table)


def parse_setting(text):
    params = {}
    for item in text.split():
        key, value = item.split("=")
        params[key] = float(value)
    return params


def statistics(embeddings, labels, batches, params):
    import tensorflow as tf

    from tfdml.losses.ranked_list import ranked_list_weights
    from tfdml.ops import pairwise_distance

    rows = []
    for index in batches:
        x, y = tf.constant(embeddings[index]), tf.constant(labels[index].astype(np.int32))
        distances = pairwise_distance(x)
        c_pos, c_neg, q = (
            np.asarray(t) for t in ranked_list_weights(y, distances, query_weighting="official", **params)
        )
        negative = labels[index][:, None] != labels[index][None, :]
        rows.append(
            {
                "effective_queries": 1.0 / float(np.sum(q**2)),
                "top5_share": float(np.sort(q)[-5:].sum()),
                "mined_negatives": float((c_neg > 0).sum(axis=1).mean()),
                "mined_positives": float((c_pos > 0).sum(axis=1).mean()),
                "distances": np.asarray(distances)[negative],
            }
        )
    negatives = np.concatenate([r.pop("distances") for r in rows])
    result = {key: round(float(np.mean([r[key] for r in rows])), 3) for key in rows[0]}
    result.update({f"distance_q{q}": round(float(np.quantile(negatives, q / 100)), 3) for q in (5, 50, 95)})
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--setting",
        action="append",
        default=[],
        help="RLL parameters 'margin=.. alpha=.. tn=..' (repeatable); the default 0.4 / 1.2 / 10 is always included",
    )
    parser.add_argument("--batches", type=int, default=20)
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    config = dict(bm.CONFIG)
    data = bm.load_data(config)
    batches = bm.index_batches(
        data["train_y"], config["classes_per_batch"], config["samples_per_class"], config["steps"], 0
    )
    settings = [dict(bm.RLL)] + [parse_setting(s) for s in args.setting]
    initial = bm.tfdml_embedder(config, seed=0)
    _, trained = bm.train_tfdml(bm.METHODS["softmax"][1], data, batches, dict(config), 0)
    for name, model in (("random initialisation", initial), ("softmax-trained 300 steps", trained)):
        embeddings = np.concatenate(
            [
                np.asarray(model(data["train_x"][i : i + 512], training=False))
                for i in range(0, len(data["train_x"]), 512)
            ]
        )
        for params in settings:
            print(
                json.dumps(
                    {
                        "embedder": name,
                        "setting": params,
                        "batch": len(batches[0]),
                        **statistics(embeddings, data["train_y"], batches[: args.batches], params),
                    }
                ),
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
