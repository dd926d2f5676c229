#!/usr/bin/env python3
"""Mutation campaign over a corpus built from every codec (the campaign of issue 26, kept runnable).

    python fuzz/mutate.py                                  # the bounded run CI does: seeds in fuzz/seeds.txt
    python fuzz/mutate.py --seeds 0-9999 --mutants 100 --out /tmp/escapes   # a longer campaign

The corpus (:func:`corpus`): for every registered codec a shared-codebook state_dict and a per-tensor
one, plus rANS-coded IDs, size and error goals, float16/float64/bfloat16-free mixes, pooled raw groups
(a policy), empty tensors and an authenticated (BLAKE2b) message.  Each seed draws ``--mutants``
mutants (:func:`mutate`: bit flips, random bytes, truncations, insertions, deletions, duplicated
ranges, section-length fields set to edge values, the CRC repaired three times out of four) and runs
the oracle (:func:`check`): ``inspect``, ``decode`` and, for the authenticated message, ``decode`` with
its key raise only ``mucsc.MucscError`` subclasses, and decoding stays within a memory bound
(tracemalloc).  An escape is printed with its seed and index and, with ``--out``, written as a
reproducer file: add it to fuzz/reproducers.py as a regression test.
"""

from __future__ import annotations

import argparse
import struct
import sys
import tracemalloc
import zlib
from pathlib import Path
from typing import NamedTuple

import numpy as np

HERE = Path(__file__).resolve().parent
KEY = bytes(range(32))
MAX_ELEMENTS = 1 << 18
PEAK_BOUND = 64 << 20  # decoding a mutant of a corpus message (< 1 MB, <= 2^18 elements)


def corpus() -> dict[str, bytes]:
    """Messages of every codec and feature, small enough to decode a few thousand times a minute."""
    import mucsc

    rng = np.random.default_rng(0)
    sd = {"conv.w": rng.standard_t(3, size=(16, 3, 3, 3)).astype(np.float32),
          "conv.b": rng.normal(size=16).astype(np.float32),
          "fc.w": rng.normal(size=(10, 40)).astype(np.float16),
          "bn.n": np.array([7], np.int64), "mask": rng.random(12) > 0.5}
    out = {}
    for codec in mucsc.available_codecs():
        params = {"keep": 0.1} if codec in ("bmucsc", "stc", "dgc", "topk") else {}
        for shared in (True, False):
            out[f"{codec}-{'shared' if shared else 'per-tensor'}"] = mucsc.encode(
                sd, codec, seed=1, shared=shared, **params)
    x = rng.normal(size=5000).astype(np.float32)
    out["mucsc-rans"] = mucsc.encode(x, "mucsc", z=8, id_coding="rans", seed=2)
    out["mucsc-bits-goal"] = mucsc.encode(x, "mucsc", bits=1.5, seed=3)
    out["bmucsc-bits-goal"] = mucsc.encode(x, "bmucsc", bits=3.0, seed=4)
    out["mucsc-float64"] = mucsc.encode(x.astype(np.float64), "mucsc", z=4, compress="off")
    out["qsgd-elias"] = mucsc.encode(x, "qsgd", coding="elias", seed=5)
    out["pooled-raw"] = mucsc.encode(sd, "mucsc", policy=mucsc.Policy(), seed=6)
    out["empty"] = mucsc.encode({"a": np.zeros(0, np.float32), "b": np.zeros((0, 3), np.int8)}, "mucsc")
    out["meta"] = mucsc.encode({"w": x[:64]}, "fp16", meta={"k": "v" * 40, "mucsc.update": "old.pt"})
    out["authenticated"] = mucsc.encode(sd, "mucsc", key=KEY, key_id="client-1", context=b"r1")
    return out


def _recrc(b: bytearray) -> bytes:
    """The message with its CRC-32 (at total_length - 4) recomputed, when total_length fits."""
    if len(b) >= 24:
        total = struct.unpack_from("<Q", b, 16)[0]
        if 8 <= total <= len(b):
            struct.pack_into("<I", b, total - 4, zlib.crc32(bytes(b[: total - 4])))
    return bytes(b)


EDGES = [0, 1, 7, 8, 255, 1 << 16, 1 << 31, (1 << 32) - 1, 1 << 40, (1 << 64) - 1]


def mutate(blob: bytes, rng: np.random.Generator) -> bytes:
    """One mutant of ``blob``: 1-4 random edits, then (3 times out of 4) a repaired CRC."""
    b = bytearray(blob)
    for _ in range(int(rng.integers(1, 5))):
        op = int(rng.integers(0, 8))
        n = len(b)
        if n == 0:
            break
        pos = int(rng.integers(0, n))
        if op == 0:  # flip a bit, mostly in the first 400 bytes (preamble, section headers, HEAD)
            pos = int(rng.integers(0, min(n, 400))) if rng.random() < 0.6 else pos
            b[pos] ^= 1 << int(rng.integers(0, 8))
        elif op == 1:
            b[pos: pos + 4] = rng.integers(0, 256, 4, dtype=np.uint8).tobytes()
        elif op == 2:
            del b[int(rng.integers(0, n)):]
        elif op == 3:
            b[pos:pos] = rng.integers(0, 256, int(rng.integers(1, 17)), dtype=np.uint8).tobytes()
        elif op == 4:
            del b[pos: pos + int(rng.integers(1, 17))]
        elif op == 5:
            end = min(n, pos + int(rng.integers(1, 64)))
            b[pos:pos] = b[pos:end]
        elif op == 6 and n >= 56:  # a section header's stored or raw length (section 0 at 24)
            field = 24 + 16 + 8 * int(rng.integers(0, 2))
            struct.pack_into("<Q", b, field, EDGES[int(rng.integers(0, len(EDGES)))])
        else:  # a byte of HEAD's JSON set to a structural character
            pos = 56 + int(rng.integers(0, max(1, min(n - 56, 300))))
            if pos < n:
                b[pos] = b'[]{}",:0\\'[int(rng.integers(0, 9))]
    return _recrc(b) if rng.random() < 0.75 else bytes(b)


class Escape(NamedTuple):
    """A mutant the oracle rejected: where it came from and what went wrong."""

    source: str
    seed: int
    index: int
    problem: str
    blob: bytes


def check(blob: bytes, keyed: bool) -> str | None:
    """None when every reader answers ``blob`` with a result or a MucscError within the memory bound,
    else what went wrong."""
    import mucsc

    tracemalloc.start()
    try:
        calls = [lambda: mucsc.inspect(blob), lambda: mucsc.decode(blob, max_elements=MAX_ELEMENTS)]
        if keyed:
            calls.append(lambda: mucsc.decode(blob, keys={"client-1": KEY}, context=b"r1",
                                              max_elements=MAX_ELEMENTS))
        for call in calls:
            try:
                call()
            except mucsc.MucscError:
                pass
            except Exception as exc:  # noqa: BLE001 - what the oracle looks for
                return f"{type(exc).__name__}: {exc}"
        _, peak = tracemalloc.get_traced_memory()
        return f"peak {peak} bytes > {PEAK_BOUND}" if peak > PEAK_BOUND else None
    finally:
        tracemalloc.stop()


def run(seeds: list[int], mutants: int, messages: dict[str, bytes] | None = None) -> list[Escape]:
    """Every seed's mutants over the corpus (each mutant of a corpus message drawn by the seed)."""
    messages = messages or corpus()
    names = sorted(messages)
    escapes = []
    for seed in seeds:
        rng = np.random.default_rng([seed, 26])
        for i in range(mutants):
            name = names[int(rng.integers(0, len(names)))]
            blob = mutate(messages[name], rng)
            problem = check(blob, keyed=name == "authenticated")
            if problem:
                escapes.append(Escape(name, seed, i, problem, blob))
    return escapes


def read_seeds(spec: str) -> list[int]:
    """Seeds from ``A-B`` (inclusive), ``A,B,C`` or a file of one seed per line ('#' comments)."""
    p = Path(spec)
    if p.exists():
        return [int(s.split("#")[0]) for s in p.read_text().splitlines() if s.split("#")[0].strip()]
    if "-" in spec:
        a, b = spec.split("-")
        return list(range(int(a), int(b) + 1))
    return [int(s) for s in spec.split(",")]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default=str(HERE / "seeds.txt"), help="A-B, A,B,C or a file (default: %(default)s)")
    ap.add_argument("--mutants", type=int, default=40, help="mutants per seed (default: %(default)s)")
    ap.add_argument("--out", type=Path, help="write each escaping mutant here as SOURCE-SEED-INDEX.mucsc")
    args = ap.parse_args(argv)
    seeds = read_seeds(args.seeds)
    escapes = run(seeds, args.mutants)
    for e in escapes:
        print(f"{e.source} seed {e.seed} mutant {e.index}: {e.problem}")
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / f"{e.source}-{e.seed}-{e.index}.mucsc").write_bytes(e.blob)
    print(f"{len(seeds) * args.mutants} mutants, {len(escapes)} escapes")
    return 1 if escapes else 0


if __name__ == "__main__":
    sys.exit(main())
