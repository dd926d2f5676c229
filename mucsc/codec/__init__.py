"""The codec, in layers that import only downwards (docs/architecture.md):

- :mod:`~mucsc.codec.wire`: the container (preamble, HEAD, sections, CRC, zstd), the authentication
  trailer, bit packing, rANS and position coding: bytes in, bytes out (spec/FORMAT.md);
- :mod:`~mucsc.codec.numerics`: levels (centroids), eq. 7's rounding, entropy-constrained levels and
  budget allocation: pure functions on arrays;
- :mod:`~mucsc.codec.backends`: the same steps on torch tensors (and the fused Triton kernel), and
  the tensor records the API reads from arrays and torch tensors;
- :mod:`~mucsc.codec.codecs`: the Codec contract, the registry and one module per codec;
- :mod:`~mucsc.codec.ratecontrol`: goals (bits / size / max_error) resolved to fixed codecs;
- :mod:`~mucsc.codec.api`: encode / decode / inspect / verify, the Policy and the stateful Compressor.

Beside the layers, two leaf modules any layer may import: :mod:`~mucsc.codec.kernels` (the compiled
kernels ``_kernels.c`` and the backend switches) and :mod:`~mucsc.codec.parallel` (threads, CRC-32).

The modules' old flat paths (``mucsc.codec.format``, ``mucsc.codec.base``, ...) still import, with a
DeprecationWarning, for one release.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

# old flat module path -> its home in the layers (kept for one release; remove in the next one)
MOVED = {
    "format": "wire.container", "auth": "wire.auth", "bitpack": "wire.bitpack", "rans": "wire.rans",
    "sparse": "wire.sparse",
    "centroids": "numerics.centroids", "quantize": "numerics.quantize", "ecsq": "numerics.ecsq",
    "allocate": "numerics.allocate",
    "torch_backend": "backends.torch_backend", "triton_round": "backends.triton_round",
    "tensors": "backends.tensors",
    "base": "codecs.base", "memory": "codecs.memory",
    "policy": "api.policy", "state": "api.state", "rates": "api.rates", "fingerprint": "api.fingerprint",
}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports ``mucsc.codec.<old>`` as the moved module itself (the same object, so monkeypatching
    either name patches both), with a DeprecationWarning naming the new path."""

    def find_spec(self, fullname, path=None, target=None):
        prefix, _, old = fullname.rpartition(".")
        if prefix != __name__ or old not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        new = f"{__name__}.{MOVED[spec.name.rpartition('.')[2]]}"
        warnings.warn(f"{spec.name} moved to {new}; the old path goes in the next release",
                      DeprecationWarning, stacklevel=2)
        return importlib.import_module(new)

    def exec_module(self, module):
        pass  # the moved module is already executed


if not any(isinstance(f, _MovedModules) for f in sys.meta_path):
    sys.meta_path.append(_MovedModules())
