"""The model registry and the paper's architectures.

Golden parameter counts (the paper's Table 1, Tables 2 and 4) plus
registry-wide invariants: every registered model runs forward and backward,
gives finite outputs and gradients of the right shape, and can be rebuilt
from the spec ``create_model`` attaches to it.
"""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import feather_sparse as fs
from feather_sparse import Registry
from feather_sparse.models import (
    MODEL_SPEC_ATTR,
    ModelInfo,
    _registry,
    create_model,
    list_models,
    model_info,
    register_model,
)
from feather_sparse.models.densenet import DenseNet
from feather_sparse.models.resnet_cifar import CifarResNet

pytestmark = pytest.mark.usefixtures("one_thread")

PAPER_MODELS = {"resnet20", "mobilenet_v1", "mobilenet_v1_imagenet", "densenet40_24", "resnet50"}
LAYERS_WITHOUT_BN = (nn.Conv1d, nn.Conv2d, nn.Linear)


def count_all(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def count_conv_linear(model: nn.Module) -> int:
    """Conv and linear weights and biases, batch norm left out."""
    return sum(
        p.numel()
        for m in model.modules()
        if isinstance(m, LAYERS_WITHOUT_BN)
        for p in m.parameters(recurse=False)
    )


# name, num_classes, parameters quoted by the paper, how the paper counts them.
# The ImageNet MobileNetV1 figure (4.21M) leaves batch norm out: with it the
# network has 4.232M, 0.52 % more (see models/mobilenet.py).
PAPER_COUNTS = [
    ("resnet20", 100, 1.096e6, count_all),
    ("mobilenet_v1", 100, 3.315e6, count_all),
    ("densenet40_24", 100, 0.714e6, count_all),
    ("resnet50", 1000, 25.6e6, count_all),
    ("mobilenet_v1_imagenet", 1000, 4.21e6, count_conv_linear),
]


@pytest.mark.parametrize(("name", "num_classes", "expected", "count"), PAPER_COUNTS)
def test_paper_parameter_counts(name: str, num_classes: int, expected: float, count) -> None:
    model = create_model(name, num_classes=num_classes)
    assert count(model) == pytest.approx(expected, rel=0.005)


def test_exact_counts_of_the_documented_configurations() -> None:
    # worked out by hand in the family docstrings
    assert count_all(create_model("resnet20")) == 1_096_196
    assert count_all(create_model("mobilenet_v1")) == 3_315_428
    assert count_all(create_model("mobilenet_v1", pointwise_bias=False)) == 3_309_476
    assert count_all(create_model("densenet40_24")) == 714_196
    assert count_all(create_model("mnist1d_cnn")) == 176_074
    assert count_all(create_model("mnist1d_cnn", width=0.5)) == 45_034


def test_resnet20_has_doubled_stages_and_projection_shortcuts() -> None:
    model = create_model("resnet20")
    assert isinstance(model, CifarResNet)
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert {m.out_channels for m in convs} == {32, 64, 128}
    # 19 3x3 convs + the 2 projection shortcuts (1x1) where the stage changes
    assert sum(m.kernel_size == (3, 3) for m in convs) == 19
    assert sum(m.kernel_size == (1, 1) for m in convs) == 2


def test_densenet40_24_is_densenet_bc() -> None:
    model = create_model("densenet40_24")
    assert isinstance(model, DenseNet)
    assert model.num_features == 264  # 48 → 192 → 96 → 240 → 120 → 264
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    # the stem, 3 blocks of 6 bottlenecks with 2 convs each, 2 transitions
    assert len(convs) == 1 + 3 * 6 * 2 + 2


def test_mobilenet_variants_differ_only_in_stem_stride_and_pointwise_bias() -> None:
    cifar = create_model("mobilenet_v1", num_classes=1000, pointwise_bias=False)
    imagenet = create_model("mobilenet_v1_imagenet")
    assert count_all(cifar) == count_all(imagenet)
    # a 32x32 CIFAR image ends at 2x2 because only the ImageNet stem halves the resolution
    assert cifar.stem[0].stride == (1, 1) and imagenet.stem[0].stride == (2, 2)
    depthwise = [m for m in imagenet.modules() if isinstance(m, nn.Conv2d) and m.groups > 1]
    assert len(depthwise) == 13 and all(m.groups == m.in_channels for m in depthwise)


def _sample_shape(name: str) -> tuple[int, ...]:
    """A small input of the model's kind: images shrunk to keep the test fast.

    ImageNet models get 32x32 (1x1 after their stride 32), CIFAR models 16x16
    (MobileNetV1's stride 16 brings it to 1x1); 1-D signals keep their length.
    """
    shape = model_info(name).input_shape
    if len(shape) == 3:
        side = 32 if shape[1] > 32 else 16
        return (shape[0], side, side)
    return shape


@pytest.mark.parametrize("name", list_models())
def test_forward_backward_every_model(name: str) -> None:
    num_classes = 7  # any number of classes, not the default
    model = create_model(name, num_classes=num_classes)
    x = torch.randn(2, *_sample_shape(name))
    out = model(x)
    assert out.shape == (2, num_classes)
    assert torch.isfinite(out).all()
    out.square().mean().backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    assert all(g is not None and torch.isfinite(g).all() for g in grads.values())
    assert any(g.abs().sum() > 0 for g in grads.values() if g is not None)
    model.eval()
    with torch.no_grad():
        assert model(x).shape == (2, num_classes)


@pytest.mark.parametrize("name", list_models())
def test_models_use_plain_layers_with_standard_init(name: str) -> None:
    model = create_model(name)
    weighted = [m for m in model.modules() if isinstance(m, LAYERS_WITHOUT_BN)]
    assert weighted, "the pruner needs Conv/Linear modules to attach to"
    # every parameter belongs to an ordinary conv, linear or batch-norm layer
    owned = {
        id(p)
        for m in model.modules()
        if isinstance(m, (*LAYERS_WITHOUT_BN, nn.BatchNorm1d, nn.BatchNorm2d))
        for p in m.parameters(recurse=False)
    }
    assert all(id(p) in owned for p in model.parameters())
    for m in model.modules():
        if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
            assert torch.all(m.weight == 1) and torch.all(m.bias == 0)
        if isinstance(m, LAYERS_WITHOUT_BN) and m.bias is not None:
            assert torch.all(m.bias == 0)
    # Kaiming fan_out for the largest conv: std ≈ sqrt(2 / fan_out)
    convs = [m for m in model.modules() if isinstance(m, (nn.Conv1d, nn.Conv2d))]
    if convs:
        conv = max(convs, key=lambda m: m.weight.numel())
        fan_out = conv.weight.shape[0] * conv.weight[0, 0].numel()
        assert conv.weight.std().item() == pytest.approx((2 / fan_out) ** 0.5, rel=0.1)
    # the classifier: uniform in ±1/sqrt(fan_in), not a tiny std-0.01 init that a
    # global magnitude threshold would prune away first
    fc = model.fc
    bound = fc.in_features**-0.5
    assert fc.weight.abs().max().item() <= bound
    assert fc.weight.std().item() == pytest.approx(bound / 3**0.5, rel=0.2)


def test_model_info_and_listing() -> None:
    names = list_models()
    assert PAPER_MODELS | {"mnist1d_cnn", "mnist1d_mlp"} <= set(names)
    assert names == sorted(names)
    info = model_info("mnist1d_cnn")
    assert info == ModelInfo("mnist1d_cnn", (1, 40), 10, info.description)
    assert info.description
    assert model_info("ResNet20").input_shape == (3, 32, 32)  # case-insensitive lookup
    assert model_info("resnet50").num_classes == 1000
    with pytest.raises(AttributeError):
        info.num_classes = 3  # type: ignore[misc]


def test_create_model_drops_none_kwargs() -> None:
    model = create_model("resnet20", num_classes=None, width=None)
    assert model.fc.out_features == 100  # the registered default
    assert model.conv1.out_channels == 32  # width=None kept the default 2
    narrow = create_model("resnet20", num_classes=10, width=1)
    assert narrow.fc.out_features == 10 and narrow.conv1.out_channels == 16


def test_create_model_errors() -> None:
    with pytest.raises(ValueError, match=r"unknown model 'resnet21'; choose one of: .*resnet20"):
        create_model("resnet21")
    with pytest.raises(ValueError, match=r"mnist1d_cnn, mnist1d_mlp"):
        model_info("nope")
    with pytest.raises(ValueError, match=r"does not accept.*accepts: num_classes, width"):
        create_model("resnet20", depth=56)
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="num_classes must be a positive integer"):
            create_model("mnist1d_cnn", num_classes=bad)


@pytest.mark.parametrize("name", list_models())
def test_spec_rebuilds_the_same_architecture(name: str) -> None:
    model = create_model(name, num_classes=5)
    spec = getattr(model, MODEL_SPEC_ATTR)
    assert spec["name"] == name
    assert spec["kwargs"]["num_classes"] == 5
    # what a checkpoint stores: JSON turns tuples into lists, which must still work
    spec = json.loads(json.dumps(spec))
    rebuilt = create_model(spec["name"], **spec["kwargs"])
    shapes = {k: v.shape for k, v in model.state_dict().items()}
    assert {k: v.shape for k, v in rebuilt.state_dict().items()} == shapes
    assert getattr(rebuilt, MODEL_SPEC_ATTR)["kwargs"] == spec["kwargs"]
    rebuilt.load_state_dict(model.state_dict())  # strict: same architecture


def test_spec_records_non_default_kwargs_and_defaults() -> None:
    model = create_model("mnist1d_mlp", hidden=(32,), num_classes=3)
    assert getattr(model, MODEL_SPEC_ATTR) == {
        "name": "mnist1d_mlp",
        "kwargs": {"num_classes": 3, "hidden": (32,)},
    }
    spec = getattr(create_model("mnist1d-CNN"), MODEL_SPEC_ATTR)
    assert spec == {"name": "mnist1d_cnn", "kwargs": {"num_classes": 10, "width": 1.0}}


@pytest.fixture
def scratch_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Registrations made by a test go into a copy of the registry, dropped afterwards."""
    scratch: Registry = Registry("model")
    for name in list_models():
        scratch.register(name, _registry._MODELS.get(name))
    monkeypatch.setattr(_registry, "_MODELS", scratch)


@pytest.mark.usefixtures("scratch_registry")
def test_register_model_in_a_scratch_name() -> None:
    name = "test_only_linear_probe"

    @register_model(name, input_shape=(4,), num_classes=2, description="a probe")
    def probe(num_classes: int = 2, bias: bool = True) -> nn.Module:
        return nn.Linear(4, num_classes, bias=bias)

    assert model_info(name) == ModelInfo(name, (4,), 2, "a probe")
    model = create_model(name, bias=False)
    assert isinstance(model, nn.Linear) and model.bias is None
    assert getattr(model, MODEL_SPEC_ATTR)["kwargs"] == {"num_classes": 2, "bias": False}
    with pytest.raises(ValueError, match="already registered"):
        register_model(name, input_shape=(4,), num_classes=2)(probe)
    with pytest.raises(ValueError, match="must accept num_classes"):
        register_model("test_only_bad", input_shape=(4,), num_classes=2)(lambda: nn.Identity())
    with pytest.raises(ValueError, match="input_shape"):
        register_model("test_only_bad", input_shape=(0, 4), num_classes=2)
    assert "test_only_bad" not in list_models()


def test_top_level_reexports() -> None:
    assert fs.create_model is create_model
    assert fs.list_models is list_models and fs.model_info is model_info
    assert fs.register_model is register_model and fs.ModelInfo is ModelInfo
    for name in ("create_model", "list_models", "model_info", "register_model", "ModelInfo"):
        assert name in fs.__all__
