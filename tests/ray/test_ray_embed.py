"""`tfdml embed --engine ray` on a real two-node Ray cluster on 127.0.0.1 (no mocks): a folder of good and
corrupt images, every good image embedded exactly once (ids counted), equal to the export's serving
signature (`ExportedEmbedder`, independent of the pipeline) to 1e-5, the corrupt ones skipped and named, the
shard evaluation equal to `tfdml.retrieval.evaluate` on all the embeddings. Skips without the ray extra."""

import json

import numpy as np
import pytest

from tests import embed_checks as checks
from tests.ray_cluster import two_node_cluster  # before Ray: it sets what Ray reads when imported

pytest.importorskip("ray", reason='the Ray tests need the ray extra: pip install -e ".[ray]"')

pytestmark = pytest.mark.slow  # the tests share one two-node Ray cluster and its embed run

from tfdml.cli import main  # noqa: E402
from tfdml.retrieval import evaluate  # noqa: E402

CLASSES, PER_CLASS = 6, 10


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("ray")
    paths, version = checks.prepare(root, CLASSES, PER_CLASS, sizes=(16, 20))
    output = root / "embeddings"
    with two_node_cluster() as cluster:
        status = main(
            ["embed", "--engine", "ray", "--address", cluster.address, "--actors", "2", "--actor-cpus", "0.25"]
            + ["--model", version, "--image-dir", str(root / "images"), "--output", str(output), "--batch-size", "8"]
            + ["--num-shards", "2", "--index-mode", "exact", "--evaluate", "--ks", "1", "2"]
        )
    assert status == 0
    return checks.read_output(root, version, output, paths)


def test_every_good_image_once_equal_to_the_serving_signature(run):
    checks.check_served(run, atol=1e-5)


def test_corrupt_images_are_skipped_and_named(run):
    manifest = checks.check_skipped(run)
    assert (manifest["engine"], manifest["embedded"]) == ("ray", CLASSES * PER_CLASS)
    assert [record["shard"] for record in manifest["shards"]] == [0, 1]


def test_sharded_evaluation_equals_evaluate(run):
    measured = json.loads((run["output"] / "evaluation.json").read_text())
    _, labels = np.unique(run["classes"], return_inverse=True)
    expected = evaluate(
        run["embeddings"], labels, ks=(1, 2), metrics=("recall", "map@r", "r_precision"), distance="dot_product"
    )
    assert measured.pop("queries") == len(labels)
    for key, value in expected.items():
        assert measured[key] == pytest.approx(value, abs=1e-6), key
