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
from mucsc.codec.api.message_file import CheckpointFile, MessageFile, open  # noqa: A004 - as safe_open
from mucsc.codec.api.stream_encode import TensorSource, encode_to, streamable
from mucsc.codec.api.stream_budget import budget_applies, budget_choices
from mucsc.errors import (
    AuthError,
    ChecksumError,
    FormatError,
    InputError,
    KeyFileError,
    LimitError,
    MucscError,
    ParameterError,
    SettingsError,
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
    "AuthError", "AuthSummary", "CheckpointFile", "ChecksumError", "Codec", "EncodeStats", "FormatError",
    "InputError", "KeyFileError", "LimitError", "MessageFile", "MessageInfo", "MucscError", "ParameterError",
    "Policy", "TensorSource", "TensorStats", "TruncatedError", "UnknownCodecError", "VersionError",
    "authenticate", "available_codecs", "budget_applies", "budget_choices", "decode", "encode", "encode_to", "encode_with_stats", "fingerprint",
    "generate_key", "get_codec", "inspect", "load_key", "load_keys", "open", "public_key", "sign", "streamable", "verify",
]

# Codec objects and what outer layers ask them (issue 8): the registry's classes, the stateful
# Compressor, limits, and the paper's formulas / exact sizes (mucsc.rates).  What a plugin's author
# writes against (Section, EncodedGroup, Memory, ...) is mucsc.plugin.
from mucsc.codec.api import rates  # noqa: E402
from mucsc.codec.api.state import Compressor  # noqa: E402
from mucsc.codec.api.aggregate import Aggregator  # noqa: E402
from mucsc.codec.api.settings import Settings  # noqa: E402
from mucsc.codec.codecs.base import Z_RANGE, codec_class  # noqa: E402
from mucsc.errors import SizeError  # noqa: E402
from mucsc import plugin  # noqa: E402

__all__ += ["Aggregator", "Compressor", "Settings", "SettingsError", "SizeError", "Z_RANGE", "codec_class", "plugin", "rates"]

# names that moved to mucsc.plugin: still importable from mucsc, with a DeprecationWarning, for one release
_MOVED_TO_PLUGIN = ("EncodedGroup", "Memory", "PaperSetup", "ResidualMemory", "Section", "ceil_log2")


def __getattr__(name: str):
    if name in _MOVED_TO_PLUGIN:
        import warnings

        warnings.warn(f"mucsc.{name} moved to mucsc.plugin.{name}; the old name goes in the next release",
                      DeprecationWarning, stacklevel=2)
        return getattr(plugin, name)
    raise AttributeError(f"module 'mucsc' has no attribute {name!r}")
