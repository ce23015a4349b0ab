"""Does the exported `match` keep the precision it states when half of the queries are of classes the gallery does
not hold? Checked on a glyph export (the default job's: `tfdml train`, then `tfdml export`); prints JSON.

The export's gallery is the job's evaluation half of the characters (seed 0 renderings) and its metadata states
the threshold and the precision it was calibrated for (`calibration`). Queries are fresh renderings (other
seeds: other faces, sizes, rotations, blurs) so that none is a gallery item:

- `training_characters_absent`: present queries are the gallery's characters, absent queries the training
  half's characters (no gallery class; the model trained on them), as many of each; the export's own
  threshold, and for comparison the closed-set (leave-one-out) threshold at the same target;
- `held_out_characters`: the gallery is half of the evaluation characters, calibrated here as the export
  calibrates (`tfdml.retrieval.calibrate`, default mode, on the gallery's items); present queries are those
  characters, absent queries the other half of the evaluation characters (never seen in training either).

For each, the precision of the matched top-1 neighbours on the mixed stream (a present query matched to a
wrong class and any matched absent query are wrong), beside the precision the calibration states.

    python -m benchmarks.open_set.open_set_check exported_models/glyphs_rll [--seeds 1 2 3] [--json out.json]
"""

import argparse
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402

from tfdml.data.glyphs import glyph_arrays  # noqa: E402
from tfdml.export import ExportedEmbedder  # noqa: E402
from tfdml.retrieval import calibrate  # noqa: E402


def unit(x):
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def stream(gallery, gallery_labels, present, present_labels, absent, threshold):
    """Precision and counts of `match` (top-1 score >= threshold) on equal numbers of present and absent
    queries (the first `min(len)` of each)."""
    n = min(len(present), len(absent))
    g = unit(gallery)
    out = {"queries_each": n}
    hits = accepted = 0
    for name, queries, labels in (("present", present[:n], present_labels[:n]), ("absent", absent[:n], None)):
        sims = unit(queries) @ g.T
        top = sims.argmax(axis=1)
        matched = sims[np.arange(n), top] >= threshold
        accepted += int(matched.sum())
        right = int((matched & (gallery_labels[top] == labels)).sum()) if labels is not None else 0
        hits += right
        out[f"{name}_matched"] = float(matched.mean())
        if labels is not None:
            out["present_correct_matched"] = right / n
    out["precision"] = hits / accepted if accepted else None
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("export", help="an exported glyph model: <base_dir>/<name> or a version directory")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3], help="rendering seeds of the queries")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()

    embedder = ExportedEmbedder(args.export)
    meta = embedder.metadata
    data = meta["training_config"]["data"]
    options = {"image_size": data["image_size"]}
    if data.get("images_per_class"):
        options["images_per_class"] = data["images_per_class"]
    target = meta["calibration"]["target_precision"]
    stated = meta["calibration"]

    def embedded(split, seed):
        images, labels, _ = glyph_arrays(split, seed=seed, **options)
        return embedder.embed(images), labels

    gallery, gallery_labels = embedded("test", 0)  # the export's gallery (the job's evaluation data)
    closed = calibrate(gallery, gallery_labels, target_precision=target, mode="closed")
    classes = np.unique(gallery_labels)
    kept = np.isin(gallery_labels, classes[::2])  # half of the evaluation characters stay in the gallery
    half = calibrate(gallery[kept], gallery_labels[kept], target_precision=target)
    report = {
        "export": embedder.path,
        "target_precision": target,
        "export_calibration": {k: stated[k] for k in ("mode", "absent_share", "threshold", "precision", "recall")},
        "closed_set_calibration": {"threshold": closed.threshold, "precision": closed.precision},
        "held_out_calibration": {"mode": half.mode, "threshold": half.threshold, "precision": half.precision},
        "seeds": {},
    }
    for seed in args.seeds:
        present, present_labels = embedded("test", seed)
        absent, _ = embedded("train", seed)
        in_half = np.isin(present_labels, classes[::2])
        report["seeds"][seed] = {
            "training_characters_absent": stream(
                gallery, gallery_labels, present, present_labels, absent, stated["threshold"]
            ),
            "training_characters_absent_closed_set": stream(
                gallery, gallery_labels, present, present_labels, absent, closed.threshold
            ),
            "held_out_characters": stream(
                gallery[kept],
                gallery_labels[kept],
                present[in_half],
                present_labels[in_half],
                present[~in_half],
                half.threshold,
            ),
        }
    for name in ("training_characters_absent", "training_characters_absent_closed_set", "held_out_characters"):
        values = [entry[name]["precision"] for entry in report["seeds"].values()]
        report[f"{name}_mean_precision"] = float(np.mean(values))
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
