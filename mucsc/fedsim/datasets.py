"""Data sets for the simulator: built-in (digits, Synthetic(alpha, beta)) and real ones read from disk.

Every loader returns a :class:`Dataset` of numpy arrays (images as N x C x H x W float32 in [0, 1],
labels int64).  Loaders for on-disk formats treat the files as untrusted: sizes are checked against
the bytes present, and CIFAR-10's pickles go through a restricted unpickler that can only rebuild
numpy arrays (the python batches are pickles; a plain ``pickle.load`` would run any code in them).
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import json
import os
import pickle
import struct
import tarfile
from pathlib import Path

import numpy as np

from mucsc.errors import FormatError, InputError


@dataclasses.dataclass(frozen=True)
class Dataset:
    """Train and test arrays; ``writers`` gives each training sample's writer/client (natural split)."""

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    writers: np.ndarray | None = None  # int per training sample, for the "natural" partition
    transform: str = "raw"             # the input normalisation applied (see ``normalize``)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])

    def describe(self) -> dict[str, object]:
        """What was actually loaded: sample counts, classes, input shape, writers, normalisation."""
        info: dict[str, object] = {
            "dataset": self.name, "train_samples": int(len(self.y_train)), "test_samples": int(len(self.y_test)),
            "classes": int(self.num_classes), "input_shape": list(self.input_shape), "normalize": self.transform}
        if self.writers is not None:
            info["writers"] = int(len(np.unique(self.writers)))
        return info


# ---- input normalisation per data set ----------------------------------------------------------------

# (invert, per-channel mean, per-channel std) applied as x -> ((1 - x if invert else x) - mean) / std.
# FEMNIST: LEAF stores ink dark on a white background (background 1.0); inverting puts the background
# at 0, which is what zero padding and ReLU conv nets expect, and standardising gives unit-variance
# input.  Its mean/std are those of the inverted shared 26-writer sample's 3,877 training images
# (1 - x: mean 0.0378, std 0.1631).  MNIST and CIFAR-10 use the customary torchvision statistics.
# digits and synthetic stay as they are (the built-in experiment's documented results use them raw).
NORMALIZATION: dict[str, tuple[bool, tuple[float, ...], tuple[float, ...]]] = {
    "femnist": (True, (0.0378,), (0.1631,)),
    "mnist": (False, (0.1307,), (0.3081,)),
    "cifar10": (False, (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
}


def normalize(data: Dataset) -> Dataset:
    """The data set's input normalisation (``NORMALIZATION``); unchanged for sets without one."""
    spec = NORMALIZATION.get(data.name)
    if spec is None or data.transform != "raw":
        return data
    invert, mean, std = spec
    shape = (1, len(mean)) + (1,) * (data.x_train.ndim - 2)
    m = np.asarray(mean, dtype=np.float32).reshape(shape)
    s = np.asarray(std, dtype=np.float32).reshape(shape)

    def f(x: np.ndarray) -> np.ndarray:
        return (((1.0 - x) if invert else x) - m) / s

    label = ("1 - x, then " if invert else "") + f"(x - {_fmt_tuple(mean)}) / {_fmt_tuple(std)}"
    return dataclasses.replace(data, x_train=f(data.x_train).astype(np.float32),
                               x_test=f(data.x_test).astype(np.float32), transform=label)


def _fmt_tuple(v: tuple[float, ...]) -> str:
    return f"{v[0]:g}" if len(v) == 1 else "(" + ", ".join(f"{x:g}" for x in v) + ")"


# ---- built-in, offline ----------------------------------------------------------------------------

def load_digits(seed: int = 0, test_fraction: float = 0.2) -> Dataset:
    """scikit-learn's bundled 8x8 handwritten digits (1797 real samples, no download), split at random."""
    from sklearn.datasets import load_digits as _sk_digits

    bunch = _sk_digits()
    x = (bunch.images.astype(np.float32) / 16.0)[:, None, :, :]  # pixel values are 0..16
    y = bunch.target.astype(np.int64)
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0xD161]))
    perm = rng.permutation(len(y))
    n_test = int(round(test_fraction * len(y)))
    te, tr = perm[:n_test], perm[n_test:]
    return Dataset("digits", x[tr], y[tr], x[te], y[te], 10)


def synthetic(alpha: float = 1.0, beta: float = 1.0, *, clients: int = 100, dim: int = 60,
              classes: int = 10, seed: int = 0, max_samples: int = 1000,
              test_fraction: float = 0.1) -> Dataset:
    """LEAF / FedProx Synthetic(alpha, beta): per-client softmax-regression data.

    Client k: u_k ~ N(0, alpha), B_k ~ N(0, beta); W_k, b_k ~ N(u_k, 1); v_k ~ N(B_k, 1);
    x ~ N(v_k, diag(j^-1.2)); y = argmax(W_k x + b_k).  Sample counts follow LEAF's
    lognormal(4, 2) + 50, capped at ``max_samples`` to keep runs small.  Each client's last
    ``test_fraction`` goes to the shared test set; ``writers`` records the client of each sample.
    """
    if alpha < 0 or beta < 0:
        raise InputError("synthetic alpha and beta must be >= 0")
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x5E17]))
    sizes = np.minimum(rng.lognormal(4, 2, clients).astype(np.int64) + 50, max_samples)
    cov_diag = np.arange(1, dim + 1, dtype=np.float64) ** -1.2
    xs_tr, ys_tr, ws_tr, xs_te, ys_te = [], [], [], [], []
    for k in range(clients):
        u = rng.normal(0.0, np.sqrt(alpha))
        b_mean = rng.normal(0.0, np.sqrt(beta))
        w = rng.normal(u, 1.0, (dim, classes))
        b = rng.normal(u, 1.0, classes)
        v = rng.normal(b_mean, 1.0, dim)
        x = rng.normal(v, np.sqrt(cov_diag), (int(sizes[k]), dim))
        y = np.argmax(x @ w + b, axis=1)
        n_tr = max(1, int(round((1 - test_fraction) * len(y))))
        xs_tr.append(x[:n_tr]); ys_tr.append(y[:n_tr]); ws_tr.append(np.full(n_tr, k))
        xs_te.append(x[n_tr:]); ys_te.append(y[n_tr:])
    cat = np.concatenate
    return Dataset(f"synthetic({alpha:g},{beta:g})", cat(xs_tr).astype(np.float32), cat(ys_tr).astype(np.int64),
                   cat(xs_te).astype(np.float32), cat(ys_te).astype(np.int64), classes,
                   writers=cat(ws_tr).astype(np.int64))


# ---- CIFAR-10 python batches ----------------------------------------------------------------------

CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
CIFAR10_MD5 = "c58f30108f718f92721af3b95e74349a"
_CIFAR_DIR = "cifar-10-batches-py"

# The only globals a CIFAR-10 batch needs: numpy's array reconstruction (module path before and after
# numpy 2.0) and _codecs.encode, which protocol-2 pickles use for byte strings.
_ALLOWED_GLOBALS = frozenset({
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("_codecs", "encode"),
})


class _ArrayOnlyUnpickler(pickle.Unpickler):
    """Unpickler that resolves only numpy array reconstruction globals; anything else is refused."""

    def find_class(self, module: str, name: str):
        if (module, name) in _ALLOWED_GLOBALS:
            return super().find_class(module, name)
        raise FormatError(f"refusing to unpickle global {module}.{name}: only numpy arrays are allowed")


def restricted_unpickle(data: bytes):
    """Unpickle bytes that may hold only dicts, lists, scalars, strings and numpy arrays."""
    try:
        return _ArrayOnlyUnpickler(io.BytesIO(data), encoding="latin1").load()
    except FormatError:
        raise
    except Exception as exc:  # malformed pickles raise many types (UnpicklingError, EOFError, ...)
        raise FormatError(f"not a valid CIFAR-10 batch pickle: {exc}") from None


def read_cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """One CIFAR-10 python batch file -> (images N x 3 x 32 x 32 float32 in [0, 1], labels int64)."""
    obj = restricted_unpickle(Path(path).read_bytes())
    if not isinstance(obj, dict):
        raise FormatError(f"{path}: a CIFAR-10 batch is a dict, got {type(obj).__name__}")
    d = {k.decode("latin1") if isinstance(k, bytes) else k: v for k, v in obj.items()}
    data, labels = d.get("data"), d.get("labels")
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        raise FormatError(f"{path}: 'data' must be a uint8 array of shape (N, 3072)")
    labels = np.asarray(labels)
    if labels.shape != (data.shape[0],) or labels.dtype.kind not in "iu" or (
            labels.size and (labels.min() < 0 or labels.max() > 9)):
        raise FormatError(f"{path}: 'labels' must be {data.shape[0]} integers in 0..9")
    x = data.reshape(-1, 3, 32, 32).astype(np.float32) / 255.0
    return x, labels.astype(np.int64)


def _find_cifar_dir(root: Path) -> Path:
    for cand in (root / _CIFAR_DIR, root):
        if (cand / "data_batch_1").is_file():
            return cand
    tar = root / "cifar-10-python.tar.gz"
    if tar.is_file():
        _safe_extract(tar, root)
        return root / _CIFAR_DIR
    raise InputError(f"no CIFAR-10 python batches under {root} (expected {_CIFAR_DIR}/data_batch_1..5 "
                     f"and test_batch, or cifar-10-python.tar.gz; or pass --download)")


def _safe_extract(tar_path: Path, dest: Path) -> None:
    with tarfile.open(tar_path, "r:gz") as tf:
        tf.extractall(dest, filter="data")  # refuses absolute paths, '..', links out of dest


def download_cifar10(root: Path) -> Path:
    """Download the CIFAR-10 python archive with urllib (only when asked), check its MD5, extract."""
    import urllib.request

    root.mkdir(parents=True, exist_ok=True)
    tar = root / "cifar-10-python.tar.gz"
    if not tar.is_file():
        tmp = tar.with_suffix(".part")
        with urllib.request.urlopen(CIFAR10_URL, timeout=60) as resp, open(tmp, "wb") as f:
            while chunk := resp.read(1 << 20):
                f.write(chunk)
        tmp.rename(tar)
    md5 = hashlib.md5(tar.read_bytes()).hexdigest()
    if md5 != CIFAR10_MD5:
        raise FormatError(f"{tar}: MD5 {md5} does not match CIFAR-10's {CIFAR10_MD5}")
    _safe_extract(tar, root)
    return root / _CIFAR_DIR


def load_cifar10(data_dir: str | os.PathLike, download: bool = False) -> Dataset:
    """CIFAR-10 as distributed (python version): data_batch_1..5 for training, test_batch for test."""
    root = Path(data_dir)
    if download and not any((c / "data_batch_1").is_file() for c in (root, root / _CIFAR_DIR)):
        d = download_cifar10(root)
    else:
        d = _find_cifar_dir(root)
    parts = [read_cifar_batch(d / f"data_batch_{i}") for i in range(1, 6)]
    x_te, y_te = read_cifar_batch(d / "test_batch")
    return Dataset("cifar10", np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]),
                   x_te, y_te, 10)


# ---- FEMNIST (LEAF json shards) ---------------------------------------------------------------------

def _read_leaf_dir(d: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    users: dict[str, tuple[list, list]] = {}
    files = sorted(d.glob("*.json"))
    if not files:
        raise InputError(f"no LEAF .json shards in {d}")
    for f in files:
        try:
            obj = json.loads(f.read_text())
            for u in obj["users"]:
                ud = obj["user_data"][u]
                xs, ys = users.setdefault(u, ([], []))
                xs.extend(ud["x"]); ys.extend(ud["y"])
        except (KeyError, TypeError, ValueError) as exc:
            raise FormatError(f"{f}: not a LEAF shard ({exc})") from None
    out = {}
    for u, (xs, ys) in users.items():
        x = np.asarray(xs, dtype=np.float32)
        y = np.asarray(ys, dtype=np.int64)
        if x.ndim != 2 or x.shape[1] != 784 or y.shape != (x.shape[0],):
            raise FormatError(f"writer {u}: expected x of shape (n, 784) and n labels")
        if y.size and (y.min() < 0 or y.max() > 61):
            raise FormatError(f"writer {u}: labels must be in 0..61")
        out[u] = (x.reshape(-1, 1, 28, 28), y)
    return out


def load_femnist(data_dir: str | os.PathLike, *, writers: int = 100, seed: int = 0,
                 test_fraction: float = 0.1) -> Dataset:
    """FEMNIST from LEAF's json shards, one client per writer.

    Reads ``train/`` and ``test/`` (LEAF's own per-writer split) when present, else every shard in
    ``data_dir`` split per writer with ``test_fraction`` held out.  ``writers`` writers are drawn at
    random (0 = all); the returned ``writers`` array maps each training sample to its client index.
    """
    root = Path(data_dir)
    if (root / "train").is_dir():
        train = _read_leaf_dir(root / "train")
        test = _read_leaf_dir(root / "test") if (root / "test").is_dir() else {}
    else:
        train, test = _read_leaf_dir(root), None
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0xFE11]))
    names = sorted(train)
    if writers and writers < len(names):
        names = sorted(rng.choice(names, writers, replace=False).tolist())
    xs_tr, ys_tr, ws, xs_te, ys_te = [], [], [], [], []
    for k, u in enumerate(names):
        x, y = train[u]
        if test is None:
            perm = rng.permutation(len(y))
            n_te = int(round(test_fraction * len(y)))
            xs_te.append(x[perm[:n_te]]); ys_te.append(y[perm[:n_te]])
            x, y = x[perm[n_te:]], y[perm[n_te:]]
        elif u in test:
            xs_te.append(test[u][0]); ys_te.append(test[u][1])
        xs_tr.append(x); ys_tr.append(y); ws.append(np.full(len(y), k))
    cat = np.concatenate
    if not xs_te:
        raise InputError(f"FEMNIST under {root}: the chosen writers have no test samples")
    return Dataset("femnist", cat(xs_tr), cat(ys_tr), cat(xs_te), cat(ys_te), 62, writers=cat(ws).astype(np.int64))


# ---- MNIST, torchvision's raw layout (idx files) ----------------------------------------------------

_IDX_TYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: np.dtype(">i2"), 0x0C: np.dtype(">i4"),
              0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}


def read_idx(path: Path) -> np.ndarray:
    """Parse an idx file (optionally .gz): magic 0, 0, type, ndim; ndim big-endian uint32 dims; data."""
    path = Path(path)
    raw = path.read_bytes()
    if path.suffix == ".gz":
        raw = gzip.decompress(raw)
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_TYPES:
        raise FormatError(f"{path}: not an idx file (bad magic)")
    ndim = raw[3]
    if ndim < 1 or len(raw) < 4 + 4 * ndim:
        raise FormatError(f"{path}: truncated idx header")
    dims = struct.unpack(f">{ndim}I", raw[4:4 + 4 * ndim])
    dt = np.dtype(_IDX_TYPES[raw[2]])
    need = int(np.prod(dims, dtype=np.int64)) * dt.itemsize
    if len(raw) - 4 - 4 * ndim != need:
        raise FormatError(f"{path}: idx header declares {need} data bytes, file has {len(raw) - 4 - 4 * ndim}")
    return np.frombuffer(raw, dtype=dt, offset=4 + 4 * ndim).reshape(dims)


MNIST_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
               "t10k-labels-idx1-ubyte")


def _find_idx(d: Path, stem: str) -> Path | None:
    for name in (stem, stem + ".gz"):
        if (d / name).is_file():
            return d / name
    return None


def load_mnist(data_dir: str | os.PathLike) -> Dataset:
    """MNIST as torchvision stores it: ``<dir>/MNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]``.

    The directory searched is the first of MNIST/raw, raw, the root itself that holds any of the four
    idx files; an error names every file missing there.
    """
    root = Path(data_dir)
    cands = (root / "MNIST" / "raw", root / "raw", root)
    d = next((c for c in cands if c.is_dir() and any(_find_idx(c, f) for f in MNIST_FILES)), None)
    if d is None:
        raise InputError(f"no MNIST idx files under {root}: expected {', '.join(MNIST_FILES)} "
                         f"(optionally .gz) in MNIST/raw/ (torchvision's layout), raw/ or {root} itself")
    found = {f: _find_idx(d, f) for f in MNIST_FILES}
    missing = [f for f, path in found.items() if path is None]
    if missing:
        raise InputError(f"MNIST under {d}: missing {', '.join(f + '[.gz]' for f in missing)} "
                         f"({4 - len(missing)} of the 4 idx files found)")
    out = []
    for prefix in ("train", "t10k"):
        x = read_idx(found[f"{prefix}-images-idx3-ubyte"])
        y = read_idx(found[f"{prefix}-labels-idx1-ubyte"])
        if x.ndim != 3 or y.ndim != 1 or x.shape[0] != y.shape[0] or (y.size and y.max() > 9):
            raise FormatError(f"{d}: {prefix} images and labels do not match")
        out += [x.astype(np.float32)[:, None] / 255.0, y.astype(np.int64)]
    return Dataset("mnist", *out, 10)


# ---- dispatch -----------------------------------------------------------------------------------------

DATASETS = ("digits", "synthetic", "cifar10", "femnist", "mnist")


def load_dataset(name: str, *, data_dir: str | None = None, download: bool = False, seed: int = 0,
                 clients: int = 100, synthetic_alpha: float = 1.0, synthetic_beta: float = 1.0,
                 normalized: bool = False) -> Dataset:
    """Load a data set by name; on-disk sets need ``data_dir``; ``normalized``: apply ``normalize``."""
    data = _load(name, data_dir=data_dir, download=download, seed=seed, clients=clients,
                 synthetic_alpha=synthetic_alpha, synthetic_beta=synthetic_beta)
    return normalize(data) if normalized else data


def _load(name: str, *, data_dir: str | None, download: bool, seed: int, clients: int,
          synthetic_alpha: float, synthetic_beta: float) -> Dataset:
    if name == "digits":
        return load_digits(seed)
    if name == "synthetic":
        return synthetic(synthetic_alpha, synthetic_beta, clients=clients, seed=seed)
    if name not in DATASETS:
        raise InputError(f"unknown data set {name!r}; choose from {', '.join(DATASETS)}")
    if data_dir is None:
        raise InputError(f"data set {name!r} is read from disk: pass --data-dir")
    if name == "cifar10":
        return load_cifar10(data_dir, download=download)
    if name == "femnist":
        return load_femnist(data_dir, writers=clients, seed=seed)
    return load_mnist(data_dir)
