"""``mucsc sim --engine flower``: the simulator's experiment as a Flower app run with ``flwr run``.

Each run is one ``flwr run`` of the app in :mod:`mucsc.fedsim.engines.flower_app` on a local
simulation federation of ``--clients`` supernodes (Flower's Simulation Runtime, Ray backend): this
module writes the run's job directory (settings and data), starts a private SuperLink for it
(``flower-superlink --simulation``, a free local port, a temporary ``FLWR_HOME``), submits the app
with ``flwr run --stream``, follows the rounds the ServerApp writes back, and stops the SuperLink.
Flower 1.42 deprecates its in-process launcher (``flwr.simulation.run_simulation``) in favour of
``flwr run``, which is what this uses; ``flwr``'s log goes to the ``mucsc.fedsim.flower`` logger
(DEBUG) and, when a run fails, into the error.

Each ClientApp runs in a Ray actor with ``num_cpus`` 1; with ``RAY_ADDRESS`` set (after
``ray start --head`` on a cluster) the actors run on that cluster instead of a local one.

Where it differs from the built-in engine (docs/integrations.md): the server aggregates client
*models* (FedAvg over ``global + update``) instead of updates, so the float rounding differs; and the
downlink reaches only the round's participants, as a compressed update when the node holds the
previous model version and as the full model otherwise (the built-in engine counts one compressed
update per recipient, assuming every client stays in sync).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import mucsc
from mucsc.fedsim.engines.flower_app import JOB_KEY, FlowerRoundRecord, _spec, write_job
from mucsc.fedsim.simulation import RunFailed, RunResult

log = logging.getLogger("mucsc.fedsim.flower")

_STARTUP_S = 120.0   # a loaded machine takes a while to start a SuperLink
_START_ATTEMPTS = 3  # fresh ports for a SuperLink that exits at start (a port taken meanwhile)


class FlowerEngine:
    """:class:`mucsc.fedsim.engines.Engine` on Flower: one run after the other, Ray's actors train."""

    name = "flower"
    workers, reason, concurrent = 1, "--engine flower", 1

    def __init__(self, device: str = "cpu") -> None:
        self.device = device

    def sweep_runs(self, specs: Any, **callbacks: Any) -> list[Any]:
        return sweep_runs(specs, self.device, **callbacks)

    def close(self) -> None:
        pass


def sweep_runs(specs: Any, device: str = "cpu", *,
               on_start: Callable[[int, str], None] | None = None,
               on_round: Callable[[int, Any], None] | None = None,
               on_done: Callable[[int, Any], None] | None = None) -> list[Any]:
    """The built-in engine's ``sweep_runs`` (same run specs, callbacks and ``RunFailed``) on Flower,
    one run after the other: each run is a Flower simulation of its own."""
    results = []
    for i, spec in enumerate(specs):
        if on_start is not None:
            on_start(i, spec.codec)
        done: list[Any] = []

        def each(rec: Any, i: int = i) -> None:
            done.append(rec)
            if on_round is not None:
                on_round(i, rec)
        try:
            res = run(spec.cfg, spec.codec, spec.setup, each, device=device)
        except (Exception, KeyboardInterrupt) as exc:
            raise RunFailed(spec.codec, len(done), exc) from exc
        if on_done is not None:
            on_done(i, res)
        results.append(res)
    return results


def run(cfg: Any, codec: str, setup: Any, on_round: Callable[[Any], None] | None = None,
        device: str = "cpu") -> Any:
    """One FedAvg run of preset ``codec`` as a ``flwr run`` of :mod:`~mucsc.fedsim.engines.flower_app`;
    the built-in engine's result (:class:`mucsc.fedsim.simulation.RunResult`).  ``device="cuda"``:
    clients train on the GPU, sharing it (fractional ``num_gpus`` per ClientApp)."""
    if cfg.sampling != "uniform":
        raise mucsc.InputError("--engine flower needs --sampling uniform: weighted sampling repeats a client "
                               "within a round, and a Flower round sends one message per supernode")
    ups, down = cfg.links(codec, cfg.clients, list(setup.groups))
    for link in {*ups, down}:
        _spec(link).compressor()  # every codec checked before Flower starts
    flwr, superlink = _commands()
    records: list[Any] = []
    # short: Ray's socket paths under the simulation's temp dir must stay < 108 bytes
    job = Path(tempfile.mkdtemp(prefix="mucsc-flwr-"))
    try:
        write_job(job, cfg, codec, setup, device)
        app = _write_app(job)
        env = _environment(job)
        with _SuperLink(superlink, job, env) as link:
            _flwr_run(flwr, app, job, env, link.address, _federation(cfg, device), records, on_round)
        result = _read_result(job)
        final = {}
        if (job / "final.npz").exists():
            with np.load(job / "final.npz", allow_pickle=False) as z:
                final = {k: z[k] for k in z.files}
    finally:
        shutil.rmtree(job, ignore_errors=True)
    labels = sorted({u.label() for u in ups})
    return RunResult(codec, labels, down.label(), setup.d, records, result["reached"], final)


def _commands() -> tuple[str, str]:
    """``flwr`` and ``flower-superlink`` from this Python's environment (or PATH)."""
    here = str(Path(sys.executable).parent)
    found = [shutil.which(c, path=here) or shutil.which(c) for c in ("flwr", "flower-superlink")]
    if None in found:
        raise mucsc.InputError("--engine flower needs Flower's commands (flwr, flower-superlink) beside this "
                               "Python or on PATH: pip install 'mucsc[flower]'")
    return found[0], found[1]


def _write_app(job: Path) -> Path:
    """A minimal Flower app directory whose components are this package's flower_app module."""
    app = job / "app"
    app.mkdir()
    (app / "pyproject.toml").write_text(f"""\
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "mucsc-sim"
version = "1.0.0"
description = "mucsc sim --engine flower: one FedAvg run of the simulator on Flower"
license = {{ text = "MIT" }}
dependencies = []

[tool.flwr.app]
publisher = "mucsc"

[tool.flwr.app.components]
serverapp = "mucsc.fedsim.engines.flower_app:server"
clientapp = "mucsc.fedsim.engines.flower_app:client"

[tool.flwr.app.config]
{JOB_KEY} = {json.dumps(str(job))}
""", encoding="utf-8")
    return app


def _environment(job: Path) -> dict[str, str]:
    """Flower's processes import this very mucsc, keep their state under ``job``, stay quiet and offline,
    and find Flower's own commands: the SuperLink starts ``flower-superexec`` through ``PATH``, so this
    Python's ``bin`` folder goes first (a venv's ``mucsc`` started by its path, without activation)."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), *filter(None, [env.get("PATH")])])
    root = str(Path(mucsc.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    env["FLWR_HOME"] = str(job / "flwr")
    env.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    env.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")  # Ray's FutureWarning about num_gpus=0
    env["FLWR_DISABLE_UPDATE_CHECK"] = "1"
    return env


def _federation(cfg: Any, device: str) -> str:
    """``--federation-config``: N supernodes, one CPU per ClientApp, a share of the GPU with cuda."""
    cpus = max(1, min(cfg.clients, os.cpu_count() or 1))
    items = [f"num_supernodes={cfg.clients}", "client_resources_num_cpus=1"]
    if device == "cuda":  # every concurrent ClientApp gets a share of one GPU
        items.append(f"client_resources_num_gpus={1.0 / cpus!r}")
    if not os.environ.get("RAY_ADDRESS"):
        items.append(f"init_args_num_cpus={cpus}")
    return " ".join(items)


def _free_port() -> int:
    """A local port that was free a moment ago (the SuperLink's start retries if it is taken meanwhile)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _SuperLink:
    """A SuperLink of our own in simulation mode on free local ports, stopped (with its process
    group) on exit; its connection is the only one in the job's ``FLWR_HOME``."""

    def __init__(self, command: str, job: Path, env: dict[str, str]) -> None:
        self.command, self.job, self.env = command, job, env
        self.address = ""
        self.proc: subprocess.Popen | None = None

    def _args(self, port: int) -> list[str]:
        # flwr >= 1.42 serves its three APIs over HTTP on --host/--port (--control-api-address and
        # --fleet-api-address are deprecated there and ignored)
        return [self.command, "--insecure", "--simulation", "--isolation", "subprocess",
                "--disable-runtime-dependency-installation", "--host", "127.0.0.1", "--port", str(port),
                "--log-file", str(self.job / "superlink.log")]

    def __enter__(self) -> _SuperLink:
        # A free port can be taken by another process between our probe and the SuperLink's bind
        # (seen with two test runs side by side): a SuperLink that exits at start gets a new port.
        for _ in range(_START_ATTEMPTS):
            if self._start(_free_port()):
                return self
        raise RuntimeError(f"Flower's SuperLink did not start ({_START_ATTEMPTS} ports tried): {self._cause()}")

    def _start(self, port: int) -> bool:
        """Start on ``port``; True once healthy, False if it exited at start; an error past the deadline."""
        self.address = f"127.0.0.1:{port}"
        home = Path(self.env["FLWR_HOME"])
        home.mkdir(parents=True, exist_ok=True)
        (home / "config.toml").write_text(
            f'[superlink]\ndefault = "mucsc"\n\n[superlink.mucsc]\naddress = "{self.address}"\ninsecure = true\n',
            encoding="utf-8")
        with open(self.job / "superlink.err", "ab") as err:  # tracebacks go here, not to --log-file
            self.proc = subprocess.Popen(self._args(port), env=self.env, stdout=subprocess.DEVNULL,
                                         stderr=err, start_new_session=True)
        deadline = time.monotonic() + _STARTUP_S
        while not _healthy(self.address):
            if self.proc.poll() is not None:
                return False
            if time.monotonic() > deadline:
                self.__exit__()
                raise RuntimeError(f"Flower's SuperLink did not start in {_STARTUP_S:.0f} s: {self._cause()}")
            time.sleep(0.2)
        return True

    def _cause(self) -> str:
        """The lines of the SuperLink's output that name why it stopped, else the tail of its log."""
        return _error_lines(self.job / "superlink.err") or _tail(self.job / "superlink.log")

    def __exit__(self, *exc: Any) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)  # its own session: the SuperLink and what it started
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def _healthy(address: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{address}/health", timeout=2) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _flwr_run(flwr: str, app: Path, job: Path, env: dict[str, str], address: str, federation: str,
              records: list[Any], on_round: Callable[[Any], None] | None) -> None:
    """``flwr run APP --stream``; the rounds the ServerApp appends to ``rounds.jsonl`` reach
    ``records`` and ``on_round`` as they come.  flwr's output goes to the log (DEBUG)."""
    out = job / "flwr.log"
    with open(out, "wb") as sink:
        proc = subprocess.Popen([flwr, "run", str(app), "--stream", "--federation-config", federation],
                                cwd=job, env=env, stdout=sink, stderr=subprocess.STDOUT)
        try:
            seen = 0
            while True:
                done = proc.poll() is not None
                seen = _follow(job / "rounds.jsonl", seen, records, on_round)
                if done:
                    break
                time.sleep(0.2)
        finally:
            if proc.poll() is None:
                proc.terminate()
                proc.wait()
    text = out.read_text(encoding="utf-8", errors="replace")
    for line in text.splitlines():
        log.debug("flwr: %s", line)
    if proc.returncode != 0:
        raise RuntimeError(f"flwr run exited with {proc.returncode}: {_tail(out)}")


def _follow(path: Path, seen: int, records: list[Any], on_round: Callable[[Any], None] | None) -> int:
    """Read the complete lines of ``path`` after byte ``seen``; the new offset."""
    if not path.exists():
        return seen
    with open(path, "rb") as f:
        f.seek(seen)
        chunk = f.read()
    end = chunk.rfind(b"\n") + 1
    for line in chunk[:end].splitlines():
        rec = FlowerRoundRecord.from_json(json.loads(line))
        records.append(rec)
        if on_round is not None:
            on_round(rec)
    return seen + end


def _read_result(job: Path) -> dict[str, Any]:
    """The ServerApp's ``result.json``: raise what it raised (a mucsc error as itself)."""
    path = job / "result.json"
    if not path.exists():
        raise RuntimeError(f"Flower run ended without a result: {_tail(job / 'flwr.log')}")
    result = json.loads(path.read_text(encoding="utf-8"))
    err = result["error"]
    if err is not None:
        kind = getattr(mucsc, err["type"], None)
        log.debug("ServerApp failed:\n%s", err["traceback"])
        if isinstance(kind, type) and issubclass(kind, mucsc.MucscError):
            raise kind(err["message"])
        raise RuntimeError(f"Flower run failed: {err['type']}: {err['message']}")
    return result


_CAUSE = re.compile(r"^\S*(Error|Exception)\b|\bERROR\b|\bfailed\b")


def _error_lines(path: Path, lines: int = 5) -> str:
    """The last distinct lines of ``path`` that name an error (an exception's last line, an ERROR log
    line), without the traceback frames around them; "" when there is none."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    found = list(dict.fromkeys(line.strip() for line in text if _CAUSE.search(line.strip())))
    return "\n".join(found[-lines:])


def _tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(text[-lines:]) or "(empty log)"
