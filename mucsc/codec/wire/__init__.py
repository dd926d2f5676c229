"""The wire: bytes in, bytes out, as spec/FORMAT.md describes them.

``container`` (preamble, HEAD JSON, typed sections, zstd, padding, CRC, limits), ``auth`` (the
authentication trailer: HMAC-SHA256 / Ed25519), ``bitpack`` (every bit-level read and write),
``rans`` (static rANS for cluster IDs), ``lanes`` (its lane-parallel layout), ``structure`` (a screen
for what zstd could use beyond order-0 coding), ``sparse`` (position sets).

May import: :mod:`mucsc.errors`, :mod:`mucsc.codec.kernels`, :mod:`mucsc.codec.parallel`; nothing
above (no numerics, backend, codec, rate control or API)."""
