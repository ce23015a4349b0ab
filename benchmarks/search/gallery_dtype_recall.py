"""Recall cost of the `search` signature's compressed galleries (`--gallery-dtype`) on a glyph export; prints JSON.

The test half of `tfdml.data.glyphs` (the default job's evaluation data and gallery) is embedded with the
export's `serving_default`; each item then queries the others (leave-one-out) against the gallery as the
signature stores it (`tfdml.export.search.quantize`, dequantised: the signature's scores are exact dot
products of that, the query is never rounded), for float32, bfloat16 and int8. Printed per dtype: class
recall@1, neighbour recall@10 against the float32 gallery and top-1 agreement with it.

    tfdml train                      # writes exported_models/glyphs_rll/<version>
    nice python -m benchmarks.search.gallery_dtype_recall exported_models/glyphs_rll
"""

import argparse
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402

from tfdml import data, export  # noqa: E402
from tfdml.export.search import GALLERY_DTYPES, dequantized, quantize  # noqa: E402

K = 10


def leave_one_out_neighbours(queries, gallery, k=K):
    scores = queries @ gallery.T
    np.fill_diagonal(scores, -np.inf)  # not itself
    return np.argsort(-scores, axis=1, kind="stable")[:, :k]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model", help="a glyph export: <base_dir>/<name> (latest version) or a version directory")
    args = parser.parse_args()
    embedder = export.ExportedEmbedder(args.model)
    size = embedder.metadata.get("image_size") or embedder.metadata["input"]["shape"][1]
    test = data.glyphs("test", image_size=int(size[0] if isinstance(size, (list, tuple)) else size))
    embeddings = embedder.embed(np.asarray(test.images))
    labels = np.asarray(test.labels)
    exact = leave_one_out_neighbours(embeddings, embeddings)
    report = {"model": embedder.path, "gallery": len(embeddings), "dim": int(embeddings.shape[1]), "dtypes": {}}
    for dtype in GALLERY_DTYPES:
        found = leave_one_out_neighbours(embeddings, dequantized(*quantize(embeddings, dtype)))
        overlap = np.mean([len(set(a) & set(b)) / K for a, b in zip(found, exact)])
        report["dtypes"][dtype] = {
            "recall@1": float((labels[found[:, 0]] == labels).mean()),
            f"neighbour_recall@{K}_vs_float32": float(overlap),
            "top1_agreement_vs_float32": float((found[:, 0] == exact[:, 0]).mean()),
        }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
