"""The step "a float64 sum that reaches the wire" (signSGD's and STC's scales, B-MUCSC's mean):
``np.sum(x, dtype=np.float64)`` bit for bit, whatever holds x.

``Host`` is numpy's own sum; ``Torch`` is numpy itself over a view for a CPU tensor, and numpy's
pairwise order rebuilt on the device elsewhere (:func:`mucsc.codec.backends.torch_backend.pairwise_sum64`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from mucsc.codec.backends import torch_backend as tb


class Host:
    @staticmethod
    def sum64(x: np.ndarray) -> float:
        """``np.sum(x, dtype=np.float64)`` as a Python float."""
        return float(x.sum(dtype=np.float64))


class Torch:
    @staticmethod
    def sum64(x: Any) -> float:
        return tb.sum64_like_numpy(x)
