"""Local training and evaluation: the one SGD loop and the one test loop of both simulator engines.

:func:`sgd` is a client's E plain SGD steps (eq. 3) and :func:`evaluate` the global model's test
accuracy and loss; :class:`LocalTrainer` holds a model and the data on one device and runs them for
the built-in engine (in this process or in a worker, module ``parallel``), and the Flower engine's
ClientApp and ServerApp call the same two functions (module ``engines.flower``), so both engines do
the same floating-point arithmetic for the same task.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from mucsc.fedsim.datasets import Dataset
from mucsc.fedsim.models import build_model

EVAL_BATCH = 1024  # test samples per forward pass of :func:`evaluate`


@dataclasses.dataclass(frozen=True)
class ClientTask:
    """What a client is told for one round's local work (besides the global model it receives)."""

    round: int                  # 0-based global round
    slot: int                   # position among the round's participants (keys its batch stream)
    client: int
    batches: np.ndarray         # (E, B) indices into the client's own samples
    lrs: tuple[float, ...]      # eta_t for each of its E steps


def sgd(model: torch.nn.Module, params: list[torch.Tensor], x: torch.Tensor, y: torch.Tensor,
        batches: np.ndarray, lrs: Any, rows: torch.Tensor | None = None) -> None:
    """E plain SGD steps w <- w - eta_t grad F_i(w, B_t) (eq. 3), in place on ``params``: step t uses
    the samples ``batches[t]`` of (x, y), through ``rows`` (a client's sample indices into x) when given."""
    for idx, lr in zip(batches, lrs):
        bi = torch.from_numpy(np.asarray(idx)).to(x.device)
        if rows is not None:
            bi = rows[bi]
        loss = F.cross_entropy(model(x[bi]), y[bi])
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for p, g in zip(params, grads):
                p.sub_(g, alpha=lr)


def evaluate(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """Test accuracy and mean cross-entropy of ``model`` on (x, y), in batches of :data:`EVAL_BATCH`."""
    model.eval()
    correct, loss_sum, n = 0, 0.0, len(y)
    with torch.no_grad():
        for i in range(0, n, EVAL_BATCH):
            out = model(x[i:i + EVAL_BATCH])
            loss_sum += float(F.cross_entropy(out, y[i:i + EVAL_BATCH], reduction="sum"))
            correct += int((out.argmax(1) == y[i:i + EVAL_BATCH]).sum())
    model.train()
    return correct / n, loss_sum / n


class LocalTrainer:
    """The model and the training/test data on one device: local SGD for any client, and evaluation.

    It keeps no state between calls (every call loads the weights it is given), so the in-process
    path and every worker process compute the same floats for the same task.  ``resident`` (default:
    on a GPU) keeps each update a tensor on the device, where the codec's torch backend encodes it,
    as a GPU client would; otherwise updates leave the device as host float32 arrays (a worker
    process's updates always do: they cross to the main process by pickling).
    """

    def __init__(self, model_name: str, data: Dataset, parts: tuple[np.ndarray, ...], seed: int,
                 device: str = "cpu", threads: int = 1, resident: bool | None = None) -> None:
        torch.set_num_threads(threads)
        self.device = torch.device(device)
        self.resident = self.device.type != "cpu" if resident is None else resident
        self.model = build_model(model_name, data.input_shape, data.num_classes, seed).to(self.device)
        self.names = [n for n, _ in self.model.named_parameters()]
        self.params = [p for _, p in self.model.named_parameters()]
        dev = self.device
        self.x_train, self.y_train, self.x_test, self.y_test = (
            canonical(a).to(dev) for a in (data.x_train, data.y_train, data.x_test, data.y_test))
        self.parts = [torch.from_numpy(np.asarray(p, dtype=np.int64)).to(dev) for p in parts]

    def _load(self, weights: list[np.ndarray]) -> list[torch.Tensor]:
        ws = [torch.from_numpy(w).to(self.device) for w in weights]
        with torch.no_grad():
            for p, w in zip(self.params, ws):
                p.copy_(w)
        return ws

    def train(self, weights: list[np.ndarray], task: ClientTask) -> tuple[dict[str, Any], float]:
        """:func:`sgd` from ``weights`` on the task's batches -> (U_i = w - w_i per parameter (eq. 5):
        float32 tensors on the device when ``resident``, else host arrays; wall seconds)."""
        t0 = time.perf_counter()
        start = self._load(weights)
        sgd(self.model, self.params, self.x_train, self.y_train, task.batches, task.lrs, self.parts[task.client])
        if self.resident:
            update = {n: w - p.detach() for n, w, p in zip(self.names, start, self.params)}
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)  # the training time includes the device's work
        else:  # .cpu() waits for the device
            update = {n: (w - p.detach()).cpu().numpy() for n, w, p in zip(self.names, start, self.params)}
        return update, time.perf_counter() - t0

    def evaluate(self, weights: list[np.ndarray]) -> tuple[float, float]:
        """:func:`evaluate` of ``weights`` on the test set."""
        self._load(weights)
        return evaluate(self.model, self.x_test, self.y_test)


def canonical(a: np.ndarray) -> torch.Tensor:
    """A tensor over ``a``'s values with row-major strides for every dimension, size-1 ones included.

    numpy calls (n, 1, 8, 8) arrays with a size-1 axis stride of 4 bytes "C-contiguous", but torch
    reads such strides as channels-last and picks another convolution algorithm, whose float sums
    differ in the last bits; without this, a worker (whose data arrive with plain strides) and the
    main process would train differently."""
    a = np.ascontiguousarray(a)
    return torch.from_numpy(a.reshape(-1)).view(a.shape)
