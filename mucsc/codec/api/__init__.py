"""The API: what ``import mucsc`` exports about messages, and the state kept between them.

``messages`` (encode / encode_with_stats / decode / inspect / verify: tensors in, one message out and
back), ``policy`` (which tensor goes to which group and codec), ``state`` (Compressor: a codec with
its error-feedback memory), ``aggregate`` (Aggregator: the weighted mean of many messages in O(d)), ``rates`` (the paper's formulas and exact message sizes), ``fingerprint``
(a digest of a set of tensors).

May import every codec layer below (wire, numerics, backends, codecs, ratecontrol) and the leaf
modules; only :mod:`mucsc`, the CLI, the simulator and the integrations import it."""

from mucsc.codec.api.messages import (  # noqa: F401  (the API's verbs, as mucsc exports them)
    DEFAULT_MAX_ELEMENTS,
    DEFAULT_MAX_EXPANSION,
    DEFAULT_ZSTD_LEVEL,
    EncodeStats,
    MessageInfo,
    TensorStats,
    as_codec,
    check_limits,
    check_meta,
    decode,
    encode,
    encode_with_stats,
    inspect,
    verify,
)
