"""The load benchmark's round, small: 4 client threads on an export's `search` signature, every answer equal to
the single-client one, none failed."""

import keras
import numpy as np
import tensorflow as tf

from benchmarks.serving_load import load
from tests.export.test_export import SIZE, single_output_model
from tfdml.export import export_saved_model


def test_four_clients_get_the_single_client_answers(tmp_path):
    keras.utils.set_random_seed(0)  # the model's weights: the same test whatever ran before it in this process
    rng = np.random.default_rng(0)
    gallery = rng.integers(0, 256, (40, SIZE, SIZE, 3)).astype(np.uint8)
    labels = np.arange(40) % 5
    path = export_saved_model(single_output_model(), tmp_path, name="m", gallery=gallery, gallery_labels=labels)
    signature = tf.saved_model.load(path).signatures["search"]
    queries = gallery[:8]
    expected = [load.answer(load.call(signature, image)) for image in queries]
    assert [answer["ids"][0][0] for answer in expected] == [b"%d" % i for i in range(8)]  # each finds itself first
    latencies, wall, wrong, errors = load.signature_round(signature, queries, expected, clients=4, requests=6)
    assert (len(latencies), wrong, errors) == (24, 0, 0) and wall > 0
    row = load.row("signature", 4, latencies, wall, wrong, errors)
    assert row["requests"] == 24 and 0 < row["p50_ms"] <= row["p99_ms"]
