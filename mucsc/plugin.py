"""What a codec plugin's author writes against (docs/plugins.md): the Codec contract and the types it
returns, the registry decorator and entry-point group, error-feedback memories, the simulator's paper
setup, and the helpers decoders use on untrusted headers.  Users of codecs need only ``import mucsc``.

    >>> from mucsc.plugin import Codec, EncodedGroup, Section, register
"""

from mucsc.codec.codecs.base import (
    ENTRY_POINT_GROUP,
    Z_RANGE,
    Codec,
    EncodedGroup,
    PaperSetup,
    ParamSpec,
    Section,
    array_from,
    ceil_log2,
    check_range,
    codec_class,
    param,
    param_float,
    param_int,
    param_str,
    register,
    section,
)
from mucsc.codec.codecs.memory import ArrayStateMemory, Memory, ResidualMemory

__all__ = [
    "ENTRY_POINT_GROUP", "Z_RANGE", "ArrayStateMemory", "Codec", "EncodedGroup", "Memory", "PaperSetup",
    "ParamSpec", "ResidualMemory", "Section", "array_from", "ceil_log2", "check_range", "codec_class", "param",
    "param_float", "param_int", "param_str", "register", "section",
]
