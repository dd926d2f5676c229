"""Exception types raised by mucsc.  Every error the library raises on purpose derives from MucscError."""

from __future__ import annotations


class MucscError(Exception):
    """Base class of every error mucsc raises on purpose."""


class FormatError(MucscError, ValueError):
    """A message is not a valid mucsc message (bad magic, bad lengths, malformed header, ...)."""


class TruncatedError(FormatError):
    """The message ends before the lengths it declares."""


class ChecksumError(FormatError):
    """The message's CRC-32 does not match its contents: it was corrupted."""


class VersionError(FormatError):
    """The message has a major format version this decoder does not implement."""


class LimitError(FormatError):
    """A declared size exceeds a limit of the spec or of the caller (rank, names, Z, elements, ...)."""


class UnknownCodecError(MucscError, KeyError):
    """A codec name is not in the registry."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else "unknown codec"


class ParameterError(MucscError, ValueError):
    """A codec parameter is missing, of the wrong type or out of range."""


class SettingsError(ParameterError):
    """Encoding settings that cannot be used (:class:`mucsc.Settings`): a codec, parameter, seed,
    compress level, thread count, key or limit out of range -- whichever API or integration took them."""


class InputError(MucscError, ValueError):
    """The data given to an encoder cannot be encoded (NaN/Inf, non-float dtype, bad container, ...)."""


class AuthError(MucscError):
    """A message failed authentication: bad tag, unknown key id, no tag where one is required, wrong
    context -- or it is too malformed to find its tag.  Not a FormatError: the bytes may be well formed
    and still not come from the key holder."""


class KeyFileError(MucscError, ValueError):
    """A key file cannot be used: unreadable, not a key, or a secret that other users can read."""


class SizeError(MucscError, ValueError):
    """A codec cannot state its section sizes in advance (they depend on the data): pass the
    data-dependent part, or ask for an estimate."""
