"""DML-ALA configurations on the glyph method table's protocol, one seed at a time (a pilot for choosing defaults).

    nice python -m benchmarks.glyph_methods.ala_pilot --base-loss triplet --seed 0 --tag floor0.5 \
        --ala '{"weight_floor": 0.5}'

Trains `ALAModel` with the given arguments on the batches of `benchmark_methods.py`
(its `CONFIG`, its seed's index batches, ALA's training/validation halves) and appends one JSON line (Recall@1, MAP@R
on the unseen characters) to `benchmarks/glyph_methods/results_ala_pilot.jsonl`. The uniform twins are the table's
`*_ala_uniform` rows of the same seed.
"""

import argparse
import json
import os
import time

from benchmarks.glyph_methods import benchmark_methods as bm

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-loss", default="triplet", choices=("triplet", "margin"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tag", required=True)
    parser.add_argument("--ala", default="{}", help="JSON object of ALAModel arguments")
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "glyph_methods", "results_ala_pilot.jsonl"))
    args = parser.parse_args()
    config = dict(bm.CONFIG)
    data = bm.load_data(config)
    batches = bm.index_batches(
        data["train_y"], config["classes_per_batch"], config["samples_per_class"], config["steps"], args.seed
    )
    name = f"{args.base_loss}_ala"
    spec = dict(bm.METHODS[name][1])
    spec["ala"] = {**spec["ala"], **json.loads(args.ala)}
    start, cpu = time.time(), time.process_time()
    embeddings, _ = bm.train_tfdml(spec, data, batches, config, args.seed)
    record = {
        "method": name,
        "tag": args.tag,
        "ala": json.loads(args.ala),
        "seed": args.seed,
        **bm.evaluate(embeddings, data["test_y"]),
        "train_wall_s": round(time.time() - start, 1),
        "train_cpu_s": round(time.process_time() - cpu, 1),
        "config": config,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "a") as f:
        f.write(json.dumps(record) + "\n")
    print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
