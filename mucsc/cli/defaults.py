"""Which default ``mucsc compress`` takes, and why: model mode, update mode, or the paper's --shared.

A file without ``--base`` is a model: the default keeps it usable (every float tensor within 1%
relative error, Z chosen per tensor, small and all-zero tensors carried losslessly).  With ``--base``
the input is an update, and the default stays the paper's update codec (unbiased mucsc at the codec's
Z = 16), with one codebook per tensor and exact small tensors.  ``--shared`` is the paper's flattened
update with one codebook for everything, as an explicit choice.  The grouping itself is
:class:`mucsc.Policy`; this module only picks its parameters from the options and says why.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import click

import mucsc

MODEL_MAX_ERROR = 0.01  # the default per-tensor target for a model: ||decoded - x|| / ||x|| <= 1%
# 1-D tensors of a model (norm weights, biases, scales: ~0.1% of the weights, yet every output
# feature goes through them) are carried as fp16 when that keeps them within this, else raw
MODEL_VECTOR_ERROR = 0.001
# a model's --bits / --size budget: no tensor above this relative error unless the budget cannot
# keep them all there, each tensor's squared relative error weighted by its size to the power 0.8
# (weighting "damped": mucsc.codec.numerics.allocate.DAMPED_POWER)
MODEL_ERROR_CAP = 0.10
MODEL_BUDGET = {"weighting": "damped", "error_cap": MODEL_ERROR_CAP}
# a stored model gains nothing from unbiased rounding; nearest rounding to its own levels has about
# half the squared error at the same size (mucsc's rounding parameter)
MODEL_ROUNDING = "nearest"


@dataclasses.dataclass(frozen=True)
class Mode:
    """The chosen default: ``name`` (model/update/shared), the one-line ``reason`` the report prints,
    and what to pass to :func:`mucsc.encode_with_stats` (``shared``, ``policy``)."""

    name: str
    reason: str
    shared: bool
    policy: mucsc.Policy | None
    max_error: float | None
    z_per_tensor: bool
    update: bool


def parse_error(text: str | float, hint: str = "--max-error") -> float:
    """'0.5%' -> 0.005, '0.01' -> 0.01; a usage error unless it is in (0, 1)."""
    t = str(text).strip()
    try:
        v = float(t[:-1]) / 100 if t.endswith("%") else float(t)
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a number (e.g. 0.01 or 1%)", param_hint=hint) from None
    if not (math.isfinite(v) and 0 < v < 1):
        raise click.BadParameter(f"{text!r} must be above 0 and below 100%", param_hint=hint)
    return v


def percent(v: float) -> str:
    return f"{100 * v:.3g}%"


TARGETS = ("z", "bits", "size", "max_error")  # codec parameters that choose the number of centroids


def choose(codec: mucsc.Codec, params: dict[str, Any], *, shared: bool | None,
           update: bool, lossless: tuple[str, ...] = ()) -> tuple[Mode, mucsc.Codec]:
    """The mode for these options (``params``: the codec parameters the user gave; ``lossless``:
    --lossless globs), and the codec to encode with: ``codec`` itself, or without its ``max_error``,
    which then moves to the policy that applies it tensor by tensor, or (a model under a budget) with
    the model's budget split (``MODEL_BUDGET``, where the user did not set it)."""
    fields = {f.name for f in dataclasses.fields(codec.params)}
    book = "codebook" if "z" in fields else "group"
    given = [t for t in TARGETS if t in params]
    if shared:
        what = f"; {given[0]} = {params[given[0]]} for the whole vector" if given else ""
        return Mode("shared", f"--shared: all float tensors as one vector, one {book} (the paper's "
                    f"flattened update){what}", True, None, params.get("max_error"), False, update), codec
    err = params.get("max_error")
    if not update and "rounding" in fields and "rounding" not in params:
        codec = codec.replace(rounding=MODEL_ROUNDING)
    if err is not None:
        codec = codec.replace(max_error=None)
    defaulted = not update and err is None and not given and "max_error" in fields
    if defaulted:
        err = MODEL_MAX_ERROR
    codec, target = _target(codec, params, fields, err, defaulted, update)
    policy = mucsc.Policy(max_error=err, lossy_fp16=not update, lossless=lossless,
                          vector_max_error=None if update else MODEL_VECTOR_ERROR)
    rounding = getattr(codec.params, "rounding", None)
    target += f", {rounding} rounding" if rounding and not update else ""
    reason = _reason(codec.name, book, target, lossless, update)
    return Mode("update" if update else "model", reason, False, policy, err, err is not None, update), codec


def _target(codec: mucsc.Codec, params: dict[str, Any], fields: set[str], err: float | None, defaulted: bool,
            update: bool) -> tuple[mucsc.Codec, str]:
    """What chooses each tensor's coding, in words, and the codec with a model's budget split applied
    (``MODEL_BUDGET`` where the user did not set it)."""
    if err is not None:
        return codec, (f"Z per tensor for <= {percent(err)} relative error"
                       + (" (--max-error to change)" if defaulted else ""))
    if "bits" in params or "size" in params:
        key = "bits" if "bits" in params else "size"
        target = f"--{key} {params[key]}: one budget for the message, split across the tensors"
        budget = {k: v for k, v in MODEL_BUDGET.items() if k in fields and k not in params}
        if not update and budget:
            codec = codec.replace(**budget)
            target += (f" (no tensor above {percent(codec.params.error_cap)} relative error where the budget "
                       "allows; each tensor's error weighted by its size)" if codec.params.error_cap else "")
        return codec, target
    if "z" in fields:
        return codec, f"Z = {getattr(codec.params, 'fixed_z', codec.params.z)}"
    return codec, "no error target (the codec has no --max-error)"


def _reason(name: str, book: str, target: str, lossless: tuple[str, ...], update: bool) -> str:
    """The mode's one-line reason the report prints."""
    kept = f"; tensors matching {', '.join(lossless)} carried exactly" if lossless else ""
    if update:
        return (f"update mode (--base given): {name}, {target}, one {book} per tensor; small and "
                f"all-zero tensors carried exactly{kept}")
    return (f"model mode (no --base): {name}, one {book} per tensor, {target}; 1-D tensors as fp16 "
            f"within {percent(MODEL_VECTOR_ERROR)} (else raw), small and all-zero tensors losslessly{kept} "
            "(--shared: the paper's flattened update)")
