"""The simulated network: per-round Gaussian link speeds; a round waits for its slowest transfer.

Section VI-A: every client's speed is drawn at the start of each global iteration from a Gaussian
with mean 1.4 Mb/s and standard deviation 10 % of the mean; the time N clients need to download M
bytes is max_n M / theta_n.  Uplink and downlink speeds are drawn independently.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from mucsc.errors import InputError


@dataclasses.dataclass(frozen=True)
class NetworkConfig:
    """Link speed distribution, in megabits per second (10^6 bit/s)."""

    up_mbps: float = 1.4
    down_mbps: float = 1.4
    sd_fraction: float = 0.1     # standard deviation as a fraction of the mean
    floor_fraction: float = 0.05  # draws are clipped below at this fraction of the mean (no <= 0 speeds)

    def __post_init__(self) -> None:
        if self.up_mbps <= 0 or self.down_mbps <= 0:
            raise InputError("link speeds must be > 0 Mb/s")
        if self.sd_fraction < 0 or not 0 < self.floor_fraction <= 1:
            raise InputError("need sd fraction >= 0 and 0 < floor fraction <= 1")


def draw_speeds(rng: np.random.Generator, n: int, mean_mbps: float, cfg: NetworkConfig) -> np.ndarray:
    """n link speeds in bit/s ~ N(mean, (sd_fraction * mean)^2), clipped at floor_fraction * mean."""
    mean = mean_mbps * 1e6
    speeds = rng.normal(mean, cfg.sd_fraction * mean, n)
    return np.maximum(speeds, cfg.floor_fraction * mean)


def transfer_time(nbytes: np.ndarray, speeds_bps: np.ndarray) -> float:
    """Seconds until the slowest of parallel transfers ends (0 when there are none)."""
    nbytes = np.asarray(nbytes, dtype=np.float64)
    if nbytes.size == 0:
        return 0.0
    return float(np.max(8.0 * nbytes / speeds_bps))
