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
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import mucsc
from mucsc.errors import InputError
from mucsc.fedsim.transport import LinkCodec

DEFAULT_CODECS = ("none", "mucsc", "bmucsc", "qsgd", "signsgd", "stc", "dgc")
LR_SCHEDULES = ("paper", "inverse", "constant")
DEVICES = ("auto", "cpu", "cuda")

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


@dataclasses.dataclass(frozen=True)
class SimConfig:
    """Everything one sweep needs.  ``None`` means: take the data set's default."""

    dataset: str = "digits"
    data_dir: str | None = None
    download: bool = False
    model: str | None = None
    partition: str | None = None
    clients: int = 100                 # N
    per_round: int = 10                # K
    sampling: str = "uniform"          # "uniform" without replacement, "weighted" with (Assumption 4)
    local_iters: int = 5               # E
    batch_size: int = 8                # B
    lr_schedule: str | None = None     # "paper", "inverse", "constant"; None: the data set's preset
    lr0: float | None = None           # eta_t = max(lr0 / (1 + t / lr_decay), lr_min); None: preset
    lr_decay: float | None = None
    lr_min: float | None = None
    normalize: str = "auto"            # "auto": the data set's input normalisation; "off": raw [0, 1]
    rounds: int | None = None          # round limit
    target: float | None = None        # stop at this test accuracy (0 = never)
    eval_every: int | None = None
    samples_per_client: int = 500      # iid
    noniid_min: int = 300              # the paper's non-iid: 300..500 samples from 5 classes
    noniid_max: int = 500
    classes_per_client: int = 5
    dirichlet_alpha: float = 0.5
    synthetic_alpha: float = 1.0
    synthetic_beta: float = 1.0
    codecs: tuple[str, ...] = DEFAULT_CODECS
    z_up: tuple[int, ...] = (4, 8, 16)  # MUCSC uplink Z, clients split into equal random groups
    z_down: int = 16
    params: tuple[tuple[str, str, str, Any], ...] = ()  # (codec, "up"|"down"|"both", key, value)
    down_codec: str | None = None      # override every preset's downlink codec (e.g. "none")
    error_feedback: str = "auto"       # "auto" (biased codecs), "on", "off"
    compress: str = "auto"             # container zstd: "auto" or "off" (fixed-width, paper counts)
    downlink: str = "all"              # downlink accounting: "all" N clients, or "participants"
    up_mbps: float = 1.4
    down_mbps: float = 1.4
    speed_sd: float = 0.1
    seed: int = 0
    seeds: tuple[int, ...] = ()        # several seeds: every codec runs with each (empty: just ``seed``)
    threads: int = 1                   # torch threads per process (main and each worker)
    device: str = "auto"               # "auto" (cuda when available), "cpu", "cuda"
    workers: int | str = "auto"        # processes training clients / runs; "auto" (or None): measured,
                                       # mucsc.fedsim.parallel.start_executor (1 on cuda)
    auth: str = "off"                  # authenticate every message: "off", "blake2b" or "ed25519"
    save_updates: str | None = None    # DIR: save raw client updates U_i (mucsc.fedsim.updates)
    save_rounds: tuple[int, ...] = (1,)  # ... of these rounds (from 1)
    save_slots: int = 1                # ... of the first this many participants of each such round

    def __post_init__(self) -> None:
        _check(self.dataset in DATASET_DEFAULTS, f"unknown data set {self.dataset!r}; "
               f"choose from {', '.join(DATASET_DEFAULTS)}")
        _check(self.clients >= 1, "clients must be >= 1")
        _check(1 <= self.per_round, "clients per round must be >= 1")
        _check(self.sampling != "uniform" or self.per_round <= self.clients,
               "clients per round cannot exceed clients with uniform sampling without replacement")
        _check(self.sampling in ("uniform", "weighted"), "sampling must be 'uniform' or 'weighted'")
        _check(self.local_iters >= 1 and self.batch_size >= 1, "local iterations and batch size must be >= 1")
        _check(self.lr_schedule is None or self.lr_schedule in LR_SCHEDULES,
               f"learning-rate schedule must be one of {', '.join(LR_SCHEDULES)}")
        _check((self.lr0 is None or self.lr0 > 0) and (self.lr_decay is None or self.lr_decay > 0)
               and (self.lr_min is None or self.lr_min >= 0),
               "bad learning-rate schedule: need lr0 > 0, lr-decay > 0, lr-min >= 0")
        _check(self.normalize in ("auto", "off"), "normalize must be 'auto' or 'off'")
        _check(self.device in DEVICES, f"device must be one of {', '.join(DEVICES)}")
        if self.workers is None:  # the Python API's old spelling of "auto"
            object.__setattr__(self, "workers", "auto")
        _check(self.workers == "auto" or (isinstance(self.workers, int) and not isinstance(self.workers, bool)
                                          and self.workers >= 1), "workers must be 'auto' or an integer >= 1")
        _check(all(x >= 0 for x in self.seeds) and len(set(self.seeds)) == len(self.seeds),
               "seeds must be distinct and >= 0")
        _check(self.rounds is None or self.rounds >= 1, "rounds must be >= 1")
        _check(self.target is None or 0 <= self.target <= 1, "target accuracy must be in [0, 1]")
        _check(self.eval_every is None or self.eval_every >= 1, "eval period must be >= 1")
        _check(len(self.codecs) >= 1, "give at least one codec")
        _check(len(self.save_rounds) >= 1 and all(r >= 1 for r in self.save_rounds),
               "save rounds must be >= 1 (rounds count from 1)")
        _check(self.save_slots >= 1, "save clients (participants per saved round) must be >= 1")
        _check(len(set(self.codecs)) == len(self.codecs), "a codec is listed twice")
        lo, hi = mucsc.Z_RANGE
        _check(len(self.z_up) >= 1 and all(lo <= z <= hi for z in self.z_up) and lo <= self.z_down <= hi,
               f"Z must be in {lo}..{hi}")
        _check(self.error_feedback in ("auto", "on", "off"), "error feedback must be auto, on or off")
        _check(self.compress in ("auto", "off"), "compress must be 'auto' or 'off'")
        _check(self.downlink in ("all", "participants"), "downlink must be 'all' or 'participants'")
        _check(self.threads >= 1 and self.seed >= 0, "threads must be >= 1 and seed >= 0")
        _check(self.auth in ("off", "blake2b", "ed25519"), "auth must be 'off', 'blake2b' or 'ed25519'")
        for p in self.params:
            _check(len(p) == 4 and p[1] in ("up", "down", "both"), f"bad codec parameter {p!r}")

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
        setup = mucsc.codec_class(name).paper_setup
        up_base, down_base = dict(setup.up), dict(setup.down)
        down_name = name if setup.downlink else "none"
        if self.down_codec is not None:
            down_name = self.down_codec

        def extra(direction: str, codec: str) -> dict[str, Any]:
            return {k: v for c, dr, k, v in self.params if c == codec and dr in (direction, "both")}

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


def _check(ok: bool, msg: str) -> None:
    if not ok:
        raise InputError(msg)


_TUPLE_FIELDS = {"codecs": str, "z_up": int, "seeds": int, "save_rounds": int}


def load_toml(path: str | Path) -> dict[str, Any]:
    """Read a TOML config: top-level keys are SimConfig fields; ``[params.CODEC]`` (both directions),
    ``[params.CODEC.up]`` / ``[params.CODEC.down]`` tables give codec parameters."""
    try:
        raw = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:  # a binary file, or text in another encoding
        raise InputError(f"cannot read config {path}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at "
                         f"offset {exc.start}); a config is a TOML file") from None
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise InputError(f"cannot read config {path}: {exc}") from None
    fields = {f.name for f in dataclasses.fields(SimConfig)}
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if key == "params":
            out["params"] = tuple(_flatten_params(value))
        elif key not in fields:
            raise InputError(f"config {path}: unknown setting {key!r}")
        elif key in _TUPLE_FIELDS:
            out[key] = tuple(_TUPLE_FIELDS[key](v) for v in (value if isinstance(value, list) else [value]))
        else:
            out[key] = value
    return out


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
