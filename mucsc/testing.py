"""The contract every codec meets, as plain functions that raise AssertionError.

mucsc's test suite runs :func:`check_codec` for every registered codec (built-in or plugin), and a
plugin's own tests can call it: ``mucsc.testing.check_codec(mucsc.get_codec("mine"))``.  It checks
round trips (shapes, dtypes, empty and one-element inputs, state dicts with integer tensors),
determinism for a seed, unbiasedness where the codec claims it (statistically, on data that needs no
clipping), parameter validation (unknown names, wrong types, the declared ``limits``), and decoders
against hostile sections (truncated, extended, missing, extra, bit-flipped), which must raise only
:class:`~mucsc.FormatError` or decode to finite values of the right shape.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable

import numpy as np

import mucsc
from mucsc.codec.wire import container as fmt

SIZES = (0, 1, 2, 9, 1000)


def check_codec(codec: mucsc.Codec, *, sizes: Iterable[int] = SIZES) -> None:
    """Every check below, for one configured codec."""
    check_round_trip(codec, sizes)
    check_float16_extremes(codec)
    check_deterministic(codec)
    if codec.unbiased and not codec.lossless:
        check_unbiased(codec)
    check_parameters(type(codec))
    check_hostile_sections(codec)


def _data(n: int, seed: int, dtype: type = np.float32) -> np.ndarray:
    # uniform in [-1, 1): no outliers, so codecs that clip (TernGrad's 2.5 sigma) leave it unchanged
    return np.random.default_rng(seed).uniform(-1, 1, n).astype(dtype)


def check_round_trip(codec: mucsc.Codec, sizes: Iterable[int] = SIZES) -> None:
    """Arrays of every size and both float dtypes, and a state dict, decode to their shapes and dtypes."""
    for n in sizes:
        for dtype in (np.float32, np.float64):
            x = _data(n, n, dtype)
            y = mucsc.decode(mucsc.encode(x, codec))
            assert isinstance(y, np.ndarray) and y.dtype == x.dtype and y.shape == x.shape, \
                f"{codec!r}: n={n} {np.dtype(dtype).name} decoded to {getattr(y, 'dtype', y)} {getattr(y, 'shape', '')}"
            assert np.all(np.isfinite(y)), f"{codec!r}: non-finite values decoded (n={n})"
            if codec.lossless:
                assert np.array_equal(x, y), f"{codec!r} is declared lossless but changed the data"
    sd = {"w": _data(600, 1).reshape(20, 30), "b": _data(30, 2), "step": np.array([3], np.int64)}
    for shared in (True, False):
        out = mucsc.decode(mucsc.encode(sd, codec, shared=shared))
        assert list(out) == ["w", "b", "step"] and out["w"].shape == (20, 30) and out["step"][0] == 3, \
            f"{codec!r}: a state dict did not round-trip (shared={shared})"


def check_float16_extremes(codec: mucsc.Codec, seeds: int = 40) -> None:
    """Finite float16 data as large as float16 allows (alone, and next to float32 data in one shared
    group) decodes to finite float16, without a numpy warning, for every seed: a codec that scales
    (QSGD's bucket norm exceeds 65504 here) must not round past what the record dtype holds, and the
    decoder saturates at the record's range rather than give +-inf (FORMAT.md 2.4)."""
    import warnings

    big = np.array([65504, -65504, 1e-7, 0, 6e4, -3e4, 65000, 1], np.float16)
    sd = {"h": big, "f": _data(8, 3) * 1e5}
    for seed in range(seeds):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            y = mucsc.decode(mucsc.encode(big, codec, seed=seed))
            out = mucsc.decode(mucsc.encode(sd, codec, seed=seed))
        for v in (y, out["h"]):
            assert v.dtype == np.float16 and np.all(np.isfinite(v)), \
                f"{codec!r}: finite float16 input decoded to {v} (seed {seed})"


def check_deterministic(codec: mucsc.Codec) -> None:
    """The same input, codec and seed give the same bytes, with and without zstd."""
    x = _data(3000, 5)
    for compress in ("auto", "off"):
        a = mucsc.encode(x, codec, seed=7, compress=compress)
        assert a == mucsc.encode(x, codec, seed=7, compress=compress), f"{codec!r} is not deterministic"


def check_unbiased(codec: mucsc.Codec, n: int = 300, draws: int = 400) -> None:
    """E[decode(encode(x))] = x: over ``draws`` seeds the mean error is within noise of zero.

    With errors e_s independent across seeds, E||mean_s e_s||^2 = E||e||^2 / draws; the check
    allows four times that (measured on the same draws), which a biased codec misses by far.
    """
    x = _data(n, 11, np.float64)
    errs = np.stack([mucsc.decode(mucsc.encode(x, codec, seed=s)) - x for s in range(draws)])
    bias2 = float(np.sum(errs.mean(axis=0) ** 2))
    noise2 = float(np.sum(errs ** 2)) / draws / draws
    assert bias2 <= 4 * noise2 + 1e-12 * float(np.dot(x, x)), \
        f"{codec!r} claims to be unbiased, but ||mean error||^2 = {bias2:.3g} >> {noise2:.3g} (noise)"


def _raises_parameter_error(make: Callable[[], object], what: str) -> None:
    try:
        make()
    except mucsc.ParameterError:
        return
    raise AssertionError(f"{what}: no ParameterError")


def check_parameters(cls: type[mucsc.Codec]) -> None:
    """Unknown names, values of the wrong type and values outside ``cls.limits`` raise ParameterError."""
    _raises_parameter_error(lambda: cls(no_such_parameter=1), f"{cls.name}: an unknown parameter")
    for f in dataclasses.fields(cls.Params):
        kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "")
        if kind.replace(" ", "") in ("int", "float"):
            _raises_parameter_error(lambda f=f: cls(**{f.name: "not a number"}), f"{cls.name}.{f.name}='not a number'")
    for field, (lo, hi) in cls.limits.items():
        below = lo - 1 if isinstance(lo, int) else math.nextafter(lo, -math.inf)
        above = hi + 1 if isinstance(hi, int) else math.nextafter(hi, math.inf)
        for bad in (below, above):
            _raises_parameter_error(lambda bad=bad, field=field: cls(**{field: bad}), f"{cls.name}.{field}={bad}")


def check_hostile_sections(codec: mucsc.Codec, n: int = 500) -> None:
    """Messages whose sections were truncated, extended, dropped, added or bit-flipped (with a valid
    checksum) raise FormatError, or (flips only) decode to finite values of the right shape."""
    blob = mucsc.encode(_data(n, 3), codec, compress="off")
    msg = fmt.read_message(blob)
    for gi in range(len(msg.header.groups)):
        secs = {t: bytes(v) for t, v in msg.group_sections(gi).items()}

        def rewrite(new: dict[str, bytes]) -> bytes:
            return fmt.write_message(msg.header, [(gi, t, d, False) for t, d in new.items()], zstd_level=None)

        def must_fail(new: dict[str, bytes], what: str) -> None:
            try:
                mucsc.decode(rewrite(new))
            except mucsc.FormatError:
                return
            raise AssertionError(f"{codec!r}: a message with {what} decoded without FormatError")

        for tag, data in secs.items():
            if data:
                must_fail({**secs, tag: data[:-1]}, f"section {tag} one byte short")
            must_fail({**secs, tag: data + b"\x00"}, f"section {tag} one byte long")
            must_fail({t: d for t, d in secs.items() if t != tag}, f"section {tag} missing")
            rng = np.random.default_rng(len(data))
            for i in rng.choice(len(data), min(len(data), 16), replace=False) if data else []:
                bad = bytearray(data)
                bad[i] ^= 1 << int(rng.integers(8))
                try:
                    y = mucsc.decode(rewrite({**secs, tag: bytes(bad)}))
                except mucsc.FormatError:
                    continue
                assert y.shape == (n,) and np.all(np.isfinite(y)), \
                    f"{codec!r}: a bit flip in {tag} decoded to a wrong shape or non-finite values"
        must_fail({**secs, "Xtra": b"\x01\x02"}, "an unknown critical section")
