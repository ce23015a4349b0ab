"""The Markdown tables of `bench_beam.py`'s results and the 100M plan computed from them (see README.md)."""

CATALOGUE = 100_000_000
SHARD_ROWS = 1_000_000  # rows a shard in the plan: 2 GB of 512-d float32, what one worker holds at a time
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
    return images / (large[name]["seconds"] - small[name]["seconds"])


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
            lines.append(f"| {name}, marginal ({sizes}) | | | **{marginal_rate(results, key):.0f}** | |")
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
    # Index builds: one shard per worker at a time (ScaNN's build is mostly single-threaded).
    index_hours = shards / WORKERS * SHARD_ROWS * build_per_row / 3600
    # Evaluation of a 1% query sample (1M queries) against every shard, the per-query time at 100k rows
    # scaled by sqrt(rows) (leaves of ~sqrt(N) points, a constant fraction searched).
    sample = CATALOGUE // 100
    per_query = query_seconds * (SHARD_ROWS / big["rows"]) ** 0.5
    eval_hours = sample * shards * per_query / cores / 3600
    storage = {dim: CATALOGUE * (dim * 4 + 80) / 1e12 for dim in (128, 512)}
    rows = [
        "| 100M plan (computed by table.py from the rows above) | value |",
        "|---|---:|",
        f"| `tfdml embed` marginal rate per core, this model | {per_core:.0f} images/s |",
        f"| shards of {SHARD_ROWS:,} rows | {shards} |",
        f"| workers x cores | {WORKERS} x {WORKER_CORES} |",
        f"| embedding, this model | {embed_hours:.1f} h |",
        f"| embedding, a model 20x as costly (ResNet-50 class at 224 px) | {embed_hours * 20:.1f} h |",
        f"| shard indexes ({build_per_row * 1e6:.0f} us a row at {big['rows']:,}), one per worker | "
        f"{index_hours:.2f} h |",
        f"| evaluation, 1% of the queries against all {shards} shards | {eval_hours:.2f} h |",
        f"| embedding files, 128-d / 512-d (float32 + ~80 B id and class) | {storage[128]:.2f} / "
        f"{storage[512]:.2f} TB |",
    ]
    return "\n".join(rows)
