"""The step "what the centroid solver reads", torch form: the solver runs on the host from a summary
computed on the device (``TorchSource``, ``DeviceSummary``): the sorted data for small inputs, or the
stratified subsample and the exact tails of ``centroids._sample_sorted`` for large ones, brought over
in one copy.  torch is imported only when it runs."""

from __future__ import annotations

import threading

import numpy as np

from mucsc.codec.backends import torch_transfer
from mucsc.codec.backends.tensors import torch_module

# ---- what the centroid solver needs from the data -------------------------------------------------

class TorchSource:
    """What ``centroids.solve`` reads from a device tensor (the duck type it accepts besides arrays).

    Every answer equals the same computation on the host copy of the data, and is small: a strided
    probe, the stratified subsample, the elements beyond two thresholds (in index order; the solver
    sorts them on the host, as ``centroids._outside`` does, so signed zeros order identically).
    ``all()`` is the whole vector on the host, for small inputs and the rare paths."""

    def __init__(self, x):
        torch = torch_module()
        self.x = x
        self.size = x.numel()
        self.dtype = np.dtype({torch.float32: np.float32, torch.float64: np.float64}[x.dtype])

    def all(self) -> np.ndarray:
        return self.x.cpu().numpy()

    def bounds(self) -> tuple[float, float]:
        torch = torch_module()
        lo, hi = torch.aminmax(self.x)
        return float(lo), float(hi)

    def gather(self, idx: np.ndarray) -> np.ndarray:
        torch = torch_module()
        return self.x[torch.tensor(idx, device=self.x.device)].cpu().numpy()  # idx may be read-only: a copy

    def strided(self, step: int) -> np.ndarray:
        return self.x[::step].cpu().numpy()

    def outside(self, t_lo, t_hi) -> tuple[np.ndarray, np.ndarray]:
        return self.x[self.x < float(t_lo)].cpu().numpy(), self.x[self.x > float(t_hi)].cpu().numpy()

    def equals_levels(self, probe: np.ndarray) -> bool:
        """Whether every element is one of the sorted values ``probe`` (exact comparison)."""
        torch = torch_module()
        p = torch.from_numpy(probe).to(self.x.device)
        k = torch.clamp(torch.searchsorted(p, self.x), max=p.numel() - 1)
        return bool(torch.equal(p[k], self.x))


def solver_source(x, z: int, solver: str, host: np.ndarray | None = None) -> "DeviceSummary":
    """What ``centroids.solve`` reads of the device vector ``x`` for ``z`` levels, brought to the host
    in ONE copy: the whole vector when the solver reads all of it (small inputs, solvers other than
    the optimal one), else the optimal solver's summary -- the stratified subsample, the strided
    probe of its distinct-value check, and the K smallest and K largest values (two top-k ops, sorted:
    their ends are min x and max x, NaN first among the largest), from which the host takes the
    elements beyond the subsample's thresholds.  Anything the summary cannot answer exactly (more
    tail elements than K, a zero in a tail: see :meth:`DeviceSummary.outside`) is asked of the device
    as :class:`TorchSource` asks it.  ``host``: x's values on the host when the caller brought them
    over already (B-MUCSC's kept values come with their positions): then nothing more is copied."""
    from mucsc.codec.numerics import centroids

    torch = torch_module()
    d = x.numel()
    if host is not None:
        return DeviceSummary(x, host=host)
    if d <= centroids.FULL_SORT_MAX or solver != "optimal":
        return DeviceSummary(x, host=torch_transfer.fetch(x))
    step = max(1, d // max(4096, 2 * z))  # centroids._distinct_if_at_most's probe
    sub = centroids._subsample_index(d)
    index = _summary_index(x.device, d, step, sub)
    K = min(d, int(TAIL_ROOM * (d * (centroids.TAIL_RANK + 1) // centroids.SUBSAMPLE)) + TAIL_SLACK)
    low, high = x.topk(K, largest=False).values, x.topk(K).values
    got = torch_transfer.fetch(torch.cat((low, high, x[index])))
    return DeviceSummary(x, low=got[:K], high=got[K:2 * K], sub=(sub, got[2 * K:2 * K + sub.size]),
                         probe=(step, got[2 * K + sub.size:]))


# the top-k tails hold TAIL_ROOM times the expected tail beyond the subsample's thresholds, plus TAIL_SLACK;
# a longer tail is asked of the device (exact, a copy more).  The threshold is the subsample's 257th value,
# so the tail's share varies by ~1/sqrt(257) = 6%: 1.25x + 512 is > 7 standard deviations at d = 1.3e6.
# (A CPU top-k costs about its k: 72 ms for k = 14.5k of 1.33M elements, 20 ms for 3.8k, one thread.)
TAIL_ROOM, TAIL_SLACK = 1.25, 512
_summary_indexes: dict = {}
_cache_lock = threading.Lock()


def _summary_index(dev, d: int, step: int, sub: np.ndarray):
    """The subsample's positions followed by the probe's (0, step, 2 step, ...) as an int64 tensor on
    ``dev``, made once per (device, d, step) and kept (a handful: an FL client sends the same shapes
    every round)."""
    key = (dev, d, step)
    t = _summary_indexes.get(key)
    if t is None:
        t = torch_transfer.to_dev(np.concatenate((sub, np.arange(0, d, step, dtype=np.int64))), dev)
        with _cache_lock:  # groups encode on several threads
            if len(_summary_indexes) >= 8:
                _summary_indexes.pop(next(iter(_summary_indexes)))
            _summary_indexes[key] = t
    return t


class DeviceSummary(TorchSource):
    """:class:`TorchSource` answered from one host copy (:func:`solver_source`): ``host`` the whole
    vector, or ``low``/``high`` the K smallest (ascending) and K largest (descending) values,
    ``sub`` (positions, values) the subsample and ``probe`` (step, values) the strided probe."""

    def __init__(self, x, host=None, low=None, high=None, sub=None, probe=None):
        super().__init__(x)
        self.host, self.low, self.high, self.sub, self.probe = host, low, high, sub, probe

    def all(self) -> np.ndarray:
        return self.host if self.host is not None else super().all()

    def bounds(self) -> tuple[float, float]:
        if self.host is not None:
            return (float(self.host.min()), float(self.host.max())) if self.host.size else (0.0, 0.0)
        return float(self.low[0]), float(self.high[0])

    def gather(self, idx: np.ndarray) -> np.ndarray:
        if self.host is not None:
            return self.host[idx]
        if self.sub is not None and idx is self.sub[0]:
            return self.sub[1]
        return super().gather(idx)

    def strided(self, step: int) -> np.ndarray:
        if self.host is not None:
            return self.host[::step]
        if self.probe is not None and step == self.probe[0]:
            return self.probe[1]
        return super().strided(step)

    def equals_levels(self, probe: np.ndarray) -> bool:
        if self.host is not None:
            k = np.minimum(np.searchsorted(probe, self.host), probe.size - 1)
            return bool(np.array_equal(probe[k], self.host))
        return super().equals_levels(probe)

    def outside(self, t_lo, t_hi) -> tuple[np.ndarray, np.ndarray]:
        """The elements below ``t_lo`` and above ``t_hi`` from the K smallest and K largest: complete
        when the K-th smallest is >= t_lo (and the K-th largest <= t_hi) or K is every element.  A
        tail holding a zero comes from the device in index order (the solver's sort then places
        -0.0 and +0.0 as the host path's does)."""
        if self.host is not None:  # in index order, as the device's answer
            return self.host[self.host < t_lo], self.host[self.host > t_hi]
        if self.low is None:
            return super().outside(t_lo, t_hi)
        every = self.low.size == self.size
        low, high = self.low[self.low < t_lo], self.high[self.high > t_hi]
        complete = every or (self.low[-1] >= t_lo and self.high[-1] <= t_hi)
        if not complete or not (np.all(low != 0) and np.all(high != 0)):
            return super().outside(t_lo, t_hi)
        return low, high
