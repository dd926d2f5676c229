"""One interface per step, chosen once per array: :func:`backend_for` gives a codec the object whose
attributes are the steps of the format (where the values live, elementwise arithmetic, packing,
ordered sums, selection, rounding, lane coding), each from its own module here, in the form for
that array's kind.  A codec calls it once per array and calls the steps through it:
no codec asks whether data is a torch tensor or whether the compiled kernels are built.

Each step module holds a ``Host`` form (numpy arrays: numpy or the compiled kernels, as
:mod:`mucsc.codec.kernels` chose) and a ``Torch`` form (torch tensors on any device) with the same
names (python-zstandard's backends work the same way: one name, one implementation per backend).
Adding a step is one module: its forms, listed in :data:`STEPS`.  tests/test_layers.py
checks the forms match and that the codecs reach no backend but through here.  torch is imported
only when a torch form runs."""

from __future__ import annotations

import types
from typing import Any

import numpy as np

from mucsc.codec import kernels
from mucsc.codec.backends import (device_rounding, elementwise, lane_coding, ordered_sum, packing, rounding,
                                  selection, transfer)
from mucsc.codec.backends.selection import Kept  # noqa: F401  (B-MUCSC's selection, as the codecs name it)
from mucsc.codec.backends.tensors import is_torch_tensor

STEPS = (transfer, elementwise, packing, ordered_sum, selection, rounding, lane_coding)
KINDS = ("Host", "Torch")


class Backend(types.SimpleNamespace):
    """The steps of one kind of array, by name (``name`` is "host" or "torch")."""


def _steps(kind: str) -> dict[str, Any]:
    """Every public step of the ``kind`` forms, by name (a name in two step modules is an error)."""
    found: dict[str, Any] = {}
    for module in STEPS:
        form = getattr(module, kind)
        for name in vars(form):
            if name.startswith("_"):
                continue
            if name in found:
                raise ImportError(f"backend step {name!r} is defined by two step modules")
            found[name] = getattr(form, name)
    return found


HOST = Backend(name="host", **_steps("Host"))
TORCH = Backend(name="torch", **_steps("Torch"))


def backend_of(x: Any) -> Backend:
    """The backend of ``x``'s kind: torch for a torch tensor (any device) or a rounding left on a
    device, the host's for anything else (what state conversions and IDs ask: where the values are)."""
    if type(x) is np.ndarray:  # the usual case, without the torch checks
        return HOST
    return TORCH if is_torch_tensor(x) or isinstance(x, device_rounding.Rounding) else HOST


def backend_for(x: Any) -> Backend:
    """The backend that encodes ``x``: :func:`backend_of`, except that host arrays take the torch
    backend too when ``MUCSC_BACKEND=torch`` asked for it (``kernels.TORCH``, read at call time)."""
    return TORCH if kernels.TORCH else backend_of(x)


def backend_on(device: Any) -> Backend:
    """The backend that decodes onto ``device``: the host's for None, else torch's."""
    return HOST if device is None else TORCH
