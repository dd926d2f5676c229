"""Worker processes that train a round's clients (and evaluate) concurrently: ``--workers N``.

Each worker holds one :class:`~mucsc.fedsim.training.LocalTrainer` per setup of the sweep (one
per seed: model + data on its device, torch pinned to ``cfg.threads`` threads), built on first use;
a task ships the global weights and a chunk of :class:`~mucsc.fedsim.training.ClientTask` s and
returns the updates as host arrays.  The codec, the server and every piece of per-client state stay
in the main process, so the results are those of the in-process path for any number of workers.
The training and test arrays travel once, through shared memory, not once per worker.

Processes come from a fork server that has imported torch but run nothing (forking a process
whose torch thread pools or CUDA context are live is unsafe); where there is none, spawn.

How many workers: an explicit count wins; ``"auto"`` (the default) measures instead of assuming that
every core is free (:func:`start_executor`): workers pay for moving the model to them and every
update back, and on a shared machine their cores may be busy, so they only win when a client's
training is long (docs/fedsim.md, measured).
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import statistics
import time
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from multiprocessing import shared_memory
from typing import Any

import numpy as np

from mucsc.errors import InputError
from mucsc.fedsim.config import SimConfig
from mucsc.fedsim.models import build_model
from mucsc.fedsim.simulation import Executor, InProcess, Setup, client_task, resolve_device, select_clients
from mucsc.fedsim.training import ClientTask, LocalTrainer


def default_workers(device: str) -> int:
    """Cores this process may use on CPU; 1 on a GPU (one device, one process training on it)."""
    if device == "cuda":
        return 1
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


@dataclasses.dataclass(frozen=True)
class _SharedSetup:
    """Where a worker finds one setup's data: a shared-memory block and (field, dtype, shape, offset)."""

    name: str
    layout: tuple[tuple[str, str, tuple[int, ...], int], ...]
    fields: dict[str, Any]            # the Dataset's other fields (name, num_classes, ...)
    parts: tuple[np.ndarray, ...]
    model_name: str


@dataclasses.dataclass(frozen=True)
class _WorkerSpec:
    setups: tuple[_SharedSetup, ...]
    seed: int
    device: str
    threads: int


_ARRAYS = ("x_train", "y_train", "x_test", "y_test")
_SPEC: _WorkerSpec | None = None
_TRAINERS: dict[int, LocalTrainer] = {}
_SHMS: list[shared_memory.SharedMemory] = []


def _share(setup: Setup) -> tuple[shared_memory.SharedMemory, _SharedSetup]:
    arrays = [np.ascontiguousarray(getattr(setup.data, k)) for k in _ARRAYS]
    layout, offset = [], 0
    for k, a in zip(_ARRAYS, arrays):
        offset = -(-offset // 64) * 64  # 64-byte aligned
        layout.append((k, a.dtype.str, a.shape, offset))
        offset += a.nbytes
    shm = shared_memory.SharedMemory(create=True, size=max(offset, 1))
    for (k, dt, shape, off), a in zip(layout, arrays):
        np.ndarray(shape, dtype=dt, buffer=shm.buf, offset=off)[...] = a
    fields = {f.name: getattr(setup.data, f.name) for f in dataclasses.fields(setup.data) if f.name not in _ARRAYS}
    return shm, _SharedSetup(shm.name, tuple(layout), fields, setup.parts, setup.model_name)


def _init_worker(spec: _WorkerSpec) -> None:
    global _SPEC
    _SPEC = spec


def _trainer(key: int) -> LocalTrainer:
    """This worker's trainer for setup ``key``: attaches the shared data on first use."""
    t = _TRAINERS.get(key)
    if t is None:
        from mucsc.fedsim.datasets import Dataset

        st = _SPEC.setups[key]
        shm = shared_memory.SharedMemory(name=st.name)
        _SHMS.append(shm)
        arrays = {k: np.ndarray(shape, dtype=dt, buffer=shm.buf, offset=off) for k, dt, shape, off in st.layout}
        data = Dataset(**arrays, **st.fields)
        # resident=False: updates cross to the main process as host arrays (pickled)
        t = _TRAINERS[key] = LocalTrainer(st.model_name, data, st.parts, _SPEC.seed, _SPEC.device, _SPEC.threads,
                                          resident=False)
    return t


def _train(weights: list[np.ndarray], task: ClientTask, key: int):
    return _trainer(key).train(weights, task)


def _train_many(weights: list[np.ndarray], tasks: list[ClientTask], key: int):
    trainer = _trainer(key)
    return [trainer.train(weights, t) for t in tasks]


def _evaluate(weights: list[np.ndarray], key: int):
    return _trainer(key).evaluate(weights)


def _context() -> mp.context.BaseContext:
    if "forkserver" in mp.get_all_start_methods():
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(["torch", "mucsc.fedsim.simulation"])
        return ctx
    return mp.get_context("spawn")


class WorkerPool(Executor):
    """``workers`` processes, each with its own trainer per setup on ``cfg.device``.

    As with any multiprocessing code, a script that creates one must guard its entry point with
    ``if __name__ == "__main__":`` (the workers import the main module)."""

    def __init__(self, cfg: SimConfig, setups: Setup | Sequence[Setup], workers: int) -> None:
        if workers < 1:
            raise InputError("workers must be >= 1")
        self.device = resolve_device(cfg.device, [setups] if isinstance(setups, Setup) else list(setups))
        self.workers = workers
        self._shms: list[shared_memory.SharedMemory] = []
        try:
            shared = []
            for st in ([setups] if isinstance(setups, Setup) else setups):
                shm, info = _share(st)
                self._shms.append(shm)
                shared.append(info)
            spec = _WorkerSpec(tuple(shared), cfg.seed, self.device, cfg.threads)
            self._pool = ProcessPoolExecutor(workers, mp_context=_context(), initializer=_init_worker,
                                             initargs=(spec,))
        except BaseException:
            self._release()
            raise

    def train(self, weights: list[np.ndarray], task: ClientTask, key: int = 0) -> Future:
        return self._pool.submit(_train, weights, task, key)

    def train_all(self, weights: list[np.ndarray], tasks: list[ClientTask], key: int = 0) -> list[Future]:
        """One chunk of consecutive tasks per worker: the weights cross once per chunk, not per client."""
        n = min(self.workers, len(tasks))
        bounds = [len(tasks) * k // n for k in range(n + 1)]
        return [self._pool.submit(_train_many, weights, tasks[a:b], key) for a, b in zip(bounds, bounds[1:])]

    def evaluate(self, weights: list[np.ndarray], key: int = 0) -> Future:
        return self._pool.submit(_evaluate, weights, key)

    def close(self) -> None:
        try:
            self._pool.shutdown(wait=True, cancel_futures=True)
        finally:
            self._release()

    def _release(self) -> None:
        for shm in self._shms:
            shm.close()
            shm.unlink()
        self._shms = []


# ---- "auto": how many workers ----------------------------------------------------------------------

# A client whose local training takes less than this in one process is not worth a worker pool: the
# pool cannot win it back (measured on this project's 2-core machine, docs/fedsim.md: the digits CNN
# at 3-30 ms per client and LeNet on FEMNIST at 30-60 ms mostly lost with 2 workers, 0.45x-0.80x).
MIN_CLIENT_S = 0.05
# The trial's workers must train clients at least this much faster than one process (seconds per
# client, transfers included).  A clear margin, because the trial times training alone: in the run,
# the main process's encoding and decoding then compete with the workers for the cores (measured:
# a trial at 1.24x, FEMNIST LeNet with E = 20, gave a sweep 0.91x as fast as one process; ALL-CNN,
# whose 2 workers trained 1.49x as many clients as one process, gave 1.39x; docs/fedsim.md).
MIN_SPEEDUP = 1.4


@dataclasses.dataclass(frozen=True)
class WorkerChoice:
    """How many processes train, and why (one line for the run header and summary.json)."""

    workers: int
    reason: str


def needs_trial(candidate: int, serial_s: float) -> bool:
    """Whether a trial of ``candidate`` workers is worth starting, given one client's local training
    time in this process: only with several cores and a client long enough to pay for the transfers."""
    return candidate > 1 and serial_s >= MIN_CLIENT_S


def auto_choice(candidate: int, serial_s: float, parallel_s: float | None = None) -> WorkerChoice:
    """What ``--workers auto`` settles on from its measurements (seconds per client): ``serial_s`` in
    this process, ``parallel_s`` with ``candidate`` workers (wall time of the trial / its clients;
    None: no trial, see :func:`needs_trial`).  Pure, so that the rule is testable without timing."""
    ms = f"{serial_s * 1e3:.0f} ms"
    if candidate <= 1:
        return WorkerChoice(1, "auto: one usable core, or one client a round and one run: nothing to train "
                               "side by side")
    if parallel_s is None or not needs_trial(candidate, serial_s):
        return WorkerChoice(1, f"auto: a client trains in {ms}, under the {MIN_CLIENT_S * 1e3:.0f} ms "
                               f"that worker processes need to pay for the transfers")
    speedup = serial_s / parallel_s
    if speedup >= MIN_SPEEDUP:
        return WorkerChoice(candidate, f"auto: {candidate} workers trained clients {speedup:.2f}x as fast as one "
                                       f"process ({parallel_s * 1e3:.0f} vs {ms} per client)")
    return WorkerChoice(1, f"auto: {candidate} workers trained clients only {speedup:.2f}x as fast as one process "
                           f"({parallel_s * 1e3:.0f} vs {ms} per client; {MIN_SPEEDUP}x needed): cores busy")


def probe_tasks(cfg: SimConfig, setup: Setup, n: int) -> tuple[list[np.ndarray], list[ClientTask]]:
    """The initial global weights and ``n`` tasks of round 1's participants (cycled, on distinct
    slots): real work of the run's size for timing it.  The trainers keep no state, so the probe
    changes no result."""
    model = build_model(setup.model_name, setup.data.input_shape, setup.data.num_classes, cfg.seed)
    weights = [p.detach().numpy().copy() for p in model.parameters()]
    selected = select_clients(cfg, 0, setup.sizes / setup.sizes.sum()).tolist()
    return weights, [client_task(cfg, setup, 0, s, selected[s % len(selected)]) for s in range(n)]


def time_serial(trainer: LocalTrainer, weights: list[np.ndarray], tasks: list[ClientTask],
                budget_s: float = 1.0) -> float:
    """Median seconds of one client's training in this process: a warm-up call (first-call costs),
    then up to ``len(tasks) - 1`` timed calls while they fit in ``budget_s``."""
    trainer.train(weights, tasks[0])
    times: list[float] = []
    for task in tasks[1:]:
        times.append(trainer.train(weights, task)[1])
        if sum(times) >= budget_s:
            break
    return statistics.median(times)


def time_parallel(pool: WorkerPool, weights: list[np.ndarray], tasks: list[ClientTask], batches: int = 2) -> float:
    """Wall seconds per client of ``pool`` training one client per worker, transfers included: the
    slowest of ``batches`` batches, after a warm-up batch (each trainer built, its first call made).
    The slowest, because a shared machine's second core was often free for a first burst and busy
    for the next (docs/fedsim.md): the rule keeps workers only for a gain that lasts."""
    w = pool.workers
    walls = []
    for b in range(batches + 1):
        t0 = time.perf_counter()
        for f in pool.train_all(weights, tasks[b * w:(b + 1) * w]):
            f.result()
        walls.append(time.perf_counter() - t0)
    return max(walls[1:]) / w


def start_executor(cfg: SimConfig, setups: Setup | Sequence[Setup], workers: int | str | None = None,
                   runs: int = 1) -> tuple[Executor, WorkerChoice]:
    """The executor for a sweep of ``runs`` runs and why it has its worker count.

    ``workers`` (else ``cfg.workers``) as a number is used as given.  ``"auto"``: 1 on cuda or with
    one core; else round 1's first clients are trained in this process and timed, and only when one
    takes at least MIN_CLIENT_S (50 ms) are min(cores, K x runs) workers started and timed on the
    same clients, kept if they train at least MIN_SPEEDUP (1.4) times as fast, else closed (this
    process then trains).  The count changes no result, only the wall time.
    """
    n = cfg.workers if workers is None else workers
    if n is None or n == "auto":
        return _auto(cfg, [setups] if isinstance(setups, Setup) else list(setups), runs)
    if not isinstance(n, int) or n < 1:
        raise InputError(f"workers must be 'auto' or an integer >= 1, got {n!r}")
    choice = WorkerChoice(n, f"--workers {n}")
    return (InProcess(cfg, setups) if n == 1 else WorkerPool(cfg, setups, n)), choice


def _auto(cfg: SimConfig, setups: list[Setup], runs: int) -> tuple[Executor, WorkerChoice]:
    local = InProcess(cfg, setups)
    if local.device == "cuda":
        return local, WorkerChoice(1, "auto: cuda, one process trains on the device")
    candidate = min(default_workers(local.device), cfg.per_round * max(runs, 1))
    if candidate <= 1:
        return local, auto_choice(candidate, 0.0)
    weights, tasks = probe_tasks(cfg, setups[0], max(4, 3 * candidate))
    serial_s = time_serial(local.trainer(0), weights, tasks[:4])
    if not needs_trial(candidate, serial_s):
        return local, auto_choice(candidate, serial_s)
    pool = WorkerPool(cfg, setups, candidate)
    try:
        choice = auto_choice(candidate, serial_s, time_parallel(pool, weights, tasks))
    except BaseException:
        pool.close()
        raise
    if choice.workers == 1:
        pool.close()
        return local, choice
    local.close()
    return pool, choice


def make_executor(cfg: SimConfig, setups: Setup | Sequence[Setup], workers: int | str | None = None) -> Executor:
    """In-process for one worker, else a :class:`WorkerPool`; ``None``: ``cfg.workers`` ("auto": see
    :func:`start_executor`)."""
    return start_executor(cfg, setups, workers)[0]
