"""Throughput of `tfdml.data.class_balanced_dataset` over a folder of generated 224 px JPEGs.

Compared with
- the ceiling: plain, unbalanced `tf.data` reading of the same files with the same per-image work
  (read, decode, resize, scale), parallel map, batch;
- a Python-generator sampler in the style of pytorch-metric-learning's `MPerClassSampler` and TF
  Similarity's samplers: a Python generator picks `C x K` indices per batch, `tf.data` decodes them.
  pytorch-metric-learning's own `MPerClassSampler` is used when it is installed.

Prints one JSON object: images/s (best of `--repeats`) and CPU microseconds per image (median) of each;
`balancing_cost_cpu = tfdml CPU per image / ceiling CPU per image - 1` (target < 0.10). On a shared
machine the CPU figure is the steadier one.

    python -m benchmarks.data.bench_data [--classes 50 --per-class 20 --batches 40 --augment]
"""

import argparse
import json
import os
import tempfile
import time

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

import tfdml.data  # noqa: E402
from tfdml.data.preprocessing import Augment, train_image  # noqa: E402


def make_folder(root, classes, per_class, size, seed=0):
    rng = np.random.default_rng(seed)
    for c in range(classes):
        folder = os.path.join(root, f"class_{c:03d}")
        os.makedirs(folder)
        base = rng.integers(0, 256, size=(1, 1, 3))
        for i in range(per_class):
            # Smooth gradients plus noise: JPEG sizes close to photographs of the same resolution.
            yy, xx = np.mgrid[0:size, 0:size]
            image = (base + 0.4 * (yy + xx)[..., None] + rng.normal(0, 25, (size, size, 3))) % 256
            encoded = tf.io.encode_jpeg(tf.constant(image.astype(np.uint8)), quality=90)
            tf.io.write_file(os.path.join(folder, f"{i:04d}.jpg"), encoded)


def measure(dataset, batches, warmup=5):
    """(images/s wall clock, CPU microseconds of this process per image). On a shared machine the CPU
    time per image is the steadier figure: wall-clock rates move with the other processes' load."""
    iterator = iter(dataset)
    for _ in range(warmup):
        next(iterator)
    count = 0
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(batches):
        images, _ = next(iterator)
        count += int(images.shape[0])
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return count / wall, cpu / count * 1e6


def image_fn(size, augment):
    def load(path, seed):
        image = tf.io.decode_image(tf.io.read_file(path), channels=3, expand_animations=False)
        image.set_shape([None, None, 3])
        return train_image(image, seed, size, augment)

    return load


def ceiling_dataset(paths, labels, batch, size, augment):
    load = image_fn(size, augment)
    ds = tf.data.Dataset.from_tensor_slices((paths, labels)).shuffle(len(paths), seed=0).repeat()
    ds = ds.enumerate().map(lambda i, pl: (load(pl[0], tf.stack([i, i])), pl[1]), num_parallel_calls=tf.data.AUTOTUNE)
    return ds.batch(batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def python_sampler_indices(labels, classes_per_batch, samples_per_class, seed=0):
    """Endless index stream from a Python sampler (pml's MPerClassSampler when available)."""
    batch = classes_per_batch * samples_per_class
    try:
        from pytorch_metric_learning.samplers import MPerClassSampler

        sampler = MPerClassSampler(labels, m=samples_per_class, batch_size=batch, length_before_new_iter=len(labels))
        name = "pytorch_metric_learning.MPerClassSampler"

        def stream():
            while True:
                yield from iter(sampler)
    except ImportError:
        name = "python generator (MPerClassSampler style)"
        rng = np.random.default_rng(seed)
        by_class = {c: np.flatnonzero(labels == c) for c in np.unique(labels)}

        def stream():
            while True:
                for c in rng.choice(list(by_class), classes_per_batch, replace=False):
                    members = by_class[c]
                    replace = len(members) < samples_per_class
                    yield from rng.choice(members, samples_per_class, replace=replace)

    return stream, name


def generator_dataset(paths, labels, classes_per_batch, samples_per_class, size, augment):
    stream, name = python_sampler_indices(labels, classes_per_batch, samples_per_class)
    paths_t, labels_t = tf.constant(paths), tf.constant(labels)
    load = image_fn(size, augment)
    ds = tf.data.Dataset.from_generator(
        lambda: (np.int64(i) for i in stream()), output_signature=tf.TensorSpec([], tf.int64)
    )
    ds = ds.enumerate().map(
        lambda j, i: (load(tf.gather(paths_t, i), tf.stack([j, j])), tf.gather(labels_t, i)),
        num_parallel_calls=tf.data.AUTOTUNE,
    )
    batch = classes_per_batch * samples_per_class
    return ds.batch(batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE), name


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--classes", type=int, default=50)
    parser.add_argument("--per-class", type=int, default=20)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--classes-per-batch", type=int, default=22)
    parser.add_argument("--samples-per-class", type=int, default=3)
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3, help="best of this many runs per pipeline")
    parser.add_argument("--augment", action="store_true", help="paper augmentation instead of resize")
    args = parser.parse_args()
    size = args.image_size
    augment = Augment() if args.augment else None
    c, k = args.classes_per_batch, args.samples_per_class
    with tempfile.TemporaryDirectory() as root:
        make_folder(root, args.classes, args.per_class, size)
        source = tfdml.data.image_folder(root)
        paths = np.asarray(source.paths)
        labels = source.labels
        pipelines = {
            "ceiling": lambda: ceiling_dataset(paths, labels, c * k, size, augment),
            "tfdml": lambda: tfdml.data.class_balanced_dataset(
                source, c, k, image_size=size, augment=augment or False, seed=0
            ),
            "python_sampler": lambda: generator_dataset(paths, labels, c, k, size, augment)[0],
        }
        runs = {name: [] for name in pipelines}
        for _ in range(args.repeats):  # round robin, so that load changes hit every pipeline alike
            for name, make in pipelines.items():
                runs[name].append(measure(make(), args.batches))
    rate = {name: max(r for r, _ in values) for name, values in runs.items()}
    cpu = {name: float(np.median([c for _, c in values])) for name, values in runs.items()}
    sampler_name = python_sampler_indices(labels, c, k)[1]
    report = {
        "benchmark": "class-balanced input pipeline at 224 px",
        "images": args.classes * args.per_class,
        "image_size": size,
        "batch": f"{c} x {k}",
        "augment": bool(args.augment),
        "cpu_cores": os.cpu_count(),
        "load_average_1min": round(os.getloadavg()[0], 2),
        "tfdml_images_per_s": round(rate["tfdml"], 1),
        "ceiling_images_per_s": round(rate["ceiling"], 1),
        "peer": sampler_name,
        "peer_images_per_s": round(rate["python_sampler"], 1),
        "tfdml_cpu_us_per_image": round(cpu["tfdml"], 1),
        "ceiling_cpu_us_per_image": round(cpu["ceiling"], 1),
        "peer_cpu_us_per_image": round(cpu["python_sampler"], 1),
        "ratio_tfdml_to_ceiling_images_per_s": round(rate["tfdml"] / rate["ceiling"], 3),
        "ratio_tfdml_to_peer_images_per_s": round(rate["tfdml"] / rate["python_sampler"], 3),
        "balancing_cost_cpu": round(cpu["tfdml"] / cpu["ceiling"] - 1, 3),
        "peer_balancing_cost_cpu": round(cpu["python_sampler"] / cpu["ceiling"] - 1, 3),
        "target_balancing_cost": 0.10,
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
