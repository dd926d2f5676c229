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
from pathlib import Path

import click

from mucsc.errors import InputError, MucscError
from mucsc.progress import SweepProgress


def _csv(kind):
    def convert(ctx, param, value):
        if value is None:
            return None
        try:
            items = tuple(kind(v.strip()) for v in value.split(",") if v.strip())
        except ValueError:
            raise click.BadParameter(f"expected a comma-separated list, got {value!r}") from None
        if not items:
            raise click.BadParameter("the list is empty")
        return items
    return convert


def _workers(ctx, param, value):
    """``--workers``: a count >= 1 or ``auto``."""
    if value is None or value == "auto":
        return value
    try:
        n = int(value)
    except ValueError:
        raise click.BadParameter(f"expected a number >= 1 or 'auto', got {value!r}") from None
    if n < 1:
        raise click.BadParameter("must be >= 1 (or 'auto')")
    return n


def data_summary(cfg, setup) -> dict[str, object]:
    """The data actually loaded and how it is used: samples, classes, writers, clients, model, d."""
    info = setup.data.describe()
    sizes = setup.sizes
    info.update({"clients": cfg.clients, "client_samples_min": int(sizes.min()),
                 "client_samples_max": int(sizes.max()), "model": setup.model_name, "d": setup.d})
    schedule, lr0, decay, lr_min = cfg.lr_settings()
    info["lr"] = (f"constant {lr0:g}" if schedule == "constant"
                  else f"{schedule}: max({lr0:g} / (1 + t/{decay:g}), {lr_min:g})")
    return info


def data_line(info: dict[str, object]) -> str:
    """One line for the log: what was loaded and the settings that shape training."""
    writers = f", {info['writers']} writers" if "writers" in info else ""
    return (f"{info['dataset']}: {info['train_samples']} train / {info['test_samples']} test samples, "
            f"{info['classes']} classes{writers}, input {'x'.join(map(str, info['input_shape']))} "
            f"({info['normalize']}); {info['clients']} clients with {info['client_samples_min']}.."
            f"{info['client_samples_max']} samples; model {info['model']} d = {info['d']}; lr {info['lr']}")


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


@click.command("sim", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--config", "config_file", type=click.Path(exists=True, dir_okay=False),
              help="TOML file of settings (flags override it).")
@click.option("--dataset", type=click.Choice(["digits", "synthetic", "cifar10", "femnist", "mnist"]),
              help="Data set [digits: built in, offline].")
@click.option("--data-dir", type=click.Path(file_okay=False), help="Where cifar10/femnist/mnist live.")
@click.option("--download/--no-download", default=None, help="CIFAR-10 only: fetch the archive if missing.")
@click.option("--model", type=click.Choice(["allcnn", "lenet", "cnn", "logreg"]), help="Model [per data set].")
@click.option("--partition", type=click.Choice(["iid", "noniid", "dirichlet", "natural"]),
              help="Client split [per data set].")
@click.option("-N", "--clients", type=int, help="Clients N [100].")
@click.option("-K", "--per-round", type=int, help="Clients per round K [10].")
@click.option("--sampling", type=click.Choice(["uniform", "weighted"]),
              help="uniform without replacement, or by data size with replacement (Assumption 4).")
@click.option("-E", "--local-iters", type=int, help="Local SGD iterations per round E [5].")
@click.option("-B", "--batch-size", type=int, help="Batch size B [8].")
@click.option("--lr-schedule", type=click.Choice(["paper", "inverse", "constant"]),
              help="Learning rate: paper = max(0.5 / (1 + t/400), 0.01); inverse = max(lr0 / (1 + t/lr-decay), "
              "lr-min); constant = lr0 [per data set: paper for digits/synthetic, inverse 0.1/400/0.01 for "
              "femnist/mnist, 0.05/400/0.005 for cifar10].")
@click.option("--lr0", type=float, help="Initial learning rate [per schedule / data set].")
@click.option("--lr-decay", type=float, help="Iterations to halve the inverse schedule [400].")
@click.option("--lr-min", type=float, help="Floor of the inverse schedule [per data set].")
@click.option("--normalize", type=click.Choice(["auto", "off"]),
              help="Input normalisation: auto = the data set's (femnist: inverted grey levels, "
              "standardised; mnist, cifar10: standardised; digits, synthetic: as is); off = raw [auto].")
@click.option("--rounds", type=int, help="Round limit [per data set].")
@click.option("--target", type=float, help="Stop at this test accuracy; 0 = never [per data set].")
@click.option("--eval-every", type=int, help="Evaluate every this many rounds [per data set].")
@click.option("--samples-per-client", type=int, help="iid partition: samples per client [500].")
@click.option("--noniid-min", type=int, help="non-iid partition: min samples [300].")
@click.option("--noniid-max", type=int, help="non-iid partition: max samples [500].")
@click.option("--classes-per-client", type=int, help="non-iid partition: classes per client [5].")
@click.option("--dirichlet-alpha", type=float, help="dirichlet partition: alpha [0.5].")
@click.option("--synthetic-alpha", type=float, help="Synthetic(alpha, beta) [1].")
@click.option("--synthetic-beta", type=float, help="Synthetic(alpha, beta) [1].")
@click.option("--codecs", callback=_csv(str), help="Comma-separated codecs to sweep "
              "[none,mucsc,bmucsc,qsgd,signsgd,stc,dgc].")
@click.option("--z-up", callback=_csv(int), help="MUCSC uplink Z per client group [4,8,16].")
@click.option("--z-down", type=int, help="MUCSC downlink Z [16].")
@click.option("-p", "--param", "params", multiple=True, metavar="CODEC[.up|.down].KEY=VALUE",
              help="A codec parameter, e.g. -p stc.keep=0.01 (repeatable).")
@click.option("--down-codec", help="Downlink codec for every run (e.g. none) [per codec, paper].")
@click.option("--error-feedback", type=click.Choice(["auto", "on", "off"]),
              help="Residual accumulation [auto: biased codecs].")
@click.option("--compress", type=click.Choice(["auto", "off"]),
              help="Container zstd of compressible sections; off = fixed-width, the paper's counts [auto].")
@click.option("--downlink", type=click.Choice(["all", "participants"]),
              help="Count the downlink to all N clients (paper) or next round's participants [all].")
@click.option("--up-mbps", type=float, help="Mean uplink speed, Mb/s [1.4].")
@click.option("--down-mbps", type=float, help="Mean downlink speed, Mb/s [1.4].")
@click.option("--speed-sd", type=float, help="Speed standard deviation / mean [0.1].")
@click.option("--auth", type=click.Choice(["off", "blake2b", "ed25519"]),
              help="Tag every message (a key per client and for the server; the context binds run, "
              "round and direction) and verify it before decoding [off].")
@click.option("--seed", type=int, help="Seed of everything [0].")
@click.option("--seeds", callback=_csv(int), help="Several seeds, e.g. 0,1,2: every codec runs with each "
              "(independent runs, in parallel with --workers); results per seed in DIR/seed<S>/.")
@click.option("--threads", type=int, help="torch threads per process [1].")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]),
              help="Where models train and aggregate: auto = cuda when available [auto].")
@click.option("--workers", callback=_workers, metavar="N|auto",
              help="Processes training a round's clients (and independent runs) concurrently; results do "
              "not depend on it. auto: times round 1's first clients in one process, and with several "
              "workers when a client takes >= 50 ms; keeps the workers only if >= 1.4x as fast [auto; "
              "1 on cuda].")
@click.option("--engine", type=click.Choice(["builtin", "flower"]), default="builtin",
              help="builtin: this process and --workers [default]; flower: Flower's simulation engine (Ray), "
                   "every update a real Flower Message (pip install 'mucsc[flower]'; RAY_ADDRESS selects a cluster).")
@click.option("-o", "--out", type=click.Path(file_okay=False), help="Write CSV/JSON/PNG results here.")
@click.option("--save-updates", type=click.Path(file_okay=False), metavar="DIR",
              help="Save raw client updates U_i (before compression) as .safetensors with a manifest.json, "
              "one directory per run: DIR/<codec>-seed<S>/ (docs/fedsim.md). Only --save-rounds and "
              "--save-clients; refused if over 4 GiB or the free space.")
@click.option("--save-rounds", callback=_csv(int), help="Rounds whose updates --save-updates saves, e.g. 1,20 [1].")
@click.option("--save-clients", "save_slots", type=int,
              help="Participants saved per saved round: the first N selected [1].")
@click.option("-q", "--quiet", is_flag=True, help="No progress output on stderr.")
def sim(config_file, out, quiet, params, engine, **flags):
    """Simulate FedAvg with every update sent through a codec as real bytes; print the paper's table.

    With no arguments: the built-in digits experiment across none, mucsc, bmucsc, qsgd, signsgd,
    stc and dgc (a few minutes on 2 cores).
    """
    _require_sim_dependencies(flags.get("dataset"), out, engine)
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


def _require_sim_dependencies(dataset: str | None, out: str | None, engine: str = "builtin") -> None:
    """One clear line (exit 1) instead of an ImportError when the simulator's extras are missing."""
    needed = ["torch"]
    if dataset in (None, "digits"):
        needed.append("sklearn")  # the built-in digits data set ships with scikit-learn
    if out:
        needed.append("matplotlib")  # the PNG plots
    missing = [m for m in needed if importlib.util.find_spec(m) is None]
    if missing:
        raise click.ClickException(f"mucsc sim needs {', '.join(missing)}: pip install 'mucsc[sim]'")
    missing = [m for m in ("flwr", "ray") if engine == "flower" and importlib.util.find_spec(m) is None]
    if missing:
        raise click.ClickException(f"--engine flower needs {', '.join(missing)}: pip install 'mucsc[sim,flower]'")


def _run_sweep(cfg, out: Path | None, quiet: bool, engine: str = "builtin") -> None:
    import torch

    from mucsc.fedsim import parallel, report, simulation
    from mucsc.fedsim.transport import check_codec

    torch.set_num_threads(cfg.threads)
    try:  # every codec and parameter checked before any training
        for name in cfg.codecs:
            ups, down = cfg.links(name, cfg.clients, [i % len(cfg.z_up) for i in range(cfg.clients)])
            for link in {*ups, down}:
                check_codec(link)
    except MucscError as exc:
        raise click.UsageError(f"codec settings: {exc}") from None
    try:
        device = simulation.resolve_device(cfg.device)
    except InputError as exc:
        raise click.ClickException(str(exc)) from None
    seeds = cfg.seed_list()
    cfgs = [cfg.with_seed(s) for s in seeds]
    try:  # each seed draws its own split, partition and Z groups
        setups = [simulation.prepare(c) for c in cfgs]
    except (MucscError, OSError) as exc:
        raise click.ClickException(f"data: {exc}") from None
    many = len(seeds) > 1
    specs = [simulation.RunSpec(c, name, st, k) for k, (c, st) in enumerate(zip(cfgs, setups)) for name in cfg.codecs]
    if cfg.save_updates:  # bounded, and no run directory overwritten: checked before any training
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
    labels = [f"{sp.codec} (seed {sp.cfg.seed})" if many else sp.codec for sp in specs]
    try:  # --engine flower: Ray runs the clients, so no worker processes of ours
        executor, choice = (None, parallel.WorkerChoice(1, "--engine flower")) if engine == "flower" else \
            parallel.start_executor(cfg, setups, runs=len(specs))
    except (MucscError, OSError, RuntimeError) as exc:
        raise click.ClickException(f"workers: {exc}") from None
    workers = choice.workers
    concurrent = 1 if workers == 1 else min(workers, len(specs))
    tty = sys.stderr.isatty()
    show = not quiet and tty
    try:  # the pool is closed below; until then, here
        machine = machine_info()
        machine.update(device=device, workers=workers, workers_reason=choice.reason, concurrent_runs=concurrent,
                       engine=engine)
        if device == "cuda":
            machine["gpu"] = torch.cuda.get_device_name()
        data_infos = [data_summary(c, st) for c, st in zip(cfgs, setups)]
        if not quiet:  # on a terminal above the progress bar; piped, the first line of the log
            for s, info in zip(seeds, data_infos):
                click.echo((f"seed {s}: " if many else "") + data_line(info) + f"; device {device}, {workers} "
                           f"worker process{'es' if workers > 1 else ''} ({choice.reason})", err=True)
        progress = SweepProgress(show, tuple(labels), cfg.resolved("rounds"), log=not quiet and not tty)
    except BaseException:
        if executor is not None:
            executor.close()
        raise
    writers: dict[int, report.RunWriter] = {}
    done: dict[int, object] = {}
    run_dir = (lambda sp: out / f"seed{sp.cfg.seed}") if many else (lambda sp: out)

    def on_start(i: int, name: str) -> None:
        if out:
            writers[i] = report.RunWriter(run_dir(specs[i]), name, specs[i].cfg)
        progress.start_run(i)

    def on_round(i: int, rec) -> None:
        if out:
            writers[i].add(rec)
        progress.round(i, rec)

    def on_done(i: int, res) -> None:
        progress.end_run(i)
        if out:
            writers.pop(i).close(res)
        done[i] = res

    failure, failed = None, None
    try:
        if executor is None:
            from mucsc.flower.sim import sweep_runs as flower_sweep_runs

            flower_sweep_runs(specs, device, on_start=on_start, on_round=on_round, on_done=on_done)
        else:
            simulation.sweep_runs(specs, executor, on_start=on_start, on_round=on_round, on_done=on_done,
                                  concurrent=concurrent)
    except simulation.RunFailed as exc:
        if not isinstance(exc.cause, (MucscError, ValueError, RuntimeError, ArithmeticError, KeyboardInterrupt)):
            raise exc.cause from None
        what = "was interrupted" if isinstance(exc.cause, KeyboardInterrupt) else "failed"
        failure, failed = f"run {labels[exc.index]!r} {what} after {exc.rounds} rounds: {exc}", exc.index
    except KeyboardInterrupt:
        failure = "interrupted"
    finally:
        if executor is not None:
            executor.close()
    for i, w in writers.items():  # runs stopped by a failure keep their rows
        w.close(None, error=failure if i == failed else f"stopped: {failure}")
    progress.close()
    tables, all_rows = [], []
    for k, (c, st, s) in enumerate(zip(cfgs, setups, seeds)):
        results = [done[i] for i in sorted(done) if specs[i].key == k]
        rows = [report.summarize(res, c) for res in results]
        report.add_relative(rows)
        table = report.format_table(rows, c) if rows else "(no run completed)"
        tables.append((f"seed {s}\n" if many else "") + table)
        all_rows.append(rows)
        if out:
            report.write_summary(run_dir(specs[k * len(cfg.codecs)]), rows, c, table, machine, data_infos[k])
            if results:
                report.plot(run_dir(specs[k * len(cfg.codecs)]), results)
    text = "\n\n".join(tables)
    if many:
        text += "\n\n" + across_seeds(cfg.codecs, seeds, all_rows)
        if out:
            (out / "summary.txt").write_text(text + "\n")
    click.echo(text)
    if out and show:
        click.echo(f"results in {out}/", err=True)
    if failure:
        raise click.ClickException(failure + (f"; results so far are in {out}/" if out else ""))


def across_seeds(codecs: tuple[str, ...], seeds: tuple[int, ...], rows_by_seed: list[list[dict]]) -> str:
    """Per codec over the seeds: rounds run (R, > when the target was missed), final accuracy mean
    and standard deviation, traffic mean."""
    import statistics

    lines = [f"across seeds {', '.join(map(str, seeds))}:",
             f"{'codec':<10} {'R per seed':<24} {'acc mean':>8} {'acc sd':>7} {'traffic MB mean':>16}"]
    for name in codecs:
        rows = [r for rows in rows_by_seed for r in rows if r["codec"] == name]
        if not rows:
            continue
        accs = [r["final_acc"] for r in rows]
        rr = ",".join(f"{r['rounds']}" if r["reached"] else f">{r['rounds']}" for r in rows)
        sd = statistics.stdev(accs) if len(accs) > 1 else 0.0
        lines.append(f"{name:<10} {rr:<24} {statistics.fmean(accs):>8.3f} {sd:>7.3f} "
                     f"{statistics.fmean(r['traffic_MB'] for r in rows):>16.3f}")
    return "\n".join(lines)
