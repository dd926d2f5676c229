"""The codecs: the Codec contract and registry (``base``: also ``param``, the typed ``Params`` fields
the command line is made from), error-feedback memories (``memory``) and one module per built-in codec
(each registers its class on import); shared parts that are not codecs themselves: ``clusters`` (the
soft clustering of mucsc and bmucsc), ``_dithered`` (mucsc's dithered layout), ``_cast`` (none's and
fp16's one-dtype layout).

A codec turns one flat vector into named sections and a JSON-able parameter dict, and back; it never
sees the wire layout (the container frames the sections) and never imports the API.  Adding a
built-in codec is adding a module here and its import below (tests/test_codec_contract.py checks
that every module is imported); a codec in another package registers itself through the
entry-point group ``mucsc.codecs`` instead (docs/plugins.md).

May import: :mod:`mucsc.codec.backends`, :mod:`mucsc.codec.numerics`, :mod:`mucsc.codec.wire` (bit
packing, rANS, positions: not the container), the leaf modules and :mod:`mucsc.errors`."""

from mucsc.codec.codecs import (  # noqa: F401
    bmucsc,
    dgc,
    fp16,
    mucsc,
    none,
    qsgd,
    raw,
    signsgd,
    stc,
    terngrad,
    topk,
)
