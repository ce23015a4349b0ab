"""In-step cost of each loss: one jit-compiled training step of a backbone with a head and a loss, on JAX.

The step is the one Keras' JAX trainer runs (`model.fit` with `jit_compile=True`): the stateless forward pass of
the model, `jax.value_and_grad`, the optimizer's `stateless_apply`, all in one `jax.jit` program whose state is
donated. It is written out here so that a loss's own variables (Proxy-Anchor's proxies) are trained in the same
program: they are mapped onto the loss's Keras variables by a `keras.StatelessScope`.

Every configuration shares the backbone's initial weights and one batch of synthetic images resident on the
device, so a step's time is the device's work alone. Configurations:

- `softmax`: the backbone, a `Dense(num_classes)` classifier and sparse softmax cross-entropy (the usual step);
- `zero_cost`: the backbone, the embedding head (`Dense(D)`, L2 normalisation) and the mean of the embeddings
  as the loss: it costs one reduction and its gradient still runs the whole backward pass (the reference);
- one per metric loss: the embedding head and that loss (Group Loss: the embedding head, a `Dense(num_classes)`
  on the embeddings and the concatenation `[embeddings, logits]` the loss reads; that layer counts as its cost).

A loss's share of the step is `(t_loss - t_zero_cost) / t_loss`, with `t` the median over rounds of the mean
step time of a round. The rounds go round-robin over the configurations, so that drift (clocks, temperature)
reaches all alike; `noise` is the zero-cost step's spread over rounds, `(max - min) / median`.
"""

import concurrent.futures
import time

import loss_calls
import loss_table
import numpy as np

SOFTMAX, ZERO_COST = "softmax", "zero_cost"


def build_backbone(kind, image_size):
    """`resnet50`: Keras' ResNet-50, random weights, global average pooling; `tiny`: two convolutions with batch
    normalisation (for `--small`: the same step, compiled in seconds on a CPU)."""
    import keras

    if kind == "resnet50":
        return keras.applications.ResNet50(
            weights=None, include_top=False, pooling="avg", input_shape=(image_size, image_size, 3)
        )
    layers = keras.layers
    return keras.Sequential(
        [
            keras.Input((image_size, image_size, 3)),
            layers.Conv2D(16, 3, strides=2, use_bias=False),
            layers.BatchNormalization(),
            layers.ReLU(),
            layers.Conv2D(32, 3, strides=2, use_bias=False),
            layers.BatchNormalization(),
            layers.ReLU(),
            layers.GlobalAveragePooling2D(),
        ],
        name="tiny_backbone",
    )


def build_head(kind, feature_dim, embedding_dim, num_classes):
    """`classifier`: float32 logits; `embedding`: `Dense(D)` then L2 normalisation in float32; `embedding_logits`:
    the embedding concatenated with `Dense(num_classes)` logits computed from it."""
    import keras

    layers = keras.layers
    inputs = keras.Input((feature_dim,))
    if kind == "classifier":
        return keras.Model(inputs, layers.Dense(num_classes, dtype="float32")(inputs), name="classifier_head")
    embeddings = layers.Activation("linear", dtype="float32")(layers.Dense(embedding_dim)(inputs))
    embeddings = layers.UnitNormalization(dtype="float32")(embeddings)
    if kind == "embedding":
        return keras.Model(inputs, embeddings, name="embedding_head")
    logits = layers.Dense(num_classes, dtype="float32")(embeddings)
    return keras.Model(inputs, layers.Concatenate(dtype="float32")([embeddings, logits]), name="group_head")


def specs(cases, num_classes, embedding_dim):
    """`[(name, head kind, loss callable, loss variables)]`: softmax, zero-cost, then one per loss case. A case
    whose tfdml loss cannot be built is returned as `(name, None, error, None)`."""
    import keras

    out = [
        (SOFTMAX, "classifier", keras.losses.SparseCategoricalCrossentropy(from_logits=True), []),
        (ZERO_COST, "embedding", lambda labels, embeddings: keras.ops.mean(embeddings), []),
    ]
    for case in cases:
        try:
            loss = case.make_tfdml(num_classes, embedding_dim)
            variables = list(loss.trainable_variables)  # created now, outside any traced function
        except Exception as exc:  # recorded; the other losses go on
            out.append((case.name, None, loss_calls.error_text(exc), None))
            continue
        out.append((case.name, "embedding_logits" if case.with_logits else "embedding", loss, variables))
    return out


def make_step(backbone, head, loss, loss_variables, optimizer):
    """The jitted training step `(state, images, labels) -> (state, loss value)`; `state` (donated) is
    `(trainable values, non-trainable values, optimizer values)` in the order of `initial_state`."""
    import jax
    import keras

    n_backbone, n_head = len(backbone.trainable_variables), len(head.trainable_variables)
    n_backbone_state = len(backbone.non_trainable_variables)

    def forward(trainable, non_trainable, images, labels):
        features, backbone_state = backbone.stateless_call(
            trainable[:n_backbone], non_trainable[:n_backbone_state], images, training=True
        )
        outputs, head_state = head.stateless_call(
            trainable[n_backbone : n_backbone + n_head], non_trainable[n_backbone_state:], features, training=True
        )
        mapping = list(zip(loss_variables, trainable[n_backbone + n_head :]))
        with keras.StatelessScope(state_mapping=mapping):
            value = loss(labels, outputs)
        return value, list(backbone_state) + list(head_state)

    value_and_grad = jax.value_and_grad(forward, has_aux=True)

    def step(state, images, labels):
        trainable, non_trainable, optimizer_values = state
        (value, non_trainable), grads = value_and_grad(trainable, non_trainable, images, labels)
        trainable, optimizer_values = optimizer.stateless_apply(optimizer_values, grads, trainable)
        return (trainable, non_trainable, optimizer_values), value

    return jax.jit(step, donate_argnums=0)


def initial_state(backbone, head, loss_variables, optimizer):
    """Fresh device copies of the variables' current values (each configuration owns its donated state)."""
    import jax.numpy as jnp

    def copies(variables):
        return [jnp.array(v.value, copy=True) for v in variables]

    trainable = backbone.trainable_variables + head.trainable_variables + list(loss_variables)
    non_trainable = backbone.non_trainable_variables + head.non_trainable_variables
    return copies(trainable), copies(non_trainable), copies(optimizer.variables)


def _lower_all(entries, backbone, heads, images, labels, learning_rate):
    """Traces and lowers every configuration's step in this thread (Keras' tracing state is per thread); a
    configuration that fails gets its error."""
    import keras

    lowered = {}
    for name, head_kind, loss, loss_variables in entries:
        if head_kind is None:
            lowered[name] = {"error": loss}
            continue
        try:
            head = heads[head_kind]
            optimizer = keras.optimizers.Adam(learning_rate)
            optimizer.build(backbone.trainable_variables + head.trainable_variables + loss_variables)
            state = initial_state(backbone, head, loss_variables, optimizer)
            start = time.perf_counter()
            program = make_step(backbone, head, loss, loss_variables, optimizer).lower(state, images, labels)
            lowered[name] = {"lowered": program, "state": state, "lower_s": time.perf_counter() - start}
        except Exception as exc:
            lowered[name] = {"error": loss_calls.error_text(exc)}
    return lowered


def _compile_all(lowered, threads):
    """XLA-compiles the lowered steps: the first alone (on a GPU it autotunes the backbone's convolutions, whose
    choices XLA then reuses), the others `threads` at a time (compilation runs outside the GIL)."""

    def compile_one(name):
        entry = lowered[name]
        start = time.perf_counter()
        try:
            entry["compiled"] = entry.pop("lowered").compile()
        except Exception as exc:  # recorded; the other configurations go on
            entry["error"] = loss_calls.error_text(exc)
        entry["compile_s"] = time.perf_counter() - start

    names = [name for name, entry in lowered.items() if "lowered" in entry]
    if names:
        compile_one(names[0])
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        list(pool.map(compile_one, names[1:]))


def _run_steps(entry, images, labels, steps):
    """`steps` steps of one configuration; the wall time in ms per step once the device is done."""
    import jax

    compiled, state = entry["compiled"], entry.pop("state")
    start = time.perf_counter()
    for _ in range(steps):
        state, value = compiled(state, images, labels)
    jax.block_until_ready(value)
    entry["state"], entry["value"] = state, float(value)
    return 1000.0 * (time.perf_counter() - start) / steps


def _time_rounds(lowered, images, labels, steps, rounds, deadline):
    """Warm-up (two steps each), then `rounds` rounds of `steps` steps of every configuration, round-robin.
    A configuration that fails at run time gets its error; the rounds stop at `deadline` (`time.monotonic()`)."""
    live = [name for name, entry in lowered.items() if "compiled" in entry]
    for name in list(live):
        try:
            _run_steps(lowered[name], images, labels, 2)
            lowered[name]["round_ms"] = []
        except Exception as exc:
            lowered[name]["error"] = loss_calls.error_text(exc)
            live.remove(name)
    for round_index in range(rounds):
        if round_index > 0 and time.monotonic() > deadline:
            break
        for name in list(live):
            try:
                lowered[name]["round_ms"].append(_run_steps(lowered[name], images, labels, steps))
            except Exception as exc:
                lowered[name]["error"] = loss_calls.error_text(exc)
                live.remove(name)


def _rows(lowered):
    """The JSON rows, with each metric loss's share of the step against the zero-cost step."""
    rows = []
    for name, entry in lowered.items():
        row = {"name": name}
        for key in ("lower_s", "compile_s"):
            if key in entry:
                row[key] = entry[key]
        if entry.get("round_ms") and "error" not in entry:
            row.update(
                ms_per_step=float(np.median(entry["round_ms"])),
                best_round_ms=float(np.min(entry["round_ms"])),
                round_ms=list(entry["round_ms"]),
                loss_value=entry["value"] if np.isfinite(entry["value"]) else None,
            )
            if row["loss_value"] is None:
                row["nonfinite_loss_value"] = repr(entry["value"])
        else:
            row["error"] = entry.get("error", "not timed: the time budget ran out")
        rows.append(row)
    by_name = {row["name"]: row for row in rows}
    zero, softmax = by_name.get(ZERO_COST, {}), by_name.get(SOFTMAX, {})
    for row in rows:
        if "ms_per_step" not in row or row["name"] in (SOFTMAX, ZERO_COST):
            continue
        if "ms_per_step" in zero:
            row["loss_ms"] = row["ms_per_step"] - zero["ms_per_step"]
            row["share"] = row["loss_ms"] / row["ms_per_step"]
        if "ms_per_step" in softmax:
            row["vs_softmax"] = row["ms_per_step"] / softmax["ms_per_step"]
    return rows


def measure(cases, options, deadline):
    """The in-step section of the results: `options` holds backbone, image_size, classes_per_batch,
    num_classes, embedding_dim, steps, rounds, learning_rate, compile_threads, seed."""
    import jax
    import keras

    o = options
    rng = np.random.default_rng(o["seed"])
    batch_size = o["classes_per_batch"] * loss_table.SAMPLES_PER_CLASS
    labels = jax.device_put(loss_table.class_balanced_labels(batch_size, rng, o["num_classes"]))
    images = jax.device_put(rng.normal(size=(batch_size, o["image_size"], o["image_size"], 3)).astype(np.float32))
    times = {}
    keras.mixed_precision.set_global_policy("mixed_bfloat16")  # the layers built now compute in bfloat16
    try:
        start = time.perf_counter()
        backbone = build_backbone(o["backbone"], o["image_size"])
        heads = {
            kind: build_head(kind, backbone.output_shape[-1], o["embedding_dim"], o["num_classes"])
            for kind in ("classifier", "embedding", "embedding_logits")
        }
        entries = specs(cases, o["num_classes"], o["embedding_dim"])
        times["build_s"] = time.perf_counter() - start
        lowered = _lower_all(entries, backbone, heads, images, labels, o["learning_rate"])
        times["lower_s"] = time.perf_counter() - start - times["build_s"]
    finally:
        keras.mixed_precision.set_global_policy("float32")
    start = time.perf_counter()
    _compile_all(lowered, o["compile_threads"])
    times["compile_s"] = time.perf_counter() - start
    _time_rounds(lowered, images, labels, o["steps"], o["rounds"], deadline)
    times["timing_s"] = time.perf_counter() - start - times["compile_s"]
    rows = _rows(lowered)
    zero = next((row for row in rows if row["name"] == ZERO_COST and "round_ms" in row), None)
    return {
        "backbone": o["backbone"],
        "batch_size": batch_size,
        "precision": "mixed_bfloat16",
        "definition": __doc__.split("\n\n", 1)[1].strip(),
        "noise": None if zero is None else (max(zero["round_ms"]) - min(zero["round_ms"])) / zero["ms_per_step"],
        **times,
        "rows": rows,
    }
