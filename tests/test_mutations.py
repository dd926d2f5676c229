"""Every spec vector, mutated (bit flips, truncations, insertions, with and without a repaired CRC),
raises only MucscError subclasses, and decoding it stays within a memory bound.  Also runs the
atheris fuzz target's oracle (fuzz/fuzz_decode.py) over the vectors as a seed corpus."""

from __future__ import annotations

import importlib.util
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

import mucsc

ROOT = Path(__file__).resolve().parent.parent
VALID = sorted((ROOT / "spec" / "vectors" / "valid").glob("*.mucsc"))
INVALID = sorted((ROOT / "spec" / "vectors" / "invalid").glob("*.mucsc"))
_spec = importlib.util.spec_from_file_location("fuzz_decode", ROOT / "fuzz" / "fuzz_decode.py")
fuzz_decode = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fuzz_decode)

MAX_ELEMENTS = 1 << 16
# decoded output <= 8 bytes * 2^16; sections <= 16 bytes per element + 1 MiB each (a few per group);
# numpy temporaries: a handful of arrays of the output's size
PEAK_BOUND = 8 << 20


def mutations(blob: bytes, seed: int):
    """Deterministic mutants: ~64 bit flips (half in the preamble, section headers and HEAD), ~24
    truncations, ~24 insertions of 1-9 bytes, each also with its CRC repaired."""
    rng = np.random.default_rng(seed)
    n = len(blob)
    hot = min(n, 24 + 32 + 256)  # preamble, HEAD's section header and the start of HEAD's JSON
    flips = np.concatenate([rng.integers(0, 8 * hot, 32), rng.integers(0, 8 * n, 32)])
    for bit in flips:
        b = bytearray(blob)
        b[bit // 8] ^= 1 << (bit % 8)
        yield bytes(b)
    for cut in sorted(set(rng.integers(0, n, 24).tolist())):
        yield blob[:cut]
    for pos in rng.integers(0, n, 24):
        ins = rng.integers(0, 256, int(rng.integers(1, 10)), dtype=np.uint8).tobytes()
        yield blob[:pos] + ins + blob[pos:]


def _decode_all(blob: bytes) -> None:
    for b in (blob, fuzz_decode.with_crc(blob)):
        try:
            mucsc.inspect(b)
            mucsc.decode(b, max_elements=MAX_ELEMENTS)
        except mucsc.MucscError:
            pass


@pytest.mark.parametrize("path", VALID, ids=lambda p: p.stem)
def test_vector_mutations_raise_only_mucsc_errors(path):
    blob = path.read_bytes()
    tracemalloc.start()
    try:
        for i, m in enumerate(mutations(blob, seed=len(blob))):
            _decode_all(m)  # any exception but MucscError fails the test here
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < PEAK_BOUND, f"{path.name}: decoding mutants peaked at {peak} bytes"


def test_fuzz_target_over_seed_corpus():
    for path in VALID + INVALID:
        fuzz_decode.one_input(path.read_bytes())
    for data in (b"", b"\x89MUC\r\n\x1a\n", bytes(64), b"\xff" * 100):
        fuzz_decode.one_input(data)
