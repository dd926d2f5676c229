"""Worker processes that train a round's clients (and evaluate) concurrently: ``--workers N``.

Each worker holds one :class:`~mucsc.fedsim.simulation.LocalTrainer` per setup of the sweep (one
per seed: model + data on its device, torch pinned to ``cfg.threads`` threads), built on first use;
a task ships the global weights and a chunk of :class:`~mucsc.fedsim.simulation.ClientTask` s and
returns the updates as host arrays.  The codec, the server and every piece of per-client state stay
in the main process, so the results are those of the in-process path for any number of workers.
The training and test arrays travel once, through shared memory, not once per worker.

Processes come from a fork server that has imported torch but run nothing (forking a process
whose torch thread pools or CUDA context are live is unsafe); where there is none, spawn.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from multiprocessing import shared_memory
from typing import Any

import numpy as np

from mucsc.errors import InputError
from mucsc.fedsim.config import SimConfig
from mucsc.fedsim.simulation import ClientTask, Executor, InProcess, LocalTrainer, Setup, resolve_device


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
        self.device = resolve_device(cfg.device)
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


def make_executor(cfg: SimConfig, setups: Setup | Sequence[Setup], workers: int | None = None) -> Executor:
    """In-process for one worker, else a :class:`WorkerPool`; ``None``: ``cfg.workers`` or the default."""
    n = workers or cfg.workers or default_workers(resolve_device(cfg.device))
    return InProcess(cfg, setups) if n == 1 else WorkerPool(cfg, setups, n)
