"""Saving the real FL updates a simulation produces (``mucsc sim --save-updates DIR``), and reading them.

Each saved update is one client's U_i = w - w_i (eq. 5) exactly as its local training returned it,
before any compression or error feedback: float32, one tensor per model parameter (the names of
``model.named_parameters()``), in a ``.safetensors`` file that ``mucsc compress``, the safetensors
library or :func:`mucsc.tensorfiles.load` read.  Layout (docs/fedsim.md "Saving updates")::

    DIR/<codec>-seed<S>/manifest.json
    DIR/<codec>-seed<S>/round0001-slot0-client0007.safetensors

one directory per run (a sweep's codec preset and seed: after round 1 every run trains a different
model), and ``manifest.json`` listing what was saved (format, data set, model, d, the run's codec
and seed, and per file its round, slot, client, learning rate and the client's sample count).  The
manifest is rewritten atomically after every file, so an interrupted run leaves a valid one.

Bounded by design: only the rounds of ``save_rounds`` and the first ``save_slots`` participants of
each (slot order = selection order), and :func:`check_budget` refuses, before any training, a
sweep whose files would exceed :data:`MAX_BYTES` or the free space of DIR.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mucsc import tensorfiles
from mucsc.errors import InputError
from mucsc.fedsim.config import folder_name

FORMAT = "mucsc-sim-updates/1"
MANIFEST = "manifest.json"
MAX_BYTES = 4 << 30  # a sweep may save at most this much (4 GiB)


def run_dir(root: str | os.PathLike, codec: str, seed: int) -> Path:
    """Where one run's updates go: ``root/<codec>-seed<seed>``, the codec spec as a shell-safe
    :func:`~mucsc.fedsim.config.folder_name` (the spec itself is in the manifest)."""
    return Path(root) / f"{folder_name(codec)}-seed{seed}"


def file_name(rnd: int, slot: int, client: int) -> str:
    return f"round{rnd:04d}-slot{slot}-client{client:04d}.safetensors"


def planned_bytes(runs: int, rounds: Sequence[int], slots: int, d: int, round_limit: int) -> int:
    """An upper bound on what a sweep saves: runs x saved rounds (within the limit) x slots x 4 d
    bytes of float32 (plus a small safetensors header each)."""
    saved_rounds = sum(1 for r in set(rounds) if r <= round_limit)
    return runs * saved_rounds * slots * (4 * d + 4096)


def check_budget(root: str | os.PathLike, nbytes: int) -> None:
    """InputError when ``nbytes`` exceeds :data:`MAX_BYTES` or the free space where ``root`` is."""
    where = Path(root)
    probe = next((p for p in (where, *where.parents) if p.exists()), Path("."))
    free = shutil.disk_usage(probe).free
    if nbytes > MAX_BYTES:
        raise InputError(f"--save-updates would write up to {nbytes / 2**20:,.0f} MiB, over the limit of "
                         f"{MAX_BYTES / 2**30:g} GiB: save fewer rounds (--save-rounds) or clients (--save-clients)")
    if nbytes > free:
        raise InputError(f"--save-updates would write up to {nbytes / 2**20:,.0f} MiB but {probe} has only "
                         f"{free / 2**20:,.0f} MiB free")


class UpdateSaver:
    """Saves the selected updates of one run (see the module docstring)."""

    def __init__(self, root: str | os.PathLike, rounds: Sequence[int], slots: int, info: Mapping[str, Any]):
        self.dir = run_dir(root, info["codec"], info["seed"])
        self.rounds, self.slots = frozenset(rounds), slots
        self.manifest: dict[str, Any] = {"format": FORMAT, **info, "files": []}
        if self.dir.exists() and any(self.dir.iterdir()):
            raise InputError(f"--save-updates: {self.dir} exists and is not empty (choose a new DIR)")

    def wants(self, rnd: int, slot: int) -> bool:
        """Whether the update of participant ``slot`` in round ``rnd`` (from 1) is saved."""
        return rnd in self.rounds and slot < self.slots

    def save(self, rnd: int, slot: int, client: int, update: Mapping[str, Any], lr: float, samples: int) -> Path:
        """Write one update (host float32 copies of device tensors) and the updated manifest."""
        self.dir.mkdir(parents=True, exist_ok=True)
        arrays = {n: np.ascontiguousarray(_host(u), dtype=np.float32) for n, u in update.items()}
        name = file_name(rnd, slot, client)
        tensorfiles.save(self.dir / name, arrays)
        self.manifest["files"].append({"file": name, "round": rnd, "slot": slot, "client": client, "lr": lr,
                                       "samples": samples, "elements": int(sum(a.size for a in arrays.values()))})
        with tensorfiles.atomic_open(self.dir / MANIFEST, force=True) as f:
            f.write((json.dumps(self.manifest, indent=1) + "\n").encode())
        return self.dir / name


@dataclasses.dataclass(frozen=True)
class SavedUpdate:
    """One saved update as read back: its manifest entry (plus the run's ``codec`` / ``seed`` / ``model``
    / ``dataset``) and its tensors, in the file's order."""

    entry: Mapping[str, Any]
    tensors: Mapping[str, np.ndarray]

    def flat(self) -> np.ndarray:
        """All tensors flattened into one float32 vector (the paper's U_i), in parameter order."""
        return np.concatenate([np.asarray(t, np.float32).reshape(-1) for t in self.tensors.values()])


def read_updates(root: str | os.PathLike) -> Iterator[SavedUpdate]:
    """Every update saved under ``root`` (a DIR given to --save-updates, or one run's directory), in
    run-directory then manifest order."""
    root = Path(root)
    manifests = [root / MANIFEST] if (root / MANIFEST).exists() else sorted(root.glob(f"*/{MANIFEST}"))
    if not manifests:
        raise InputError(f"{root}: no {MANIFEST} (not a directory written by mucsc sim --save-updates)")
    for m in manifests:
        man = json.loads(m.read_text())
        if man.get("format") != FORMAT:
            raise InputError(f"{m}: format {man.get('format')!r}, expected {FORMAT!r}")
        run = {k: v for k, v in man.items() if k != "files"}
        order = man.get("names")
        for e in man["files"]:
            loaded = tensorfiles.load(m.parent / e["file"])
            tensors = loaded.tensors
            if order:
                tensors = {n: tensors[n] for n in order}
            yield SavedUpdate({**run, **e}, tensors)


def _host(u: Any) -> np.ndarray:
    """A host numpy array of an update tensor (a torch tensor on any device, or an array)."""
    if hasattr(u, "detach"):
        return u.detach().cpu().numpy()
    return np.asarray(u)
