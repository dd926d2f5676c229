"""The message bytes do not depend on the BLAS thread count (issue 37): every reduction on the encode
path that feeds a choice or the bytes is summed in a fixed order (``kernels.dot``), never by ``np.dot`` (OpenBLAS
splits a long dot product among its threads, which changes the rounding of the sum).

The corpus is every valid vector's case (spec/make_vectors.py: every codec, goal and rounding there)
on its own input and on a larger one (60,000 elements: above OpenBLAS's threading threshold, so a
threaded BLAS does split the sums), encoded in two fresh processes with ``OPENBLAS_NUM_THREADS`` (and
``OMP_NUM_THREADS``) 1 and 2; their SHA-256 digests must agree case by case.

Run as a script it prints the corpus digests as JSON (what the test compares)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.backends

ROOT = Path(__file__).resolve().parents[1]
LARGE = 60_000


def _larger(data, seed):
    """A LARGE-element stand-in for a case's input: Student-t(3) values of the same float dtype and
    largest magnitude, a quarter of them zeros (a float tensor of a dict: the same; other tensors kept)."""
    def big(a, s):
        a = np.asarray(a)
        if a.dtype.kind != "f" or a.size < 2:
            return a
        g = np.random.default_rng(s)
        v = g.standard_t(3, LARGE)
        v *= (float(np.max(np.abs(a.astype(np.float64)))) or 1.0) / np.max(np.abs(v))  # within the case's range
        return np.where(g.random(LARGE) < 0.25, 0.0, v).astype(a.dtype)
    if isinstance(data, dict):
        return {k: big(v, seed + i) for i, (k, v) in enumerate(data.items())}
    return big(data, seed)


def corpus_digests() -> dict[str, str]:
    """name -> SHA-256 of the message, for every valid vector case and its larger stand-in."""
    import mucsc

    sys.path.insert(0, str(ROOT / "spec"))
    import make_vectors as mv

    out = {}
    for i, (name, (_, data, kw)) in enumerate(sorted(mv.CASES.items())):
        kw = dict(kw)
        enc = {"seed": kw.pop("seed", 7), "shared": kw.pop("shared", True), "compress": kw.pop("compress", "auto")}
        codec = kw.pop("codec")
        if "policy" in kw:
            enc["policy"] = mucsc.Policy(**kw.pop("policy"))
        for variant, x in (("", data), ("@large", _larger(data, 1000 + i))):
            blob = mucsc.encode(x, codec, **enc, **kw)
            out[name + variant] = hashlib.sha256(blob).hexdigest()
    return out


def _digests_with(threads: int) -> dict[str, str]:
    env = {**os.environ, "OPENBLAS_NUM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads),
           "MKL_NUM_THREADS": str(threads), "PYTHONPATH": os.pathsep.join(
               [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
    run = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout)


@pytest.mark.skipif(not (ROOT / "spec" / "make_vectors.py").exists(), reason="spec/ not in this checkout")
def test_the_bytes_do_not_depend_on_the_blas_thread_count():
    one, two = _digests_with(1), _digests_with(2)
    assert one.keys() == two.keys() and len(one) >= 40
    differ = sorted(k for k in one if one[k] != two[k])
    assert not differ, f"bytes differ with 1 and 2 BLAS threads: {differ}"


def test_the_encode_path_calls_no_blas_dot(monkeypatch):
    # the same corpus in this process with np.dot refused: no reduction of any codec, goal or
    # rounding goes through BLAS (what makes the test above hold on every machine, not only here:
    # a BLAS kernel's order also changes with the CPU it picks, and small dots are not split)
    def refused(*args, **kwargs):
        raise AssertionError("np.dot on the encode path: use mucsc.codec.kernels.dot")
    monkeypatch.setattr(np, "dot", refused)
    assert len(corpus_digests()) >= 40


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 15, 17, 1000, 65536, 65539, 300_001])
def test_kernels_dot_has_one_order_on_every_backend(n, monkeypatch):
    from mucsc.codec import kernels

    g = np.random.default_rng(n)
    a = g.normal(size=n) * 10.0 ** g.uniform(-6, 6, n)  # magnitudes where the order shows
    b = g.normal(size=n)
    acc = [0.0] * 8  # the documented order, spelled out
    for i in range(0, n - n % 8, 8):
        for j in range(8):
            acc[j] += float(a[i + j]) * float(b[i + j])
    for j in range(n % 8):
        acc[j] += float(a[n - n % 8 + j]) * float(b[n - n % 8 + j])
    want = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))
    got = {}
    for backend in ("c", "numpy") if kernels.c_module() is not None else ("numpy",):
        monkeypatch.setattr(kernels, "BACKEND", backend)
        got[backend] = kernels.dot(a, b)
        assert kernels.dot(a.astype(np.float32), b) == kernels.dot(a.astype(np.float32).astype(np.float64), b)
    assert set(got.values()) == {want}


if __name__ == "__main__":
    print(json.dumps(corpus_digests(), sort_keys=True))
