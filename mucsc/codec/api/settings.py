"""``mucsc.Settings``: the encoding settings every integration takes, validated once, in one place.

The codec and its parameters (with its error-feedback memory's options), the seed, the container's zstd
level, ``shared``, threads, error feedback, the authentication key and the decoder's limits: what
:func:`mucsc.encode`, :class:`mucsc.Compressor`, fedsim's transport, the Flower mod and strategy, the
DDP hook and the numcodecs / zarr codec each used to declare and check on their own (and their checks
had drifted).  A frozen dataclass: build it once, pass it around, compare and hash it;
:meth:`Settings.get_config` / :meth:`Settings.from_config` are its whole configuration as JSON-able
values (without the key), as numcodecs' ``get_config`` / ``from_config`` are a codec's.  Every bad
value raises :class:`mucsc.SettingsError` (a :class:`ParameterError`) naming the field.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Mapping
from typing import Any

from mucsc.codec import parallel
from mucsc.codec.api.messages import DEFAULT_MAX_ELEMENTS, DEFAULT_MAX_EXPANSION, _zstd_level, check_reader_args
from mucsc.codec.codecs.base import Codec, codec_class
from mucsc.errors import MucscError, SettingsError, UnknownCodecError

# the key (and so its key_id) is never part of a configuration
_CONFIG_FIELDS = ("codec", "params", "seed", "compress", "shared", "threads", "error_feedback", "max_elements",
                  "max_expansion")


class UnknownCodecSetting(SettingsError, UnknownCodecError):
    """An unknown codec name in settings: a SettingsError, and the UnknownCodecError callers caught before."""

    __str__ = UnknownCodecError.__str__


@dataclasses.dataclass(frozen=True)
class Settings:
    """How updates are encoded (and decoded), checked when made.

    ``codec``: a codec name (``params`` its parameters and its memory's options, e.g. DGC's
    ``momentum``) or a :class:`mucsc.Codec` (its parameters are read from it).  ``seed``: a
    non-negative integer.  ``compress``: "auto", "off" or a zstd level 1..22.  ``threads``: >= 0
    (0: all cores).  ``error_feedback``: None (on for biased codecs), True or False.  ``key`` /
    ``key_id``: sign messages (both or neither).  ``max_elements`` / ``max_expansion``: the decoder's
    limits for untrusted input (None lifts one), as :func:`mucsc.decode` takes them.
    """

    codec: str = "mucsc"
    params: tuple[tuple[str, Any], ...] = ()
    seed: int = 0
    compress: str | int = "auto"
    shared: bool = True
    threads: int = 1
    error_feedback: bool | None = None
    key: Any = dataclasses.field(default=None, repr=False, compare=False)
    key_id: str | None = None
    max_elements: int | None = DEFAULT_MAX_ELEMENTS
    max_expansion: float | None = DEFAULT_MAX_EXPANSION

    def __post_init__(self) -> None:
        codec, params = self.codec, self.params
        if isinstance(codec, Codec):  # a codec object: its name and parameters
            if params:
                raise SettingsError("params given next to a codec object: set them in mucsc.get_codec(...)")
            config = codec.get_config()
            codec, params = config.pop("codec"), config
        if not isinstance(codec, str):
            raise SettingsError(f"codec must be a codec name or a mucsc.Codec, got {type(codec).__name__}")
        if isinstance(params, Mapping):
            params = tuple(params.items())
        try:
            params = tuple(sorted((str(k), v) for k, v in params))
        except (TypeError, ValueError):
            raise SettingsError(f"params must be a mapping of parameter names to values, got {self.params!r}") \
                from None
        object.__setattr__(self, "codec", codec)
        object.__setattr__(self, "params", params)
        self._check()

    def _check(self) -> None:
        try:
            cls = codec_class(self.codec)
            options = cls.memory_options
            codec = cls(**{k: v for k, v in self.params if k not in options})
            codec.memory(**{k: v for k, v in self.params if k in options})
        except SettingsError:
            raise
        except UnknownCodecError as exc:
            raise UnknownCodecSetting(str(exc)) from None
        except MucscError as exc:  # bad parameter or memory option
            raise SettingsError(str(exc)) from None
        _check_int("seed", self.seed)
        try:
            _zstd_level(self.compress)
            parallel.resolve(self.threads)
            check_reader_args(b"", max_elements=self.max_elements, max_expansion=self.max_expansion)
        except MucscError as exc:
            raise SettingsError(str(exc)) from None
        if not isinstance(self.shared, bool):
            raise SettingsError(f"shared must be True or False, got {self.shared!r}")
        if self.error_feedback is not None and not isinstance(self.error_feedback, bool):
            raise SettingsError(f"error_feedback must be None, True or False, got {self.error_feedback!r}")
        if (self.key is None) != (self.key_id is None):
            raise SettingsError("key and key_id go together: a signed message names its key by key_id")
        if self.key_id is not None and (not isinstance(self.key_id, str) or not self.key_id):
            raise SettingsError(f"key_id must be a non-empty string, got {self.key_id!r}")

    # -- what the callers need --------------------------------------------------------------------

    @property
    def codec_params(self) -> dict[str, Any]:
        """The codec's own parameters (its memory's options left out)."""
        options = codec_class(self.codec).memory_options
        return {k: v for k, v in self.params if k not in options}

    @property
    def memory_options(self) -> dict[str, Any]:
        """The options of the codec's error-feedback memory (e.g. DGC's ``momentum``)."""
        options = codec_class(self.codec).memory_options
        return {k: v for k, v in self.params if k in options}

    def codec_object(self) -> Codec:
        return codec_class(self.codec)(**self.codec_params)

    def encode_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of :func:`mucsc.encode` (with ``codec`` as an object; no seed: per message)."""
        out = {"codec": self.codec_object(), "shared": self.shared, "compress": self.compress,
               "threads": self.threads}
        if self.key is not None:
            out.update(key=self.key, key_id=self.key_id)
        return out

    def decode_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of :func:`mucsc.decode`: the limits and threads."""
        return {"max_elements": self.max_elements, "max_expansion": self.max_expansion, "threads": self.threads}

    def replace(self, **changes: Any) -> Settings:
        """The same settings with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def get_config(self) -> dict[str, Any]:
        """JSON-able fields (``params`` as a dict; the key and key_id are never included)."""
        out = {f: getattr(self, f) for f in _CONFIG_FIELDS}
        out["params"] = dict(self.params)
        return out

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Settings:
        unknown = set(config) - set(_CONFIG_FIELDS)
        if unknown:
            raise SettingsError(f"unknown settings field(s) {', '.join(map(repr, sorted(unknown)))}")
        return cls(**config)


def _check_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise SettingsError(f"{name} must be a non-negative integer, got {value!r}")
