"""Optional dependencies, imported only when a feature needs them.

``import mucsc`` and the codec stay free of torch: torch is imported here on demand (decoding
``as_torch=True``, the torch backend, .pt files and bfloat16 tensors), and a missing or too old torch
becomes one clear error of the caller's type instead of an ImportError traceback.  Every layer (codec,
tensorfiles, CLI, simulator, integrations) may import this module.
"""

from __future__ import annotations

import re
from typing import Any

from mucsc.errors import MucscError, ParameterError

TORCH_EXTRA = "pip install 'mucsc[torch]'"


def require_torch(needed_for: str, error: type[MucscError] = ParameterError,
                  min_version: tuple[int, int] | None = None, why_version: str = "") -> Any:
    """The ``torch`` module, or ``error`` naming what needs it (``needed_for``) and how to install it.

    ``min_version`` (major, minor) refuses an older torch; ``why_version`` says why in the message."""
    try:
        import torch
    except ImportError:
        raise error(f"PyTorch is needed for {needed_for} but is not installed ({TORCH_EXTRA})") from None
    if min_version is not None:
        found = tuple(int(x) for x in re.findall(r"\d+", torch.__version__)[:2])
        if found < min_version:
            need = ".".join(map(str, min_version))
            raise error(f"torch {torch.__version__} is too old for {needed_for}: torch >= {need} is required"
                        + (f" ({why_version})" if why_version else ""))
    return torch
