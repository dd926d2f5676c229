#!/usr/bin/env python3
"""Memory campaign on format 1.2's sections (issue 38): mutants of dithered and lane-coded messages
must decode within 2 x their output + 32 MiB, or be refused with a MucscError within 32 MiB.

    python fuzz/sections12.py --minutes 10              # the campaign of issue 38 (prints the counts)
    python fuzz/sections12.py --mutants 200 --seed 1    # a bounded run (what tests/test_hostile_round4.py does)

The corpus (:func:`corpus`): ``mucsc`` with ``rounding="dithered"`` (fixed z, the bits/size/max_error
goals, escapes, 1 to 16 contexts, float64), ``mucsc`` and ``bmucsc`` with lane-coded IDs (IDSL),
rANS-coded IDs (IDSA), in tensor and dict containers, and a dict of every other lossy codec (a float16
record in a float32 group: decoded into its records a piece at a time).  Each mutant applies
1-3 edits (:func:`mutate`): a record's shape grown by 2^1 .. 2^10 (what the messages of
shared/data/hostile-4 did to HEAD: the group then claims more elements than its sections code),
bit flips, edge values written over 1-4 bytes, truncations and insertions inside one of the group's
sections (GRID, QIDX, QESC, IDSL, IDSA, CENT, INDX...), a header parameter (``symbols``, ``escape``,
``centroids``, ``k``) changed; HEAD is re-serialised and the CRC recomputed, so every mutant reaches
the codec.  The oracle (:func:`check`) decodes with ``max_elements`` 2^22 and no ``max_expansion``
(the limits would hide the decoder's own memory) under tracemalloc: a non-MucscError is an escape, so
is a peak above 2 x the output + 32 MiB (32 MiB when refused).  "Output" is the returned arrays'
bytes (a float16 record of a float32 group counts its own 2 bytes an element: FORMAT.md 3.2).
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
import time
import tracemalloc
import zlib
from pathlib import Path
from typing import NamedTuple

import numpy as np
import zstandard

HERE = Path(__file__).resolve().parent
MiB = 1 << 20
SLACK = 32 * MiB
MAX_ELEMENTS = 1 << 22
EDGES = [0, 1, 2, 0x7F, 0x80, 0xFF, 0xFFFF, 1 << 23, (1 << 31) - 1, (1 << 32) - 1]


def corpus() -> dict[str, bytes]:
    """Format 1.2 messages (and 1.1 IDSA ones) of a few thousand elements each."""
    import mucsc

    rng = np.random.default_rng(38)
    x = rng.standard_normal(6000).astype(np.float32)
    sparse = np.where(rng.random(6000) < 0.05, x, 0).astype(np.float32)
    sd = {"a": rng.standard_t(3, size=(40, 30)).astype(np.float32), "b": rng.normal(size=700).astype(np.float32),
          "h": rng.normal(size=500).astype(np.float16)}
    out = {
        "dith-z16": mucsc.encode(x, "mucsc", rounding="dithered", z=16, seed=1),
        "dith-z4": mucsc.encode(x, "mucsc", rounding="dithered", z=4, seed=2),
        "dith-bits2": mucsc.encode(x, "mucsc", rounding="dithered", bits=2.0, seed=3),
        "dith-bits5": mucsc.encode(x, "mucsc", rounding="dithered", bits=5.0, seed=4),
        "dith-maxerr": mucsc.encode(x, "mucsc", rounding="dithered", max_error=0.05, seed=5),
        "dith-sparse": mucsc.encode(sparse, "mucsc", rounding="dithered", bits=1.0, seed=6),
        "dith-f64": mucsc.encode(x.astype(np.float64), "mucsc", rounding="dithered", z=64, seed=7),
        "dith-const": mucsc.encode(np.full(3000, 0.25, np.float32), "mucsc", rounding="dithered", z=16, seed=8),
        "dith-dict": mucsc.encode(sd, "mucsc", rounding="dithered", z=16, seed=9),
        "lanes": mucsc.encode(x, "mucsc", z=16, id_coding="lanes", seed=10),
        "lanes-dict": mucsc.encode(sd, "mucsc", id_coding="lanes", seed=11),
        "bmucsc-lanes": mucsc.encode(x, "bmucsc", keep=0.1, id_coding="lanes", seed=16),
        "idsa": mucsc.encode(x, "mucsc", z=8, id_coding="rans", seed=12),
        "bmucsc": mucsc.encode(x, "bmucsc", keep=0.1, seed=13),
        "bmucsc-rans": mucsc.encode(x, "bmucsc", keep=0.1, id_coding="rans", seed=14),
        "bmucsc-dict": mucsc.encode(sd, "bmucsc", keep=0.05, seed=15),
        **{f"{name}-dict": mucsc.encode(sd, name.split("-")[0], seed=17 + i, **p) for i, (name, p) in enumerate((
            ("topk", {"keep": 0.1}), ("qsgd", {}), ("qsgd-elias", {"coding": "elias"}), ("terngrad", {}),
            ("signsgd", {}), ("fp16", {})))},
    }
    return out


class Parts(NamedTuple):
    """A message taken apart: preamble fields, HEAD as JSON, the other sections verbatim."""

    major: int
    minor: int
    flags: int
    head: dict
    sections: list  # [tag, group, encoding, stored bytes, raw length]


def split(blob: bytes) -> Parts:
    from mucsc.codec.wire import container as fmt

    _magic, major, minor, flags, count, _total = fmt.PREAMBLE.unpack_from(blob, 0)
    pos, sections = fmt.PREAMBLE.size, []
    for _ in range(count):
        tag, group, enc, _r1, _r2, _r3, stored, raw = fmt.SECTION.unpack_from(blob, pos)
        pos += fmt.SECTION.size
        sections.append([tag.decode(), group, enc, bytes(blob[pos: pos + stored]), raw])
        pos += stored + fmt.padding(stored)
    _tag, _group, enc, stored, _raw = next(s for s in sections if s[0] == "HEAD")
    head = json.loads(zstandard.ZstdDecompressor().decompress(stored) if enc else stored)
    return Parts(major, minor, flags, head, [s for s in sections if s[0] != "HEAD"])


def join(p: Parts) -> bytes:
    """The message again: HEAD stored raw, every other section as it was, a valid CRC."""
    from mucsc.codec.wire import container as fmt

    head = fmt.canonical_json(p.head)
    rows = [["HEAD", fmt.MESSAGE_GROUP, 0, head, len(head)], *p.sections]
    body = []
    for tag, group, enc, data, raw in rows:
        body.append(fmt.SECTION.pack(tag.encode(), group, enc, 0, 0, 0, len(data), raw if enc else len(data)))
        body.append(data + bytes(fmt.padding(len(data))))
    total = fmt.PREAMBLE.size + sum(map(len, body)) + 4
    out = fmt.PREAMBLE.pack(fmt.MAGIC, p.major, p.minor, p.flags, len(rows), total) + b"".join(body)
    return out + struct.pack("<I", zlib.crc32(out))


def mutate(p: Parts, rng: np.random.Generator) -> Parts:
    """1-3 edits of a copy of ``p`` (see the module's docstring)."""
    head = json.loads(json.dumps(p.head))
    sections = [list(s) for s in p.sections]
    for _ in range(int(rng.integers(1, 4))):
        op = int(rng.integers(0, 6))
        if op == 0 and head["records"]:  # grow a record: its group claims more elements
            rec = head["records"][int(rng.integers(0, len(head["records"])))]
            shape = rec["shape"] or [1]
            total = int(np.prod(shape)) or 1
            grow = 1 << int(rng.integers(1, 11))
            if total * grow <= MAX_ELEMENTS:
                rec["shape"] = [shape[0] * grow, *shape[1:]]
        elif op == 1 and head["groups"]:
            g = head["groups"][int(rng.integers(0, len(head["groups"])))]
            params = g.get("params", {})
            key = [k for k in ("symbols", "centroids", "k", "escape") if k in params]
            if key:
                k = key[int(rng.integers(0, len(key)))]
                params[k] = (not params[k]) if isinstance(params[k], bool) else max(0, params[k] + int(
                    rng.choice([-1, 1, 2, -2, 100, 1 << 16])))
        elif sections:
            s = sections[int(rng.integers(0, len(sections)))]
            data = bytearray(s[3])
            if s[2] != 0 or not data:  # zstd-stored: flip a byte only
                if data:
                    data[int(rng.integers(0, len(data)))] ^= 1 << int(rng.integers(0, 8))
            elif op == 2:
                data[int(rng.integers(0, len(data)))] ^= 1 << int(rng.integers(0, 8))
            elif op == 3:  # an edge value over 1, 2 or 4 bytes (a count, a length, a frequency)
                width = int(rng.choice([1, 2, 4]))
                at = int(rng.integers(0, max(1, len(data) - width + 1)))
                v = EDGES[int(rng.integers(0, len(EDGES)))] & ((1 << (8 * width)) - 1)
                data[at: at + width] = v.to_bytes(width, "little")[: len(data) - at]
            elif op == 4:
                del data[int(rng.integers(0, len(data))):]
            else:
                at = int(rng.integers(0, len(data) + 1))
                data[at:at] = rng.integers(0, 256, int(rng.integers(1, 9)), dtype=np.uint8).tobytes()
            s[3] = bytes(data)
            if s[2] == 0:
                s[4] = len(data)
    return Parts(p.major, p.minor, p.flags, head, sections)


def output_bytes(result) -> int:
    """The returned arrays' bytes."""
    arrays = result.values() if isinstance(result, dict) else [result]
    return sum(int(a.nbytes) for a in arrays)


def check(blob: bytes) -> tuple[str, str | None]:
    """(outcome, problem): outcome "decoded" or the MucscError's type; problem None when the decode
    stayed within the bound, else what went wrong."""
    import mucsc

    tracemalloc.start()
    try:
        try:
            result = mucsc.decode(blob, max_elements=MAX_ELEMENTS, max_expansion=None)
        except mucsc.MucscError as exc:
            _, peak = tracemalloc.get_traced_memory()
            return type(exc).__name__, (f"refused after a peak of {peak} bytes" if peak > SLACK else None)
        except Exception as exc:  # noqa: BLE001 - what the oracle looks for
            return "escape", f"{type(exc).__name__}: {exc}"
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    out = output_bytes(result)
    return "decoded", (f"peak {peak} bytes for {out} bytes of output" if peak > 2 * out + SLACK else None)


def run(seed: int, mutants: int | None, seconds: float | None, out: Path | None = None) -> dict:
    """Mutants until ``mutants`` were checked or ``seconds`` have passed; the counts per outcome, the
    largest peak ratio seen, and the problems (written to ``out`` as reproducers)."""
    messages = {k: split(v) for k, v in corpus().items()}
    names = sorted(messages)
    rng = np.random.default_rng([seed, 38])
    counts: dict[str, int] = {}
    problems = []
    start = time.monotonic()
    i = 0
    while (mutants is None or i < mutants) and (seconds is None or time.monotonic() - start < seconds):
        name = names[int(rng.integers(0, len(names)))]
        blob = join(mutate(messages[name], rng))
        outcome, problem = check(blob)
        counts[outcome] = counts.get(outcome, 0) + 1
        if problem:
            problems.append((name, i, problem))
            if out:
                out.mkdir(parents=True, exist_ok=True)
                (out / f"{name}-{seed}-{i}.mucsc").write_bytes(blob)
        i += 1
    return {"mutants": i, "seconds": round(time.monotonic() - start, 1), "outcomes": counts, "problems": problems}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, help="run for this long")
    ap.add_argument("--mutants", type=int, help="stop after this many mutants")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, help="write each problem mutant here as NAME-SEED-INDEX.mucsc")
    args = ap.parse_args(argv)
    if args.minutes is None and args.mutants is None:
        args.mutants = 200
    res = run(args.seed, args.mutants, None if args.minutes is None else 60 * args.minutes, args.out)
    for name, i, problem in res["problems"]:
        print(f"{name} mutant {i}: {problem}")
    print(f"{res['mutants']} mutants in {res['seconds']} s: "
          + ", ".join(f"{k} {v}" for k, v in sorted(res["outcomes"].items())) + f"; {len(res['problems'])} problems")
    return 1 if res["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
