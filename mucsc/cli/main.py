"""The ``mucsc`` command: compress checkpoints, decompress, inspect and test messages.

It calls only the public API (``mucsc.encode_with_stats``, ``decode``, ``inspect``, ``verify``) and
:mod:`mucsc.tensorfiles`.  Conventions follow gzip/zstd: inputs are kept, ``-`` is stdin/stdout, no
binary to a terminal, no overwrite without ``-f``, atomic outputs, reports on stderr (data on stdout),
``--json`` for scripts.  Exit codes: see :mod:`mucsc.cli.errors`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import io
import json
import math
import os
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import IO, Any

import click
import numpy as np

import mucsc
from mucsc import tensorfiles
from mucsc.cli import defaults, report
from mucsc.cli.auth_options import (
    signing_kwargs, signing_options, unverified_note, verifying_kwargs, verifying_options,
)
from mucsc.cli.codec_options import chosen_params, click_options, codec_params, codecs_epilog
from mucsc.cli.errors import EXIT_USAGE, Failure, about, prefixed, to_click_error
from mucsc.cli.lazy import LazyGroup
from mucsc.optional import require_torch
from mucsc.progress import StageProgress
from mucsc.update import BASE_KEY, META_KEY, BaseMismatchError, apply_update, make_update, squared_norm, widen_bfloat16

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}
LAZY = {
    "sim": ("mucsc.fedsim.cli:sim", "Run the federated-learning simulator (needs torch)."),
    "rate": ("mucsc.cli.rate:rate", "The paper's compression-rate formulas next to measured bytes."),
}
PROGRESS_DELAY_S = 1.0  # the progress line appears once a run has taken this long (none for quick runs)
# the encode stage's share of the bar, in bytes of NEW (reading takes one unit per byte): encoding a
# 294 MB float32 .safetensors with mucsc took 0.72 s against 0.26 s to read it from the page cache
ENCODE_WEIGHT = 2.0
OUT_FORMATS = {"safetensors": "safetensors", "pt": "torch", "torch": "torch", "npz": "npz", "npy": "npy"}
EXIT_CODES = """\b
Exit codes: 0 success; 1 bad or unreadable data, I/O error, an existing output (without -f);
2 usage error (bad option or value, unknown file suffix).  Every error starts "mucsc: error:"."""


class Limit(click.ParamType):
    """A decoding limit: a non-negative number, or 'none' for no limit."""

    name = "N|none"

    def __init__(self, kind: type) -> None:
        self.kind = kind

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        if value is None or isinstance(value, (int, float)) and not isinstance(value, bool):
            return value
        if str(value).lower() in ("none", "unlimited"):
            return None
        try:
            v = self.kind(value)
        except ValueError:
            self.fail(f"{value!r} is not a number or 'none'", param, ctx)
        if v < 0 or v != v:
            self.fail(f"{value!r} must be >= 0 (or 'none')", param, ctx)
        return v


MAX_EXPANSION = click.option(
    "--max-expansion", type=Limit(float), default=mucsc.DEFAULT_MAX_EXPANSION, show_default=True,
    help="Refuse messages that decode to more than this many bytes per message byte (outputs up to "
    "64 MiB always pass; for info: the header's bytes, 1 MiB always pass); 'none': no limit. Raise it "
    "for messages you trust (a nearly constant update compresses far beyond it).")


def limit_options(f: Callable) -> Callable:
    """--max-elements and --max-expansion: mucsc.decode's limits for untrusted messages."""
    f = MAX_EXPANSION(f)
    return click.option("--max-elements", type=Limit(int), default=mucsc.DEFAULT_MAX_ELEMENTS,
                        show_default=True, help="Refuse messages that decode to more elements than "
                        "this; 'none': no limit.")(f)


# bytes never depend on the thread count, so the command line uses every core by default
THREADS_OPTION = click.option("-T", "--threads", type=click.IntRange(min=0), default=0, show_default=True,
                              help="Threads to use (0: all cores); the output is the same for any value.")


class Size(click.ParamType):
    """A byte count with an optional unit (512M, 4G, 1.5GiB; k/M/G/T are powers of 1024), or 'none'."""

    name = "SIZE|none"
    UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        if value is None or isinstance(value, (int, float)) and not isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("none", "unlimited"):
            return math.inf
        m = re.fullmatch(r"(\d+(?:\.\d*)?)\s*([kmgt]?)(?:i?b)?", text)
        if not m:
            self.fail(f"{value!r} is not a size (e.g. 512M, 4G) or 'none'", param, ctx)
        return int(float(m.group(1)) * self.UNITS[m.group(2)])


MAX_MEMORY = click.option(
    "--max-memory", type=Size(), default=None, metavar="SIZE|none",
    help="Refuse input files that would load to more than this (default: 32x the file's size, at least "
    "256 MiB: zip bombs and crafted checkpoints); 'none': no limit.")


class SignalExit(BaseException):
    """SIGTERM or SIGHUP, raised where the program is so that cleanup runs (like KeyboardInterrupt)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def _unwind_on_signals() -> Iterator[None]:
    """Turn SIGTERM and SIGHUP into an exception while a command runs, so that atomic outputs delete
    their temporary file (as they do on Ctrl-C); then die of the same signal, as without the handler."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise SignalExit(signum)

    sigs = [s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None)) if s is not None]
    old = {s: signal.signal(s, handler) for s in sigs}
    try:
        yield
    except SignalExit as exc:
        for s, h in old.items():
            signal.signal(s, h)
        old = {}
        signal.signal(exc.signum, signal.SIG_DFL)
        os.kill(os.getpid(), exc.signum)  # the conventional exit status (128 + signum) for the parent
        raise SystemExit(128 + exc.signum) from None
    finally:
        for s, h in old.items():
            signal.signal(s, h)


@contextlib.contextmanager
def _stdout_errors() -> Iterator[None]:
    """Name <stdout> in write errors (ENOSPC, EIO); a broken pipe keeps its own handling."""
    try:
        yield
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise Failure(f"<stdout>: {exc.strerror or exc}") from None


class UsageFailure(Failure):
    """A one-line usage error about a file name (exit status 2)."""

    exit_code = EXIT_USAGE


class MainGroup(LazyGroup):
    """The command group; maps every library error to one line on stderr, in one place, and gives
    every error (click's own too) the one prefix ``mucsc: error:``."""

    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None,
                     **extra: Any) -> click.Context:
        try:  # the group's own options (`mucsc --bogus`) are parsed here
            return super().make_context(info_name, args, parent, **extra)
        except click.ClickException as exc:
            raise prefixed(exc) from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            with _unwind_on_signals():
                return super().invoke(ctx)
        except BrokenPipeError:  # the reader went away (`mucsc info x.mucsc | head`): quietly, status 1
            _silence_stdout()
            raise click.exceptions.Exit(1) from None
        except click.ClickException as exc:
            raise prefixed(exc) from None
        except (click.exceptions.Exit, click.Abort):
            raise
        except Exception as exc:
            err = to_click_error(exc)
            if err is None:
                raise
            raise err from None


@click.group(cls=MainGroup, context_settings=CONTEXT, lazy_subcommands=LAZY, epilog=EXIT_CODES)
@click.version_option(package_name="mucsc", prog_name="mucsc", message="%(prog)s %(version)s")
def main() -> None:
    """Compress model checkpoints and updates with MUCSC and the paper's baselines.

    \b
    mucsc compress model.safetensors            -> model.safetensors.mucsc
    mucsc compress new.pt --base old.pt -o update.mucsc
    mucsc decompress update.mucsc --base old.pt -o restored.pt
    mucsc info model.safetensors.mucsc
    """


# ---- compress ------------------------------------------------------------------------------------

_RESERVED = {"output", "codec", "shared", "per-tensor", "seed", "base", "force", "quiet", "json",
             "compress", "help", "version", "format", "max-elements", "max-expansion", "key-file", "key-id",
             "keys", "context", "threads", "max-memory", "lossless"}
CODEC_PARAMS = codec_params(_RESERVED)


@main.command(short_help="Compress a checkpoint into a .mucsc message.",
              epilog=codecs_epilog(CODEC_PARAMS) + "\n\n" + EXIT_CODES)
@click.argument("input", metavar="IN")
@click.option("-o", "--output", metavar="OUT", help="Output file ('-': stdout). Default: IN.mucsc, or "
              "stdout when IN is '-'.")
@click.option("-c", "--codec", default="mucsc", show_default=True, help="Codec (see below).")
@click.option("--shared/--per-tensor", default=None,
              help="--shared: all float tensors as one vector with one codebook (the paper's flattened "
              "update). --per-tensor (default): one codebook per tensor, small and all-zero tensors "
              "carried losslessly.")
@click.option("--lossless", "lossless", multiple=True, metavar="PATTERN",
              help="Carry the float tensors whose names match this glob exactly (e.g. '*.norm.*'; "
              "repeatable; not with --shared).")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True,
              help="Seed of the stochastic rounding: same input, options and seed give the same bytes.")
@click.option("--base", metavar="OLD", help="Compress the update IN - OLD (same names, shapes, dtypes); "
              "non-float tensors are stored as they are in IN.")
@click.option("--compress", "compress_mode", default="auto", show_default=True, metavar="auto|off|LEVEL",
              help="auto: zstd-compress sections when smaller; off: fixed-width (the paper's byte "
              "counts); 1..22: that zstd level.")
@THREADS_OPTION
@click.option("-f", "--force", is_flag=True, help="Overwrite OUT; allow binary output to a terminal.")
@signing_options
@MAX_MEMORY
@click.option("-q", "--quiet", is_flag=True, help="No report, notes or progress.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON on stdout.")
def compress(input: str, output: str | None, codec: str, shared: bool | None, lossless: tuple[str, ...],
             seed: int, base: str | None,
             compress_mode: str, threads: int, force: bool, key_file: str | None, key_id: str | None,
             context: str | None, max_memory: float | None, quiet: bool, as_json: bool,
             **codec_values: Any) -> None:
    """Compress a checkpoint (.safetensors, .pt/.pth/.bin/.ckpt, .npz, .npy) into a .mucsc message.

    Without --base the input is a model: by default every float tensor gets its own codebook with Z
    chosen so that its relative error stays within 1% (--max-error ERR, a fraction or e.g. 0.5%),
    1-D tensors (norm weights, biases) as fp16 within 0.1% (else raw), all-zero and small tensors
    losslessly; with --bits/--size no tensor goes above 10% unless the budget forces it.  With --base the input is the update IN - OLD: unbiased mucsc at Z = 16, one
    codebook per tensor.  Integer and bool tensors are always carried losslessly.  The report goes to
    stderr (or, with --json, to stdout).
    """
    mode, codec_obj, level = _compress_codec(codec, codec_values, shared, base is not None, compress_mode,
                                             lossless)
    out = output or ("-" if input == "-" else input + ".mucsc")
    _check_compress_paths(input, base, out, force, as_json)
    signing = signing_kwargs(key_file, key_id, context)  # a key file problem, before any work

    run = _Compression(input, base, out, force, quiet, codec, codec_obj, mode, seed, level, threads, max_memory,
                       signing)
    reader = _stream_reader(input, base, out, mode, codec_obj, max_memory)
    if reader is not None:
        stats, info, norm2, notes, mode = run.streamed(reader)
    else:
        stats, info, norm2, notes, mode = run.loaded()
    _compress_report(input, out, base, codec, codec_obj, mode, seed, level, stats, info, norm2, notes, quiet,
                     as_json)


def _stream_reader(input: str, base: str | None, out: str, mode: defaults.Mode, codec_obj: mucsc.Codec,
                   max_memory: float | None) -> tensorfiles.TensorReader | None:
    """IN opened for streamed compression (one tensor at a time, bounded memory), or None when this run
    needs the model in memory: stdin, --base (IN - OLD), --shared (one vector), a message-wide budget
    (--bits/--size) over fewer than 2^20 elements (planned in memory; larger ones stream in two passes,
    mucsc.budget_choices), output to stdout (the report reads the file back), or a format that cannot
    be read tensor by tensor."""
    if input == "-" or out == "-" or base is not None or mode.policy is None:
        return None
    if tensorfiles.capabilities(_format_of(input)).needs_torch:
        require_torch(tensorfiles.NEEDS_TORCH, tensorfiles.TensorFileError)
    reader = tensorfiles.open_reader(input, max_bytes=max_memory)
    if reader is not None and not mucsc.streamable(codec_obj) and not mucsc.budget_applies(codec_obj, sum(
            math.prod(shape) for _, _, shape in reader.entries)):
        reader.close()
        return None
    return reader


@dataclasses.dataclass(frozen=True)
class _Compression:
    """One ``compress`` run's settings, and its two ways: streamed or loaded whole."""

    input: str
    base: str | None
    out: str
    force: bool
    quiet: bool
    codec: str
    codec_obj: mucsc.Codec
    mode: defaults.Mode
    seed: int
    level: str | int
    threads: int
    max_memory: float | None
    signing: dict[str, Any]

    def _progress(self, total: float) -> StageProgress:
        return StageProgress(not self.quiet and _is_terminal(sys.stderr), delay=PROGRESS_DELAY_S, total=total)

    def streamed(self, reader: tensorfiles.TensorReader) -> tuple:
        """Tensor by tensor from ``reader`` into OUT (written atomically), the message never held."""
        source = _NormedSource(reader)
        mode = _bare_mode(self.mode) if reader.bare else self.mode
        progress = self._progress(1)
        try:
            progress.phase(f"compressing with {self.codec}", 1, measured=True)
            container = "tensor" if reader.bare else "dict"
            with about(_label(self.input)):
                # a budget (--bits/--size): pass 1 reads every tensor for its summary, then the split
                choose = None if mucsc.streamable(self.codec_obj) else mucsc.budget_choices(
                    source, self.codec_obj, policy=mode.policy, seed=self.seed, compress=self.level,
                    container=container, **self.signing)
            with about(_label(self.input)), tensorfiles.atomic_open(self.out, force=self.force) as f:
                stats = mucsc.encode_to(f, source, self.codec_obj, policy=mode.policy, seed=self.seed,
                                        compress=self.level, container=container, choose=choose,
                                        threads=self.threads, progress=progress.hook(),
                                        spool_dir=os.path.dirname(os.path.abspath(self.out)), **self.signing)
        finally:
            reader.close()
            progress.done()
        with open(self.out, "rb") as f:
            info = mucsc.MessageFile(f, max_elements=None, max_expansion=None, check_crc=False).info()
        return stats, info, source.norm2, list(reader.notes), mode

    def loaded(self) -> tuple:
        """The model (and --base) loaded whole, encoded in memory, written."""
        input, base, out = self.input, self.base, self.out
        new_size, old_size = _size(input), _size(base)
        progress = self._progress(new_size + old_size + ENCODE_WEIGHT * new_size)
        mode = self.mode
        try:  # the progress line is cleared (and its ticker stopped) on success and on error alike
            if any(p not in (None, "-") and tensorfiles.capabilities(_format_of(p)).needs_torch
                   for p in (input, base)):
                progress.phase("importing torch (to read .pt files)")  # seconds, before any byte is read
                require_torch(tensorfiles.NEEDS_TORCH, tensorfiles.TensorFileError)
            progress.phase(f"loading {input}", new_size, measured=True)
            loaded = _load(input, progress, self.max_memory)
            tensors, notes, meta = loaded.tensors, list(loaded.notes), None
            if base is not None:
                tensors, meta = _subtract_base(tensors, input, base, progress, self.max_memory, notes)
            progress.phase(f"encoding with {self.codec}", ENCODE_WEIGHT * new_size, measured=True)
            norm2 = squared_norm(tensors)
            notes += _zero_update_notes(input, base, norm2)
            data = tensors[tensorfiles.BARE_NAME] if loaded.bare else tensors
            mode = _bare_mode(mode) if loaded.bare else mode
            del loaded
            with about(_label(input)):
                blob, stats = mucsc.encode_with_stats(data, self.codec_obj, seed=self.seed, shared=mode.shared,
                                                      compress=self.level, meta=meta, policy=mode.policy,
                                                      threads=self.threads, progress=progress.hook(),
                                                      **self.signing)
            del data, tensors
            progress.phase(f"writing {out}")
            _write_bytes(out, blob, self.force)
            info = mucsc.inspect(blob, max_expansion=None)  # our own message
        finally:
            progress.done()
        return stats, info, norm2, notes, mode


class _NormedSource:
    """A tensor reader as ``mucsc.encode_to``'s source, adding up the squared norm of the float
    tensors as they are read (once each) for the report."""

    def __init__(self, reader: tensorfiles.TensorReader) -> None:
        # a bare array's record is conventionally named "" (FORMAT.md 2.4), as mucsc.encode names it
        self.entries = [("", *reader.entries[0][1:])] if reader.bare else reader.entries
        self._reader = reader
        self._seen: set[int] = set()
        self._lock = threading.Lock()
        self.norm2 = 0.0

    def read(self, i: int) -> Any:
        value = self._reader.read(i)
        dtype = self.entries[i][1]
        if i not in self._seen and dtype.startswith(("float", "bfloat")):
            flat = value
            if dtype == "bfloat16" and isinstance(value, np.ndarray):
                flat = value.astype(np.uint32)
                flat <<= 16  # in place (one temporary, not two)
                flat = flat.view(np.float32)
            n2 = squared_norm({"": flat})
            with self._lock:
                self._seen.add(i)
                self.norm2 += n2
        return value


def _check_compress_paths(input: str, base: str | None, out: str, force: bool, as_json: bool) -> None:
    """``compress``'s usage and path errors, found before any file is read."""
    if out == "-" and as_json:
        raise click.UsageError("--json prints to stdout, so the message needs -o FILE")
    for path in (input, base):
        if path is not None and path != "-":
            _format_of(path)  # an unknown suffix is a usage error, found before any file is read
    _check_input(input)
    _check_base_input(input, base)
    _check_output(out, force, inputs=[input, base])


def _bare_mode(mode: defaults.Mode) -> defaults.Mode:
    """A bare array is the data itself, not a model's norm or bias: the 1-D carve-out is for checkpoints."""
    if mode.policy is None or mode.policy.vector_max_error is None:
        return mode
    return dataclasses.replace(mode, policy=dataclasses.replace(mode.policy, vector_max_error=None))


def _compress_report(input, out, base, codec, codec_obj, mode, seed, level, stats, info, norm2, notes, quiet,
                     as_json) -> None:
    """``compress``'s report: on stderr, or as JSON on stdout (the quality warning on stderr either way)."""
    # the parameters used: "auto" choices and a goal's z as the groups resolved them
    effective = report.used_params(codec_obj, stats.groups,
                                   per_tensor=("z", "max_error") if mode.z_per_tensor else ())
    warning = report.quality_warning(stats, codec_obj) if not mode.update else None
    if as_json:
        click.echo(json.dumps(_compress_json(input, out, base, codec, effective, mode, seed, level,
                                             stats, info, norm2, notes, warning), indent=2))
        if warning and not quiet:  # a script reads stdout; whoever runs it still sees the warning
            click.echo(f"mucsc: warning: {warning}", err=True)
    elif not quiet:
        _echo_notes(notes)
        lines = report.compress_lines(_label(input), _out_label(out), codec, effective, mode, stats, info, norm2,
                                      base)
        click.echo("\n".join(lines), err=True)
        if warning:
            click.echo(f"mucsc: warning: {warning}", err=True)


def _compress_codec(codec: str, codec_values: dict[str, Any], shared: bool | None, update: bool,
                    compress_mode: str, lossless: tuple[str, ...] = ()
                    ) -> tuple[defaults.Mode, mucsc.Codec, str | int]:
    """The one codec object of ``compress`` (bad values: a usage error before any file is read), its
    mode and the container's compression level."""
    params = chosen_params(codec, codec_values, CODEC_PARAMS)  # --max-error / --error-cap also take "0.5%"
    if shared and lossless:
        raise click.UsageError("--lossless needs one group per tensor: not with --shared")
    mode, codec_obj = defaults.choose(mucsc.get_codec(codec, **params), params, shared=shared, update=update,
                                      lossless=lossless)
    level: str | int = int(compress_mode) if compress_mode.isdigit() else compress_mode
    # resolved for the container (mucsc's id_packing="auto"), so the report shows what is written
    return mode, codec_obj.for_container(compressing=level != "off"), level


def _subtract_base(tensors: dict[str, Any], input: str, base: str, progress: StageProgress,
                   max_memory: float | None, notes: list[str]) -> tuple[dict[str, Any], dict[str, str]]:
    """``--base``: the update IN - OLD (in place in IN's arrays) and the message meta naming OLD."""
    progress.phase(f"loading {base}", _size(base), measured=True)
    old = _load(base, progress, max_memory)
    notes += old.notes
    progress.phase("subtracting")
    update = make_update(tensors, old.tensors, in_place=True, names=(input, base))
    return update, {META_KEY: os.path.basename(base), BASE_KEY: mucsc.fingerprint(old.tensors)}


def _zero_update_notes(input: str, base: str | None, norm2: float) -> list[str]:
    if base is not None and _same_file(input, base):
        return [f"--base {base} is {input} itself: the update is zero (every float decodes to 0)"]
    if base is not None and norm2 == 0.0:
        return [f"{input} and {base} hold the same float values: the update is zero"]
    return []


compress.params.extend(click_options(CODEC_PARAMS, {
    "max_error": f"model mode (no --base): {defaults.percent(defaults.MODEL_MAX_ERROR)} per tensor",
    "error_cap": f"model mode with --bits/--size: {defaults.percent(defaults.MODEL_ERROR_CAP)}",
    "weighting": "model mode with --bits/--size: damped",
    "rounding": f"model mode (no --base): {defaults.MODEL_ROUNDING}"}))


def _compress_json(input, out, base, codec, params, mode, seed, level, stats, info, norm2, notes, warning):
    J = stats.J
    return {
        "input": input, "output": out, "base": base, "codec": codec, "params": params,
        "mode": mode.name, "mode_reason": mode.reason, "shared": mode.shared and mode.policy is None,
        "max_error": mode.max_error, "seed": seed, "compress": level,
        **report.size_keys(stats.original_bytes, stats.message_bytes, stats.elements),
        "J": J, "squared_norm": norm2, "relative_error_expected": report.relative_error(J, norm2),
        "groups": [{"index": g.index, "codec": g.codec, "records": list(g.records), "elements": g.elements,
                    "bytes": g.bytes, "stats": gs.stats} for g, gs in zip(info.groups, stats.groups)],
        "tensors": [report.tensor_entry(t) for t in stats.tensors],
        "warning": warning, "notes": notes,
    }


# ---- decompress ----------------------------------------------------------------------------------

@main.command(short_help="Decode a .mucsc message into a tensor file.", epilog=EXIT_CODES)
@click.argument("input", metavar="IN.mucsc")
@click.option("-o", "--output", metavar="OUT", help="Output file; its suffix picks the format "
              "(.safetensors, .pt/.pth/.bin/.ckpt, .npz, .npy). Default: IN without .mucsc (plus "
              ".safetensors when that leaves no tensor suffix); stdout when IN is '-'.")
@click.option("-F", "--format", "out_format", type=click.Choice(sorted(OUT_FORMATS)),
              help="Output format, overriding the suffix (default for stdout: safetensors).")
@click.option("--base", metavar="OLD", help="Add the decoded update back onto OLD (float tensors only); OLD "
              "must be the base the update was made from (its fingerprint is checked).")
@click.option("--ignore-base-mismatch", is_flag=True, help="Add the update to a --base whose fingerprint "
              "differs from the one the message records.")
@limit_options
@verifying_options
@THREADS_OPTION
@MAX_MEMORY
@click.option("--only", "only", multiple=True, metavar="PATTERN",
              help="Write only the tensors whose names match this glob (e.g. 'layers.0.*'; repeatable); "
              "only their groups are decoded.")
@click.option("-f", "--force", is_flag=True, help="Overwrite OUT; allow binary output to a terminal.")
@click.option("-q", "--quiet", is_flag=True, help="No report or notes.")
def decompress(input: str, output: str | None, out_format: str | None, base: str | None,
               ignore_base_mismatch: bool, max_elements: int | None, max_expansion: float | None,
               key_file: str | None, keys_dir: str | None, key_id: str | None, context: str | None, threads: int,
               max_memory: float | None, only: tuple[str, ...], force: bool, quiet: bool) -> None:
    """Decode a .mucsc message into a tensor file (dtypes and shapes restored).

    A message file is decoded group by group and each tensor written as it is decoded (memory: one
    group, not the model), unless the output is .pt (torch.save writes the whole state_dict at once)
    or the run needs the whole message: stdin, --base, or --key-file/--keys (the tag covers every byte).
    With --key-file or --keys the message must carry a valid authentication tag (checked before
    anything is decoded); without, an authenticated message is decoded unverified, with a note.
    """
    out = output or _default_decompressed_name(input)
    fmt = _out_format(out, out_format)
    _check_input(input)
    if base is not None and base != "-":
        _format_of(base)
    _check_base_input(input, base)
    _check_output(out, force, inputs=[input, base])
    verifying = verifying_kwargs(key_file, keys_dir, key_id, context)
    if input != "-" and base is None and not verifying:
        _decompress_streamed(input, out, fmt, only, max_elements, max_expansion, threads, force, quiet)
        return

    info, decoded = _decode_file(input, out, fmt, verifying, max_elements, max_expansion, threads, quiet)
    tensors = _recorded_shapes(decoded, info)
    if only:
        keep = set(_selected(list(tensors), only, input))
        tensors = {k: v for k, v in tensors.items() if k in keep}
    notes = [n for n in [unverified_note(info)] if n]
    if base is not None:
        tensors = _add_base(tensors, info, input, base, ignore_base_mismatch, max_memory, notes)
    elif META_KEY in info.meta:
        notes.append(f"{input} holds an update relative to {info.meta[META_KEY]!r}; "
                     "use --base OLD to add it back")
    if not tensorfiles.capabilities(fmt).bfloat16:
        tensors = _without_bfloat16(tensors, fmt, notes)
    single = tensorfiles.capabilities(fmt).max_tensors == 1
    target = tensors if isinstance(decoded, dict) or not single else tensors[tensorfiles.BARE_NAME]
    del decoded
    _save_tensors(out, target, fmt, force)
    if not quiet:
        _echo_notes(notes)
        click.echo(f"{_label(input)} -> {_out_label(out)}: "
                   f"{len(info.records)} tensor(s), {report.nbytes(info.original_bytes)} bytes ({fmt})",
                   err=True)


def _decompress_streamed(input: str, out: str, fmt: str, only: tuple[str, ...], max_elements: int | None,
                         max_expansion: float | None, threads: int, force: bool, quiet: bool) -> None:
    """``decompress`` of a message file, group by group: HEAD and the section table read, the CRC
    checked in one pass, then each group decoded and its tensors written (a format that cannot
    stream out, .pt, collects them and saves once)."""
    spec = tensorfiles.capabilities(fmt)
    with about(_label(input)):
        if os.path.isdir(input):
            raise Failure(f"{input}: is a directory")
        with open(input, "rb") as f:
            mf = mucsc.MessageFile(f, max_elements=max_elements, max_expansion=max_expansion, check_crc=True)
            info = mf.info()
            names = [r.name for r in mf.header.records]
            chosen = _selected(names, only, input) if only else names
            if spec.max_tensors is not None and len(chosen) > spec.max_tensors:
                raise UsageFailure(f"{out}: a .{fmt} file holds {spec.max_tensors} array; {input} has "
                                   f"{len(chosen)} tensors (write .npz, .safetensors or .pt)")
            if spec.needs_torch:
                require_torch(tensorfiles.NEEDS_TORCH, tensorfiles.TensorFileError)  # before any decoding
            notes = [n for n in [unverified_note(info)] if n]
            if META_KEY in info.meta:
                notes.append(f"{input} holds an update relative to {info.meta[META_KEY]!r}; "
                             "use --base OLD to add it back")
            widened = [r.name or tensorfiles.BARE_NAME for r in mf.write_order(chosen) if r.dtype == "bfloat16"]
            if widened and not spec.bfloat16:
                listed = ", ".join(map(repr, widened[:5])) + (" ..." if len(widened) > 5 else "")
                notes.append(f"bfloat16 tensors written as float32 (.{fmt} has no bfloat16): {listed}")
            total = sum(r.size for r in mf.write_order(chosen))
            nbytes = sum(r.nbytes for r in mf.write_order(chosen))
            progress = StageProgress(not quiet and _is_terminal(sys.stderr), delay=PROGRESS_DELAY_S, total=1)
            try:
                progress.phase(f"decoding {_label(input)}", 1, measured=True)
                _write_streamed(out, fmt, mf, chosen, threads, force, progress.hook(), total)
            finally:
                progress.done()
    if not quiet:
        _echo_notes(notes)
        click.echo(f"{_label(input)} -> {_out_label(out)}: {len(chosen)} tensor(s), {report.nbytes(nbytes)} "
                   f"bytes ({fmt})", err=True)


def _write_streamed(out: str, fmt: str, mf: mucsc.MessageFile, names: list[str], threads: int, force: bool,
                    hook: Callable[[int, int], None], total: int) -> None:
    """The chosen tensors of ``mf`` decoded group by group into OUT (atomic) or stdout."""
    spec = tensorfiles.capabilities(fmt)
    order = mf.write_order(names)
    entries = [(r.name or tensorfiles.BARE_NAME, "float32" if r.dtype == "bfloat16" and not spec.bfloat16
                else r.dtype, r.shape) for r in order]
    bf16 = "torch" if spec.needs_torch else "bits" if spec.bfloat16 else "float32"

    def write(f: IO[bytes]) -> None:
        writer = tensorfiles.open_writer(f, fmt, entries)
        held: dict[str, Any] = {}
        done = 0
        try:
            for rec, values in mf.records(names, bfloat16=bf16, threads=threads):
                name = rec.name or tensorfiles.BARE_NAME
                if writer is None:
                    held[name] = values
                else:
                    writer.write(name, values)
                done += rec.size
                hook(done, total)
        except BaseException:
            getattr(writer, "abandon", lambda: None)()
            raise
        if writer is None:  # the format pickles everything at once (.pt): the model is held here
            tensorfiles.save(f, held, fmt=fmt)
        else:
            writer.finish()

    if out == "-":
        with _stdout_errors():
            write(tensorfiles.WriteAll(sys.stdout.buffer))
    else:
        with tensorfiles.atomic_open(out, force=force) as f:
            write(f)


def _selected(names: list[str], patterns: tuple[str, ...], input: str) -> list[str]:
    """``--only``: the names matching any of the globs, in message order; a usage error when none do."""
    chosen = [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in patterns)]
    if not chosen:
        raise UsageFailure(f"{input}: no tensor matches --only {' '.join(map(repr, patterns))} "
                           f"({len(names)} tensors, e.g. {', '.join(map(repr, names[:3]))})")
    return chosen


def _out_format(out: str, out_format: str | None) -> str:
    """The tensor format of OUT: -F, else its suffix (safetensors for stdout)."""
    if out_format:
        return OUT_FORMATS[out_format]
    return "safetensors" if out == "-" else _format_of(out)


def _recorded_shapes(decoded: Any, info: mucsc.MessageInfo) -> dict[str, Any]:
    """The decoded tensors by name, each in its record's shape (a view, no copy; a safety net for 0-d
    tensors)."""
    tensors = decoded if isinstance(decoded, dict) else {tensorfiles.BARE_NAME: decoded}
    shapes = {r.name or tensorfiles.BARE_NAME: tuple(r.shape) for r in info.records}
    return {k: v if tuple(v.shape) == shapes[k] else v.reshape(shapes[k]) for k, v in tensors.items()}


def _without_bfloat16(tensors: dict[str, Any], fmt: str, notes: list[str]) -> dict[str, Any]:
    """.npz / .npy have no bfloat16: such tensors widened (exactly) to float32, with a note."""
    tensors, widened = widen_bfloat16(tensors)
    if widened:
        listed = ", ".join(map(repr, widened[:5])) + (" ..." if len(widened) > 5 else "")
        notes.append(f"bfloat16 tensors written as float32 (.{fmt} has no bfloat16): {listed}")
    return tensors


def _save_tensors(out: str, target: Any, fmt: str, force: bool) -> None:
    if out == "-":
        with _stdout_errors():
            tensorfiles.save(sys.stdout.buffer, target, fmt=fmt)
    else:
        tensorfiles.save(out, target, fmt=fmt, force=force)


def _decode_file(input: str, out: str, fmt: str, verifying: dict[str, Any], max_elements: int | None,
                 max_expansion: float | None, threads: int, quiet: bool = False) -> tuple[mucsc.MessageInfo, Any]:
    """Read, inspect (verifying first with keys) and decode IN for an output of format ``fmt``."""
    blob = _read_bytes(input)
    with about(_label(input)):
        info = mucsc.inspect(blob, max_expansion=max_expansion, **verifying)  # verifies first with keys
        spec = tensorfiles.capabilities(fmt)
        if spec.max_tensors is not None and len(info.records) > spec.max_tensors:
            raise UsageFailure(f"{out}: a .{fmt} file holds {spec.max_tensors} array; {input} has "
                               f"{len(info.records)} tensors (write .npz, .safetensors or .pt)")
        has_bf16 = any(r.dtype == "bfloat16" for r in info.records)
        as_torch = spec.needs_torch or (spec.bfloat16 and has_bf16)  # bfloat16 out of memory: torch
        if as_torch:
            require_torch(tensorfiles.NEEDS_TORCH, tensorfiles.TensorFileError)  # before any decoding
        # the same immutable bytes inspect() verified: no second tag check needed
        progress = StageProgress(not quiet and _is_terminal(sys.stderr), delay=PROGRESS_DELAY_S, total=1)
        try:  # a line only when decoding takes over a second; moved by the API's progress hook
            progress.phase(f"decoding {_label(input)}", 1, measured=True)
            decoded = mucsc.decode(blob, as_torch=as_torch, max_elements=max_elements,
                                   max_expansion=max_expansion, threads=threads, progress=progress.hook())
        finally:
            progress.done()
    return info, decoded


def _add_base(tensors: dict[str, Any], info: mucsc.MessageInfo, input: str, base: str, ignore_mismatch: bool,
              max_memory: float | None, notes: list[str]) -> dict[str, Any]:
    """``--base``: OLD + the decoded update, after the layout and (same layout, other values: another
    checkpoint of the same model) the fingerprint check."""
    old = _load(base, None, max_memory)
    notes += old.notes
    rec_layout = {r.name or tensorfiles.BARE_NAME: (tuple(r.shape), r.dtype) for r in info.records}
    names = (input, base)
    try:
        tensors = apply_update(old.tensors, tensors, expect=info.meta.get(BASE_KEY), update_layout=rec_layout,
                               names=names, in_place=True)
    except BaseMismatchError as exc:
        made_from = f" ({info.meta[META_KEY]})" if META_KEY in info.meta else ""
        if not ignore_mismatch:
            raise Failure(f"{base}: not the base {input} was made from: its fingerprint is {exc.got}, "
                          f"the message records {exc.expected}{made_from} (--ignore-base-mismatch adds "
                          "the update anyway)") from None
        notes.append(f"{base}'s fingerprint {exc.got} differs from the recorded {exc.expected}{made_from}; "
                     "added the update anyway (--ignore-base-mismatch)")
        tensors = apply_update(old.tensors, tensors, update_layout=rec_layout, names=names, in_place=True)
    if META_KEY not in info.meta:
        notes.append(f"{input} was not made with --base; added it to {base} anyway")
    return tensors


def _default_decompressed_name(input: str) -> str:
    if input == "-":
        return "-"
    if input.endswith(".mucsc") and len(os.path.basename(input)) > len(".mucsc"):
        stem = input[: -len(".mucsc")]
        known = os.path.splitext(stem)[1].lower() in tensorfiles.SUFFIXES
        return stem if known else stem + ".safetensors"
    raise UsageFailure(f"{input}: does not end in .mucsc; give the output name with -o")


# ---- info and test -------------------------------------------------------------------------------

@main.command(short_help="List tensors, codecs, sections and sizes of a message.", epilog=EXIT_CODES)
@click.argument("input", metavar="IN.mucsc")
@verifying_options
@MAX_EXPANSION
@click.option("--json", "as_json", is_flag=True, help="Print plain JSON.")
def info(input: str, key_file: str | None, keys_dir: str | None, key_id: str | None, context: str | None,
         max_expansion: float | None, as_json: bool) -> None:
    """List a message's tensors, groups (codec and parameters), sections and sizes, and its
    authentication tag (algorithm and key id; verified with --key-file or --keys)."""
    _check_input(input)
    verifying = verifying_kwargs(key_file, keys_dir, key_id, context)
    with about(_label(input)):
        if input != "-" and not verifying and not os.path.isdir(input):  # HEAD and section headers only
            with open(input, "rb") as f:
                summary = mucsc.MessageFile(f, max_expansion=max_expansion, check_output=False).info()
        else:
            summary = mucsc.inspect(_read_bytes(input), max_expansion=max_expansion, **verifying)
    if as_json:
        click.echo(json.dumps(report.info_json(input, summary), indent=2))
    else:
        click.echo("\n".join(report.info_lines(input if input != "-" else "<stdin>", summary)))


@main.command("test", short_help="Verify messages (checksum, every tensor decodes).", epilog=EXIT_CODES)
@click.argument("inputs", metavar="IN.mucsc...", nargs=-1, required=True)
@limit_options
@verifying_options
@THREADS_OPTION
@click.option("-q", "--quiet", is_flag=True, help="Print only failures.")
@click.option("--json", "as_json", is_flag=True, help="Print plain JSON.")
def test_cmd(inputs: tuple[str, ...], max_elements: int | None, max_expansion: float | None,
             key_file: str | None, keys_dir: str | None, key_id: str | None, context: str | None,
             threads: int, quiet: bool, as_json: bool) -> None:
    """Check messages like gzip -t: the checksum holds and every tensor decodes (exit 0), else exit 1.

    With --key-file or --keys every message must also carry a valid authentication tag.
    """
    verifying = verifying_kwargs(key_file, keys_dir, key_id, context)
    results = []
    for path in inputs:
        try:
            _check_input(path)
            with about(_label(path)):
                if path != "-" and not verifying and not os.path.isdir(path):
                    _verify_file(path, max_elements, max_expansion, threads)
                else:
                    blob = _read_bytes(path)
                    mucsc.verify(blob, max_elements=max_elements, max_expansion=max_expansion, threads=threads,
                                 **verifying)
            results.append({"file": path, "ok": True, "error": None})
            if not (quiet or as_json):
                how = f" (authenticated: key id {_key_id(blob)!r})" if verifying else ""
                click.echo(f"{_label(path)}: OK{how}")
        except Exception as exc:  # noqa: BLE001 - mapped to one line, or re-raised when not ours
            err = prefixed(exc) if isinstance(exc, click.ClickException) else to_click_error(exc)
            if err is None:
                raise
            results.append({"file": path, "ok": False, "error": err.format_message()})
            if not as_json:
                err.show()
    if as_json:
        click.echo(json.dumps(results, indent=2))
    if not all(r["ok"] for r in results):
        raise click.exceptions.Exit(1)


def _verify_file(path: str, max_elements: int | None, max_expansion: float | None, threads: int) -> None:
    """``mucsc.verify`` of a message file a group at a time: the CRC in one pass, then every group
    decoded and dropped (memory: one group, not the model)."""
    with open(path, "rb") as f:
        mf = mucsc.MessageFile(f, max_elements=max_elements, max_expansion=max_expansion, check_crc=True)
        for gi in range(len(mf.header.groups)):
            mf.decode_group(gi, threads=threads)


# ---- shared helpers ------------------------------------------------------------------------------

def _key_id(blob: bytes) -> str | None:
    """The key id of a message already verified (read from its trailer; nothing is decoded)."""
    auth = mucsc.inspect(blob).auth
    return auth.key_id if auth else None


def _check_input(path: str, allow_stdin: bool = True) -> None:
    """Refuse a terminal as binary input and a second use of stdin (a usage error)."""
    if path == "-":
        if not allow_stdin:
            raise UsageFailure("-: stdin can be used for one input only")
        if _is_terminal(sys.stdin):
            raise UsageFailure("<stdin>: refusing to read binary data from a terminal")


def _check_base_input(input: str, base: str | None) -> None:
    """--base OLD: a second input, which cannot also be stdin when IN is."""
    if base is not None:
        _check_input(base, allow_stdin=input != "-")


def _echo_notes(notes: list[str]) -> None:
    for note in notes:
        click.echo(f"mucsc: note: {note}", err=True)


def _check_output(out: str, force: bool, inputs: list[str | None]) -> None:
    """Before any work: no binary to a terminal, no silent overwrite, never the input itself."""
    if out == "-":
        if _is_terminal(sys.stdout) and not force:
            raise UsageFailure("<stdout>: refusing to write binary data to a terminal "
                               "(use -o FILE, a pipe, or -f)")
        return
    for src in inputs:
        if src and src != "-" and os.path.exists(out) and os.path.exists(src) and os.path.samefile(out, src):
            raise Failure(f"{out}: is also an input; refusing to overwrite it")
    if os.path.isdir(out):
        raise Failure(f"{out}: is a directory")
    if not force and os.path.lexists(out):
        raise Failure(f"{out}: already exists (-f overwrites it; -o OTHER writes another file)")


def _format_of(path: str) -> str:
    try:
        return tensorfiles.format_of(path)
    except tensorfiles.TensorFileError as exc:
        raise UsageFailure(str(exc)) from None


def _load(path: str, progress: StageProgress | None = None,
          max_bytes: float | None = None) -> tensorfiles.Loaded:
    if path == "-":
        return tensorfiles.load(sys.stdin.buffer, name="<stdin>", max_bytes=max_bytes)
    if progress is None or not progress.enabled:
        return tensorfiles.load(path, max_bytes=max_bytes)
    return _load_counting(path, progress.advance, max_bytes)


def _load_counting(path: str, on_read: Callable[[int], None],
                   max_bytes: float | None = None) -> tensorfiles.Loaded:
    """``tensorfiles.load(path)`` with the opened file read through a :class:`CountingReader`, so the
    bar follows the bytes (the file is still parsed in place, not buffered whole)."""
    return tensorfiles.load(path, wrap=lambda f: CountingReader(f, on_read), max_bytes=max_bytes)


def _same_file(a: str, b: str) -> bool:
    try:
        return a != "-" and b != "-" and os.path.samefile(a, b)
    except OSError:
        return False


class CountingReader(io.RawIOBase):
    """A read-only, seekable view of an open binary file that reports every byte read to ``on_read``.

    ``readinto`` fills its buffer in slices of CHUNK bytes (one report per slice), so the single large
    read of a safetensors data block still moves the bar; ``read(n)`` is passed through whole (zipfile
    and torch rely on full reads; slicing it would copy).  No ``fileno``: every read goes through here.
    """

    CHUNK = 8 << 20

    def __init__(self, f: IO[bytes], on_read: Callable[[int], None]) -> None:
        super().__init__()
        self._f, self._on_read = f, on_read

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return self._f.seekable()

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return self._f.seek(offset, whence)

    def tell(self) -> int:
        return self._f.tell()

    def readinto(self, b: Any) -> int:
        mv = memoryview(b).cast("B")
        got = 0
        while got < len(mv):
            n = self._f.readinto(mv[got:got + self.CHUNK])
            if not n:
                break
            got += n
            self._on_read(n)
        return got

    def read(self, size: int | None = -1) -> bytes:
        data = self._f.read(-1 if size is None else size)
        self._on_read(len(data))
        return data

    def readall(self) -> bytes:
        return self.read(-1)


def _read_bytes(path: str) -> bytes:
    if path == "-":
        return sys.stdin.buffer.read()
    with about(_label(path)):
        if os.path.isdir(path):
            raise Failure(f"{path}: is a directory")
        with open(path, "rb") as f:
            return f.read()


def _write_bytes(out: str, blob: bytes, force: bool) -> None:
    if out == "-":
        with _stdout_errors():
            stream = tensorfiles.WriteAll(sys.stdout.buffer)
            stream.write(blob)
            stream.flush()
        return
    with tensorfiles.atomic_open(out, force=force) as f:
        f.write(blob)


def _label(path: str) -> str:
    """How a path is named in messages ('-' is '<stdin>')."""
    return "<stdin>" if path == "-" else path


def _out_label(path: str) -> str:
    """How an output is named in messages ('-' is '<stdout>')."""
    return "<stdout>" if path == "-" else path


def _size(path: str | None) -> int:
    try:
        return os.path.getsize(path) if path and path != "-" else 0
    except OSError:
        return 0


def _is_terminal(stream: IO[Any]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _silence_stdout() -> None:
    """After EPIPE, point stdout at /dev/null so the interpreter's final flush stays quiet."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


if __name__ == "__main__":
    main(prog_name="mucsc")
