import numpy as np
import pytest

from mucsc.codec.wire import bitpack
from mucsc.codec.wire.bitpack import pack, packed_size, unpack
from mucsc.errors import FormatError, ParameterError


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


# ---- bit streams of wider fields, unary and Elias-gamma codes ---------------------------------------

def test_field_reader_straddles_bytes():
    vals = np.array([0, 1, (1 << 57) - 1, 12345678901234, 5], np.int64)
    widths = np.array([1, 1, 57, 44, 3])
    start = np.concatenate([[0], np.cumsum(widths)[:-1]])
    bits = np.zeros(int(widths.sum()), np.uint8)
    bitpack.write_fields(bits, start, vals, widths)
    buf = np.frombuffer(bitpack.bits_to_bytes(bits), np.uint8)
    assert np.array_equal(bitpack.read_fields(buf, start, widths), vals)
    with pytest.raises(FormatError, match="wider than 57"):
        bitpack.read_fields(buf, np.array([0]), 58)


@pytest.mark.parametrize("width", [1, 7, 13, 33, 57])
def test_pack_fields_round_trip_and_agree_with_pack(width):
    rng = np.random.default_rng(width)
    v = rng.integers(0, 1 << width, 1001, dtype=np.int64)
    data = bitpack.pack_fields(v, width)
    assert len(data) == packed_size(v.size, width)
    buf = np.frombuffer(data, np.uint8)
    assert np.array_equal(bitpack.unpack_fields(buf, 0, v.size, width), v)
    if width <= bitpack.MAX_WIDTH:  # one bit order for IDs and wider fields
        assert data == pack(v, width)


def test_unary_round_trip_and_short_stream():
    q = np.array([0, 3, 0, 9, 1], np.int64)
    bits = np.zeros(int(q.sum()) + q.size + 4, np.uint8)
    end = bitpack.write_unary(bits, 4, q)
    assert end == 4 + int(q.sum()) + q.size
    buf = np.frombuffer(bitpack.bits_to_bytes(bits), np.uint8)
    got, got_end = bitpack.read_unary(buf, 4, q.size)
    assert np.array_equal(got, q) and got_end == end
    with pytest.raises(FormatError, match="holds 5 codes, expected 6"):
        bitpack.read_unary(buf, 4, q.size + 1)


def test_set_bits_stops_at_limit():
    buf = np.frombuffer(bitpack.bits_to_bytes(np.array([0, 1, 1, 0, 1, 0, 0, 1, 1], np.uint8)), np.uint8)
    pos, more = bitpack.set_bits(buf, 0, 9, 3)
    assert pos.tolist() == [1, 2, 4] and more
    pos, more = bitpack.set_bits(buf, 2, 8, 10)
    assert pos.tolist() == [2, 4, 7] and not more


def test_gamma_round_trip_and_size():
    rng = np.random.default_rng(0)
    v = np.concatenate([[1, 2, 3, (1 << 40) + 5], rng.integers(1, 1000, 200)]).astype(np.int64)
    data = bitpack.gamma_encode(v)
    # 2 floor(log2 v) + 1 bits per value, as interleaved Elias gamma
    assert len(data) == (sum(2 * (int(x).bit_length() - 1) + 1 for x in v) + 7) // 8
    assert np.array_equal(bitpack.gamma_decode(data, v.size, int(v.max())), v)
    assert bitpack.gamma_encode(np.zeros(0, np.int64)) == b""
    assert bitpack.gamma_decode(b"", 0, 1).size == 0
    assert np.array_equal(bitpack.bit_length(v), [int(x).bit_length() for x in v])


@pytest.mark.parametrize("chunk", [1, 5, 64])
def test_gamma_writer_in_chunks_is_the_whole_stream(monkeypatch, chunk):
    """gamma_encode codes its values GAMMA_CHUNK at a time (each stream packed as it goes, the low
    bits' stream starting mid-byte after the unary codes): the bytes of the one-byte-a-bit stream
    built whole, whatever the chunk; BitStream ORs a stream in from any bit."""
    monkeypatch.setattr(bitpack, "GAMMA_CHUNK", chunk)
    rng = np.random.default_rng(chunk)
    v = np.concatenate([rng.integers(1, 4, 300), [1 << 56, 7, (1 << 40) + 5], rng.integers(1, 1 << 20, 50)]).astype(np.int64)
    n_bits = bitpack.bit_length(v) - 1
    whole = np.zeros(2 * int(n_bits.sum()) + v.size, np.uint8)
    unary_end = bitpack.write_unary(whole, 0, n_bits)
    bitpack.write_fields(whole, unary_end + np.cumsum(n_bits) - n_bits, v, n_bits)
    assert bitpack.gamma_encode(v) == bitpack.bits_to_bytes(whole)
    assert bitpack.gamma_totals(np.array_split(v, 7)) == (v.size, int(n_bits.sum()))
    buf = np.zeros(3, np.uint8)
    first, second = bitpack.BitStream(buf, 0), bitpack.BitStream(buf, 11)
    first.put(np.ones(11, np.uint8))
    first.close()
    second.put(np.array([0, 1, 1], np.uint8))
    second.put(np.ones(5, np.uint8))
    second.close()
    assert bitpack.bits_to_bytes(np.concatenate((np.ones(11), [0, 1, 1], np.ones(5)))) == buf.tobytes()


@pytest.mark.parametrize("block", [1, 3, 4096])
def test_gamma_reader_reads_in_any_split(monkeypatch, block):
    """GammaReader's values, read in pieces of any size over blocks of any size, are the codes' values
    (long codes straddling blocks included), and gamma_codes sums them exactly."""
    monkeypatch.setattr(bitpack, "GAMMA_BLOCK", block)
    rng = np.random.default_rng(block)
    v = np.concatenate([rng.integers(1, 4, 3000), [1 << 56, 7, (1 << 40) + 5], rng.integers(1, 1 << 20, 500)]).astype(np.int64)
    codes = bitpack.gamma_codes(bitpack.gamma_encode(v), v.size, 1 << 57)
    assert codes.total == sum(int(x) for x in v)
    reader, got = bitpack.GammaReader(codes), []
    while reader.left:
        got.append(reader.read(int(rng.integers(1, 700))))
    assert np.array_equal(np.concatenate(got), v)


def test_gamma_rejects_bad_input():
    with pytest.raises(ParameterError):
        bitpack.gamma_encode(np.array([0, 1]))
    data = bitpack.gamma_encode(np.array([5, 9]))
    with pytest.raises(FormatError, match="bound"):
        bitpack.gamma_decode(data, 2, 8)
    with pytest.raises(FormatError):
        bitpack.gamma_decode(data + b"\x00", 2, 9)  # a whole stray byte
    with pytest.raises(FormatError):
        bitpack.gamma_decode(b"\x00", 1, 9)  # no terminating one
    with pytest.raises(FormatError, match="bytes present"):
        bitpack.gamma_decode(b"\x01", 0, 9)


def test_check_padding_names_the_stream():
    buf = np.array([0x07], np.uint8)
    bitpack.check_padding(buf, 3)
    with pytest.raises(FormatError, match="signs: padding bits"):
        bitpack.check_padding(buf, 2, "signs")
    with pytest.raises(FormatError, match="whole unused byte"):
        bitpack.check_padding(np.array([0x07, 0], np.uint8), 3)
