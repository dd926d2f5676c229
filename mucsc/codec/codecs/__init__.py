"""Built-in codecs, imported explicitly (one module per codec; each registers its class on import).

Adding a built-in codec is adding a module here and its import below (tests/test_codec_contract.py
checks that every module is imported); a codec in another package registers itself through the
entry-point group ``mucsc.codecs`` instead (docs/plugins.md)."""

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
