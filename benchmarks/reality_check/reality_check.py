"""Which loss should I use? Every method tuned the same way on glyphs, then tested (Musgrave et al.'s protocol).

    python -m benchmarks.reality_check.reality_check               # search, then final runs: every method, both regimes
    python -m benchmarks.reality_check.reality_check --regimes scratch --methods contrastive rll_official
    python -m benchmarks.reality_check.reality_check --phase search            # only the searches
    python -m benchmarks.reality_check.reality_check --table-only              # table.md and methods.png from the JSONL
    python -m benchmarks.reality_check.reality_check --list                    # the methods and their search spaces
    python -m benchmarks.reality_check.reality_check --paired scratch rll_uniform margin_dw  # per-seed differences

Protocol ("A Metric Learning Reality Check", Musgrave, Belongie and Lim, ECCV 2020, on a small scale):

1. The training characters of `tfdml.data.glyphs` are split by class into a training part (two thirds) and
   a validation part (one third, `VALIDATION_FRACTION`, a fixed shuffle).
2. Search: per method `TRIALS` settings, the same number for every method: trial 0 is the method's setting
   in `benchmarks/glyph_methods/benchmark_methods.py` (the papers' or libraries' defaults, Adam 2e-3), trials
   1.. a seeded random draw from `SEARCH_SPACE` (the method's own parameters and the learning rate). Each trial trains
   on the training part (seed 0) and is scored by MAP@R on the validation classes.
3. Final: the setting with the best validation MAP@R is retrained on all training characters with the
   seeds `FINAL_SEEDS` and evaluated on the unseen test characters: Recall@1, MAP@R and R-precision, mean and standard
   deviation over the seeds.

Everything else is `benchmarks/glyph_methods/benchmark_methods.py`'s (its data, batches, small CNN, training
function and method definitions are imported from there): 32 px, 20 images per character, 300 steps of 22 x 3
class-balanced batches, the 16-32-64-128 CNN with a 64-d embedding, Adam.

Two regimes: `scratch` (random initial weights) and `pretrained`: the papers start from a backbone trained
on another task, and the Group Loss paper warm-starts with classification on the training classes
(`tfdml.callbacks.ClassificationPretraining` does that inside one `fit`). Here every method of the
`pretrained` regime starts from one embedder per seed trained first with softmax cross-entropy on the same
training classes for `PRETRAIN_STEPS` steps (other batches, Adam 2e-3); its backbone and embedding head
are copied, classifier and auxiliary heads start fresh. The search is repeated in that regime.

Results are appended, one JSON line per run, to `<out-dir>/results.jsonl` (default
`benchmarks/reality_check/`, committed); runs already there for the current protocol are skipped, so a
killed run resumes where it stopped. `table.md` and `methods.png` are rebuilt from the lines.
"""

import argparse
import datetime
import json
import os
import sys
import time
import traceback
import zlib

import numpy as np

from benchmarks.glyph_methods import benchmark_methods as bm  # the method table's methods, data, training

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

OUT_DIR = os.path.join(ROOT, "benchmarks", "reality_check")
REGIMES = ("scratch", "pretrained")
# The budget. On the 2 shared CPU cores of the first run (20-60 s wall per 300-step run) every method got 5
# settings per regime, so that the search of both regimes fits in one session (Musgrave et al. search far
# longer); the final runs use 5 seeds. `--trials` and `--seeds` raise them; runs already done are kept.
TRIALS = 5  # settings tried per method and regime (trial 0: the default)
VALIDATION_FRACTION = 1 / 3  # of the training characters, by class
SPLIT_SEED = 2020  # the training / validation split of the training characters
SEARCH_SEED = 23  # the random search's draws
FINAL_SEEDS = (0, 1, 2, 3, 4)
PRETRAIN_STEPS = 300  # softmax steps before the method's own, in the "pretrained" regime

# name -> {parameter: (kind, ...)}: "log" (log-uniform between two bounds), "uniform", "choice". Every method
# also searches "learning_rate" (Adam's). The method's parameters are those of its loss in
# benchmark_methods.METHODS; the ALA rows' "loss_params" are the base loss's.
LEARNING_RATE = ("log", 3e-4, 1e-2)
SEARCH_SPACE = {
    "softmax": {},
    "contrastive": {"pos_margin": ("uniform", 0.0, 0.6), "neg_margin": ("uniform", 0.3, 1.5)},
    "triplet_semihard": {"margin": ("log", 0.02, 1.0)},
    "triplet_all": {"margin": ("log", 0.02, 1.0)},
    "margin_dw": {"alpha": ("uniform", 0.05, 0.5), "beta": ("uniform", 0.6, 1.5)},
    "multi_similarity": {"alpha": ("log", 0.5, 20.0), "beta": ("log", 5.0, 100.0), "base": ("uniform", 0.1, 0.9)},
    "proxy_anchor": {
        "margin": ("uniform", 0.0, 0.5),
        "alpha": ("log", 4.0, 64.0),
        "proxy_lr_factor": ("log", 1.0, 100.0),
    },
    "normsoftmax": {"temperature": ("log", 0.01, 0.3), "proxy_lr_factor": ("log", 1.0, 100.0)},
    # RLL: alpha is the negative boundary, margin the gap to the positive boundary alpha - margin (>= 0).
    "rll_official": {"margin": ("uniform", 0.05, 1.0), "alpha": ("uniform", 0.4, 1.6), "tn": ("uniform", 0.0, 30.0)},
    "rll_uniform": {"margin": ("uniform", 0.05, 1.0), "alpha": ("uniform", 0.4, 1.6), "tn": ("uniform", 0.0, 30.0)},
    "rll_lmh": {
        "margin": ("uniform", 0.05, 1.0),
        "alpha": ("uniform", 0.4, 1.6),
        "tn": ("uniform", 0.0, 30.0),
        "query_weighting": ("choice", "official", "uniform"),
    },
    "group": {
        "temperature": ("log", 2.0, 60.0),
        "num_iterations": ("choice", 1, 2, 3),
        "num_anchors": ("choice", 1, 2),
        "ce_weight": ("log", 0.1, 3.0),
    },
    "triplet_ala": {
        "margin": ("log", 0.02, 1.0),
        "inner_learning_rate": ("log", 1e-5, 1e-2),
        "assessor_learning_rate": ("log", 1e-4, 3e-3),
    },
    "margin_ala": {
        "alpha": ("uniform", 0.05, 0.5),
        "beta": ("uniform", 0.6, 1.5),
        "inner_learning_rate": ("log", 1e-5, 1e-2),
        "assessor_learning_rate": ("log", 1e-4, 3e-3),
    },
}
METHODS = [name for name in SEARCH_SPACE]
ALA_METHODS = ("triplet_ala", "margin_ala")


def line_protocol(proto, method):
    """What a result line of `method` records and must match: `proto`, and for DML-ALA the design it ran
    (`benchmark_methods.ala_design`: lines of an earlier episode design or other defaults do not count)."""
    return dict(proto, ala_design=bm.ala_design()) if method in ALA_METHODS else proto


def protocol(config):
    """What a result line must match to count (any change re-runs everything). `glyph_classes` (150 / 151
    characters) is not part of it: `benchmark_methods.load_data` refuses any other glyph set, and every line
    of `benchmarks/reality_check/` ran on that set (the key was added to the config after they ran)."""
    config = {k: v for k, v in config.items() if k != "glyph_classes"}
    return {
        "config": config,
        "trials": TRIALS,
        "validation_fraction": VALIDATION_FRACTION,
        "split_seed": SPLIT_SEED,
        "search_seed": SEARCH_SEED,
        "pretrain_steps": PRETRAIN_STEPS,
        "search_space": {name: {k: list(v) for k, v in space.items()} for name, space in SEARCH_SPACE.items()},
        "learning_rate": list(LEARNING_RATE),
    }


# ------------------------------------------------------------------------------------------------ search space
def _draw(rng, spec):
    kind, *args = spec
    if kind == "log":
        return float(np.exp(rng.uniform(np.log(args[0]), np.log(args[1]))))
    if kind == "uniform":
        return float(rng.uniform(args[0], args[1]))
    if kind == "choice":
        value = args[int(rng.integers(len(args)))]
        return value.item() if hasattr(value, "item") else value
    raise ValueError(f"unknown search-space kind {kind!r}")


def _valid(name, params):
    if name == "contrastive":
        return params["pos_margin"] < params["neg_margin"]
    if name.startswith("rll"):
        return params["margin"] <= params["alpha"]  # a positive boundary alpha - margin >= 0
    return True


def trials(name, count=None):
    """The `count` (default `TRIALS`) settings of method `name`: `[{}]` (its default) then seeded random
    draws, each a dict of the method's parameters and "learning_rate"."""
    count = TRIALS if count is None else count
    rng = np.random.default_rng([SEARCH_SEED, zlib.crc32(name.encode())])
    space = dict(SEARCH_SPACE[name], learning_rate=LEARNING_RATE)
    settings = [{}]
    while len(settings) < count:
        params = {key: _draw(rng, spec) for key, spec in space.items()}
        if _valid(name, params):
            settings.append({k: round(v, 6) if isinstance(v, float) else v for k, v in params.items()})
    return settings


def method_spec(name, params):
    """`(spec for benchmark_methods.train_tfdml, learning rate)` of method `name` with setting `params`."""
    params = dict(params)
    learning_rate = params.pop("learning_rate", bm.CONFIG["learning_rate"])
    factor = params.pop("proxy_lr_factor", None)
    if factor is not None:
        params["proxy_learning_rate"] = factor * learning_rate
    return bm.with_params(name, params), learning_rate  # an ALA row's own parameters go to ALAModel


# ------------------------------------------------------------------------------------------------ data
def split_training_classes(data):
    """`data` (benchmark_methods.load_data) -> the search's data: training part as `train_*` (labels 0..n-1)
    and the validation classes as `test_*`."""
    classes = np.unique(data["train_y"])
    order = np.random.default_rng(SPLIT_SEED).permutation(classes)
    validation = np.sort(order[: round(len(classes) * VALIDATION_FRACTION)])
    held = np.isin(data["train_y"], validation)
    _, train_y = np.unique(data["train_y"][~held], return_inverse=True)
    return {
        "train_x": data["train_x"][~held],
        "train_y": train_y.astype(np.int64),
        "test_x": data["train_x"][held],
        "test_y": data["train_y"][held],
        "num_classes": int(train_y.max()) + 1,
    }


class Pretrained:
    """The softmax-pretrained embedders of the "pretrained" regime, one per (data part, seed), trained on
    first use and kept on disk (`cache_dir`) so that a resumed run starts from the same weights."""

    def __init__(self, config, cache_dir):
        self.config, self.cache_dir, self.models = config, cache_dir, {}

    def get(self, part, data, seed):
        key = (part, seed)
        if key in self.models:
            return self.models[key]
        model = bm.tfdml_embedder(self.config, num_classes=data["num_classes"], seed=seed)
        path = os.path.join(self.cache_dir, f"pretrained_{part}_seed{seed}_{PRETRAIN_STEPS}.weights.h5")
        if os.path.exists(path):
            model.load_weights(path)
        else:
            batches = bm.index_batches(
                data["train_y"],
                self.config["classes_per_batch"],
                self.config["samples_per_class"],
                PRETRAIN_STEPS,
                10_000 + seed,
            )
            _, model = bm.train_tfdml(bm.METHODS["softmax"][1], data, batches, dict(self.config), seed)
            os.makedirs(self.cache_dir, exist_ok=True)
            model.save_weights(path)
        self.models[key] = model
        return model


# ------------------------------------------------------------------------------------------------ runs
def run(name, params, data, config, seed, warm_start=None, keep_classifier=False):
    spec, learning_rate = method_spec(name, params)
    run_config = dict(config, learning_rate=learning_rate)
    batches = bm.index_batches(
        data["train_y"], config["classes_per_batch"], config["samples_per_class"], config["steps"], seed
    )
    started, cpu = time.time(), time.process_time()
    embeddings, _ = bm.train_tfdml(
        spec, data, batches, run_config, seed, warm_start=warm_start, keep_classifier=keep_classifier
    )
    metrics = bm.evaluate(embeddings, data["test_y"])
    return {
        **metrics,
        "train_wall_s": round(time.time() - started, 2),
        "train_cpu_s": round(time.process_time() - cpu, 2),
    }


def read_lines(path, proto):
    """The lines of `path` for protocol `proto`, the latest per key."""
    return bm.latest_records(
        path, _key, lambda record: record.get("protocol") == line_protocol(proto, record.get("method"))
    )


def _key(record):
    return (record["phase"], record["regime"], record["method"], record.get("trial"), record.get("seed"))


def best_setting(lines, regime, name):
    """`(trial, params, validation MAP@R)` of the best completed search, or None while trials are missing."""
    found = [r for r in lines.values() if r["phase"] == "search" and r["regime"] == regime and r["method"] == name]
    if len({r["trial"] for r in found}) < TRIALS:
        return None
    best = max(found, key=lambda r: (r["map@r"], -r["trial"]))
    return best["trial"], best["params"], best["map@r"]


def main(argv=None):
    global TRIALS
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    parser.add_argument(
        "--methods",
        nargs="+",
        default=["all"],
        help="method names (see --list), 'all' (every method but the ALA rows) or 'ala'",
    )
    parser.add_argument("--regimes", nargs="+", default=list(REGIMES), choices=REGIMES)
    parser.add_argument("--phase", default="all", choices=["search", "final", "all"])
    parser.add_argument("--seeds", nargs="+", type=int, default=list(FINAL_SEEDS), help="final-run seeds")
    parser.add_argument("--out-dir", default=OUT_DIR)
    parser.add_argument("--threads", type=int, default=1, help="TensorFlow CPU threads (0: its default)")
    parser.add_argument(
        "--steps",
        type=int,
        default=bm.CONFIG["steps"],
        help="training steps per run (a smoke test's; the protocol is 300)",
    )
    parser.add_argument("--trials", type=int, default=TRIALS, help="settings per method and regime")
    parser.add_argument(
        "--keep-classifier",
        action="store_true",
        help="pretrained regime: the method's "
        "classifier head (softmax, Group Loss) also starts from the pretrained one (same classes), "
        "as in the Group Loss paper's warm start; use another --out-dir",
    )
    parser.add_argument("--cache-dir", default=None, help="pretrained embedders (default: <out-dir>/cache)")
    parser.add_argument("--table-only", action="store_true")
    parser.add_argument("--list", action="store_true")
    parser.add_argument(
        "--paired",
        nargs=3,
        metavar=("REGIME", "A", "B"),
        help="print the final runs' differences A - B paired by seed (same batches and initial weights), as JSON",
    )
    args = parser.parse_args(argv)
    if args.list:
        for name in METHODS:
            print(
                f"{name:18s} {bm.METHODS[name][0]:34s} learning_rate {LEARNING_RATE} "
                + " ".join(f"{k} {v}" for k, v in SEARCH_SPACE[name].items())
            )
        return 0
    if args.methods == ["all"]:
        names = [n for n in METHODS if n not in ALA_METHODS]
    elif args.methods == ["ala"]:
        names = list(ALA_METHODS)
    else:
        names = args.methods
    unknown = [n for n in names if n not in SEARCH_SPACE]
    if unknown:
        parser.error(f"unknown methods {unknown}; choose from {METHODS}")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    TRIALS = int(args.trials)
    config = dict(bm.CONFIG, steps=int(args.steps))
    proto = protocol(config)
    os.makedirs(args.out_dir, exist_ok=True)
    jsonl = os.path.join(args.out_dir, "results.jsonl")
    if args.paired:
        print(json.dumps(paired(read_lines(jsonl, proto), *args.paired)))
        return 0
    if not args.table_only:
        if args.threads:
            import tensorflow as tf

            tf.config.threading.set_intra_op_parallelism_threads(args.threads)
            tf.config.threading.set_inter_op_parallelism_threads(args.threads)
        full = bm.load_data(config)
        parts = {"search": split_training_classes(full), "final": full}
        pretrained = Pretrained(config, args.cache_dir or os.path.join(args.out_dir, "cache"))

        def record(line):
            now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
            line.update(protocol=line_protocol(proto, line["method"]), date=now)
            with open(jsonl, "a") as f:
                f.write(json.dumps(line) + "\n")

        def attempt(phase, regime, name, params, seed, **key):
            data = parts[phase]
            try:
                warm = pretrained.get(phase, data, seed) if regime == "pretrained" else None
                metrics = run(name, params, data, config, seed, warm_start=warm, keep_classifier=args.keep_classifier)
            except Exception:  # noqa: BLE001  (one failing run must not stop the others)
                print(f"{phase} {regime} {name} {key} failed:\n{traceback.format_exc()}", flush=True)
                return
            record({"phase": phase, "regime": regime, "method": name, "seed": seed, "params": params, **key, **metrics})
            print(
                f"{phase:6s} {regime:10s} {name:18s} {key or ''} seed {seed}: R@1 {metrics['recall@1']:.3f} "
                f"MAP@R {metrics['map@r']:.3f} ({metrics['train_cpu_s']:.0f} s CPU)",
                flush=True,
            )

        for regime in args.regimes:
            if args.phase in ("search", "all"):
                for name in names:
                    for trial, params in enumerate(trials(name)):
                        if ("search", regime, name, trial, 0) not in read_lines(jsonl, proto):
                            attempt("search", regime, name, params, 0, trial=trial)
            if args.phase in ("final", "all"):
                for name in names:
                    best = best_setting(read_lines(jsonl, proto), regime, name)
                    if best is None:
                        print(f"final {regime} {name}: its search is not complete yet", flush=True)
                        continue
                    for seed in args.seeds:
                        if ("final", regime, name, None, seed) not in read_lines(jsonl, proto):
                            attempt("final", regime, name, best[1], seed)
    lines = read_lines(jsonl, proto)
    table = markdown_table(lines, config)
    with open(os.path.join(args.out_dir, "table.md"), "w") as f:
        f.write(table)
    plot(lines, os.path.join(args.out_dir, "methods.png"))
    print(table)
    return 0


# ------------------------------------------------------------------------------------------------ report
def summary(lines, regime, name):
    """`{metric: (mean, std, n)}` of the final runs, plus the search's default and best validation MAP@R."""
    finals = [r for r in lines.values() if r["phase"] == "final" and r["regime"] == regime and r["method"] == name]
    result = {}
    for metric in ("recall@1", "map@r", "r_precision"):
        values = np.array([r[metric] for r in finals])
        result[metric] = (values.mean(), values.std(), len(values)) if len(values) else None
    search = {
        r["trial"]: r
        for r in lines.values()
        if r["phase"] == "search" and r["regime"] == regime and r["method"] == name
    }
    result["default_val"] = search[0]["map@r"] if 0 in search else None
    best = best_setting(lines, regime, name)
    result["best_val"] = best[2] if best else None
    result["best"] = best
    result["trials_done"] = len(search)
    return result


def paired(lines, regime, a, b):
    """Per metric, mean and standard deviation over the common seeds of `a - b` (points) and how many
    seeds `a` is higher on."""
    finals = {(r["method"], r["seed"]): r for r in lines.values() if r["phase"] == "final" and r["regime"] == regime}
    seeds = sorted(s for (m, s) in finals if m == a and (b, s) in finals)
    if not seeds:
        raise SystemExit(f"no common final seeds of {a} and {b} in regime {regime}")
    result = {"regime": regime, "a": a, "b": b, "seeds": seeds}
    for metric in ("recall@1", "map@r", "r_precision"):
        d = np.array([100 * (finals[(a, s)][metric] - finals[(b, s)][metric]) for s in seeds])
        result[metric] = {
            "mean": round(float(d.mean()), 2),
            "std": round(float(d.std()), 2),
            "a_higher": int((d > 0).sum()),
        }
    return result


def _cell(value):
    if value is None:
        return "-"
    mean, std, n = value
    return f"{100 * mean:.1f} +- {100 * std:.1f}" + ("" if n == len(FINAL_SEEDS) else f" (n={n})")


def _setting(best):
    if best is None:
        return "search running"
    _, params, _ = best
    if not params:
        return "default"
    return ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in params.items())


def markdown_table(lines, config):
    lines_out = [
        (
            f"Glyphs, {config['image_size']} px, {config['images_per_class']} images per character; small CNN "
            f"{'-'.join(map(str, config['widths']))}, {config['embedding_dim']}-d, {config['steps']} steps of "
            f"{config['classes_per_batch']} x {config['samples_per_class']} batches, Adam. Per method and regime, "
            f"{TRIALS} settings (the default and {TRIALS - 1} random draws) scored by MAP@R on validation classes "
            f"held out of the training characters; the best retrained on all training characters with seeds "
            f"{FINAL_SEEDS[0]}-{FINAL_SEEDS[-1]} and tested on the unseen characters (mean +- standard deviation, "
            f"%). Pretrained: the backbone first trained {PRETRAIN_STEPS} steps with softmax on the same "
            "training characters."
        ),
        "",
        (
            "| method | from scratch: Recall@1 | MAP@R | R-precision | pretrained: Recall@1 | MAP@R | R-precision | "
            "validation MAP@R, default -> tuned (scratch / pretrained) | tuned setting (scratch) | "
            "tuned setting (pretrained) |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in METHODS:
        rows = {regime: summary(lines, regime, name) for regime in REGIMES}
        if not any(r["trials_done"] for r in rows.values()):
            continue
        validation = " / ".join(
            "-"
            if r["default_val"] is None
            else f"{100 * r['default_val']:.1f} -> {100 * r['best_val']:.1f}"
            if r["best_val"] is not None
            else f"{100 * r['default_val']:.1f} -> ({r['trials_done']}/{TRIALS} trials)"
            for r in rows.values()
        )
        cells = [_cell(rows[regime][metric]) for regime in REGIMES for metric in ("recall@1", "map@r", "r_precision")]
        label = bm.METHODS[name][0]
        lines_out.append(
            f"| {label} | " + " | ".join(cells) + f" | {validation} | "
            f"{_setting(rows['scratch']['best'])} | {_setting(rows['pretrained']['best'])} |"
        )
    return "\n".join(lines_out) + "\n"


def plot(lines, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n in METHODS if any(summary(lines, r, n)["recall@1"] for r in REGIMES)]
    if not names:
        return
    figure, axes = plt.subplots(1, 2, figsize=(12, 0.4 * len(names) + 1.5), sharey=True)
    y = np.arange(len(names))
    for axis, metric, title in zip(axes, ("recall@1", "map@r"), ("Recall@1", "MAP@R")):
        for offset, regime, colour in ((-0.2, "scratch", "tab:blue"), (0.2, "pretrained", "tab:orange")):
            values = [summary(lines, regime, n)[metric] for n in names]
            axis.barh(
                y + offset,
                [v[0] if v else 0 for v in values],
                height=0.38,
                xerr=[v[1] if v else 0 for v in values],
                color=colour,
                label=regime,
            )
        axis.set_title(f"{title} on unseen glyphs, tuned")
        axis.set_xlim(0, 1)
        axis.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(y)
    axes[0].set_yticklabels([bm.METHODS[n][0] for n in names])
    axes[0].invert_yaxis()
    axes[1].legend(loc="lower right")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


if __name__ == "__main__":
    sys.exit(main())
