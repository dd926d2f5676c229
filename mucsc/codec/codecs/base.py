"""The codec interface and the registry of codecs.

A codec turns one flat vector (a *group*: one tensor, or several tensors sharing a codebook) into a
few named byte sections plus a small JSON-able parameter dict, and back.  The container
(:mod:`mucsc.codec.wire.container`) frames, compresses and checksums the sections; codecs never see the wire
layout.  Encoders are deterministic given ``rng``; decoders must treat ``params`` and ``sections`` as
untrusted input and raise :class:`~mucsc.errors.FormatError` on anything inconsistent.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from mucsc.codec import parallel
from mucsc.codec.wire.bitpack import ceil_log2  # noqa: F401  (re-exported: one helper for every codec)
from mucsc.codec.codecs.memory import Memory, ResidualMemory
from mucsc.errors import FormatError, InputError, ParameterError, SizeError, UnknownCodecError

# Limits shared by every codec with a number of centroids Z: cluster IDs are at most 16 bits
# (spec/FORMAT.md, limits), and Z = 1 would carry no information.
Z_RANGE = (2, 1 << 16)
H = 4  # bytes of one float in the paper's byte counts (float32), section IV-D


@dataclasses.dataclass(frozen=True)
class PaperSetup:
    """How the paper's experiments (section VI-A) use a codec in federated learning.

    ``up`` / ``down``: parameters for the uplink and the downlink; ``downlink``: whether the server
    compresses the model update it broadcasts (False: it sends float32, codec ``none``);
    ``z_param``: the parameter that a simulation's per-client Z_U and its Z_D set (MUCSC's mixed Z).
    """

    up: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    down: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    downlink: bool = True
    z_param: str | None = None


@dataclasses.dataclass(frozen=True)
class Section:
    """One typed payload of a group.  ``tag`` is 4 ASCII characters, upper-case first letter (critical)."""

    tag: str
    # host bytes, or a payload still on a device (a backend's ``payload`` step, see format.Payload)
    data: Any
    compressible: bool = False  # the container may store it zstd-compressed when that is smaller

    def tobytes(self) -> bytes | memoryview:
        """The payload as host bytes (a device payload is copied to the host once, then kept)."""
        d = self.data
        if hasattr(d, "write_into"):
            d = d.host()
        if isinstance(d, np.ndarray):
            return memoryview(np.ascontiguousarray(d)).cast("B")
        return d

    def payload(self) -> Any:
        """The payload as the message writer takes it: host bytes as :meth:`tobytes` gives them, a
        device payload as it is (the writer copies it straight into the message)."""
        d = self.data  # (tobytes() but for a device payload; asked per section of every message)
        return memoryview(np.ascontiguousarray(d)).cast("B") if isinstance(d, np.ndarray) else d


@dataclasses.dataclass(frozen=True)
class EncodedGroup:
    """What a codec's encoder returns: header params, sections, and statistics that are not sent."""

    params: dict[str, Any]
    sections: tuple[Section, ...]
    # e.g. {"J": exact expected squared error}; a value may be a zero-argument callable, evaluated
    # only when the caller asks for statistics (J costs a pass over the data).
    stats: dict[str, Any] = dataclasses.field(default_factory=dict)
    # parameters this encoding settled that the codec's own left open (a goal's z, an "auto"
    # choice), named as the codec's parameters; never sent: reports show what was used
    resolved: dict[str, Any] = dataclasses.field(default_factory=dict)
    # (table, ids) when the decode is a table lookup: ``decode_array`` returns ``table[ids]`` (the
    # table in the encoded vector's dtype), kept by the encoder (a clustering's wire levels and IDs)
    # so that whoever measures the realised error ||decode - x|| reads it chunk by chunk instead of
    # decoding the sections (a full-size decode beside x; the rANS decode cost as much as the encode).
    # Never sent; None when the encoder kept nothing (IDs on a device, other codecs): decode.
    lookup: tuple[np.ndarray, np.ndarray] | None = dataclasses.field(default=None, compare=False, repr=False)
    # (||x||, ||decode - x||) once measured (the policy measures its error bound on the encoding it
    # keeps), so the report need not measure again; the lookup is dropped then (it holds the IDs)
    measured: tuple[float, float] | None = None


class Codec(ABC):
    """Base class of every codec.  Subclasses set ``name``, ``Params`` and implement the two methods.

    ``Params`` is a frozen dataclass with defaults for every field; ``__post_init__`` validation should
    raise :class:`ParameterError`.  Instances are immutable and thread-safe.
    """

    name: ClassVar[str]
    Params: ClassVar[type]
    unbiased: ClassVar[bool] = False  # E[decode(encode(x))] == x
    lossless: ClassVar[bool] = False
    summary: ClassVar[str] = ""
    # encode_array also takes a torch tensor (any device) and encodes it there with the same bytes,
    # through its backend's steps (backends.dispatch.backend_for); such a codec may define
    # ``decode_on_device(n, params, sections, dtype, device)`` too
    accepts_device: ClassVar[bool] = False
    # encode_array draws from its ``rng``; False: it never does, and the API passes None instead of
    # a generator (making one costs ~1-4 us per group of every message)
    draws: ClassVar[bool] = True
    # Ranges of the numeric parameters, {field: (lo, hi)} inclusive (Params' validation uses them).
    limits: ClassVar[Mapping[str, tuple[float, float]]] = {}
    # Options of :meth:`memory` (error-feedback state), accepted next to the codec's parameters by
    # :class:`mucsc.Compressor` and the simulator.
    memory_options: ClassVar[tuple[str, ...]] = ()
    paper_setup: ClassVar[PaperSetup] = PaperSetup()
    # Parameter sets that ``mucsc rate --baselines`` lists for this codec, one row each.
    rate_variants: ClassVar[tuple[Mapping[str, Any], ...]] = ({},)
    # The largest |x| the codec's wire can carry (None: every finite value).  The API refuses larger
    # input with an InputError naming the tensor and the value, so an encoder never writes a message
    # its own decoder rejects (e.g. a float64 3.5e38 stored as float32 would become infinite).
    # A property where it depends on the parameters.
    input_limit: ClassVar[float | None] = None

    def __init__(self, **params: Any) -> None:
        self.params = make_params(self.Params, params, self.name)

    def check_input(self, x: np.ndarray, label: str) -> None:
        """Refuse (InputError naming ``label`` and the value) a float vector this codec must not
        encode: NaN or Inf, or beyond :attr:`input_limit`.  Checked before any encoding, so no
        overflowing cast runs first."""
        if not x.size:
            return
        lo, hi = parallel.bounds(x)  # Python floats
        if not (math.isfinite(lo) and math.isfinite(hi)):
            raise InputError(f"{label} contains NaN or Inf")
        limit = self.input_limit
        if limit is not None and max(-lo, hi) > limit:
            raise InputError(f"{label} holds {lo if -lo > hi else hi:.9g}, beyond the largest magnitude "
                             f"codec {self.name!r} can carry ({limit:.9g}); scale it, or use a codec "
                             "with a wider wire (raw is lossless)")

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in dataclasses.asdict(self.params).items())
        return f"{type(self).__name__}({args})"

    def for_container(self, compressing: bool) -> "Codec":
        """The codec to use when the container will (``compressing``) or will not zstd the
        compressible sections.  A codec whose best layout depends on that (mucsc's ID packing)
        returns a resolved variant; the default is the codec itself."""
        return self

    def get_config(self) -> dict[str, Any]:
        """numcodecs-style config: ``{"codec": name, **params}``."""
        return {"codec": self.name, **dataclasses.asdict(self.params)}

    @classmethod
    def param_specs(cls) -> dict[str, ParamSpec]:
        """Each parameter's type, choices, range, default and help (from the ``Params`` fields), for
        tools that build options or forms (``mucsc compress``'s options)."""
        return param_specs(cls.Params)

    @classmethod
    def with_preset(cls, preset: Mapping[str, Any], given: Mapping[str, Any]) -> dict[str, Any]:
        """Parameters from a preset (a simulator's per-experiment settings) overridden by those a
        user gave.  A codec whose parameters exclude each other drops the preset's that conflict."""
        return {**preset, **given}

    @classmethod
    def format_minor(cls, params: Mapping[str, Any]) -> int:
        """The format minor version (FORMAT.md 2.1) a group with these header params needs: 0 unless
        the group uses a 1.1 feature.  A message is written with the largest over its groups."""
        return 0

    @property
    def needs_plan(self) -> bool:
        """Deprecated: a goal is rate control's (``mucsc.codec.ratecontrol.needs_plan``)."""
        import warnings

        warnings.warn("Codec.needs_plan is deprecated: use mucsc.codec.ratecontrol.needs_plan(codec)",
                      DeprecationWarning, stacklevel=2)
        return getattr(self.params, "target", "z") != "z"

    def exceeds_within(self, x: np.ndarray, sq_error: float, size: int) -> bool:
        """True when every encoding of ``x`` by this codec whose decode is within squared error
        ``sq_error`` of ``x`` has sections of more than ``size`` bytes; False when not known (the
        default).  Lets a caller rule the codec out by size before searching its encodings."""
        return False

    def trials(self, x: np.ndarray) -> Any:
        """Trial encodings of one group for rate control (the measuring protocol its search drives,
        mucsc.codec.ratecontrol) when a goal field (bits= / size= / max_error=) is set in this
        codec's parameters; None (the default): the codec has no goal."""
        return None

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.params == self.params

    def __hash__(self) -> int:
        return hash((type(self), self.params))

    def replace(self, **changes: Any) -> "Codec":
        """The same codec with some parameters changed (validated like the constructor's)."""
        return type(self)(**{**params_dict(self.params), **changes})

    @property
    def biased(self) -> bool:
        """True for a lossy codec whose decode is not an unbiased estimate of its input: such a
        codec needs error feedback (:meth:`memory`) to converge in federated training."""
        return not (self.unbiased or self.lossless)

    def section_sizes(self, n: int, *, positions_bytes: int | None = None, centroids: int | None = None,
                      estimate: bool = False) -> dict[str, int]:
        """Raw (uncompressed) payload bytes of each section when this codec encodes ``n`` elements.

        Codecs whose sizes depend on the data take what they need as arguments (``positions_bytes``:
        the position code's size; ``centroids``: the number of centroids sent), or, with
        ``estimate=True``, use the expected size for continuous random data.  Raises
        :class:`~mucsc.errors.SizeError` when the size cannot be stated.
        """
        raise SizeError(f"codec {self.name!r} does not state its section sizes")

    def paper_bytes(self, d: int, h: int = H) -> float | None:
        """Bytes of one transfer of ``d`` values as the paper's formulas count them (payload only,
        ``h`` bytes per float), or None where the paper gives no formula for this codec."""
        return None

    def memory(self, **options: Any) -> Memory:
        """A fresh error-feedback state for a sender using this codec (GRACE's Memory), used when
        error feedback is on (by default exactly for :attr:`biased` codecs).

        The default is a residual (EF-SGD: encode x + e, then e = x + e - decode); a codec with its
        own correction (DGC's momentum) returns that.  ``options`` are the codec's ``memory_options``.
        """
        check_memory_options(self, options)
        return ResidualMemory()

    @abstractmethod
    def encode_array(self, x: np.ndarray, rng: np.random.Generator) -> EncodedGroup:
        """Encode a 1-D, C-contiguous, finite float32 or float64 vector (possibly empty)."""

    @classmethod
    @abstractmethod
    def decode_array(
        cls, n: int, params: Mapping[str, Any], sections: Mapping[str, memoryview], dtype: np.dtype
    ) -> np.ndarray:
        """Rebuild the length-``n`` vector of ``dtype`` from header ``params`` and raw ``sections``."""

    @classmethod
    def decode_mapped(cls, n: int, params: Mapping[str, Any], sections: Mapping[str, memoryview],
                      dtype: np.dtype, table_map: Callable[[np.ndarray], np.ndarray]) -> np.ndarray | None:
        """``table_map(decode_array(...))`` for an elementwise ``table_map`` (a record's bfloat16
        rounding), read and checked as :meth:`decode_array` reads them, when the decode is a table
        lookup: the map then runs on the table, not on the ``n`` values, and no vector of ``dtype`` is
        made.  None (the default) when it is not: the caller maps :meth:`decode_array`'s values."""
        return None

    @classmethod
    def decode_parts(cls, n: int, params: Mapping[str, Any], sections: Mapping[str, memoryview],
                     dtype: np.dtype) -> Iterator[np.ndarray]:
        """:meth:`decode_array`'s vector as consecutive 1-D pieces of ``dtype`` (together its n values),
        each checked before it is yielded; a piece may be reused by the next one, so a caller copies it.
        For a caller that stores the values elsewhere (a float16 record of a float32 group, narrowed
        a piece at a time): a codec whose decoder works in passes yields each pass, so the group's
        whole vector is never held (FORMAT.md 3.2).  The default yields the whole vector."""
        yield cls.decode_array(n, params, sections, dtype)

    @classmethod
    def accumulator(cls, n: int, params: Mapping[str, Any], sections: Mapping[str, memoryview],
                    dtype: np.dtype) -> Callable[[np.ndarray, float], None]:
        """For a server's running sum (:class:`mucsc.Aggregator`): read and check the group as
        :meth:`decode_array` does, and return ``add(acc, weight)`` that adds ``float64(value) * weight``
        of each of the ``n`` decoded values to the float64 array ``acc`` -- the same sums as adding the
        decode.  Every check happens here, so ``add`` cannot fail: a message is added whole or not at all.
        The default keeps the decoded vector; a codec that can add its values straight from its
        sections (no decoded float vector) overrides it."""
        x = cls.decode_array(n, params, sections, dtype)
        return lambda acc, weight: add_scaled(acc, weight, x)


ACCUMULATE_CHUNK = 1 << 16  # elements per step of a running sum: a 512 KiB float64 buffer, in cache


def add_scaled(acc: np.ndarray, weight: float, x: np.ndarray) -> None:
    """``acc += float64(x) * weight`` in place, chunk by chunk (no float64 copy of ``x``)."""
    w = np.float64(weight)
    buf = np.empty(min(ACCUMULATE_CHUNK, x.size), np.float64)
    for s in range(0, x.size, ACCUMULATE_CHUNK):
        e = min(s + ACCUMULATE_CHUNK, x.size)
        t = buf[: e - s]
        np.multiply(x[s:e], w, out=t, dtype=np.float64)
        np.add(acc[s:e], t, out=acc[s:e])


def joined(n: int, dtype: np.dtype, parts: Iterator[np.ndarray]) -> np.ndarray:
    """The length-``n`` vector of ``dtype`` made of a :meth:`Codec.decode_parts` sequence: a codec's
    ``decode_array`` written as its passes.  The output is allocated when the first piece has come,
    so the checks a decoder makes before its first pass run before anything of size n is."""
    out = None
    a = 0
    for part in parts:
        out = np.empty(n, dtype) if out is None else out
        out[a: a + part.size] = part
        a += part.size
    if a != n:
        raise FormatError(f"the decoder gave {a} values for {n} elements")
    return np.empty(n, dtype) if out is None else out


PART = 1 << 18  # elements per piece of a decoder's parts that are not its passes (1 MiB of float32)


def scattered(n: int, pos: np.ndarray, vals: np.ndarray, fill: float, dtype: np.dtype) -> Iterator[np.ndarray]:
    """The pieces (:meth:`Codec.decode_parts`) of ``out = full(n, fill); out[pos] = vals``, ``PART``
    at a time into one reused buffer; ``pos`` strictly increasing in [0, n) (as its decoder checks)."""
    return scattered_runs(n, iter([(pos, vals)]), fill, dtype)


def scattered_runs(n: int, runs: Iterator[tuple[np.ndarray, np.ndarray]], fill: float, dtype: np.dtype
                   ) -> Iterator[np.ndarray]:
    """:func:`scattered` of positions and values that come as consecutive runs ``(pos, vals)`` (all
    positions strictly increasing in [0, n)), a run taken only when a piece reaches it: a decoder of
    a stream of positions holds one run, not all of them."""
    buf = np.empty(min(PART, n), dtype)
    pos, vals = np.zeros(0, np.int64), np.zeros(0)
    for a in range(0, n, PART):
        b = min(a + PART, n)
        part = buf[: b - a]
        part.fill(fill)
        while True:
            hi = int(np.searchsorted(pos, b))
            part[pos[:hi] - a] = vals[:hi]
            if hi < pos.size:
                pos, vals = pos[hi:], vals[hi:]
                break
            pos, vals = next(runs, (np.zeros(0, np.int64), None))
            if vals is None:
                vals = np.zeros(0)
                break
        yield part


# Rate control's planner of a lone group (mucsc.codec.ratecontrol installs it when imported, and
# ``import mucsc`` imports it): what a goal codec's encode_array, called directly rather than through
# the API, uses to resolve its goal for that one group.
_lone_planner: list[Callable[..., tuple[Codec, Any, np.random.Generator, EncodedGroup | None]]] = []


def plan_alone(codec: Codec, x: Any, rng: np.random.Generator
               ) -> tuple[Codec, Any, np.random.Generator, EncodedGroup | None]:
    """A goal codec's ``encode_array`` called directly: ``x`` planned as a message of its own ->
    (the resolved codec, x on the host, a generator in ``rng``'s state, and the resolved codec's
    encoding of x when planning already made it: then it is the encoding)."""
    if not _lone_planner:
        raise ParameterError(f"codec {codec.name!r} with a goal needs mucsc's rate control: import mucsc")
    return _lone_planner[0](codec, x, rng)


def check_memory_options(codec: Codec, options: Mapping[str, Any]) -> None:
    """ParameterError for options the codec's :meth:`Codec.memory` does not take."""
    unknown = sorted(set(options) - set(codec.memory_options))
    if unknown:
        raise ParameterError(f"codec {codec.name!r} has no error-feedback option "
                             f"{', '.join(map(repr, unknown))}; its options are: "
                             f"{', '.join(codec.memory_options) or '(none)'}")


def check_range(codec: str, field: str, value: float, limits: Mapping[str, tuple[float, float]],
                open_low: bool = False) -> None:
    """ParameterError unless ``value`` lies in ``limits[field]`` (lower end open if ``open_low``)."""
    lo, hi = limits[field]
    if not ((lo < value if open_low else lo <= value) and value <= hi):
        low = "(" if open_low else "["
        raise ParameterError(f"{codec}.{field} must be in {low}{lo}, {hi}], got {value}")


F32_MAX = float(np.finfo(np.float32).max)  # the largest finite float32 (FLT_MAX)


_REGISTRY: dict[str, type[Codec]] = {}


def register(cls: type[Codec]) -> type[Codec]:
    """Class decorator adding a codec to the registry under ``cls.name``."""
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise RuntimeError(f"codec name {cls.name!r} registered twice")
    _REGISTRY[cls.name] = cls
    return cls


ENTRY_POINT_GROUP = "mucsc.codecs"  # where other packages register codec classes (docs/plugins.md)
_plugins_loaded = False
_plugin_problems: dict[str, str] = {}  # entry-point name -> why it was not registered


def codec_class(name: str) -> type[Codec]:
    """The codec class registered as ``name``; :class:`UnknownCodecError` lists the known ones.
    A built-in is there already; a plugin's entry point is loaded when its name is first asked for
    (numcodecs' way: other plugins stay unimported)."""
    if name not in _REGISTRY and name not in _plugin_problems and not _plugins_loaded:
        load_plugins(only=name)
    if name not in _REGISTRY:
        _load_codecs()  # for the error message: every codec known
    try:
        return _REGISTRY[name]
    except KeyError:
        why = f" (a plugin of that name failed to load: {_plugin_problems[name]})" if name in _plugin_problems else ""
        raise UnknownCodecError(
            f"unknown codec {name!r}{why}; known codecs: {', '.join(sorted(_REGISTRY))}"
        ) from None


def get_codec(name: str, **params: Any) -> Codec:
    """A codec instance: ``get_codec("mucsc", z=16)``."""
    return codec_class(name)(**params)


def available_codecs() -> list[str]:
    """Names of every registered codec (built-in and plugins), sorted."""
    _load_codecs()
    return sorted(_REGISTRY)


def _load_codecs() -> None:
    """Once, the plugins' entry points (the built-in codecs registered themselves when this
    package, ``mucsc.codec.codecs``, was imported)."""
    global _plugins_loaded
    if not _plugins_loaded:
        _plugins_loaded = True
        load_plugins()


def load_plugins(only: str | None = None) -> list[str]:
    """Register the codec classes of the ``mucsc.codecs`` entry points (``only``: those of that
    name); returns the names added.

    A plugin never replaces a registered codec, and one that fails to load, is not a
    :class:`Codec` subclass or has a ``name`` other than its entry point's is skipped with a
    RuntimeWarning (the library keeps working; asking for it names the problem)."""
    from importlib.metadata import entry_points

    added = []
    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: (e.name, e.value)):
        if only is not None and ep.name != only:
            continue
        if ep.name in _REGISTRY:
            if _REGISTRY[ep.name].__module__ != ep.value.partition(":")[0]:
                _skip(ep, f"the name {ep.name!r} is taken by {_REGISTRY[ep.name].__module__}")
            continue
        try:
            cls = ep.load()
        except Exception as exc:  # noqa: BLE001 - any import failure of foreign code: skip it, say why
            _skip(ep, f"{type(exc).__name__}: {exc}")
            continue
        problem = _plugin_problem(cls, ep.name)
        if problem:
            _skip(ep, problem)
            continue
        _REGISTRY[ep.name] = cls
        added.append(ep.name)
    return added


def _plugin_problem(cls: Any, name: str) -> str | None:
    if not (isinstance(cls, type) and issubclass(cls, Codec)):
        return f"{cls!r} is not a mucsc.Codec subclass"
    if getattr(cls, "name", None) != name:
        return f"its class's name is {getattr(cls, 'name', None)!r}, not the entry point's {name!r}"
    if not dataclasses.is_dataclass(getattr(cls, "Params", None)):
        return "its Params is not a dataclass"
    if getattr(cls, "__abstractmethods__", None):
        return f"it does not implement {', '.join(sorted(cls.__abstractmethods__))}"
    return None


def _skip(ep: Any, why: str) -> None:
    import warnings

    _plugin_problems[ep.name] = why
    warnings.warn(f"mucsc: codec plugin {ep.name!r} ({ep.value}) not registered: {why}", RuntimeWarning,
                  stacklevel=3)


def param(default: Any, help: str, *, min: float | None = None, max: float | None = None,
          min_open: bool = False, cli: bool = True) -> Any:
    """A field of a codec's ``Params`` dataclass with its help text and, for numbers, its range
    (inclusive; ``min_open``: min excluded) as the command line shows them; choices come from a
    ``Literal`` annotation; ``cli`` False: set by rate control (resolved levels), not a user option.
    The dataclass's ``__post_init__`` stays the validation."""
    return dataclasses.field(default=default, metadata={"help": help, "min": min, "max": max,
                                                         "min_open": min_open, "cli": cli})


@dataclasses.dataclass(frozen=True)
class ParamSpec:
    """One codec parameter's type as the annotation says it: what the CLI and :func:`make_params` need."""

    name: str
    kind: type                         # int, float, str or bool
    choices: tuple[str, ...] | None    # a Literal field's values
    optional: bool                     # None allowed (unset)
    default: Any
    help: str
    min: float | None
    max: float | None
    min_open: bool
    cli: bool                          # a user option (False: what rate control resolves a goal to)


_SPECS: dict[type, dict[str, ParamSpec]] = {}


def param_specs(params_cls: type) -> dict[str, ParamSpec]:
    """name -> :class:`ParamSpec` for every field of a Params dataclass (annotations resolved once)."""
    specs = _SPECS.get(params_cls)
    if specs is None:
        try:
            hints = typing.get_type_hints(params_cls)
        except Exception:  # noqa: BLE001 - a plugin's unresolvable annotation: no coercion, no CLI type
            hints = {f.name: f.type if isinstance(f.type, type) else object for f in dataclasses.fields(params_cls)}
        specs = _SPECS[params_cls] = {f.name: _spec(f, hints[f.name]) for f in dataclasses.fields(params_cls)}
    return specs


def _spec(f: dataclasses.Field, t: Any) -> ParamSpec:
    args = typing.get_args(t)
    optional = typing.get_origin(t) in (typing.Union, types.UnionType) and type(None) in args
    if optional:
        t = next(a for a in args if a is not type(None))
    choices = tuple(typing.get_args(t)) if typing.get_origin(t) is typing.Literal else None
    kind = str if choices is not None else (t if isinstance(t, type) else object)
    default = f.default if f.default is not dataclasses.MISSING else None
    m = f.metadata
    return ParamSpec(f.name, kind, choices, optional, default, m.get("help", ""), m.get("min"), m.get("max"),
                     m.get("min_open", False), m.get("cli", True))


_IMMUTABLE = (type(None), bool, int, float, str)


def params_dict(params: Any) -> dict[str, Any]:
    """A Params dataclass as :func:`dataclasses.asdict` gives it, without deep-copying the immutable
    values (strings, numbers and tuples of them): asdict copies a tuple of levels one float at a
    time, ~0.1 ms per codec a goal's search rebuilds."""
    out = {}
    for f in dataclasses.fields(params):
        v = getattr(params, f.name)
        if isinstance(v, _IMMUTABLE) or (type(v) is tuple and all(type(e) in _IMMUTABLE for e in v)):
            out[f.name] = v
        else:
            out[f.name] = dataclasses.asdict(params)[f.name]
    return out


def make_params(params_cls: type, given: Mapping[str, Any], codec_name: str) -> Any:
    """Build a frozen Params dataclass, rejecting unknown names and coercing simple types.

    Coercion (by the field's resolved type) lets a CLI or a config file pass ``"16"`` for an int
    field; values of the wrong kind raise ParameterError.
    """
    specs = param_specs(params_cls)
    unknown = sorted(set(given) - set(specs))
    if unknown:
        raise ParameterError(
            f"codec {codec_name!r} has no parameter {', '.join(map(repr, unknown))}; "
            f"its parameters are: {', '.join(specs) or '(none)'}"
        )
    kw = {key: _coerce(value, specs[key], f"{codec_name}.{key}") for key, value in given.items()}
    try:
        return params_cls(**kw)
    except ParameterError:
        raise
    except (TypeError, ValueError) as exc:
        raise ParameterError(f"codec {codec_name!r}: {exc}") from None


def _coerce(value: Any, spec: ParamSpec, where: str) -> Any:
    if spec.optional and (value is None or (isinstance(value, str) and value.lower() == "none")):
        return None  # optional parameter: None (or "none" from a command line) means unset
    convert = _CONVERTERS.get(spec.kind)
    if convert is None:
        return value  # other annotations: the dataclass validates
    try:
        return convert(value)
    except (TypeError, ValueError):
        raise ParameterError(f"parameter {where} expects {spec.kind.__name__}, got {value!r}") from None


def _to_int(value: Any) -> int:
    if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        raise ValueError
    return int(value)


def _to_float(value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError
    v = float(value)
    if not math.isfinite(v):
        raise ValueError
    return v


def _to_bool(value: Any) -> bool:
    if isinstance(value, str):
        low = value.lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise ValueError
    if isinstance(value, (bool, int, np.bool_)) and value in (0, 1):
        return bool(value)
    raise ValueError


def _to_str(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError
    return value


_CONVERTERS: dict[type, Callable[[Any], Any]] = {int: _to_int, float: _to_float, bool: _to_bool, str: _to_str}


# ---- helpers for decoders: untrusted header params ---------------------------------------------

def param_int(params: Mapping[str, Any], key: str, lo: int, hi: int) -> int:
    """An integer header parameter within [lo, hi], else FormatError."""
    v = params.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise FormatError(f"header parameter {key!r} must be an integer in [{lo}, {hi}], got {v!r}")
    return v


def param_str(params: Mapping[str, Any], key: str, choices: tuple[str, ...]) -> str:
    """A string header parameter from ``choices``, else FormatError."""
    v = params.get(key)
    if v not in choices:
        raise FormatError(f"header parameter {key!r} must be one of {choices}, got {v!r}")
    return v


def param_float(params: Mapping[str, Any], key: str) -> float:
    """A finite float header parameter, else FormatError."""
    v = params.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise FormatError(f"header parameter {key!r} must be a finite number, got {v!r}")
    return float(v)


def section(sections: Mapping[str, memoryview], tag: str, nbytes: int | None = None) -> memoryview:
    """Fetch a required section, checking its exact length when ``nbytes`` is given.

    The length is checked against the declared raw length *before* the section is read, so a
    zstd-encoded section of the wrong size is never decompressed (FORMAT.md 3)."""
    _check_section(sections, tag, nbytes)
    return sections[tag]


def section_array(sections: Mapping[str, memoryview], tag: str, nbytes: int) -> np.ndarray:
    """:func:`section` as a new writable uint8 array the caller keeps: a zstd section decompressed
    straight into it (the container's progressive decompressor, read to the end), a stored one copied
    out of the message; so a lossless decode holds its output once, not the payload and a copy."""
    _check_section(sections, tag, nbytes)
    stream = getattr(sections, "stream", None)
    got = stream(tag) if stream is not None and nbytes else sections[tag]
    if hasattr(got, "read_to"):
        got.read_to(nbytes)
        if got.buffer.flags.writeable:  # else decompressed in one shot into bytes: copied below
            return got.buffer
        got = got.buffer
    return np.frombuffer(got, np.uint8).copy()


def section_stream(sections: Mapping[str, memoryview], tag: str, nbytes: int) -> Any:
    """:func:`section` for a reader that consumes the payload front to back: the container's
    progressive decompressor (``format.GroupSections.stream``) where it has one and the call runs
    on several threads (one decompresses while the others read), else the payload."""
    _check_section(sections, tag, nbytes)
    stream = getattr(sections, "stream", None)
    if stream is None or nbytes == 0 or parallel.current() <= 1:
        return sections[tag]
    return stream(tag)


def _check_section(sections: Mapping[str, memoryview], tag: str, nbytes: int | None) -> None:
    if tag not in sections:
        raise FormatError(f"missing section {tag!r}")
    if nbytes is not None:
        raw_size = getattr(sections, "raw_size", None)  # the container's lazy mapping knows it
        size = raw_size(tag) if raw_size is not None else len(sections[tag])
        if size != nbytes:
            raise FormatError(f"section {tag!r} has {size} bytes, expected {nbytes}")


def array_from(mv: memoryview, dtype: str, count: int | None = None) -> np.ndarray:
    """A read-only little-endian numpy view of a section (length checked)."""
    dt = np.dtype(dtype).newbyteorder("<")
    if len(mv) % dt.itemsize:
        raise FormatError(f"section length {len(mv)} is not a multiple of {dt.itemsize}")
    arr = np.frombuffer(mv, dtype=dt)
    if count is not None and arr.size != count:
        raise FormatError(f"section holds {arr.size} values of {dtype}, expected {count}")
    return arr
