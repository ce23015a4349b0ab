"""Label-noise benchmark: what symmetric label noise costs each tuned base loss on glyphs, and how much of it
the small-loss heuristic, PRISM and DML-ALA recover.

    nice -n 5 python -m benchmarks.label_noise.label_noise --noise 0.4            # every row at 40 % noise
    nice -n 5 python -m benchmarks.label_noise.label_noise --noise 0.4 --methods base --bases contrastive
    python -m benchmarks.label_noise.label_noise --table-only                     # table.md from results.jsonl
    nice -n 5 python -m benchmarks.label_noise.label_noise --data fashion_mnist --noise 0.0 --bases contrastive \
        --methods base                                                            # Fashion-MNIST's clean rows
    nice -n 5 python -m benchmarks.label_noise.label_noise --data fashion_mnist --noise 0.4 0.2 --bases contrastive \
        --methods base heuristic ala --ala-options '{"trusted": [5, 60]}'

Protocol (the reality check's, `benchmarks/reality_check/reality_check.py` and
`benchmarks/glyph_methods/benchmark_methods.py`): glyphs at 32 px, 20 images per character, 150 training / 151 test
characters; a small CNN 16-32-64-128 with a 64-d embedding trained from scratch with Adam for 300 steps of 22 x 3
class-balanced batches. Each base loss runs at its tuned clean setting of the reality check (scratch regime; read from
`benchmarks/reality_check/ results.jsonl`): `contrastive` (`ContrastiveLoss`), `triplet` (`TripletSemiHardLoss`),
`margin` (`MarginLoss`, distance-weighted sampling), each with its tuned learning rate.

Noise: per seed, `round(noise * 3000)` training images chosen at random get the label of another training
character chosen uniformly (symmetric noise); the batches are drawn on the noisy labels (what a user's
sampler sees). The test characters stay clean. For one seed every row (base loss and methods) trains on the
same noisy labels, the same batches and from the same initial weights, so differences are paired by seed.

Rows (`--methods`): `base` (the loss as users compile it), `heuristic` (`tfdml.losses.SmallLossWeighting`
around it: the fraction `drop_rate` of positive pairs of each batch with the largest anchor-positive distance
weigh 0), `prism` (`tfdml.losses.PRISM` around it: per sample, the probability that its label is clean from
the cross-batch memory's class centres; the least likely clean samples weigh 0), `ala` (DML-ALA at the
library defaults on the same base loss and batches).

Settings are chosen on a validation split, never on the test characters: the 150 training characters (with
the seed's noisy labels, as a user has them) are split by label into 100 training and 50 validation
characters (`reality_check.split_training_classes`); each candidate trains on the 100 with
`VALIDATION_SEEDS` and is scored by MAP@R on the 50 (noisy labels); the best is used for the test rows. The
heuristic's drop rate: `HEURISTIC_RATES`, per base loss. PRISM: its rate is the noise rate (the paper's
setting on synthetic noise, an oracle the heuristic does not get); its memory size, `PRISM_MEMORIES`, chosen
on the contrastive loss for all three. DML-ALA: the options given, or, when `--ala-options` is a JSON list, the
candidate with the best validation MAP@R (the split's verified set is drawn from its 100 training characters).
Phase "validation" lines hold those runs.

Regimes (`--regime`), as in the reality check: `scratch` (random initial weights) or `pretrained` (every row
of a seed starts from the same softmax-pretrained embedder, trained on that seed's noisy training labels; the
base losses at their tuned settings of that regime); a pretrained run's line has `"regime": "pretrained"`,
and the table shows the regime asked for.

Data (`--data`): `glyphs` (the protocol above) or `fashion_mnist` (`fashion.py`: training classes 0-4,
retrieval on the unseen classes 5-9, batches of 3 classes x 12 images; the same CNN, steps and tuned glyph
settings; its lines carry `"data": "fashion_mnist"`, in `results_fashion.jsonl` by default, with its own clean
base rows since the reality check has none).

Results: one JSON line per run appended to `results.jsonl` as it finishes (a stopped run loses nothing);
runs already there are skipped. `table.md` is written from every line.
"""

import argparse
import datetime
import functools
import hashlib
import json
import os
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

from benchmarks.glyph_methods import benchmark_methods as bm  # noqa: E402
from benchmarks.label_noise import cells as fmt  # noqa: E402
from benchmarks.label_noise import fashion, summary  # noqa: E402
from benchmarks.label_noise.noisy_labels import noisy_data, trusted_labels, validation_split  # noqa: E402
from benchmarks.label_noise.weights import WEIGHT_AUC_BATCHES, weight_auc  # noqa: E402
from benchmarks.reality_check import reality_check as rc  # noqa: E402

RESULTS = os.path.join(HERE, "results.jsonl")
FASHION_RESULTS = os.path.join(HERE, "results_fashion.jsonl")
TABLE = os.path.join(HERE, "table.md")
CONFIG = dict(bm.CONFIG)  # the reality check's protocol: 300 steps of 22 x 3 batches
# base loss -> its reality-check method (tuned clean setting, scratch regime)
# The triplet row is the all-triplets `TripletLoss`: the per-tuple weightings (heuristic, DML-ALA) need a loss
# that lists its terms, which the tensorflow-addons drop-in `TripletSemiHardLoss` does not.
BASES = {"contrastive": "contrastive", "triplet": "triplet_all", "margin": "margin_dw"}
NOISE_LEVELS = (0.0, 0.2, 0.4)
SEEDS = (0, 1, 2, 3, 4)
METHODS = ("base", "heuristic", "prism", "ala")
HEURISTIC_RATES = (0.25, 0.5)  # the candidate drop rates (the CPU time allowed two)
# PRISM's memory: 10 batches, or the whole training set (3,000 glyph images) as the paper's configurations hold
# about the training set (9,500 on CARS-98N); from scratch the embedder drifts fast and old entries go stale.
PRISM_MEMORIES = (660, 3000)
PRISM_WINDOW = 30  # the threshold is the mean over the last 30 batches (the paper's configuration)
# Two: with one, a choice could turn on one run's luck (the rows of the earlier runs used seed 0 alone).
VALIDATION_SEEDS = (0, 1)
VALIDATION_STREAM = 104729  # DML-ALA's validation subsets of seed s are drawn from [s, VALIDATION_STREAM]
# The reality check's regimes: "scratch" (random initial weights) or "pretrained" (every row starts from the
# seed's softmax-pretrained embedder, trained on the same noisy training labels, `rc.Pretrained`); set by
# --regime, recorded in each line (lines without it are scratch runs).
REGIME = "scratch"
# The data set, set by --data: "glyphs" or "fashion_mnist" (`fashion.CONFIG` then replaces CONFIG's protocol);
# recorded in each line that is not a glyph run.
DATA = "glyphs"


# ------------------------------------------------------------------------------------------------ settings
def tuned_setting(base):
    """`(reality-check method name, tuned parameters)` of base loss `base` in the current `REGIME`."""
    name = BASES[base]
    lines = rc.read_lines(os.path.join(rc.OUT_DIR, "results.jsonl"), rc.protocol(bm.CONFIG))
    best = rc.best_setting(lines, REGIME, name)
    if best is None:
        raise SystemExit(
            f"the reality check has no complete search of {name}: run benchmarks/reality_check/reality_check.py first"
        )
    return name, best[1]


def reality_check_clean_runs():
    """The reality check's final scratch runs of the tuned base losses as this benchmark's clean base rows
    (`{key: record}`): the same protocol, seeds, batches (drawn on the clean labels) and initial weights."""
    lines = rc.read_lines(os.path.join(rc.OUT_DIR, "results.jsonl"), rc.protocol(bm.CONFIG))
    out = {}
    for base, name in BASES.items():
        for r in lines.values():
            if r["phase"] == "final" and r["regime"] == "scratch" and r["method"] == name:
                record = {
                    "phase": "final",
                    "noise": 0.0,
                    "base": base,
                    "base_method": name,
                    "method": "base",
                    "options": {},
                    "seed": r["seed"],
                    "steps": CONFIG["steps"],
                    "recall@1": r["recall@1"],
                    "map@r": r["map@r"],
                    "source": "benchmarks/reality_check/results.jsonl",
                }
                out[key(record)] = record
    return out


def base_spec(base):
    """`(spec for benchmark_methods.train_tfdml, learning rate)` of the tuned base loss."""
    name, params = tuned_setting(base)
    return rc.method_spec(name, params)


def method_spec(base, method, options):
    """`(spec, learning rate)` of row `method` on base loss `base`; `options` the method's own settings."""
    spec, learning_rate = base_spec(base)
    if method == "base":
        return spec, learning_rate
    builder = spec["loss"]
    if method == "heuristic":
        from tfdml.losses import SmallLossWeighting

        def loss(num_classes):
            return SmallLossWeighting(builder(num_classes), drop_rate=options["drop_rate"])

    elif method == "prism":
        from tfdml.losses import PRISM

        def loss(num_classes):
            return PRISM(
                builder(num_classes),
                noise_rate=options["noise_rate"],
                memory_size=options["memory_size"],
                embedding_dim=CONFIG["embedding_dim"],
                window_size=PRISM_WINDOW,
            )

    elif method == "ala":
        # DML-ALA at the library defaults on the tuned base loss (`options`: ALAModel arguments, e.g. meta_interval).
        return {"ala_base": builder, "ala_options": dict(options)}, learning_rate
    else:
        raise ValueError(f"unknown method {method!r}; choose from {METHODS}")
    return dict(spec, loss=loss), learning_rate


# ------------------------------------------------------------------------------------------------ runs
def commit():
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def ala_model(spec, data, batches, config, seed, warm_start=None):
    """DML-ALA (`tfdml.models.ALAModel`), compiled, on the same batches as the other rows, each with a validation
    subset drawn in addition (`tfdml.ala_options.episode_sizes`): `(model, embedder, episodes, validation labels,
    validation batches)`. With the option `trusted: [classes, per_class]` the validation subsets come from a small
    verified set (`trusted_labels`) instead of the noisy training labels; with `heuristic: drop_rate` DML-ALA
    weighs the terms that the small-loss heuristic keeps (`SmallLossWeighting(base, drop_rate)` as its base
    loss)."""
    import keras
    import tensorflow as tf

    from tfdml.ala_options import episode_sizes
    from tfdml.models import ALAModel

    options = dict(spec["ala_options"])
    trusted = options.pop("trusted", None)
    drop_rate = options.pop("heuristic", None)
    sizes = episode_sizes(config["classes_per_batch"], config["samples_per_class"])
    val_labels = data["train_y"] if trusted is None else trusted_labels(data, *trusted, seed)
    extra = bm.validation_batches(
        val_labels,
        batches,
        sizes["val_size"] // sizes["samples_per_class"],
        sizes["samples_per_class"],
        seed,
        batch_labels=data["train_y"],
        stream=VALIDATION_STREAM,
    )
    embedder = bm.tfdml_embedder(config, seed=seed)
    if warm_start is not None:
        bm.transfer_weights(warm_start, embedder)
    images, labels = tf.constant(data["train_x"]), tf.constant(data["train_y"])
    dataset = bm.episodes(images, labels, batches, extra, tf.constant(val_labels))
    base_loss = spec["ala_base"](data["num_classes"])
    if drop_rate is not None:  # DML-ALA on the pairs the small-loss heuristic keeps
        from tfdml.losses import SmallLossWeighting

        base_loss = SmallLossWeighting(base_loss, drop_rate=drop_rate)
    model = ALAModel(
        embedder,
        base_loss=base_loss,
        embedding_dim=config["embedding_dim"],
        **options,
    )
    model.compile(optimizer=keras.optimizers.Adam(config["learning_rate"]))
    return model, embedder, dataset, val_labels, extra


def train_ala(spec, data, batches, config, seed, warm_start=None):
    """`ala_model`'s model trained on its episodes: the test embeddings and the model."""
    model, embedder, dataset, _, _ = ala_model(spec, data, batches, config, seed, warm_start)
    model.fit(dataset.prefetch(2), epochs=1, steps_per_epoch=len(batches), verbose=0)
    return bm.embed(embedder, data["test_x"]), model


def train_and_test(spec, learning_rate, data, seed, steps, warm_start=None):
    """Trains `spec` on `data`'s (noisy) training labels, from `warm_start`'s weights when given, and evaluates
    on its test part: the metrics and the training's wall and CPU seconds."""
    config = dict(CONFIG, steps=steps, learning_rate=learning_rate)
    batches = bm.index_batches(
        data["train_y"], config["classes_per_batch"], config["samples_per_class"], config["steps"], seed
    )
    started, cpu = time.time(), time.process_time()
    extra = {}
    if "ala_base" in spec:
        embeddings, model = train_ala(spec, data, batches, config, seed, warm_start)
        embedder = model.embedder
    else:
        embeddings, embedder = bm.train_tfdml(spec, data, batches, config, seed, warm_start=warm_start)
    wall, cpu = time.time() - started, time.process_time() - cpu
    if "ala_base" in spec:
        extra.update(weight_auc(model, data, batches[:WEIGHT_AUC_BATCHES]) or {})
    if "seen_x" in data:  # Fashion-MNIST: also the test images of the training classes
        seen = bm.evaluate(bm.embed(embedder, data["seen_x"]), data["seen_y"])
        extra.update({f"seen_{name}": value for name, value in seen.items()})
    metrics = bm.evaluate(embeddings, data["test_y"])
    return {**metrics, **extra, "train_wall_s": round(wall, 2), "train_cpu_s": round(cpu, 2)}


def key(record):
    fields = ("phase", "noise", "base", "base_method", "method", "options", "seed")
    extra = [record.get("regime", "scratch")] + ([record["machine"]] if "machine" in record else [])
    return json.dumps([record[f] for f in fields] + extra, sort_keys=True)


@functools.cache
def machine():
    """The machine a run belongs to: runs repeat exactly on one machine but not across machines (the CPU's
    instruction sets choose TensorFlow's kernels; the warm start's cache is built on the machine too), and a run
    moves by up to about 2 R@1 from one to another, so a paired comparison pairs runs of one machine. The CPU
    model, a hash of its instruction-set flags and the TensorFlow version."""
    import tensorflow as tf

    model, flags = "unknown CPU", ""
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            fields = {name.strip(): value.strip() for name, value in (line.split(":", 1) for line in f if ":" in line)}
        model = fields.get("model name", model)
        flags = " ".join(sorted(fields.get("flags", "").split()))
    digest = hashlib.sha1(flags.encode()).hexdigest()[:8]
    return f"{model}, flags {digest}, TensorFlow {tf.__version__}"


def read_results(path=RESULTS, steps=None):
    """The lines of `path` (the latest per key), those of `steps` training steps only when given; the clean
    base rows not run here are the reality check's (`reality_check_clean_runs`)."""
    glyph_scratch = REGIME == "scratch" and DATA == "glyphs"
    latest = reality_check_clean_runs() if steps in (None, CONFIG["steps"]) and glyph_scratch else {}
    return bm.latest_records(path, key, lambda record: steps is None or record["steps"] == steps, latest)


def run(phase, noise, base, method, options, seed, full, steps, path=RESULTS, done=None):
    """One run (skipped when `done` has it): appends its line to `path` and returns it."""
    record = {
        "phase": phase,
        "noise": noise,
        "base": base,
        "base_method": BASES[base],
        "method": method,
        "options": options,
        "seed": seed,
        "steps": steps,
        **({"regime": REGIME} if REGIME != "scratch" else {}),
        **({"data": DATA} if DATA != "glyphs" else {}),
        "machine": machine(),
    }
    if done is not None and key(record) in done:
        return done[key(record)]
    data = noisy_data(full, noise, seed)
    if phase == "validation":
        data = validation_split(data)
    spec, learning_rate = method_spec(base, method, options)
    warm_start = None
    if REGIME == "pretrained":  # the softmax-pretrained embedder of this seed, data part and noise level
        cache = os.path.join(HERE, "cache", f"noise{round(1000 * noise)}")
        warm_start = rc.Pretrained(CONFIG, cache).get(phase if phase == "validation" else "final", data, seed)
    record.update(train_and_test(spec, learning_rate, data, seed, steps, warm_start))
    record.update(
        learning_rate=learning_rate,
        commit=commit(),
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    )
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
    if done is not None:
        done[key(record)] = record
    print(
        f"{phase} noise {noise} {base} {method} {options} seed {seed}: R@1 {record['recall@1']:.3f} "
        f"MAP@R {record['map@r']:.3f} ({record['train_wall_s']:.0f} s wall, {record['train_cpu_s']:.0f} s CPU)"
        + (
            f", weight AUC {record['weight_auc']:.2f}, ratio {record['weight_ratio']:.2f}"
            if "weight_ratio" in record
            else ""
        ),
        flush=True,
    )
    return record


def row_options(method, noise, base, full, steps, path=RESULTS, done=None, ala_options=None):
    """The options of row `method` at `noise` (None: no such row), running the validation it needs;
    `ala_options` those of the DML-ALA row (ALAModel arguments, and `trusted`), or a list of candidates chosen
    among on the validation split like the heuristic's rate (clean labels: the choice at 40 % noise)."""
    # Clean labels: the setting validated at 40 % noise (what it costs where nothing is wrong, at the setting a
    # user would have chosen for noisy data).
    validation_noise = noise if noise > 0 else 0.4
    if method == "ala":
        if isinstance(ala_options, list):
            return validated(method, ala_options, validation_noise, base, full, steps, path, done)
        return dict(ala_options or {})
    if method == "heuristic":
        candidates = [{"drop_rate": rate} for rate in HEURISTIC_RATES]
        return validated(method, candidates, validation_noise, base, full, steps, path, done)
    if method == "prism":
        if noise == 0:
            return None  # the paper's rate is the noise rate: nothing to drop on clean labels
        # The paper's setting on synthetic noise: the noise rate. The memory size is chosen on the validation
        # split of the contrastive loss, for every base loss (CPU time).
        candidates = [{"noise_rate": noise, "memory_size": size} for size in PRISM_MEMORIES]
        chosen = validated(method, candidates, noise, "contrastive", full, steps, path, done)
        return chosen
    return {}


def validated(method, candidates, noise, base, full, steps, path=RESULTS, done=None):
    """The options among `candidates` of row `method` with the best mean validation MAP@R (ties: the first),
    each trained (or read from `path`) on the validation split with `VALIDATION_SEEDS`."""
    scores = []
    for options in candidates:
        values = [
            run("validation", noise, base, method, options, seed, full, steps, path, done)["map@r"]
            for seed in VALIDATION_SEEDS
        ]
        scores.append(float(np.mean(values)))
    return candidates[int(np.argmax(scores))]


# ------------------------------------------------------------------------------------------------ table
def table(records, steps=None, caption=None):
    """Markdown: per base loss and noise level, each row's R@1 and MAP@R (mean +- standard error over seeds),
    the paired difference to the base loss, and the fraction of the noise's cost recovered. `caption`: the
    table's first words in place of the data set's (then without the validation and exploration lists)."""
    steps = CONFIG["steps"] if steps is None else steps
    current = [
        r
        for r in records.values()
        if r["steps"] == steps and r["base_method"] == BASES[r["base"]] and r.get("regime", "scratch") == REGIME
    ]
    finals = [r for r in current if r["phase"] == "final"]
    letters = fmt.machine_letters(current)
    by = {}  # (base, noise, method, options, machine) -> {seed: line}
    for r in finals:
        options = json.dumps(r["options"], sort_keys=True)
        by.setdefault((r["base"], r["noise"], r["method"], options, r.get("machine", "")), {})[r["seed"]] = r
    default_caption = caption is None
    with_map = DATA == "fashion_mnist"  # where the noise costs MAP@R more than R@1: its recovered fraction too
    caption = caption or (
        f"Glyphs, 150 training / 151 test characters, symmetric label noise on the training labels; small CNN, "
        f"{steps} steps of 22 x 3 batches"
        + (" from the seed's softmax-pretrained embedder" if REGIME == "pretrained" else "")
        + f", each base loss at its tuned clean setting (reality check, {REGIME}). "
    )
    if DATA == "fashion_mnist" and default_caption:
        caption = fashion.CAPTION.format(images=f"{CONFIG['images_per_class']:,}", steps=steps)
    lines = [
        caption
        + "Mean +- standard error over seeds (%). Delta: the row minus the base loss at the same noise, paired by "
        "seed. Noise cost: clean base minus noisy base, paired by seed (the clean base rows are the reality "
        "check's final runs, the same protocol, batches and initial weights, unless run here). Recovered: mean "
        "Delta R@1 / mean noise cost over the seeds that have both (+- the standard error of Delta over the "
        "cost). Minus the heuristic: the row's R@1 minus the small-loss heuristic's at the same noise, paired by "
        "seed, and on how many seeds the row is above." + fmt.machine_legend(letters),
        "",
        "| base loss | noise | row | n | R@1 | MAP@R | Delta R@1 | Delta MAP@R | noise cost R@1 | recovered | "
        "R@1 minus the heuristic, paired |" + (" noise cost MAP@R | recovered MAP@R |" if with_map else ""),
        "|---|---|---|---|---|---|---|---|---|---|---|" + ("---|---|" if with_map else ""),
    ]
    validation = [r for r in current if r["phase"] == "validation" and default_caption]
    for base, noise, host in ((b, n, m) for b in BASES for n in NOISE_LEVELS for m in letters):
        clean = by.get((base, 0.0, "base", "{}", host), {})
        reference = by.get((base, noise, "base", "{}", host), {})
        heuristic = fmt.validated_heuristic(by[k] for k in by if k[:3] == (base, noise, "heuristic") and k[4] == host)
        rows = sorted(
            (k for k in by if k[0] == base and k[1] == noise and k[4] == host),
            key=lambda k: (METHODS.index(k[2]) if k[2] in METHODS else 99, k[3]),
        )
        for _, _, method, options, _ in rows:
            runs = by[(base, noise, method, options, host)]
            seeds = sorted(runs)
            r1 = [runs[s]["recall@1"] for s in seeds]
            mapr = [runs[s]["map@r"] for s in seeds]
            common = sorted(set(seeds) & set(reference))
            delta = [runs[s]["recall@1"] - reference[s]["recall@1"] for s in common]
            delta_map = [runs[s]["map@r"] - reference[s]["map@r"] for s in common]
            costed = sorted(set(common) & set(clean)) if noise > 0 else []
            extra = [_recovered(runs, reference, clean, costed, "map@r", method == "base")] if with_map else []
            label = fmt.row_label(method, json.loads(options)) + fmt.machine_tag(letters, host)
            cells = [base, f"{noise:.0%}", label, str(len(seeds))]
            cells += [fmt.cell(r1), fmt.cell(mapr)]
            if method == "base":
                cost = [clean[s]["recall@1"] - reference[s]["recall@1"] for s in costed]
                cells += ["-", "-", fmt.cell(cost) if cost else "-", "-"]
            else:
                cells += [fmt.signed(delta), fmt.signed(delta_map), "-"]
                cells.append(fmt.recovered_cell(runs, reference, clean, costed))
            cells.append(fmt.paired_versus(runs, heuristic) if method not in ("base", "heuristic") else "-")
            lines.append("| " + " | ".join(cells + sum(extra, [])) + " |")
    exploration = [r for r in current if r["phase"] == "exploration" and default_caption]
    if exploration:
        lines += [
            "",
            "Exploration (`--phase exploration`): DML-ALA settings tried on one seed and scored on the test "
            "characters, so the setting picked from them is not an unbiased estimate on that seed; the final rows "
            "of a setting picked here leave that seed out. Weight AUC: P(a correctly labelled positive pair "
            "outweighs a mislabelled one) over the positive pairs of 20 training batches after training; ratio: "
            "mean weight of the mislabelled over the correct ones.",
            "",
            "| base loss | noise | row | seed | R@1 | Delta R@1 | weight AUC | weight ratio |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in sorted(exploration, key=lambda r: (r["base"], r["noise"], json.dumps(r["options"], sort_keys=True))):
            reference = by.get((r["base"], r["noise"], "base", "{}", r.get("machine", "")), {}).get(r["seed"])
            delta = f"{100 * (r['recall@1'] - reference['recall@1']):+.1f}" if reference else "-"
            auc = f"{r['weight_auc']:.2f}" if "weight_auc" in r else "-"
            ratio = f"{r['weight_ratio']:.2f}" if "weight_ratio" in r else "-"
            label = fmt.row_label(r["method"], r["options"]) + fmt.machine_tag(letters, r.get("machine", ""))
            cells = [r["base"], f"{r['noise']:.0%}", label, str(r["seed"])]
            lines.append("| " + " | ".join(cells + [f"{100 * r['recall@1']:.1f}", delta, auc, ratio]) + " |")
    if validation:
        lines += [
            "",
            "Settings chosen on the validation split ("
            + (
                fashion.VALIDATION_WORDS
                if DATA == "fashion_mnist"
                else "100 of the training characters to train, 50 to score"
            )
            + ", noisy labels; MAP@R %, one line per seed):",
            "",
            "| base loss | noise | row | seed | validation MAP@R |",
            "|---|---|---|---|---|",
        ]
        for r in sorted(validation, key=lambda r: (r["base"], r["noise"], r["method"], json.dumps(r["options"]))):
            label = fmt.row_label(r["method"], r["options"]) + fmt.machine_tag(letters, r.get("machine", ""))
            lines.append(f"| {r['base']} | {r['noise']:.0%} | {label} | {r['seed']} | {100 * r['map@r']:.1f} |")
    return "\n".join(lines) + "\n"


def _recovered(runs, reference, clean, seeds, metric, base):
    """The noise cost's and recovered fraction's cells of `metric` (`base`: the cost; else the fraction)."""
    if base:
        cost = [clean[s][metric] - reference[s][metric] for s in seeds]
        return [fmt.cell(cost) if cost else "-", "-"]
    return ["-", fmt.recovered_cell(runs, reference, clean, seeds, metric)]


def tables(records, steps):
    """`table(records, steps)`, and on Fashion-MNIST the same rows scored on the test images of the training
    classes (the lines' `seen_` metrics) after it."""
    text = table(records, steps)
    if DATA != "fashion_mnist":
        return text
    seen = {
        k: dict(r, **{name: r["seen_" + name] for name in ("recall@1", "map@r")})
        for k, r in records.items()
        if "seen_recall@1" in r
    }
    return text + "\n" + table(seen, steps, caption=fashion.SEEN_CAPTION.format(steps=steps))


# ------------------------------------------------------------------------------------------------ main
def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    parser.add_argument(
        "--data",
        choices=("glyphs", "fashion_mnist"),
        default="glyphs",
        help="glyphs: the protocol of table.md; fashion_mnist: training classes 0-4, retrieval on 5-9 (fashion.py), "
        "results in results_fashion.jsonl unless --out names another file",
    )
    parser.add_argument("--noise", type=float, nargs="+", default=[0.4], help="noise levels of the runs")
    parser.add_argument("--bases", nargs="+", default=list(BASES), choices=list(BASES))
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        help="default: the data set's protocol (300); 300: the protocol of table.md; 600: the issue's original "
        "length (results_600.jsonl)",
    )
    parser.add_argument(
        "--regime",
        choices=("scratch", "pretrained"),
        default="scratch",
        help="scratch: random initial weights; pretrained: every row starts from the seed's softmax-pretrained "
        "embedder (the reality check's warm start, on the same noisy labels; cached under cache/), at the base "
        "losses' tuned settings of that regime",
    )
    parser.add_argument("--threads", type=int, default=1, help="TensorFlow CPU threads (0: its default)")
    parser.add_argument(
        "--ala-options",
        type=json.loads,
        default={},
        help='the DML-ALA row\'s options as JSON: ALAModel arguments, and "trusted": [classes, images per class] '
        "for validation subsets from a verified set (default {}: the library defaults, noisy validation labels); "
        "a JSON list of such objects: candidates, the one with the best validation MAP@R is the row's",
    )
    parser.add_argument(
        "--phase",
        choices=("final", "exploration"),
        default="final",
        help="final: a row of the table; exploration: a setting tried on the test characters (listed apart)",
    )
    parser.add_argument("--out", default=None, help="the results file (default: the data set's)")
    parser.add_argument("--table-only", action="store_true")
    args = parser.parse_args(argv)
    global REGIME, DATA
    REGIME, DATA = args.regime, args.data
    if DATA == "fashion_mnist":
        CONFIG.update(fashion.CONFIG)
    args.steps = CONFIG["steps"] if args.steps is None else args.steps
    args.out = args.out or (FASHION_RESULTS if DATA == "fashion_mnist" else RESULTS)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    table_path = TABLE if args.out == RESULTS else os.path.splitext(args.out)[0] + "_table.md"
    if not args.table_only:
        import tensorflow as tf

        if args.threads:
            tf.config.threading.set_intra_op_parallelism_threads(args.threads)
            tf.config.threading.set_inter_op_parallelism_threads(args.threads)
        full = fashion.load_data(CONFIG) if DATA == "fashion_mnist" else bm.load_data(CONFIG)
        done = read_results(args.out, args.steps)  # another step count's runs (and clean rows) are not these
        for noise in args.noise:
            for base in args.bases:  # the validation runs first
                for method in args.methods:
                    row_options(method, noise, base, full, args.steps, args.out, done, args.ala_options)
            # Seeds outermost: a stopped run leaves every row with the same seeds, paired.
            for seed in args.seeds:
                for base in args.bases:
                    for method in args.methods:
                        option = row_options(method, noise, base, full, args.steps, args.out, done, args.ala_options)
                        if option is None:
                            continue
                        run(args.phase, noise, base, method, option, seed, full, args.steps, args.out, done)
                        with open(table_path, "w") as f:
                            f.write(tables(read_results(args.out, args.steps), args.steps))
    text = tables(read_results(args.out, args.steps), args.steps)
    with open(table_path, "w") as f:
        f.write(text)
    summary.main(quiet=True)  # the cell-by-cell summary reads every results file, this one included
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
