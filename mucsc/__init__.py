"""mucsc: Model Update Compression by Soft Clustering (MUCSC / B-MUCSC) and the paper's baselines.

    >>> import numpy as np, mucsc
    >>> blob = mucsc.encode(np.random.default_rng(0).normal(size=1000).astype("float32"), z=16)
    >>> x = mucsc.decode(blob)          # unbiased: E[x] equals the input

The codec never imports torch; torch tensors are accepted when torch is installed.
"""

from importlib.metadata import PackageNotFoundError, version

from mucsc.codec.api.messages import (
    DEFAULT_MAX_ELEMENTS,
    DEFAULT_MAX_EXPANSION,
    EncodeStats,
    MessageInfo,
    TensorStats,
    decode,
    encode,
    encode_with_stats,
    inspect,
    verify,
)
from mucsc.codec.wire.auth import AuthSummary, authenticate, generate_key, load_key, load_keys, public_key, sign
from mucsc.codec.codecs.base import Codec, available_codecs, get_codec
from mucsc.codec.api.fingerprint import fingerprint
from mucsc.codec.api.policy import Policy
from mucsc.errors import (
    AuthError,
    ChecksumError,
    FormatError,
    InputError,
    KeyFileError,
    LimitError,
    MucscError,
    ParameterError,
    TruncatedError,
    UnknownCodecError,
    VersionError,
)

try:
    __version__ = version("mucsc")
except PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0.0.0"

__all__ = [
    "DEFAULT_MAX_ELEMENTS", "DEFAULT_MAX_EXPANSION",
    "AuthError", "AuthSummary", "ChecksumError", "Codec", "EncodeStats", "FormatError", "InputError",
    "KeyFileError", "LimitError", "MessageInfo", "MucscError", "ParameterError", "Policy", "TensorStats",
    "TruncatedError",
    "UnknownCodecError", "VersionError",
    "authenticate", "available_codecs", "decode", "encode", "encode_with_stats", "fingerprint", "generate_key",
    "get_codec", "inspect", "load_key", "load_keys", "public_key", "sign", "verify",
]

# Codec objects and what outer layers ask them (issue 8): the registry's classes, error-feedback
# memories and the stateful Compressor, limits, and the paper's formulas / exact sizes (mucsc.rates).
from mucsc.codec.api import rates  # noqa: E402
from mucsc.codec.codecs.base import Z_RANGE, EncodedGroup, PaperSetup, Section, ceil_log2, codec_class  # noqa: E402
from mucsc.codec.codecs.memory import Memory, ResidualMemory  # noqa: E402
from mucsc.codec.api.state import Compressor  # noqa: E402
from mucsc.errors import SizeError  # noqa: E402

__all__ += [
    "Compressor", "EncodedGroup", "Memory", "PaperSetup", "ResidualMemory", "Section", "SizeError", "Z_RANGE",
    "ceil_log2", "codec_class", "rates",
]
