"""Models: ALL-CNN (CIFAR-10), a LeNet-5-style CNN (FEMNIST/MNIST), a small CNN and logistic regression.

All models are plain stacks without batch norm, so a model's state is exactly its float parameters:
the whole state crosses the codec as one flattened update (the paper's d).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch
from torch import nn

from mucsc.errors import InputError

MODELS = ("allcnn", "lenet", "cnn", "logreg")


def all_cnn(in_channels: int = 3, num_classes: int = 10) -> nn.Sequential:
    """ALL-CNN-C of Springenberg et al. (2014): 9 conv layers, strided convs instead of pooling,
    global average pooling.  1,369,738 parameters for CIFAR-10 (the paper: "more than 10^6")."""
    def conv(cin: int, cout: int, k: int, stride: int = 1, pad: int = 1) -> list[nn.Module]:
        return [nn.Conv2d(cin, cout, k, stride=stride, padding=pad), nn.ReLU()]

    return nn.Sequential(
        *conv(in_channels, 96, 3), *conv(96, 96, 3), *conv(96, 96, 3, stride=2),
        *conv(96, 192, 3), *conv(192, 192, 3), *conv(192, 192, 3, stride=2),
        *conv(192, 192, 3, pad=0), *conv(192, 192, 1, pad=0),
        nn.Conv2d(192, num_classes, 1), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
    )


def lenet(in_channels: int = 1, num_classes: int = 62, side: int = 28, hidden: int = 400) -> nn.Sequential:
    """LeNet-5-style CNN as used for FEMNIST in LEAF: two 5x5 conv + max-pool stages (32, 64 maps),
    one hidden dense layer, softmax output.  With hidden=400: 1,331,758 parameters for FEMNIST."""
    flat = 64 * (side // 4) * (side // 4)
    return nn.Sequential(
        nn.Conv2d(in_channels, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(flat, hidden), nn.ReLU(), nn.Linear(hidden, num_classes),
    )


def small_cnn(in_channels: int = 1, num_classes: int = 10, side: int = 8) -> nn.Sequential:
    """A small CNN for 8x8 digits: two 3x3 convs, one pool, a 64-unit dense layer (38,282 params)."""
    return nn.Sequential(
        nn.Conv2d(in_channels, 16, 3, padding=1), nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * (side // 2) * (side // 2), 64), nn.ReLU(), nn.Linear(64, num_classes),
    )


def logreg(input_shape: tuple[int, ...], num_classes: int) -> nn.Sequential:
    """Multinomial logistic regression on the flattened input."""
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), num_classes))


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int, seed: int = 0) -> nn.Module:
    """A freshly initialised model, seeded so that every run of a sweep starts from the same weights."""
    torch.manual_seed(seed)
    if name == "logreg":
        return logreg(input_shape, num_classes)
    if len(input_shape) != 3:
        raise InputError(f"model {name!r} needs image input (C, H, W), the data has shape {input_shape}")
    c, h, w = input_shape
    if h != w:
        raise InputError(f"model {name!r} expects square images, got {h}x{w}")
    if name == "allcnn":
        if h < 9:  # two stride-2 convs, then a 3x3 conv without padding: needs 3x3 left, so h >= 9
            raise InputError(f"allcnn needs images of at least 9x9, the data has {h}x{w}")
        return all_cnn(c, num_classes)
    if name == "lenet":
        return lenet(c, num_classes, h)
    if name == "cnn":
        return small_cnn(c, num_classes, h)
    raise InputError(f"unknown model {name!r}; choose from {', '.join(MODELS)}")


def num_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@functools.lru_cache(maxsize=16)  # the CLI and each executor ask for the same setups
def macs_per_sample(name: str, input_shape: tuple[int, ...], num_classes: int) -> int:
    """Multiply-accumulates of one sample's forward pass through the convolutions and dense layers
    (counted from the output shapes of a forward pass of one zero sample on the CPU)."""
    model = build_model(name, input_shape, num_classes)
    total = 0

    def count(module: nn.Module, _inputs: Any, out: torch.Tensor) -> None:
        nonlocal total
        if isinstance(module, nn.Conv2d):  # each output element: C_in / groups x k_h x k_w MACs
            kh, kw = module.kernel_size
            total += out.numel() * (module.in_channels // module.groups) * kh * kw
        elif isinstance(module, nn.Linear):
            total += out.numel() * module.in_features

    hooks = [m.register_forward_hook(count) for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    try:
        with torch.no_grad():
            model(torch.zeros((1, *input_shape)))
    finally:
        for h in hooks:
            h.remove()
    return total
