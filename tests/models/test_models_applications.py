"""Shapes and default taps of MultiLevelEmbedder / Embedder on ResNet50 and InceptionV3 (`weights=None`,
small inputs, built once per module, never trained)."""

import keras
import numpy as np
import pytest

from tfdml.models import DEFAULT_TAPS, Embedder, MultiLevelEmbedder
from tfdml.models.backbones import freeze_batchnorm

DIM = 16


@pytest.fixture(scope="module")
def resnet50():
    # The paper's 224x224 input: conv4_block1_out 14x14x1024 (stride 16, as GoogLeNet-BN's inception_3c),
    # conv5_block1_out 7x7x2048 (stride 32, as inception_4e), conv5_block3_out 7x7x2048 (inception_5b)
    return MultiLevelEmbedder(
        "resnet50", embedding_dim=DIM, input_shape=(224, 224, 3), weights=None, head_filters=8, head_units=16
    )


@pytest.fixture(scope="module")
def inception_v3():
    # 75x75 is InceptionV3's smallest input: mixed3 3x3x768, mixed8 1x1x1280, mixed10 1x1x2048
    return MultiLevelEmbedder(
        "inception_v3", embedding_dim=DIM, input_shape=(75, 75, 3), weights=None, head_filters=8, head_units=16
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "fixture, taps, shapes",
    [
        (
            "resnet50",
            ("conv4_block1_out", "conv5_block1_out", "conv5_block3_out"),
            [(14, 14, 1024), (7, 7, 2048), (7, 7, 2048)],
        ),
        ("inception_v3", ("mixed3", "mixed8", "mixed10"), [(3, 3, 768), (1, 1, 1280), (1, 1, 2048)]),
    ],
)
def test_default_taps_and_shapes(fixture, taps, shapes, request):
    model = request.getfixturevalue(fixture)
    assert tuple(model.taps) == taps
    assert tuple(DEFAULT_TAPS[model.backbone.name].values()) == taps
    assert [tuple(o.shape[1:]) for o in model.feature_extractor.outputs] == shapes
    images = np.random.RandomState(0).uniform(0, 255, (2,) + model.image_shape).astype("float32")
    outputs = model.export_outputs(images)  # raw pixels: the model applies preprocess_input itself
    assert outputs["embedding"].shape == (2, 3 * DIM)
    np.testing.assert_allclose(np.linalg.norm(outputs["embedding"], axis=1), 1.0, atol=1e-5)
    for level in "LMH":
        assert outputs[level].shape == (2, DIM)
    assert model.preprocessing == f"keras.applications.{fixture}.preprocess_input"
    preprocessed = getattr(keras.applications, fixture).preprocess_input(images.copy())
    features = model.feature_extractor(preprocessed)
    raw = [head(f) for head, f in zip(model.level_heads, features)]
    expected = np.concatenate([r.numpy() for r in raw], axis=1)
    np.testing.assert_allclose(
        outputs["embedding"], expected / np.linalg.norm(expected, axis=1, keepdims=True), atol=1e-5
    )
    # new layers vs backbone: disjoint and together every trainable variable
    head, backbone = model.head_variables, model.backbone_variables
    assert {id(v) for v in head}.isdisjoint({id(v) for v in backbone})
    assert len(head) + len(backbone) == len(model.trainable_variables)


@pytest.mark.slow
def test_pool_geometry_on_resnet_taps(resnet50):
    # Caffe's 5x5/3 pool rounds up: 14x14 -> 4x4 (L), 7x7 -> 2x2 (M); a "valid" pool would give 3x3 and 1x1
    assert resnet50.get_layer("head_L").fc.kernel.shape == (4 * 4 * 8, 16)
    assert resnet50.get_layer("head_M").fc.kernel.shape == (2 * 2 * 8, 16)


@pytest.mark.slow
def test_deeper_resnets_have_the_same_taps_at_the_same_strides():
    # ResNet152 names its layers as ResNet101 does (only the block counts of conv3/conv4 differ); building it
    # costs 10 s, so only ResNet101 is built here.
    assert DEFAULT_TAPS["resnet152"] == DEFAULT_TAPS["resnet101"] == DEFAULT_TAPS["resnet50"]
    backbone = keras.applications.ResNet101(include_top=False, weights=None, input_shape=(64, 64, 3))
    taps = DEFAULT_TAPS[backbone.name]
    assert taps == {"L": "conv4_block1_out", "M": "conv5_block1_out", "H": "conv5_block3_out"}
    # 64 px: stride 16 -> 4x4, stride 32 -> 2x2; the tap opens its stage (the block before is one stride up)
    assert backbone.get_layer(taps["L"]).output.shape[1:3] == (4, 4)
    assert backbone.get_layer(taps["M"]).output.shape[1:3] == (2, 2)
    assert backbone.get_layer(taps["H"]).output is backbone.output
    assert backbone.get_layer("conv3_block4_out").output.shape[1:3] == (8, 8)


def test_single_level_embedder_and_frozen_batchnorm(resnet50):
    model = Embedder(resnet50.backbone, embedding_dim=DIM)
    assert model.taps == [None] and model(np.zeros((1, 224, 224, 3), "float32")).shape == (1, DIM)
    frozen = freeze_batchnorm(resnet50.backbone)
    try:
        assert frozen == 53  # every BatchNormalization of ResNet50
        bn = [layer for layer in resnet50.backbone.layers if isinstance(layer, keras.layers.BatchNormalization)]
        assert all(not layer.trainable for layer in bn)
        assert not any(v is w for layer in bn for v in layer.weights for w in resnet50.trainable_variables)
    finally:
        for layer in resnet50.backbone.layers:
            layer.trainable = True
