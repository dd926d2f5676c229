"""Simulation settings: one frozen dataclass, readable from a TOML file, overridden by flags.

Defaults follow the paper's section VI-A (N = 100, K = 10, E = 5, B = 8, Z_U in {4, 8, 16} by
thirds, Z_D = 16, 1.4 Mb/s +- 10 %) where it gives them; the data-set-dependent settings (model,
partition, target accuracy, round limit, learning-rate schedule) take per-data-set defaults from
``DATASET_DEFAULTS`` / ``LR_PRESETS`` when left unset.  The paper's learning rate
max(0.5 / (1 + t/400), 0.01) is the preset only where it was seen to learn (digits, synthetic): on
FEMNIST with LeNet it leaves the network dead at chance level (docs/fedsim.md, measured curves).
"""

from __future__ import annotations

import dataclasses
import functools
import re
import tomllib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import mucsc
from mucsc.errors import InputError
from mucsc.fedsim.transport import LinkCodec

DEFAULT_CODECS = ("none", "mucsc", "bmucsc", "qsgd", "signsgd", "stc", "dgc")

# Per data set: model, partition, target accuracy, round limit, evaluation period.
DATASET_DEFAULTS: dict[str, dict[str, Any]] = {
    "digits": dict(model="cnn", partition="iid", target=0.95, rounds=60, eval_every=2),
    "synthetic": dict(model="logreg", partition="natural", target=0.7, rounds=200, eval_every=5),
    "cifar10": dict(model="allcnn", partition="iid", target=0.82, rounds=1500, eval_every=10),
    "femnist": dict(model="lenet", partition="natural", target=0.85, rounds=500, eval_every=5),
    "mnist": dict(model="lenet", partition="iid", target=0.97, rounds=500, eval_every=5),
}

# Learning-rate schedule per (data set, model); (data set, None) is the data set's fallback.
# Each value is (schedule, lr0, lr_decay, lr_min) for eta_t = max(lr0 / (1 + t / lr_decay), lr_min)
# ("inverse", the paper's shape) or eta_t = lr0 ("constant").  FEMNIST's was chosen on the shared
# 26-writer LEAF sample (docs/fedsim.md); MNIST's and CIFAR-10's follow it but were not verified on
# the real data sets here (none on this machine).
_PAPER_LR = ("paper", 0.5, 400.0, 0.01)
LR_PRESETS: dict[tuple[str, str | None], tuple[str, float, float, float]] = {
    ("digits", None): _PAPER_LR,
    ("synthetic", None): _PAPER_LR,
    ("femnist", None): ("inverse", 0.1, 400.0, 0.01),
    ("mnist", None): ("inverse", 0.1, 400.0, 0.01),
    ("cifar10", None): ("inverse", 0.05, 400.0, 0.005),
}


def setting(default: Any, help: str, *, flags: tuple[str, ...] = (), label: str | None = None,
            min: float | None = None, max: float | None = None, min_open: bool = False,
            metavar: str | None = None, directory: bool = False, cli: bool = True) -> Any:
    """A SimConfig field with what the command line, the TOML reader and the validation need: its help
    text, extra flags (``-N``), the name errors use, an inclusive range (``min_open``: min excluded),
    applied to every item of a tuple, and whether a string names a directory; choices come from a
    ``Literal`` annotation.  ``cli=False``: no generated option."""
    meta = {"help": help, "flags": flags, "label": label, "min": min, "max": max, "min_open": min_open,
            "metavar": metavar, "directory": directory, "cli": cli}
    return dataclasses.field(default=default, metadata=meta)


@dataclasses.dataclass(frozen=True)
class Setting:
    """One SimConfig field as the command line, the TOML reader and the validation see it."""

    name: str
    kind: type                          # int, float, str or bool (of each item, for a tuple)
    choices: tuple[str, ...] | None     # a Literal field's values
    many: bool                          # a tuple of ``kind``
    optional: bool                      # None allowed (the data set's default)
    default: Any
    help: str
    flags: tuple[str, ...]
    label: str
    min: float | None
    max: float | None
    min_open: bool
    metavar: str | None
    directory: bool
    cli: bool

    @property
    def option(self) -> str:
        return "--" + self.name.replace("_", "-")

    def check(self, value: Any) -> None:
        """InputError naming the setting unless ``value`` has its type, choices and range."""
        if value is None and self.optional:
            return
        for v in (value if self.many and isinstance(value, tuple) else (value,)):
            self._check_item(v)

    def _check_item(self, v: Any) -> None:
        if self.choices is not None:
            _check(v in self.choices, f"{self.label} must be one of {', '.join(self.choices)}, got {v!r}")
            return
        ok = isinstance(v, self.kind) or (self.kind is float and isinstance(v, int))
        if not ok or (isinstance(v, bool) and self.kind is not bool):
            raise InputError(f"{self.label} must be {_KIND_NAMES.get(self.kind, self.kind.__name__)}, got {v!r}")
        lo_ok = self.min is None or (v > self.min if self.min_open else v >= self.min)
        if not (lo_ok and (self.max is None or v <= self.max)):
            raise InputError(f"{self.label} must be {self.range_text()}")

    def range_text(self) -> str:
        lo = None if self.min is None else f"{'>' if self.min_open else '>='} {self.min:g}"
        if self.max is not None and lo is not None and not self.min_open:
            return f"in [{self.min:g}, {self.max:g}]"
        return lo or f"<= {self.max:g}"


_KIND_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}


@dataclasses.dataclass(frozen=True)
class SimConfig:
    """Everything one sweep needs.  ``None`` means: take the data set's default.

    Every field's help, choices (``Literal``) and range live here, in the field's metadata
    (:func:`setting`): ``mucsc sim``'s options, the TOML reader and the validation are made from them
    (:func:`settings`)."""

    dataset: Literal["digits", "synthetic", "cifar10", "femnist", "mnist"] = setting(
        "digits", "Data set [digits: built in, offline].", label="data set")
    data_dir: str | None = setting(None, "Where cifar10/femnist/mnist live.", directory=True)
    download: bool = setting(False, "CIFAR-10 only: fetch the archive if missing.")
    model: Literal["allcnn", "lenet", "cnn", "logreg"] | None = setting(None, "Model [per data set].")
    partition: Literal["iid", "noniid", "dirichlet", "natural"] | None = setting(
        None, "Client split [per data set].")
    clients: int = setting(100, "Clients N [100].", flags=("-N",), min=1)
    per_round: int = setting(10, "Clients per round K [10].", flags=("-K",), min=1, label="clients per round")
    sampling: Literal["uniform", "weighted"] = setting(
        "uniform", "uniform without replacement, or by data size with replacement (Assumption 4).")
    local_iters: int = setting(5, "Local SGD iterations per round E [5].", flags=("-E",), min=1,
                               label="local iterations")
    batch_size: int = setting(8, "Batch size B [8].", flags=("-B",), min=1, label="batch size")
    lr_schedule: Literal["paper", "inverse", "constant"] | None = setting(
        None, "Learning rate: paper = max(0.5 / (1 + t/400), 0.01); inverse = max(lr0 / (1 + t/lr-decay), "
        "lr-min); constant = lr0 [per data set: paper for digits/synthetic, inverse 0.1/400/0.01 for "
        "femnist/mnist, 0.05/400/0.005 for cifar10].", label="learning-rate schedule")
    lr0: float | None = setting(None, "Initial learning rate [per schedule / data set].", min=0, min_open=True)
    lr_decay: float | None = setting(None, "Iterations to halve the inverse schedule [400].", min=0,
                                     min_open=True, label="lr-decay")
    lr_min: float | None = setting(None, "Floor of the inverse schedule [per data set].", min=0, label="lr-min")
    normalize: Literal["auto", "off"] = setting(
        "auto", "Input normalisation: auto = the data set's (femnist: inverted grey levels, standardised; "
        "mnist, cifar10: standardised; digits, synthetic: as is); off = raw [auto].")
    rounds: int | None = setting(None, "Round limit [per data set].", min=1)
    target: float | None = setting(None, "Stop at this test accuracy; 0 = never [per data set].", min=0, max=1,
                                   label="target accuracy")
    eval_every: int | None = setting(None, "Evaluate every this many rounds [per data set].", min=1,
                                     label="eval period")
    samples_per_client: int = setting(500, "iid partition: samples per client [500].")
    noniid_min: int = setting(300, "non-iid partition: min samples [300].")
    noniid_max: int = setting(500, "non-iid partition: max samples [500].")
    classes_per_client: int = setting(5, "non-iid partition: classes per client [5].")
    dirichlet_alpha: float = setting(0.5, "dirichlet partition: alpha [0.5].")
    synthetic_alpha: float = setting(1.0, "Synthetic(alpha, beta) [1].")
    synthetic_beta: float = setting(1.0, "Synthetic(alpha, beta) [1].")
    codecs: tuple[str, ...] = setting(DEFAULT_CODECS, "Comma-separated codecs to sweep, each NAME or "
                                      "NAME(KEY=VALUE,...), e.g. mucsc(rounding=dithered,bits=1) "
                                      "[none,mucsc,bmucsc,qsgd,signsgd,stc,dgc].")
    z_up: tuple[int, ...] = setting((4, 8, 16), "MUCSC uplink Z per client group [4,8,16].",
                                    min=mucsc.Z_RANGE[0], max=mucsc.Z_RANGE[1], label="Z")
    z_down: int = setting(16, "MUCSC downlink Z [16].", min=mucsc.Z_RANGE[0], max=mucsc.Z_RANGE[1], label="Z")
    params: tuple[tuple[str, str, str, Any], ...] = setting(
        (), "(codec, 'up'|'down'|'both', key, value): codec parameters (-p, [params.CODEC] tables).", cli=False)
    down_codec: str | None = setting(None, "Downlink codec for every run (e.g. none) [per codec, paper].")
    error_feedback: Literal["auto", "on", "off"] = setting(
        "auto", "Residual accumulation [auto: biased codecs].", label="error feedback")
    compress: Literal["auto", "off"] = setting(
        "auto", "Container zstd of compressible sections; off = fixed-width, the paper's counts [auto].")
    downlink: Literal["all", "participants"] = setting(
        "all", "Count the downlink to all N clients (paper) or next round's participants [all].")
    up_mbps: float = setting(1.4, "Mean uplink speed, Mb/s [1.4].")
    down_mbps: float = setting(1.4, "Mean downlink speed, Mb/s [1.4].")
    speed_sd: float = setting(0.1, "Speed standard deviation / mean [0.1].")
    seed: int = setting(0, "Seed of everything [0].", min=0)
    seeds: tuple[int, ...] = setting((), "Several seeds, e.g. 0,1,2: every codec runs with each (independent "
                                     "runs, in parallel with --workers); results per seed in DIR/seed<S>/.", min=0)
    threads: int = setting(1, "torch threads per process [1].", min=1)
    device: Literal["auto", "cpu", "cuda"] = setting(
        "auto", "Where models train and aggregate: auto = cuda when available, except for models under 2 M "
        "multiply-accumulates per sample (the digits CNN), which train faster on the CPU [auto].")
    workers: int | str = setting(
        "auto", "Processes training a round's clients (and independent runs) concurrently; results do not "
        "depend on it. auto: times round 1's first clients in one process, and with several workers when a "
        "client takes >= 50 ms; keeps the workers only if >= 1.4x as fast [auto; 1 on cuda].", metavar="N|auto")
    auth: Literal["off", "blake2b", "ed25519"] = setting(
        "off", "Tag every message (a key per client and for the server; the context binds run, round and "
        "direction) and verify it before decoding [off].")
    save_updates: str | None = setting(
        None, "Save raw client updates U_i (before compression) as .safetensors with a manifest.json, one "
        "directory per run: DIR/<codec>-seed<S>/ (docs/fedsim.md). Only --save-rounds and --save-clients; "
        "refused if over 4 GiB or the free space.", metavar="DIR", directory=True)
    save_rounds: tuple[int, ...] = setting((1,), "Rounds whose updates --save-updates saves, e.g. 1,20 [1].",
                                           min=1, label="save rounds")
    save_slots: int = setting(1, "Participants saved per saved round: the first N selected [1].",
                              flags=("--save-clients",), min=1, label="save clients (participants per saved round)")

    def __post_init__(self) -> None:
        if self.workers is None:  # the Python API's old spelling of "auto"
            object.__setattr__(self, "workers", "auto")
        for st in settings():
            st.check(getattr(self, st.name))
        self._check_combinations()

    def _check_combinations(self) -> None:
        """What a single field's type and range cannot say."""
        _check(self.sampling != "uniform" or self.per_round <= self.clients,
               "clients per round cannot exceed clients with uniform sampling without replacement")
        _check(self.workers == "auto" or (isinstance(self.workers, int) and not isinstance(self.workers, bool)
                                          and self.workers >= 1), "workers must be 'auto' or an integer >= 1")
        _check(len(set(self.seeds)) == len(self.seeds), "seeds must be distinct and >= 0")
        _check(len(self.codecs) >= 1, "give at least one codec")
        _check(len(self.save_rounds) >= 1, "save rounds must be >= 1 (rounds count from 1)")
        _check(len(set(self.codecs)) == len(self.codecs), "a codec is listed twice")
        self._check_folder_names()
        _check(len(self.z_up) >= 1, "give at least one uplink Z")
        for p in self.params:
            _check(len(p) == 4 and p[1] in ("up", "down", "both"), f"bad codec parameter {p!r}")

    def _check_folder_names(self) -> None:
        """Two ``--codecs`` entries must not share a results folder (one run would overwrite the other)."""
        seen: dict[str, str] = {}
        for spec in self.codecs:
            other = seen.setdefault(folder_name(spec), spec)
            _check(other == spec, f"codecs {other!r} and {spec!r} would share the results folder "
                                  f"{folder_name(spec)!r}")

    def seed_list(self) -> tuple[int, ...]:
        """The seeds a sweep runs: ``seeds``, or just ``seed``."""
        return self.seeds or (self.seed,)

    def with_seed(self, seed: int) -> SimConfig:
        """These settings for one seed of the sweep."""
        return dataclasses.replace(self, seed=seed, seeds=())

    def resolved(self, key: str) -> Any:
        """A setting, with the data set's default when it was left as None."""
        v = getattr(self, key)
        return DATASET_DEFAULTS[self.dataset][key] if v is None else v

    def lr_settings(self) -> tuple[str, float, float, float]:
        """(schedule, lr0, lr_decay, lr_min) in effect: flags over the schedule's or data set's preset.

        ``paper`` means the paper's constants (0.5, 400, 0.01) unless a flag overrides one; a
        schedule named without constants takes the rest from the data set's preset.
        """
        model = self.resolved("model")
        preset = LR_PRESETS.get((self.dataset, model)) or LR_PRESETS[(self.dataset, None)]
        if self.lr_schedule == "paper" or (self.lr_schedule is None and preset[0] == "paper"):
            preset = _PAPER_LR
        schedule = self.lr_schedule or preset[0]
        lr0, decay, lr_min = (preset[i] if v is None else v
                              for i, v in ((1, self.lr0), (2, self.lr_decay), (3, self.lr_min)))
        return schedule, float(lr0), float(decay), float(lr_min)

    def learning_rate(self, t: int) -> float:
        """eta_t at global iteration index t (the paper's shape: max(lr0 / (1 + t / decay), lr_min))."""
        schedule, lr0, decay, lr_min = self.lr_settings()
        if schedule == "constant":
            return lr0
        return max(lr0 / (1.0 + t / decay), lr_min)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for k in ("model", "partition", "target", "rounds", "eval_every"):
            d[k] = self.resolved(k)
        d["lr_schedule"], d["lr0"], d["lr_decay"], d["lr_min"] = self.lr_settings()
        return d

    # ---- the per-codec experiment presets (section VI-A) ----

    def links(self, name: str, clients: int, rng_groups: list[int]) -> tuple[list[LinkCodec], LinkCodec]:
        """Uplink codec per client and the server's downlink codec for the experiment ``name``.

        The codec class's ``paper_setup`` gives the paper's settings (section VI-A): parameters per
        direction, whether the downlink is compressed, and the parameter that takes the per-client
        Z_U (``rng_groups[i]`` is client i's index into ``z_up``) and the server's Z_D.
        """
        ef = {"auto": None, "on": True, "off": False}[self.error_feedback]
        name, own = split_experiment(name)
        setup = mucsc.codec_class(name).paper_setup
        up_base, down_base = dict(setup.up), dict(setup.down)
        down_name = name if setup.downlink else "none"
        if self.down_codec is not None:
            down_name = self.down_codec

        def extra(direction: str, codec: str) -> dict[str, Any]:
            given = {k: v for c, dr, k, v in self.params if c == codec and dr in (direction, "both")}
            return {**given, **own} if codec == name else given

        def link(codec: str, base: dict[str, Any], direction: str) -> LinkCodec:
            try:  # the codec decides how a user's parameters combine with the preset (mucsc: z vs bits)
                params = mucsc.get_codec(codec).with_preset(base, extra(direction, codec))
            except mucsc.MucscError:  # an unknown codec: reported by check_codec with the links
                params = {**base, **extra(direction, codec)}
            return LinkCodec(codec, tuple(sorted(params.items())), ef, self.compress)

        ups = []
        for i in range(clients):
            base = dict(up_base)
            if setup.z_param is not None:
                base[setup.z_param] = self.z_up[rng_groups[i]]
            ups.append(link(name, base, "up"))
        down_base_eff = down_base if down_name == name else {}
        z_down = mucsc.codec_class(down_name).paper_setup.z_param
        if z_down is not None and z_down not in down_base_eff:
            down_base_eff[z_down] = self.z_down
        return ups, link(down_name, down_base_eff, "down")


def split_experiment(spec: str) -> tuple[str, dict[str, str]]:
    """A ``--codecs`` entry: ``NAME`` or ``NAME(KEY=VALUE,...)`` (parameters of that experiment's
    codec in both directions, e.g. ``mucsc(rounding=dithered,bits=1)``) -> (NAME, {KEY: VALUE})."""
    spec = spec.strip()
    if "(" not in spec:
        return spec, {}
    name, _, rest = spec.partition("(")
    if not rest.endswith(")") or not name.strip():
        raise InputError(f"codec {spec!r}: expected NAME or NAME(KEY=VALUE,...)")
    params = {}
    for item in filter(None, (i.strip() for i in rest[:-1].split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key.strip() or not value.strip():
            raise InputError(f"codec {spec!r}: {item!r} is not KEY=VALUE")
        params[key.strip()] = value.strip()
    return name.strip(), params


_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def folder_name(spec: str) -> str:
    """A ``--codecs`` entry as a file name a shell takes unquoted: whitespace dropped, every other
    character outside ``A-Z a-z 0-9 . _ -`` made ``-``, none at the ends
    (``mucsc(rounding=dithered,bits=1)`` -> ``mucsc-rounding-dithered-bits-1``).  The spec itself is
    kept in the run's rounds.json and in summary.json."""
    return _UNSAFE.sub("-", "".join(spec.split())).strip("-")


def split_list(value: str) -> list[str]:
    """Comma-separated items, commas inside parentheses kept (``mucsc(z=4,solver=dp),qsgd``)."""
    items, depth, cur = [], 0, ""
    for ch in value:
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
        else:
            cur += ch
    return [i.strip() for i in [*items, cur] if i.strip()]


def _check(ok: bool, msg: str) -> None:
    if not ok:
        raise InputError(msg)


@functools.cache
def settings() -> tuple[Setting, ...]:
    """Every SimConfig field as a :class:`Setting`, in field order: the one table behind ``mucsc sim``'s
    options, the TOML reader and :meth:`SimConfig.__post_init__`."""
    hints = typing.get_type_hints(SimConfig)
    out = []
    for f in dataclasses.fields(SimConfig):
        kind, choices, many, optional = _parse_type(hints[f.name])
        m = f.metadata
        out.append(Setting(f.name, kind, choices, many, optional, f.default, m["help"], m["flags"],
                           m["label"] or f.name.replace("_", " "), m["min"], m["max"], m["min_open"],
                           m["metavar"], m["directory"], m["cli"]))
    return tuple(out)


def _parse_type(t: Any) -> tuple[type, tuple[str, ...] | None, bool, bool]:
    """(item kind, Literal choices, is a tuple, None allowed) of a SimConfig annotation."""
    args = typing.get_args(t)
    optional = typing.get_origin(t) in (typing.Union, types.UnionType) and type(None) in args
    if optional:
        rest = [a for a in args if a is not type(None)]
        t = rest[0] if len(rest) == 1 else t
    if typing.get_origin(t) is Literal:
        return str, tuple(typing.get_args(t)), False, optional
    if typing.get_origin(t) is tuple:
        item = typing.get_args(t)[0]
        return (item if isinstance(item, type) else object), None, True, optional
    return (t if isinstance(t, type) else object), None, False, optional


def load_toml(path: str | Path) -> dict[str, Any]:
    """Read a TOML config: top-level keys are SimConfig fields (a list, or a single value, for a tuple
    field); ``[params.CODEC]`` (both directions), ``[params.CODEC.up]`` / ``[params.CODEC.down]``
    tables give codec parameters."""
    try:
        raw = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:  # a binary file, or text in another encoding
        raise InputError(f"cannot read config {path}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at "
                         f"offset {exc.start}); a config is a TOML file") from None
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise InputError(f"cannot read config {path}: {exc}") from None
    table = {st.name: st for st in settings()}
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if key == "params":
            out["params"] = tuple(_flatten_params(value))
        elif key not in table:
            raise InputError(f"config {path}: unknown setting {key!r}")
        elif table[key].many:
            out[key] = tuple(_item(table[key], v) for v in (value if isinstance(value, list) else [value]))
        else:
            out[key] = value
    return out


def _item(st: Setting, v: Any) -> Any:
    try:
        return st.kind(v)
    except (TypeError, ValueError):
        raise InputError(f"{st.label}: {v!r} is not {_KIND_NAMES.get(st.kind, 'valid')}") from None


def _flatten_params(table: Mapping[str, Any]):
    if not isinstance(table, Mapping):
        raise InputError("[params] must be a table of codec tables")
    for codec, entries in table.items():
        for key, value in entries.items():
            if key in ("up", "down") and isinstance(value, Mapping):
                for k, v in value.items():
                    yield (codec, key, k, v)
            else:
                yield (codec, "both", key, value)


def parse_param(text: str) -> tuple[str, str, str, Any]:
    """``CODEC[.up|.down].KEY=VALUE`` -> (codec, direction, key, value); numbers become int/float."""
    lhs, sep, rhs = text.partition("=")
    parts = lhs.strip().split(".")
    if not sep or len(parts) not in (2, 3) or (len(parts) == 3 and parts[1] not in ("up", "down")):
        raise InputError(f"codec parameter {text!r} must look like CODEC.KEY=VALUE or CODEC.up.KEY=VALUE")
    direction = parts[1] if len(parts) == 3 else "both"
    return parts[0], direction, parts[-1], _number(rhs.strip())


def _number(s: str) -> Any:
    for conv in (int, float):
        try:
            return conv(s)
        except ValueError:
            pass
    return s


def make_config(file: str | Path | None = None, **overrides: Any) -> SimConfig:
    """Defaults < TOML file < overrides (flags); overrides that are None are ignored."""
    kw = load_toml(file) if file else {}
    kw.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return SimConfig(**kw)
    except TypeError as exc:
        raise InputError(f"bad setting: {exc}") from None
