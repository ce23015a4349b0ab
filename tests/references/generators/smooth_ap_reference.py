"""Writes pytorch-metric-learning's `SmoothAPLoss` values and gradients to `tests/references/smooth_ap_reference.json`,
which `tests/losses/test_losses_smooth_ap.py` reads (the tests do not need torch).

PML 2.9's Smooth-AP needs labels in consecutive blocks of one size, and groups the batch correctly only when
there are as many classes as samples per class (see `tfdml.losses.smooth_ap`): the batches here are such
layouts (2 x 2, 3 x 3, 4 x 4), float64, at two temperatures. PML accumulates the per-anchor AP in a float32
tensor, so its values and gradients carry float32 round-off.

Needs the bench extra (torch, pytorch-metric-learning 2.9):
    python tests/references/generators/smooth_ap_reference.py [--output tests/references/smooth_ap_reference.json]
"""

import argparse
import json
import os

import numpy as np
import pytorch_metric_learning
import torch
from pytorch_metric_learning import losses

DEFAULT_OUTPUT = os.path.join(os.path.dirname(__file__), "..", "smooth_ap_reference.json")
TEMPERATURES = (0.01, 0.1)


def make_batches(seed=0):
    rng = np.random.default_rng(seed)
    batches = {}
    for classes in (2, 3, 4):
        labels = np.repeat(rng.permutation(10)[:classes], classes)  # blocks, class ids in any order
        centres = rng.normal(size=(classes, 6))
        embeddings = np.repeat(centres, classes, axis=0) + 1.5 * rng.normal(size=(classes * classes, 6))
        batches[f"blocks_{classes}x{classes}"] = {"labels": labels, "embeddings": embeddings}
    return batches


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default=DEFAULT_OUTPUT)
    args = parser.parse_args()
    batches = make_batches()
    out = {
        "pml_version": pytorch_metric_learning.__version__,
        "torch_version": torch.__version__,
        "dtype": "float64",
        "batches": {},
        "cases": [],
    }
    for name, batch in batches.items():
        out["batches"][name] = {
            "labels": batch["labels"].tolist(),
            "embeddings": np.round(batch["embeddings"], 15).tolist(),
        }
        for temperature in TEMPERATURES:
            x = torch.tensor(batch["embeddings"], dtype=torch.float64, requires_grad=True)
            value = losses.SmoothAPLoss(temperature=temperature)(x, torch.tensor(batch["labels"]))
            value.backward()
            out["cases"].append(
                {
                    "batch": name,
                    "temperature": temperature,
                    "value": float(value.detach()),
                    "grad_embeddings": np.round(x.grad.numpy(), 15).tolist(),
                }
            )
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w") as f:
        json.dump(out, f, separators=(",", ":"))
    print(f"wrote {args.output} ({os.path.getsize(args.output) / 1024:.0f} KB)")


if __name__ == "__main__":
    main()
