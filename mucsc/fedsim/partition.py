"""Split a training set among N clients: iid, the paper's non-iid, Dirichlet(alpha), natural (per writer).

Each function returns a list of N index arrays into the training set.  The paper (section VI-A) has
each client *select* its samples from the whole training set (iid: 500 uniformly; non-iid: 300 to
500 from 5 random classes); following that wording, clients draw independently, so two clients may
share a sample when the set is small (they cannot when N * size fits and ``disjoint`` is possible).
"""

from __future__ import annotations

import numpy as np

from mucsc.errors import InputError

PARTITIONS = ("iid", "noniid", "dirichlet", "natural")


def iid(n_samples: int, clients: int, size: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Each client gets ``size`` samples drawn uniformly; disjoint when clients * size <= n_samples."""
    if size < 1 or size > n_samples:
        raise InputError(f"iid partition: size per client must be in 1..{n_samples}, got {size}")
    if clients * size <= n_samples:
        perm = rng.permutation(n_samples)
        return [np.sort(perm[k * size:(k + 1) * size]) for k in range(clients)]
    return [np.sort(rng.choice(n_samples, size, replace=False)) for _ in range(clients)]


def noniid_classes(labels: np.ndarray, clients: int, rng: np.random.Generator, *, classes_per_client: int = 5,
                   min_size: int = 300, max_size: int = 500) -> list[np.ndarray]:
    """The paper's non-iid split: each client picks ``classes_per_client`` random classes and draws a
    size uniform in [min_size, max_size] from the samples of those classes (capped at what exists)."""
    classes = np.unique(labels)
    if not 1 <= classes_per_client <= len(classes):
        raise InputError(f"non-iid partition: classes per client must be in 1..{len(classes)}")
    if not 1 <= min_size <= max_size:
        raise InputError("non-iid partition: need 1 <= min size <= max size")
    by_class = {c: np.flatnonzero(labels == c) for c in classes}
    out = []
    for _ in range(clients):
        chosen = rng.choice(classes, classes_per_client, replace=False)
        pool = np.concatenate([by_class[c] for c in chosen])
        size = min(int(rng.integers(min_size, max_size + 1)), len(pool))
        out.append(np.sort(rng.choice(pool, size, replace=False)))
    return out


def dirichlet(labels: np.ndarray, clients: int, alpha: float, rng: np.random.Generator,
              min_size: int = 1) -> list[np.ndarray]:
    """Disjoint label-skew split: each class's samples are divided by proportions ~ Dir(alpha).

    Redrawn (up to 100 times) until every client has at least ``min_size`` samples.
    """
    if alpha <= 0:
        raise InputError("dirichlet partition: alpha must be > 0")
    if clients * min_size > len(labels):
        raise InputError(f"dirichlet partition: {len(labels)} samples cannot give {clients} clients "
                         f"{min_size} each")
    classes = np.unique(labels)
    for _ in range(100):
        parts: list[list[np.ndarray]] = [[] for _ in range(clients)]
        for c in classes:
            idx = rng.permutation(np.flatnonzero(labels == c))
            props = rng.dirichlet(np.full(clients, alpha))
            cuts = (np.cumsum(props)[:-1] * len(idx)).astype(np.int64)
            for k, chunk in enumerate(np.split(idx, cuts)):
                parts[k].append(chunk)
        out = [np.sort(np.concatenate(p)) for p in parts]
        if min(len(p) for p in out) >= min_size:
            return out
    raise InputError(f"dirichlet partition: could not give every client {min_size} samples; raise alpha")


def natural(writers: np.ndarray | None, clients: int) -> list[np.ndarray]:
    """One client per writer (FEMNIST, Synthetic): client k holds the samples with writer id k."""
    if writers is None:
        raise InputError("natural partition needs a data set with writers (femnist, synthetic)")
    ids = np.unique(writers)
    if clients > len(ids):
        raise InputError(f"natural partition: the data set has {len(ids)} writers, asked for {clients} clients")
    return [np.flatnonzero(writers == w) for w in ids[:clients]]


def make_partition(kind: str, labels: np.ndarray, clients: int, rng: np.random.Generator, *,
                   writers: np.ndarray | None = None, size: int = 500, min_size: int = 300,
                   max_size: int = 500, classes_per_client: int = 5, alpha: float = 0.5) -> list[np.ndarray]:
    """Dispatch on ``kind`` (one of PARTITIONS)."""
    if clients < 1:
        raise InputError("need at least one client")
    if kind == "iid":
        return iid(len(labels), clients, min(size, len(labels)), rng)
    if kind == "noniid":
        return noniid_classes(labels, clients, rng, classes_per_client=classes_per_client,
                              min_size=min_size, max_size=max_size)
    if kind == "dirichlet":
        return dirichlet(labels, clients, alpha, rng)
    if kind == "natural":
        return natural(writers, clients)
    raise InputError(f"unknown partition {kind!r}; choose from {', '.join(PARTITIONS)}")
