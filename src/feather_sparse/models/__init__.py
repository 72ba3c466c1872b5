"""The paper's architectures and small models for the bundled data, by name.

``create_model("resnet20", num_classes=100)`` builds a registered model;
``list_models()`` names them and ``model_info(name)`` tells the input shape
and default number of classes. Each family lives in its own file and
registers its factories with :func:`register_model`:

- ``resnet_cifar``: ``resnet20`` (CIFAR, 2x width, 1.096M parameters)
- ``mobilenet``: ``mobilenet_v1`` (CIFAR, 3.315M), ``mobilenet_v1_imagenet`` (4.21M)
- ``densenet``: ``densenet40_24`` (DenseNet-BC, 0.714M)
- ``resnet50``: ``resnet50`` (ImageNet, 25.6M)
- ``small``: ``mnist1d_cnn`` (the default model), ``mnist1d_mlp``
- ``mixer``: ``mnist1d_mlpmixer`` (Linear-heavy, for N:M patterns)
"""

from feather_sparse.models import densenet, mixer, mobilenet, resnet50, resnet_cifar, small
from feather_sparse.models._registry import (
    MODEL_SPEC_ATTR,
    ModelInfo,
    check_model_kwargs,
    create_model,
    list_models,
    model_info,
    register_model,
)

__all__ = [
    "MODEL_SPEC_ATTR",
    "ModelInfo",
    "check_model_kwargs",
    "create_model",
    "densenet",
    "list_models",
    "mixer",
    "mobilenet",
    "model_info",
    "register_model",
    "resnet50",
    "resnet_cifar",
    "small",
]
