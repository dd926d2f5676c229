"""``mucsc sim``: run the FedAvg simulator over one or more codecs and print the paper-style table.

With no arguments it runs the built-in experiment (scikit-learn's digits, offline) across
none, mucsc, bmucsc, qsgd, signsgd, stc and dgc.  The CLI group loads this command lazily as
``mucsc.fedsim.cli:sim``.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import click

from mucsc.errors import InputError, MucscError
from mucsc.progress import SweepProgress


class CommaList(click.ParamType):
    """A comma-separated list of ``kind`` values, as a tuple (``--codecs none,mucsc``, ``--seeds 0,1``)."""

    def __init__(self, kind: type) -> None:
        self.kind = kind
        self.name = f"{kind.__name__}[,{kind.__name__}...]"

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        from mucsc.fedsim.config import split_list  # commas inside NAME(KEY=VALUE,...) kept

        try:
            items = tuple(self.kind(v) for v in split_list(value))
        except ValueError:
            self.fail(f"expected a comma-separated list, got {value!r}", param, ctx)
        if not items:
            self.fail("the list is empty", param, ctx)
        return items


class Workers(click.ParamType):
    """``--workers``: a count >= 1 or ``auto``."""

    name = "N|auto"

    def convert(self, value, param, ctx):
        if value == "auto" or isinstance(value, int):
            return value
        try:
            n = int(value)
        except ValueError:
            self.fail(f"expected a number >= 1 or 'auto', got {value!r}", param, ctx)
        if n < 1:
            self.fail("must be >= 1 (or 'auto')", param, ctx)
        return n


def setting_option(st) -> click.Option:
    """The click option of one SimConfig setting (:func:`mucsc.fedsim.config.settings`): its flags,
    type (Choice, IntRange / FloatRange, comma lists, directories, flags for booleans) and help; the
    default is None, so that the TOML file and SimConfig's own defaults apply."""
    short = [f for f in st.flags if len(f) == 2]
    long = [f for f in st.flags if len(f) > 2] or [st.option]
    decls = [*short, *long, st.name]
    if st.kind is bool:
        decls = [f"{st.option}/--no-{st.option[2:]}", st.name]
        return click.Option(decls, default=None, help=st.help)
    return click.Option(decls, type=_click_type(st), default=None, metavar=st.metavar, help=st.help)


def _click_type(st) -> click.ParamType:
    if st.name == "workers":
        return Workers()
    if st.choices is not None:
        return click.Choice(st.choices)
    if st.many:
        return CommaList(st.kind)
    if st.directory:
        return click.Path(file_okay=False)
    if st.kind in (int, float) and (st.min is not None or st.max is not None):
        ranged = click.IntRange if st.kind is int else click.FloatRange
        return ranged(st.min, st.max, min_open=st.min_open)
    return click.types.convert_type(st.kind)


def data_summary(cfg, setup) -> dict[str, object]:
    """The data actually loaded and how it is used: samples, classes, writers, clients, model, d."""
    info = setup.data.describe()
    sizes = setup.sizes
    info.update({"clients": cfg.clients, "client_samples_min": int(sizes.min()),
                 "client_samples_max": int(sizes.max()), "client_samples_total": int(sizes.sum()),
                 "model": setup.model_name, "d": setup.d})
    schedule, lr0, decay, lr_min = cfg.lr_settings()
    info["lr"] = (f"constant {lr0:g}" if schedule == "constant"
                  else f"{schedule}: max({lr0:g} / (1 + t/{decay:g}), {lr_min:g})")
    return info


def data_line(info: dict[str, object]) -> str:
    """One line for the log: what was loaded and the settings that shape training."""
    writers = f", {info['writers']} writers" if "writers" in info else ""
    return (f"{info['dataset']}: {info['train_samples']} train / {info['test_samples']} test samples, "
            f"{info['classes']} classes{writers}, input {'x'.join(map(str, info['input_shape']))} "
            f"({info['normalize']}); {info['clients']} clients with {_samples(info)}; "
            f"model {info['model']} d = {info['d']}; lr {info['lr']}")


def _samples(info: dict[str, object]) -> str:
    """ "500 samples each" or "300..500 samples", and why N clients can hold more than the data set."""
    lo, hi, total = info["client_samples_min"], info["client_samples_max"], info["client_samples_total"]
    text = f"{lo} samples each" if lo == hi else f"{lo}..{hi} samples"
    if total > info["train_samples"]:  # type: ignore[operator]
        text += (f" (drawn with overlap: {total} client samples from {info['train_samples']} train samples, "
                 "no repeats within a client)")
    return text


def machine_info() -> dict[str, object]:
    """CPU model, logical cores, python and torch versions, torch threads (for the results)."""
    model = platform.processor() or "unknown"
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=5).stdout
        model = next((l.split(":", 1)[1].strip() for l in out.splitlines() if l.startswith("Model name")), model)
    except (OSError, subprocess.SubprocessError):
        pass
    import torch

    return {"cpu": model, "cores": os.cpu_count(), "python": platform.python_version(),
            "torch": torch.__version__, "torch_threads": torch.get_num_threads()}


RESULTS = "mucsc-sim"  # without -o, each sweep's results go to a new folder under ./mucsc-sim/


def new_results_dir(root: Path = Path(RESULTS)) -> Path:
    """A new, empty ``root/<date>-<time>`` folder (local time to the second, e.g. ``2026-11-28-074700``;
    ``-2``, ``-3``, ... appended when a sweep started in the same second already took the name)."""
    stamp = time.strftime("%Y-%m-%d-%H%M%S")
    root.mkdir(parents=True, exist_ok=True)
    for k in range(1, 1000):
        path = root / (stamp if k == 1 else f"{stamp}-{k}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise click.ClickException(f"no free results folder name under {root}/ for {stamp} (give -o DIR)")


@click.command("sim", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--config", "config_file", type=click.Path(exists=True, dir_okay=False),
              help="TOML file of settings (flags override it).")
@click.option("-p", "--param", "params", multiple=True, metavar="CODEC[.up|.down].KEY=VALUE",
              help="A codec parameter, e.g. -p stc.keep=0.01 (repeatable).")
@click.option("--engine", type=click.Choice(["builtin", "flower"]), default="builtin",
              help="builtin: this process and --workers [default]; flower: Flower's simulation engine (Ray), "
                   "every update a real Flower Message (pip install 'mucsc[flower]'; RAY_ADDRESS selects a cluster).")
@click.option("-o", "--out", type=click.Path(file_okay=False),
              help=f"Write CSV/JSON/PNG results here [default: a new {RESULTS}/<date>-<time>/].")
@click.option("-q", "--quiet", is_flag=True, help="No progress output on stderr.")
def sim(config_file, out, quiet, params, engine, **flags):
    """Simulate FedAvg with every update sent through a codec as real bytes; print the paper's table
    and where the results (summary.csv, per-run CSV/JSON, plots) are.

    With no arguments: the built-in digits experiment across none, mucsc, bmucsc, qsgd, signsgd,
    stc and dgc (a few minutes on 2 cores), its results in a new ./mucsc-sim/<date>-<time>/.
    """
    _require_sim_dependencies(flags.get("dataset"), engine)
    from mucsc.fedsim.config import make_config, parse_param

    try:
        if params:
            flags["params"] = tuple(parse_param(p) for p in params)
        cfg = make_config(config_file, **flags)
    except InputError as exc:
        raise click.UsageError(str(exc)) from None
    if engine == "flower" and cfg.save_updates:
        raise click.UsageError("--save-updates needs --engine builtin")
    if engine == "flower" and cfg.sampling != "uniform":
        raise click.UsageError("--engine flower needs --sampling uniform (a Flower round sends one message "
                               "per supernode; weighted sampling can pick a client twice)")
    _run_sweep(cfg, Path(out) if out else None, quiet, engine)


def _sim_options() -> list[click.Option]:
    from mucsc.fedsim.config import settings

    return [setting_option(st) for st in settings() if st.cli]


sim.params[1:1] = _sim_options()  # after --config, in SimConfig's field order


def _require_sim_dependencies(dataset: str | None, engine: str = "builtin") -> None:
    """One clear line (exit 1) instead of an ImportError when the simulator's extras are missing."""
    needed = ["torch"]
    if dataset in (None, "digits"):
        needed.append("sklearn")  # the built-in digits data set ships with scikit-learn
    needed.append("matplotlib")  # the PNG plots (results are always written: -o, or ./mucsc-sim/)
    missing = [m for m in needed if importlib.util.find_spec(m) is None]
    if missing:
        raise click.ClickException(f"mucsc sim needs {', '.join(missing)}: pip install 'mucsc[sim]'")
    missing = [m for m in ("flwr", "ray") if engine == "flower" and importlib.util.find_spec(m) is None]
    if missing:
        raise click.ClickException(f"--engine flower needs {', '.join(missing)}: pip install 'mucsc[sim,flower]'")


def _run_sweep(cfg, out: Path | None, quiet: bool, engine: str = "builtin") -> None:
    import torch

    from mucsc.fedsim import simulation

    torch.set_num_threads(cfg.threads)
    _check_codecs(cfg)
    try:
        simulation.resolve_device(cfg.device)  # --device cuda without a GPU: say so before loading data
    except InputError as exc:
        raise click.ClickException(str(exc)) from None
    sweep = _Sweep.prepare(cfg, out, quiet)
    where = simulation.choose_device(cfg.device, sweep.setups)
    runner = _start_engine(engine, cfg, sweep.setups, len(sweep.specs), where.device)
    try:  # the pool is closed below; until then, here
        machine = _machine(runner, where, engine)
        sweep.start(runner, where)
    except BaseException:
        runner.close()
        raise
    failure = sweep.run(runner)
    text = sweep.report(machine)
    click.echo(text)
    click.echo(f"results in {sweep.out}/")
    if failure:
        raise click.ClickException(f"{failure}; results so far are in {sweep.out}/")


def _check_codecs(cfg) -> None:
    """Every codec and parameter checked before any training (a usage error)."""
    from mucsc.fedsim.transport import check_codec

    try:
        for name in cfg.codecs:
            ups, down = cfg.links(name, cfg.clients, [i % len(cfg.z_up) for i in range(cfg.clients)])
            for link in {*ups, down}:
                check_codec(link)
    except MucscError as exc:
        raise click.UsageError(f"codec settings: {exc}") from None


def _check_save_updates(cfg, specs) -> None:
    """--save-updates: bounded, and no run directory overwritten (checked before any training)."""
    from mucsc.fedsim import updates

    try:
        updates.check_budget(cfg.save_updates, sum(
            updates.planned_bytes(1, cfg.save_rounds, cfg.save_slots, sp.setup.d, cfg.resolved("rounds"))
            for sp in specs))
        for sp in specs:
            d = updates.run_dir(cfg.save_updates, sp.codec, sp.cfg.seed)
            if d.exists() and any(d.iterdir()):
                raise InputError(f"--save-updates: {d} exists and is not empty (choose a new DIR)")
    except InputError as exc:
        raise click.UsageError(str(exc)) from None


def _start_engine(engine: str, cfg, setups, runs: int, device: str):
    """The sweep's engine (--engine flower: Ray runs the clients, so no worker processes of ours)."""
    from mucsc.fedsim import engines

    try:
        return engines.start(engine, cfg, setups, runs, device)
    except (MucscError, OSError, RuntimeError) as exc:
        raise click.ClickException(f"workers: {exc}") from None


def _machine(runner, where, engine: str) -> dict[str, object]:
    """machine_info() plus how this sweep runs (for summary.json)."""
    machine = machine_info()
    machine.update(device=where.device, device_reason=where.reason, workers=runner.workers,
                   workers_reason=runner.reason, concurrent_runs=runner.concurrent, engine=engine)
    if where.device == "cuda":
        import torch

        machine["gpu"] = torch.cuda.get_device_name()
    return machine


class _Sweep:
    """One ``mucsc sim`` sweep: its runs (codec x seed), their progress and result files, the table."""

    def __init__(self, cfg, out: Path, quiet: bool, seeds, cfgs, setups, specs) -> None:
        self.cfg, self.out, self.quiet = cfg, out, quiet
        self.seeds, self.cfgs, self.setups, self.specs = seeds, cfgs, setups, specs
        self.many = len(seeds) > 1
        self.labels = [f"{sp.codec} (seed {sp.cfg.seed})" if self.many else sp.codec for sp in specs]
        self.show = not quiet and sys.stderr.isatty()
        self.writers: dict[int, object] = {}
        self.done: dict[int, object] = {}
        self.progress = None
        self.data_infos: list[dict[str, object]] = []

    @classmethod
    def prepare(cls, cfg, out: Path | None, quiet: bool) -> _Sweep:
        """Data, partition and Z groups per seed, the run specs (bad data: exit 1), and the results
        folder: ``out``, or a new one under ./mucsc-sim/ (made only once the data loaded)."""
        from mucsc.fedsim import simulation

        seeds = cfg.seed_list()
        cfgs = [cfg.with_seed(s) for s in seeds]
        try:  # each seed draws its own split, partition and Z groups
            setups = [simulation.prepare(c) for c in cfgs]
        except (MucscError, OSError) as exc:
            raise click.ClickException(f"data: {exc}") from None
        specs = [simulation.RunSpec(c, name, st, k) for k, (c, st) in enumerate(zip(cfgs, setups))
                 for name in cfg.codecs]
        if cfg.save_updates:
            _check_save_updates(cfg, specs)
        return cls(cfg, out or new_results_dir(), quiet, seeds, cfgs, setups, specs)

    def run_dir(self, spec) -> Path:
        return self.out / f"seed{spec.cfg.seed}" if self.many else self.out

    def start(self, runner, where) -> None:
        """The data lines (on a terminal above the progress bar; piped, the first lines of the log)."""
        self.data_infos = [data_summary(c, st) for c, st in zip(self.cfgs, self.setups)]
        if not self.quiet:
            workers = runner.workers
            unused = f" ({where.reason})" if where.gpu_unused else ""
            for s, info in zip(self.seeds, self.data_infos):
                click.echo((f"seed {s}: " if self.many else "") + data_line(info)
                           + f"; device {where.device}{unused}, {workers} "
                           f"worker process{'es' if workers > 1 else ''} ({runner.reason})", err=True)
        self.progress = SweepProgress(self.show, tuple(self.labels), self.cfg.resolved("rounds"),
                                      log=not self.quiet and not sys.stderr.isatty())

    def on_start(self, i: int, name: str) -> None:
        from mucsc.fedsim import report

        self.writers[i] = report.RunWriter(self.run_dir(self.specs[i]), name, self.specs[i].cfg)
        self.progress.start_run(i)

    def on_round(self, i: int, rec) -> None:
        self.writers[i].add(rec)
        self.progress.round(i, rec)

    def on_done(self, i: int, res) -> None:
        self.progress.end_run(i)
        self.writers.pop(i).close(res)
        self.done[i] = res

    def run(self, runner) -> str | None:
        """Run every spec on ``runner`` (closed after); the failure to report, if any."""
        from mucsc.fedsim import simulation

        failure, failed = None, None
        try:
            runner.sweep_runs(self.specs, on_start=self.on_start, on_round=self.on_round, on_done=self.on_done)
        except simulation.RunFailed as exc:
            if not isinstance(exc.cause, (MucscError, ValueError, RuntimeError, ArithmeticError, KeyboardInterrupt)):
                raise exc.cause from None
            what = "was interrupted" if isinstance(exc.cause, KeyboardInterrupt) else "failed"
            failure, failed = f"run {self.labels[exc.index]!r} {what} after {exc.rounds} rounds: {exc}", exc.index
        except KeyboardInterrupt:
            failure = "interrupted"
        finally:
            runner.close()
        for i, w in self.writers.items():  # runs stopped by a failure keep their rows
            w.close(None, error=failure if i == failed else f"stopped: {failure}")
        self.progress.close()
        return failure

    def report(self, machine: dict[str, object]) -> str:
        """The tables (per seed, and across seeds), also written to the results folder."""
        from mucsc.fedsim import report

        tables, all_rows = [], []
        for k, (c, s) in enumerate(zip(self.cfgs, self.seeds)):
            results = [self.done[i] for i in sorted(self.done) if self.specs[i].key == k]
            rows = [report.summarize(res, c) for res in results]
            report.add_relative(rows)
            table = report.format_table(rows, c) if rows else "(no run completed)"
            tables.append((f"seed {s}\n" if self.many else "") + table)
            all_rows.append(rows)
            where = self.run_dir(self.specs[k * len(self.cfg.codecs)])
            report.write_summary(where, rows, c, table, machine, self.data_infos[k])
            if results:
                report.plot(where, results, c)
        text = "\n\n".join(tables)
        if self.many:
            text += "\n\n" + across_seeds(self.cfg.codecs, self.seeds, all_rows)
            (self.out / "summary.txt").write_text(text + "\n")
        return text


def across_seeds(codecs: tuple[str, ...], seeds: tuple[int, ...], rows_by_seed: list[list]) -> str:
    """Per codec over the seeds: rounds run (R, > when the target was missed), final accuracy mean
    and standard deviation, traffic mean."""
    import statistics

    lines = [f"across seeds {', '.join(map(str, seeds))}:",
             f"{'codec':<10} {'R per seed':<24} {'acc mean':>8} {'acc sd':>7} {'traffic MiB mean':>16}"]
    for name in codecs:
        rows = [r for rows in rows_by_seed for r in rows if r.codec == name]
        if not rows:
            continue
        accs = [r.final_acc for r in rows]
        rr = ",".join(f"{r.rounds}" if r.reached else f">{r.rounds}" for r in rows)
        sd = statistics.stdev(accs) if len(accs) > 1 else 0.0
        lines.append(f"{name:<10} {rr:<24} {statistics.fmean(accs):>8.3f} {sd:>7.3f} "
                     f"{statistics.fmean(r.traffic_MB for r in rows):>16.3f}")
    return "\n".join(lines)
