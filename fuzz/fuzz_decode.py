"""Coverage-guided fuzz target for the mucsc decoder (atheris; optional, not a dependency).

    pip install atheris
    python fuzz/fuzz_decode.py -max_total_time=600 -rss_limit_mb=2048 CORPUS_DIR spec/vectors/valid

The oracle: ``inspect`` and ``decode`` of any bytes either succeed or raise a ``mucsc.MucscError``
subclass; anything else (and a crash, a hang or a blown memory limit) is a bug.  Each input is also
tried with its CRC-32 recomputed, so mutations reach the parsers behind the checksum.  The normal
test suite runs :func:`one_input` over a seed corpus (tests/test_mutations.py).
"""

from __future__ import annotations

import struct
import sys
import zlib

MAX_ELEMENTS = 1 << 20  # keep every decode small: the fuzzer looks for escapes, not big outputs


def with_crc(data: bytes) -> bytes:
    """``data`` with its last 4 bytes replaced by the CRC-32 of the rest (FORMAT.md 2.2)."""
    if len(data) < 4:
        return data
    return data[:-4] + struct.pack("<I", zlib.crc32(data[:-4]))


def one_input(data: bytes) -> None:
    """Decode ``data`` (as given and with a valid CRC); only MucscError may escape, never another."""
    import mucsc

    for blob in (data, with_crc(data)):
        try:
            mucsc.inspect(blob)
            mucsc.decode(blob, max_elements=MAX_ELEMENTS)
        except mucsc.MucscError:
            pass


def main() -> None:
    import atheris

    with atheris.instrument_imports():
        import mucsc  # noqa: F401  (instrumented for coverage)
        import mucsc.codec.codecs  # noqa: F401
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
