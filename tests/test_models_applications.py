"""Shapes and default taps of MultiLevelEmbedder / Embedder on ResNet50 and InceptionV3 (`weights=None`,
small inputs, built once per module, never trained)."""

import numpy as np
import pytest
import keras

from tfdml.models import DEFAULT_TAPS, Embedder, MultiLevelEmbedder
from tfdml.recipes import freeze_batchnorm

DIM = 16


@pytest.fixture(scope="module")
def resnet50():
    # 64x64 input: conv3 8x8x512, conv4 4x4x1024, conv5 2x2x2048
    return MultiLevelEmbedder("resnet50", embedding_dim=DIM, input_shape=(64, 64, 3), weights=None,
                              head_filters=8, head_units=16)


@pytest.fixture(scope="module")
def inception_v3():
    # 75x75 is InceptionV3's smallest input: mixed2 7x7x288, mixed7 3x3x768, mixed10 1x1x2048
    return MultiLevelEmbedder("inception_v3", embedding_dim=DIM, input_shape=(75, 75, 3), weights=None,
                              head_filters=8, head_units=16)


@pytest.mark.parametrize("fixture, taps, shapes", [
    ("resnet50", ("conv3_block4_out", "conv4_block6_out", "conv5_block3_out"),
     [(8, 8, 512), (4, 4, 1024), (2, 2, 2048)]),
    ("inception_v3", ("mixed2", "mixed7", "mixed10"), [(7, 7, 288), (3, 3, 768), (1, 1, 2048)]),
])
def test_default_taps_and_shapes(fixture, taps, shapes, request):
    model = request.getfixturevalue(fixture)
    assert tuple(model.taps) == taps
    assert tuple(DEFAULT_TAPS[model.backbone.name].values()) == taps
    assert [tuple(o.shape[1:]) for o in model.feature_extractor.outputs] == shapes
    images = np.random.RandomState(0).uniform(0, 255, (2,) + model.image_shape).astype("float32")
    outputs = model.export_outputs(model.preprocess(images))
    assert outputs["embedding"].shape == (2, 3 * DIM)
    np.testing.assert_allclose(np.linalg.norm(outputs["embedding"], axis=1), 1.0, atol=1e-5)
    for level in "LMH":
        assert outputs[level].shape == (2, DIM)
    assert model.preprocessing == f"keras.applications.{fixture}.preprocess_input"
    # new layers vs backbone: disjoint and together every trainable variable
    head, backbone = model.head_variables, model.backbone_variables
    assert {id(v) for v in head}.isdisjoint({id(v) for v in backbone})
    assert len(head) + len(backbone) == len(model.trainable_variables)


def test_pool_geometry_on_resnet_taps(resnet50):
    # 8x8 -> 5x5/3 valid pool -> 2x2; 4x4 (< 5) -> pooled whole -> 1x1
    assert resnet50.get_layer("head_L").fc.kernel.shape == (2 * 2 * 8, 16)
    assert resnet50.get_layer("head_M").fc.kernel.shape == (1 * 1 * 8, 16)


def test_single_level_embedder_and_frozen_batchnorm(resnet50):
    model = Embedder(resnet50.backbone, embedding_dim=DIM)
    assert model.taps == [None] and model(np.zeros((1, 64, 64, 3), "float32")).shape == (1, DIM)
    frozen = freeze_batchnorm(resnet50.backbone)
    try:
        assert frozen == 53  # every BatchNormalization of ResNet50
        bn = [layer for layer in resnet50.backbone.layers if isinstance(layer, keras.layers.BatchNormalization)]
        assert all(not layer.trainable for layer in bn)
        assert not any(v is w for layer in bn for v in layer.weights for w in resnet50.trainable_variables)
    finally:
        for layer in resnet50.backbone.layers:
            layer.trainable = True
