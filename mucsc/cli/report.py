"""What the commands print: size tables with an unambiguous ratio line, and plain-JSON reports.

Ratios are said one way only: bytes first, then "N.NNx smaller (original/compressed), P% saved"
(gzip prints space saved, xz compressed/original, zstd original/compressed; users mix them up).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from mucsc.texttable import text_table

MAX_ROWS = 20  # larger tables show the first rows and one summary row
WORST_ROWS = 5  # the per-tensor quality table lists this many tensors of largest relative error
WARN_ERROR = 0.10  # a model with a float tensor beyond this relative error gets a warning
CAP_SLACK = 1.05  # a measured error this far above a budget's error cap: the budget could not keep it
RATIO_BASIS = "tensor bytes (elements x dtype size, not the input file's size) / message bytes"

FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
ITEMSIZE = {"bool": 1, "int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "float16": 2, "bfloat16": 2,
            "int32": 4, "uint32": 4, "float32": 4, "int64": 8, "uint64": 8, "float64": 8}


def nbytes(n: int) -> str:
    """1234567 -> '1,234,567'."""
    return f"{n:,}"


def ratio_phrase(original: int, compressed: int) -> str:
    """'7.95x smaller (original/compressed), 87.4% saved' (or larger, when it grew)."""
    if compressed <= 0:
        return "n/a"
    if original >= compressed:
        saved = 100.0 * (1 - compressed / original) if original else 0.0
        return f"{original / compressed:.2f}x smaller (original/compressed), {saved:.1f}% saved"
    grew = 100.0 * (compressed / original - 1) if original else math.inf
    return f"{compressed / original:.2f}x larger (compressed/original), {grew:.1f}% more" if original \
        else "larger than the (empty) original"


def fmt_float(v: float | None) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    return f"{v:.3g}" if v == 0 or 1e-3 <= abs(v) < 1e4 else f"{v:.3e}"


def record_bytes(dtype: str, shape: Sequence[int]) -> int:
    return math.prod(shape) * ITEMSIZE.get(dtype, 0)


def used_params(codec: Any, groups: Sequence[Any], per_tensor: Sequence[str] = ()) -> dict[str, Any]:
    """The parameters of ``codec`` as the message used them, for the report: those set, with any the
    encoder resolved per group (an "auto" choice, a goal's z or keep; ``GroupStats.config``) shown as
    the groups' value, or their range / alternatives when groups differ.  ``per_tensor``: parameters
    the mode line already describes as chosen per tensor (left out)."""
    mine = [g.config for g in groups if g.codec == codec.name and g.config]
    out: dict[str, Any] = {}
    for key, value in codec.get_config().items():
        if key == "codec" or key in per_tensor:
            continue
        seen = list(dict.fromkeys(c[key] for c in mine if c.get(key) is not None))
        if not seen or seen == [value]:
            if value is not None:
                out[key] = value
        elif len(seen) == 1:
            out[key] = seen[0]
        elif all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in seen):
            out[key] = f"{min(seen)}..{max(seen)} (per group)"
        else:
            out[key] = "/".join(map(str, sorted(seen, key=str))) + " (per group)"
    return out


def compress_lines(src: str, dst: str, codec: str, params: dict[str, Any], mode: Any,
                   stats: Any, info: Any, norm2: float, base: str | None) -> list[str]:
    """The human report of ``mucsc compress``: the mode line, one row per group, the worst tensors by
    relative error, then the totals line."""
    rec_bytes = {r.name: record_bytes(r.dtype, r.shape) for r in info.records}
    rows = []
    for g, gs in zip(info.groups, stats.groups):
        names = g.records
        label = names[0] if len(names) == 1 else f"{len(names)} tensors"
        orig = sum(rec_bytes[n] for n in names)
        rows.append([str(g.index), label or "(array)", g.codec, nbytes(g.elements), nbytes(orig),
                     nbytes(g.bytes), fmt_float(8 * g.bytes / g.elements if g.elements else math.nan),
                     fmt_float(gs.stats.get("J"))])
    if len(rows) > MAX_ROWS:
        rest = rows[MAX_ROWS - 1:]
        rows = rows[: MAX_ROWS - 1] + [["...", f"{len(rest)} more groups", "", "", "", "", "", ""]]
    out = [f"{src} -> {dst}", f"  {mode.reason}",
           "  codec " + " ".join([codec] + [f"{k}={v}" for k, v in params.items()])
           + (f"; update relative to {base}" if base else "")]
    out += ["  " + s for s in text_table(["group", "tensors", "codec", "elements", "tensor B", "stored B",
                                     "bits/elem", "J"], rows, [True, False, False, True, True, True, True, True])]
    out += worst_lines(stats.tensors)
    out.append("  total: " + totals_phrase(stats.original_bytes, stats.message_bytes, stats.elements,
                                           stats.J, norm2))
    if info.auth is not None:
        out.append("  " + auth_phrase(info.auth).replace(", not verified (no keys given)", ""))
    return out


def worst_lines(tensors: Sequence[Any]) -> list[str]:
    """The float tensors of largest measured relative error (||decoded - x|| / ||x||)."""
    lossy = [t for t in tensors if t.dtype in FLOAT_DTYPES and (t.rel_error is None or t.rel_error > 0)]
    if not lossy:
        return ["  every tensor is stored exactly"] if tensors else []
    lossy.sort(key=lambda t: (t.rel_error is not None, -(t.rel_error or 0.0), t.name))
    rows = [[t.name or "(array)", t.codec, t.dtype, "x".join(map(str, t.shape)) or "scalar",
             fmt_float(t.bits_per_element), error_text(t)] for t in lossy[:WORST_ROWS]]
    title = (f"  worst tensors by relative error ||decoded - x|| / ||x|| (measured; {len(lossy)} lossy of "
             f"{len(tensors)}):")
    return [title] + ["    " + s for s in text_table(["tensor", "codec", "dtype", "shape", "bits/elem", "rel error"],
                                                rows, [False, False, False, False, True, True])]


def error_text(t: Any) -> str:
    if t.rel_error is None:  # an all-zero tensor that does not decode to zeros
        return f"inf (x = 0, ||error|| = {fmt_float(t.abs_error)})"
    return f"{100 * t.rel_error:.3g}%"


def quality_warning(stats: Any, codec: Any = None) -> str | None:
    """A sentence when any float tensor of a model exceeds WARN_ERROR relative error, else None;
    under a --bits/--size budget with an error cap (``codec``'s), which tensors and why."""
    bad = [t for t in stats.tensors if t.dtype in FLOAT_DTYPES and (t.rel_error is None or t.rel_error > WARN_ERROR)]
    if not bad:
        return None
    bad.sort(key=lambda t: (t.rel_error is not None, -(t.rel_error or 0.0)))
    worst = bad[0]
    p = getattr(codec, "params", None)
    target = getattr(p, "target", None)
    cap = getattr(p, "error_cap", None)
    # the cap bounds the expected error; a measured one strays a little (CAP_SLACK)
    if target in ("bits", "size") and cap and (worst.rel_error is None or worst.rel_error > cap * CAP_SLACK):
        shown = ", ".join(f"{t.name or '(array)'} {error_text(t)}" for t in bad[:5])
        more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
        budget = f"--bits {p.bits:g}" if target == "bits" else f"--size {p.size}"
        return (f"{len(bad)} float tensor(s) exceed {100 * WARN_ERROR:.0f}% relative error: {shown}{more}. "
                f"{budget} is below the smallest message that keeps every tensor within "
                f"{100 * p.error_cap:.3g}% (--error-cap), so the budget was split to keep the worst tensor as "
                "low as it allows; a larger budget or --max-error keeps them all within bounds")
    return (f"{len(bad)} float tensor(s) exceed {100 * WARN_ERROR:.0f}% relative error (worst: "
            f"{worst.name or '(array)'} {error_text(worst)}); the restored model may not work "
            "(the default without --shared/--z keeps every tensor within 1%; see --max-error)")


def size_keys(original: int, compressed: int, elements: int) -> dict[str, Any]:
    """The size figures of every JSON report, under the same keys in ``compress`` and ``info``."""
    return {"original_bytes": original, "compressed_bytes": compressed, "elements": elements,
            "ratio": original / compressed if compressed else None, "ratio_basis": RATIO_BASIS,
            "saved_percent": 100.0 * (1 - compressed / original) if original else None,
            "bits_per_element": 8 * compressed / elements if elements else None}


def tensor_entry(t: Any) -> dict[str, Any]:
    """One tensor's figures in a JSON report (``compress --json`` and ``info --json``)."""
    return {"name": t.name, "dtype": t.dtype, "shape": list(t.shape), "codec": t.codec, "group": t.group,
            "bits_per_element": t.bits_per_element, "rel_error": t.rel_error, "abs_error": t.abs_error}


def info_json(name: str, info: Any) -> dict[str, Any]:
    """``mucsc info --json``: the message summary plus the same size and tensor keys as compress."""
    d = info.to_dict()
    d.update(size_keys(info.original_bytes, info.size, info.elements))
    per = {g.index: (g.codec, 8 * g.bytes / g.elements if g.elements else None) for g in info.groups}
    d["tensors"] = [{"name": r.name, "dtype": r.dtype, "shape": list(r.shape), "codec": per[r.group][0],
                     "group": r.group, "bits_per_element": per[r.group][1], "rel_error": None,
                     "abs_error": None} for r in info.records]  # errors need the original: not in a message
    return {"file": name, **d}


def auth_phrase(a: Any) -> str:
    """'authenticated: blake2b-256, key id 'client-17', 45 B trailer (32 B tag), verified'."""
    state = "verified" if a.verified else "not verified (no keys given)"
    return (f"authenticated: {a.algorithm}, key id {a.key_id!r}, {a.trailer_bytes} B trailer "
            f"({a.tag_bytes} B tag), {state}")


def totals_phrase(original: int, compressed: int, elements: int, J: float | None, norm2: float | None) -> str:
    """'tensor bytes 5,200,008 -> 654,321 bytes, 7.95x smaller (...), 87.4% saved; 4.03 bits/element; J ...'."""
    bits = 8 * compressed / elements if elements else math.nan
    text = (f"tensor bytes {nbytes(original)} -> {nbytes(compressed)} bytes, {ratio_phrase(original, compressed)}; "
            f"{fmt_float(bits)} bits/element")
    if J is not None:
        text += f"; J = {fmt_float(J)}"
        rel = relative_error(J, norm2)
        if rel is not None:
            text += f", expected relative error sqrt(J)/||x|| = {100 * rel:.3g}%"
    return text


def relative_error(J: float | None, norm2: float | None) -> float | None:
    """sqrt(J / ||x||^2): the root-mean-square relative error to expect (None when undefined)."""
    if J is None or norm2 is None:
        return None
    if norm2 == 0:
        return 0.0 if J == 0 else None
    return math.sqrt(J / norm2)


def info_lines(name: str, info: Any) -> list[str]:
    """The human output of ``mucsc info``."""
    out = [f"{name}: mucsc message v{info.version}, {nbytes(info.size)} bytes, "
           f"{len(info.records)} tensor(s) in {len(info.groups)} group(s), container {info.container}",
           "  " + totals_phrase(info.original_bytes, info.size, info.elements, None, None)]
    if info.meta:
        out.append("  meta: " + ", ".join(f"{k}={v}" for k, v in sorted(info.meta.items())))
    if info.auth is not None:
        out.append("  " + auth_phrase(info.auth))
    out.append("records:")
    out += ["  " + s for s in text_table(["name", "dtype", "shape", "group"],
                                    [[r.name or "(array)", r.dtype, "x".join(map(str, r.shape)) or "scalar",
                                      str(r.group)] for r in info.records], [False, False, False, True])]
    out.append("groups:")
    out += ["  " + s for s in text_table(
        ["group", "codec", "dtype", "elements", "bytes", "bits/elem", "params"],
        [[str(g.index), g.codec, g.dtype, nbytes(g.elements), nbytes(g.bytes),
          fmt_float(8 * g.bytes / g.elements if g.elements else math.nan),
          " ".join(f"{k}={v}" for k, v in g.params.items())] for g in info.groups],
        [True, False, False, True, True, True, False])]
    out.append("sections:")
    out += ["  " + s for s in text_table(
        ["group", "tag", "encoding", "stored B", "raw B"],
        [["-" if s.group is None else str(s.group), s.tag, s.encoding, nbytes(s.stored_bytes),
          nbytes(s.raw_bytes)] for s in info.sections], [True, False, False, True, True])]
    return out
