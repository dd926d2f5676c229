import numpy as np
import pytest

from mucsc.codec.bitpack import pack, packed_size, unpack
from mucsc.errors import FormatError


@pytest.mark.parametrize("width", range(0, 17))
@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 63, 64, 65, 1001])
def test_round_trip_every_width(width, n):
    rng = np.random.default_rng(width * 1000 + n)
    v = rng.integers(0, 1 << width, n) if width else np.zeros(n, int)
    buf = pack(v, width)
    assert len(buf) == packed_size(n, width)
    np.testing.assert_array_equal(unpack(buf, width, n), v)


def test_lsb_first_bit_order():
    # element i at stream bits [i*w, (i+1)*w); stream bit k = bit k%8 of byte k//8
    assert pack(np.array([1, 0, 3]), 2) == bytes([0b00110001])
    assert pack(np.array([5, 3]), 3) == bytes([0b00011101])
    assert pack(np.array([0x1234]), 16) == b"\x34\x12"
    assert pack(np.array([0x1FF, 0]), 9) == b"\xff\x01\x00"
    bits = np.unpackbits(np.frombuffer(pack(np.arange(8), 3), np.uint8), bitorder="little")
    assert [int("".join(map(str, bits[3 * i: 3 * i + 3][::-1])), 2) for i in range(8)] == list(range(8))


def test_unpack_checks_length_and_padding():
    with pytest.raises(FormatError, match="expected 2"):
        unpack(b"\x00", 4, 3)
    with pytest.raises(FormatError, match="padding"):
        unpack(b"\xff", 4, 1)  # high nibble is padding and must be zero
    with pytest.raises(FormatError):
        unpack(b"", 17, 0)
