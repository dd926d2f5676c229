"""torch checkpoints (.pt/.pth/.bin/.ckpt), loaded only with ``torch.load(weights_only=True)``.

torch is imported inside the functions, never at import time: ``import mucsc`` stays free of torch.
The loaded object must be a tensor (a bare array), a mapping of names to tensors (a state_dict), or a
mapping holding one under one of :data:`STATE_DICT_KEYS` (first match wins); the other top-level
entries are skipped and listed in ``Loaded.notes``.  Non-tensor entries *inside* the chosen state_dict
are refused, not skipped: silently dropping part of a model would make the round trip lie.
"""

from __future__ import annotations

import math
import os
import re
import warnings
from collections.abc import Mapping
from typing import IO, Any

import numpy as np

from mucsc.optional import require_torch
from mucsc.tensorfiles import zips
from mucsc.tensorfiles._common import (
    BARE_NAME, RECORD_DTYPE, Format, Loaded, TensorFileError, _is_torch, _native, _over_limit, record_dtype,
)

#: keys searched, in order, for a state_dict inside a torch checkpoint dict
STATE_DICT_KEYS = ("state_dict", "model_state_dict", "model", "module", "net", "weights", "params")


def sniff(head: bytes) -> bool:
    """A legacy torch.save pickle stream (zip checkpoints are told apart from .npz by their members)."""
    return head.startswith(b"\x80") and len(head) >= 2 and head[1] in range(2, 6)


def load(src: str | IO[bytes], label: str, limit: float, size: int, explicit: bool) -> Loaded:
    """Load a checkpoint from a path or a stream.  A zip checkpoint's members are checked against
    ``limit`` before torch inflates any (:mod:`.zips`); the caller checks the loaded bytes against it
    too (torch views can declare far more than the storages they share)."""
    return _load_torch(src, label, limit, size, explicit)


NEEDS_TORCH = ".pt files and bfloat16 tensors"  # what needs torch, in tensorfiles' error messages


def _torch() -> Any:
    """torch, or a TensorFileError saying it is needed."""
    return require_torch(NEEDS_TORCH, TensorFileError)



def _torch_to_numpy(t: Any, key: str, fmt: str | None = None) -> np.ndarray:
    torch = _torch()
    if t.dtype == torch.bfloat16:
        raise TensorFileError(f"tensor {key!r}: bfloat16 cannot be stored in .{fmt} "
                              "(write .safetensors or .pt)")
    try:
        return t.detach().cpu().resolve_conj().resolve_neg().numpy()
    except (TypeError, RuntimeError) as exc:
        raise TensorFileError(f"tensor {key!r}: {t.dtype} has no numpy equivalent ({exc})") from None


def _check_zip_members(src: str | IO[bytes], label: str, limit: float, size: int, explicit: bool) -> None:
    """A zip checkpoint's members checked before torch reads them (a storage member may be deflated:
    a 2 MB file can inflate to 2 GiB).  A legacy pickle stream stores its storages uncompressed in the
    file itself, so it is left to torch."""
    if isinstance(src, (str, os.PathLike)):
        with open(src, "rb") as f:
            _check_zip_members(f, label, limit, size, explicit)
        return
    start = src.tell()
    try:
        if zips.is_zip(src.read(4)):
            src.seek(start)
            zips.open_checked(src, label, limit, size, explicit, what="torch zip checkpoint").close()
    finally:
        src.seek(start)


def _load_torch(src: str | IO[bytes], label: str, limit: float, size: int, explicit: bool) -> Loaded:
    state, notes, bare = _torch_state(src, label, limit, size, explicit)
    tensors = {k: _from_torch(v, label, k) for k, v in state.items()}
    return Loaded(tensors, "torch", bare=bare, notes=tuple(notes))


def _torch_state(src: str | IO[bytes], label: str, limit: float, size: int, explicit: bool,
                 mmap: bool = False) -> tuple[Mapping, list[str], bool]:
    """(state_dict of torch tensors, notes, bare) of a checkpoint, loaded with
    ``torch.load(weights_only=True)``; ``mmap``: map the storages instead of reading them (a zip
    checkpoint from a path; a legacy one is read whole)."""
    # CVE-2025-32434: torch.load(weights_only=True) could still execute code before torch 2.6
    torch = require_torch("loading .pt checkpoints safely", TensorFileError, min_version=(2, 6),
                          why_version="CVE-2025-32434")
    _check_zip_members(src, label, limit, size, explicit)
    if mmap and isinstance(src, (str, os.PathLike)):
        with open(src, "rb") as f:
            mmap = zips.is_zip(f.read(4))
    try:
        with warnings.catch_warnings():  # e.g. "Detected pickle protocol 4": noise on a CLI
            warnings.simplefilter("ignore")
            obj = torch.load(src, weights_only=True, map_location="cpu", **({"mmap": True} if mmap else {}))
    except Exception as exc:  # noqa: BLE001 - torch raises many types; all mean "cannot load"
        raise TensorFileError(f"{label}: {_torch_load_problem(exc)}") from None
    if isinstance(obj, torch.Tensor):
        return {BARE_NAME: obj}, [], True
    if not isinstance(obj, Mapping):
        raise TensorFileError(f"{label}: holds a {type(obj).__name__}, not a state_dict "
                              "(a mapping of names to tensors)")
    state, notes = _state_dict(obj, label, torch)
    return state, notes, False


class Reader:
    """A torch checkpoint read tensor by tensor: a zip checkpoint is loaded with ``mmap=True`` (its
    storages are mapped, read as each tensor is converted), a legacy one whole.  ``read(i)``: a numpy
    view, or the torch tensor for bfloat16 (as :func:`load` returns them)."""

    def __init__(self, path: str, label: str, limit: float = math.inf, explicit: bool = False) -> None:
        size = os.path.getsize(path)
        state, notes, self.bare = _torch_state(path, label, limit, size, explicit, mmap=True)
        self.notes = tuple(notes)
        self._label = label
        self._tensors = list(state.items())
        self.entries = [(k, _torch_dtype_name(v, label, k), tuple(v.shape)) for k, v in self._tensors]
        nbytes = sum(v.numel() * v.element_size() for _, v in self._tensors)
        if nbytes > limit:  # views can declare far more than the storages they share
            raise _over_limit(label, "the tensors take", nbytes, limit, size, explicit)

    def read(self, i: int) -> Any:
        k, v = self._tensors[i]
        return _from_torch(v, self._label, k)

    def close(self) -> None:
        self._tensors = []


def _torch_dtype_name(t: Any, label: str, key: str) -> str:
    name = str(t.dtype).removeprefix("torch.")
    if name == "bfloat16":
        return name
    return record_dtype(np.dtype(name) if name in RECORD_DTYPE else np.dtype("complex64"),
                        f"{label}: tensor {key!r} ({t.dtype})")


def _state_dict(obj: Mapping, label: str, torch: Any) -> tuple[Mapping, list[str]]:
    """The mapping of names to tensors in a loaded checkpoint: itself, or its first entry under
    STATE_DICT_KEYS that is one (with a note saying what was skipped); TensorFileError otherwise."""
    notes: list[str] = []
    state = obj
    if not _all_tensors(obj, torch):
        for k in STATE_DICT_KEYS:
            if isinstance(obj.get(k), Mapping) and obj[k] and _all_tensors(obj[k], torch):
                state = obj[k]
                skipped = [repr(s) for s in obj if s != k]
                notes.append(f"{label}: using checkpoint[{k!r}]"
                             + (f"; skipped {', '.join(skipped[:8])}" if skipped else "")
                             + (" ..." if len(skipped) > 8 else ""))
                break
    bad = [(k, v) for k, v in state.items() if not (isinstance(k, str) and isinstance(v, torch.Tensor))]
    if bad:
        shown = ", ".join(f"{k!r} ({type(v).__name__})" for k, v in bad[:3])
        more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
        hint = (f"; no state_dict found under {', '.join(map(repr, STATE_DICT_KEYS))}"
                if state is obj else "")
        raise TensorFileError(f"{label}: not a state_dict of tensors: entries {shown}{more} are not "
                              f"named tensors{hint}")
    return state, notes


def _all_tensors(m: Mapping, torch: Any) -> bool:
    return all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in m.items())


def _from_torch(t: Any, label: str, key: str) -> Any:
    """A loaded tensor as a numpy view (no copy), or the tensor itself for bfloat16."""
    torch = _torch()
    if t.layout != torch.strided or t.is_quantized:
        raise TensorFileError(f"{label}: tensor {key!r} is {t.layout} / quantized; only dense "
                              "tensors are supported")
    if t.dtype == torch.bfloat16:
        return t.detach()
    try:
        return _native(t.detach().resolve_conj().resolve_neg().numpy())
    except (TypeError, RuntimeError):
        raise TensorFileError(f"{label}: tensor {key!r} has dtype {t.dtype}, which is not "
                              "supported") from None


def _torch_load_problem(exc: BaseException) -> str:
    """One readable clause out of torch's multi-paragraph load errors."""
    text = str(exc)
    m = re.search(r"Unsupported global: ([^\n]*)", text)
    if m:
        return ("refused: the checkpoint is not plain tensors, loading it would call "
                f"{m.group(1).strip().rstrip('.')}; mucsc loads .pt files only with "
                "torch.load(weights_only=True)")
    m = re.search(r"WeightsUnpickler error: \s*([^\n]+)", text)
    if m:
        return (f"not a torch checkpoint that torch.load(weights_only=True) can read "
                f"({m.group(1).strip()})")
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    first = first.split(". ")[0].rstrip(".")
    return f"not a readable torch checkpoint ({first[:300]})"


def _save_torch(f: IO[bytes], tensors: Mapping[str, Any]) -> None:
    torch = _torch()
    out = {}
    for key, t in tensors.items():
        if not _is_torch(t):
            a = np.asarray(t)
            t = torch.from_numpy(a if a.flags.writeable else a.copy())
        out[key] = t
    torch.save(out, f)



save = _save_torch
# stream in (mapped storages); no stream out: torch.save pickles the whole state_dict at once, so a
# .pt output holds the model in memory (write .safetensors to stream)
FORMAT = Format("torch", (".pt", ".pth", ".bin", ".ckpt"), sniff, load, save, open_reader=Reader,
                needs_torch=True)
