"""The short markdown table of a results file (`table.md`)."""


def _ms(value):
    return "-" if value is None else f"{value:.3g}"


def _ratio(value):
    return "-" if value is None else f"{value:.3g}x"


def _environment(env):
    gpu = env.get("gpu") or {}
    device = gpu.get("name") or env.get("jax_devices", ["?"])[0]
    driver = gpu.get("driver_version")
    versions = ", ".join(f"{k} {env[k]}" for k in ("jax", "torch", "keras", "pytorch_metric_learning") if env.get(k))
    driver = f" (driver {driver})" if driver else ""
    return f"Device: {device}{driver}; Keras backend {env['keras_backend']}; {versions}."


def _in_step(section):
    lines = [
        f"In-step cost: {section['backbone']}, batch {section['batch_size']}, {section['precision']}, one jitted step "
        f"(share = (t_loss - t_zero_cost) / t_loss; zero-cost step spread over rounds: {_pct(section['noise'])}).",
        "",
        "| step | ms / step | loss's share | step / softmax step |",
        "| --- | --- | --- | --- |",
    ]
    for row in section["rows"]:
        if "error" in row:
            lines.append(f"| {row['name']} | failed: {_cell(row['error'])} | | |")
            continue
        share = _pct(row.get("share"))
        lines.append(f"| {row['name']} | {_ms(row['ms_per_step'])} | {share} | {_ratio(row.get('vs_softmax'))} |")
    return lines


def _pct(value):
    return "-" if value is None else f"{100.0 * value:.1f} %"


def _cell(text):
    return str(text).replace("|", "/")[:120]


def _side(row, prefix):
    if f"{prefix}_error" in row:
        return "failed"
    return _ms(row.get(f"{prefix}_ms"))


def _calls(sections):
    """One row per loss and B: tfdml / PML best ms and PML's time over tfdml's, per backend pair."""
    names = [name for name in ("accelerator", "cpu") if sections.get(name)]
    header = "| loss | B |" + "".join(f" tfdml, {n} | PML, {n} | PML / tfdml, {n} |" for n in names)
    lines = [header, "|" + " --- |" * (2 + 3 * len(names))]
    keys = []
    for name in names:
        for row in sections[name]:
            if (row["loss"], row["B"]) not in keys:
                keys.append((row["loss"], row["B"]))
    for loss, batch_size in keys:
        cells = [loss, str(batch_size)]
        for name in names:
            row = next((r for r in sections[name] if (r["loss"], r["B"]) == (loss, batch_size)), {})
            peer = "n/a" if "peer_skipped" in row else _side(row, "peer")
            cells += [_side(row, "tfdml"), peer, _ratio(row.get("speedup"))]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def markdown(results):
    """The table of `results` (the JSON written by `bench_gpu.py`)."""
    lines = [_environment(results["environment"]), ""]
    if results.get("in_step"):
        lines += _in_step(results["in_step"]) + [""]
    calls = results.get("loss_calls") or {}
    if any(calls.values()):
        devices = "; ".join(f"{name}: {desc}" for name, desc in (results.get("loss_call_devices") or {}).items())
        lines += [f"Loss calls, forward + backward, best ms per call ({devices}):", ""] + _calls(calls) + [""]
    return "\n".join(lines)
