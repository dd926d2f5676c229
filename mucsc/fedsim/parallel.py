"""Worker processes that train a round's clients (and evaluate) concurrently: ``--workers N``.

Each worker holds one :class:`~mucsc.fedsim.simulation.LocalTrainer` (model + data on its device,
torch pinned to ``cfg.threads`` threads) built once; a task ships the global weights and a
:class:`~mucsc.fedsim.simulation.ClientTask` and returns the update as host arrays.  The codec,
the server and every piece of per-client state stay in the main process, so the results are those
of the in-process path for any number of workers.  The training and test arrays travel once,
through shared memory, not once per worker.

Processes come from a fork server that has imported torch but run nothing (forking a process
whose torch thread pools or CUDA context are live is unsafe); where there is none, spawn.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
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
class _SharedArrays:
    """Where a worker finds the data: one shared-memory block and (field, dtype, shape, offset)."""

    name: str
    layout: tuple[tuple[str, str, tuple[int, ...], int], ...]
    fields: dict[str, Any]            # the Dataset's other fields (name, num_classes, ...)
    parts: tuple[np.ndarray, ...]
    model_name: str
    seed: int
    device: str
    threads: int


_ARRAYS = ("x_train", "y_train", "x_test", "y_test")
_TRAINER: LocalTrainer | None = None
_SHM: shared_memory.SharedMemory | None = None


def _share(setup: Setup) -> tuple[shared_memory.SharedMemory, tuple]:
    arrays = [np.ascontiguousarray(getattr(setup.data, k)) for k in _ARRAYS]
    layout, offset = [], 0
    for k, a in zip(_ARRAYS, arrays):
        offset = -(-offset // 64) * 64  # 64-byte aligned
        layout.append((k, a.dtype.str, a.shape, offset))
        offset += a.nbytes
    shm = shared_memory.SharedMemory(create=True, size=max(offset, 1))
    for (k, dt, shape, off), a in zip(layout, arrays):
        np.ndarray(shape, dtype=dt, buffer=shm.buf, offset=off)[...] = a
    return shm, tuple(layout)


def _init_worker(spec: _SharedArrays) -> None:
    """Attach the shared data and build this worker's trainer (once per process)."""
    global _TRAINER, _SHM
    from mucsc.fedsim.datasets import Dataset

    _SHM = shared_memory.SharedMemory(name=spec.name)
    arrays = {k: np.ndarray(shape, dtype=dt, buffer=_SHM.buf, offset=off) for k, dt, shape, off in spec.layout}
    data = Dataset(x_train=arrays["x_train"], y_train=arrays["y_train"], x_test=arrays["x_test"],
                   y_test=arrays["y_test"], **spec.fields)
    _TRAINER = LocalTrainer(spec.model_name, data, spec.parts, spec.seed, spec.device, spec.threads)


def _train(weights: list[np.ndarray], task: ClientTask):
    return _TRAINER.train(weights, task)


def _evaluate(weights: list[np.ndarray]):
    return _TRAINER.evaluate(weights)


def _context() -> mp.context.BaseContext:
    if "forkserver" in mp.get_all_start_methods():
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(["torch", "mucsc.fedsim.simulation"])
        return ctx
    return mp.get_context("spawn")


class WorkerPool(Executor):
    """``workers`` processes, each with its own trainer on ``cfg.device``."""

    def __init__(self, cfg: SimConfig, setup: Setup, workers: int) -> None:
        if workers < 1:
            raise InputError("workers must be >= 1")
        self.device = resolve_device(cfg.device)
        self.workers = workers
        self._shm, layout = _share(setup)
        fields = {f.name: getattr(setup.data, f.name) for f in dataclasses.fields(setup.data)
                  if f.name not in _ARRAYS}
        spec = _SharedArrays(self._shm.name, layout, fields, setup.parts, setup.model_name, cfg.seed,
                             self.device, cfg.threads)
        try:
            self._pool = ProcessPoolExecutor(workers, mp_context=_context(), initializer=_init_worker,
                                             initargs=(spec,))
        except BaseException:
            self._release()
            raise

    def train(self, weights: list[np.ndarray], task: ClientTask) -> Future:
        return self._pool.submit(_train, weights, task)

    def evaluate(self, weights: list[np.ndarray]) -> Future:
        return self._pool.submit(_evaluate, weights)

    def close(self) -> None:
        try:
            self._pool.shutdown(wait=True, cancel_futures=True)
        finally:
            self._release()

    def _release(self) -> None:
        if self._shm is not None:
            self._shm.close()
            self._shm.unlink()
            self._shm = None


def make_executor(cfg: SimConfig, setup: Setup, workers: int | None = None) -> Executor:
    """In-process for one worker, else a :class:`WorkerPool`; ``None``: ``cfg.workers`` or the default."""
    n = workers or cfg.workers or default_workers(resolve_device(cfg.device))
    return InProcess(cfg, setup) if n == 1 else WorkerPool(cfg, setup, n)
