"""The Markdown tables of `bench_beam.py`'s results and the 100M plan computed from them (see README.md)."""

CATALOGUE = 100_000_000
SHARD_ROWS = 1_000_000  # rows a shard: 0.5 GB of 128-d float32 (as measured), what one worker holds at a time
WORKERS, WORKER_CORES = 50, 16
NAMES = {
    "export": "in-process export path (`read_image` + `ExportedEmbedder.embed`)",
    "beam_inprocess": "`tfdml embed`, DirectRunner in-memory (1 process)",
    "beam_multiprocess": "`tfdml embed`, DirectRunner multi_processing, 2 workers",
}


def marginal_rate(results, name):
    """Images/s between the two sizes: the rate without the fixed start-up cost (pipeline, model load)."""
    small, large = results["embed"][0], results["embed"][-1]
    images = large[name]["images"] - small[name]["images"]
    seconds = large[name]["seconds"] - small[name]["seconds"]
    return images / seconds if seconds > 0 else None  # None: the start-up's noise exceeded the difference


def table(results):
    lines = ["| run | images | seconds | images/s | peak memory (MiB) |", "|---|---:|---:|---:|---:|"]
    for row in results["embed"]:
        for key, name in NAMES.items():
            run = row[key]
            memory = f"{run['peak_rss_mib']:.0f}"
            if run.get("peak_rss_worker_mib"):
                memory += f" driver, {run['peak_rss_worker_mib']:.0f} largest worker"
            rate = run["images"] / run["seconds"]
            lines.append(f"| {name} | {run['images']:,} | {run['seconds']:.1f} | {rate:.0f} | {memory} |")
    if len(results["embed"]) > 1:
        sizes = f"{results['embed'][0]['images']:,} -> {results['embed'][-1]['images']:,}"
        for key, name in NAMES.items():
            rate = marginal_rate(results, key)
            shown = f"**{rate:.0f}**" if rate else "not measurable (start-up noise)"
            lines.append(f"| {name}, marginal ({sizes}) | | | {shown} | |")
    lines += ["", "| shard index (128-d rows) | mode | build s | recall@10 | search s / 10k queries | peak MiB |"]
    lines.append("|---:|---|---:|---:|---:|---:|")
    for run in results["shard_index"]:
        recall = run["recall"]["measured"] if run.get("recall") else float("nan")
        lines.append(
            f"| {run['rows']:,} | {run['mode']} | {run['build_seconds']:.1f} | {recall:.3f} | "
            f"{run['search_seconds_per_10k_queries']:.2f} | {run['peak_rss_mib']:.0f} |"
        )
    lines += ["", "| evaluation step: shards x rows (256-d) | catalogue rows | s (one query shard) | peak MiB |"]
    lines.append("|---|---:|---:|---:|")
    for run in results["evaluation_memory"]:
        lines.append(
            f"| {run['shards']} x {run['rows_per_shard']:,} | {run['catalogue_rows']:,} | {run['seconds']:.1f} | "
            f"{run['peak_rss_mib']:.0f} |"
        )
    return "\n".join(lines + ["", plan(results)])


def plan(results):
    """The 100M plan's numbers from the measured rates (README.md explains each line)."""
    per_core = marginal_rate(results, "beam_inprocess") / results["machine"]["cpus"]
    shards = CATALOGUE // SHARD_ROWS
    big = max(results["shard_index"], key=lambda run: run["rows"])
    build_per_row = big["build_seconds"] / big["rows"]
    query_seconds = big["search_seconds_per_10k_queries"] / 10000
    cores = WORKERS * WORKER_CORES
    embed_hours = CATALOGUE / (per_core * cores) / 3600
    backbone = results["backbone"]
    backbone_per_core = backbone["images"] / backbone["seconds"] / results["machine"]["cpus"]
    # A ResNet-50 catalogue: the pipeline's own cost per image (measured with the small CNN, whose model cost
    # is small) plus the ResNet-50's, per core.
    resnet_hours = CATALOGUE * (1 / per_core + 1 / backbone_per_core) / cores / 3600
    # Index builds: one shard per worker at a time (ScaNN's build is mostly single-threaded).
    index_hours = shards / WORKERS * SHARD_ROWS * build_per_row / 3600
    # Evaluation: every image queries every shard (k = 10). The search time of 10,000 queries was measured with
    # ScaNN's batched search on all the machine's cores: core-seconds a query = seconds x cores / 10,000, scaled
    # by sqrt(rows) to 1M-row shards (leaves of ~sqrt(N) points, a constant fraction of them searched).
    per_query = query_seconds * results["machine"]["cpus"] * (SHARD_ROWS / big["rows"]) ** 0.5
    eval_hours = CATALOGUE * shards * per_query / cores / 3600
    worker_mib = max(run[key]["peak_rss_mib"] for run in results["embed"] for key in NAMES)
    shard_mib = SHARD_ROWS * 128 * 4 / 2**20
    storage = {dim: CATALOGUE * (dim * 4 + 80) / 1e12 for dim in (128, 512)}
    rows = [
        "| 100M plan (computed by table.py from the rows above) | value |",
        "|---|---:|",
        f"| `tfdml embed` marginal rate per core, this model | {per_core:.0f} images/s |",
        f"| shards of {SHARD_ROWS:,} rows | {shards} |",
        f"| workers x cores | {WORKERS} x {WORKER_CORES} |",
        f"| embedding, this model | {embed_hours:.1f} h |",
        f"| ResNet-50 at 224 px alone, measured per core | {backbone_per_core:.1f} images/s |",
        f"| embedding with a ResNet-50 (pipeline + model per image) | {resnet_hours:.1f} h |",
        f"| shard indexes ({build_per_row * 1e6:.0f} us a row at {big['rows']:,}), one per worker | "
        f"{index_hours:.2f} h |",
        f"| evaluation, all 100M queries against all {shards} shards (k = 10) | {eval_hours:.1f} h |",
        f"| memory a worker: measured process + one shard's vectors and index copy | {worker_mib / 1024:.1f} + "
        f"{2 * shard_mib / 1024:.1f} GB |",
        f"| embedding files, 128-d / 512-d (float32 + ~80 B id and class) | {storage[128]:.2f} / "
        f"{storage[512]:.2f} TB |",
    ]
    return "\n".join(rows)
