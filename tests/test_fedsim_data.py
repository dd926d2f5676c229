"""fedsim data: each loader on a fixture in the real format, the restricted unpickler, partitions."""

from __future__ import annotations

import gzip
import pickle
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from mucsc.errors import FormatError, InputError
from mucsc.fedsim import datasets, partition

FIX = Path(__file__).parent / "fixtures" / "fedsim"


def test_cifar10_python_batches():
    d = datasets.load_cifar10(FIX / "cifar10")
    assert d.x_train.shape == (15, 3, 32, 32) and d.x_test.shape == (3, 3, 32, 32)
    assert d.x_train.dtype == np.float32 and 0 <= d.x_train.min() and d.x_train.max() <= 1
    # Compare with an independent read: the stock unpickler, as torchvision does (trusted fixture).
    raw = pickle.loads((FIX / "cifar10" / "cifar-10-batches-py" / "data_batch_2").read_bytes(), encoding="latin1")
    np.testing.assert_array_equal(d.y_train[3:6], raw["labels"])
    np.testing.assert_array_equal(d.x_train[3:6], raw["data"].reshape(-1, 3, 32, 32) / np.float32(255))


def test_cifar10_from_tar_gz(tmp_path):
    import tarfile
    with tarfile.open(tmp_path / "cifar-10-python.tar.gz", "w:gz") as tf:
        tf.add(FIX / "cifar10" / "cifar-10-batches-py", arcname="cifar-10-batches-py")
    d = datasets.load_cifar10(tmp_path)
    assert d.x_train.shape[0] == 15


class _Evil:
    def __reduce__(self):
        import os
        return (os.system, ("touch pwned_marker",))


def test_malicious_pickle_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    blob = pickle.dumps({"data": _Evil(), "labels": [1]}, protocol=2)
    with pytest.raises(FormatError, match="refusing to unpickle"):
        datasets.restricted_unpickle(blob)
    assert not (tmp_path / "pwned_marker").exists()
    # builtins that a crafted pickle could use to run code are refused too
    for mod, name in (("builtins", "eval"), ("builtins", "getattr"), ("numpy", "load")):
        evil = b"\x80\x02c" + mod.encode() + b"\n" + name.encode() + b"\nU\x011\x85R."
        with pytest.raises(FormatError):
            datasets.restricted_unpickle(evil)


def test_cifar_batch_validation(tmp_path):
    (tmp_path / "bad").write_bytes(pickle.dumps({"data": np.zeros((2, 5), np.uint8), "labels": [0, 1]}))
    with pytest.raises(FormatError, match="3072"):
        datasets.read_cifar_batch(tmp_path / "bad")
    (tmp_path / "junk").write_bytes(b"\x80\x02}q")
    with pytest.raises(FormatError):
        datasets.read_cifar_batch(tmp_path / "junk")
    with pytest.raises(InputError, match="download"):
        datasets.load_cifar10(tmp_path)


def test_femnist_leaf_shards_one_client_per_writer():
    d = datasets.load_femnist(FIX / "femnist", writers=0)
    assert d.num_classes == 62 and d.x_train.shape == (15, 1, 28, 28) and d.x_test.shape == (6, 1, 28, 28)
    assert [int((d.writers == k).sum()) for k in range(3)] == [5, 4, 6]
    parts = partition.natural(d.writers, 3)
    assert [len(p) for p in parts] == [5, 4, 6]
    two = datasets.load_femnist(FIX / "femnist", writers=2, seed=1)
    assert len(np.unique(two.writers)) == 2


def test_femnist_without_split_dirs(tmp_path):
    shutil.copytree(FIX / "femnist" / "train", tmp_path / "all")
    d = datasets.load_femnist(tmp_path / "all", writers=0, test_fraction=0.2)
    assert len(d.y_train) + len(d.y_test) == 15 and len(d.y_test) == 3


def test_mnist_idx_gz_and_plain():
    d = datasets.load_mnist(FIX / "mnist")
    assert d.x_train.shape == (6, 1, 28, 28) and d.x_test.shape == (4, 1, 28, 28)
    raw = gzip.decompress((FIX / "mnist" / "MNIST" / "raw" / "train-labels-idx1-ubyte.gz").read_bytes())
    np.testing.assert_array_equal(d.y_train, np.frombuffer(raw, np.uint8, offset=8))


@pytest.mark.parametrize("gone", [("t10k-labels-idx1-ubyte",),
                                  ("train-images-idx3-ubyte.gz", "t10k-images-idx3-ubyte")])
def test_mnist_names_the_missing_files(tmp_path, gone):
    raw = tmp_path / "MNIST" / "raw"
    shutil.copytree(FIX / "mnist" / "MNIST" / "raw", raw)
    for name in gone:
        (raw / name).unlink()
    with pytest.raises(InputError) as exc:
        datasets.load_mnist(tmp_path)
    msg = str(exc.value)
    for name in gone:
        assert name.removesuffix(".gz") + "[.gz]" in msg
    assert f"{4 - len(gone)} of the 4 idx files found" in msg and str(raw) in msg
    with pytest.raises(InputError, match="no MNIST idx files under .*train-images-idx3-ubyte"):
        datasets.load_mnist(tmp_path / "MNIST" / "nothing-here")


def test_normalization_per_data_set():
    fem = datasets.load_femnist(FIX / "femnist", writers=0)
    assert fem.transform == "raw" and fem.x_train.max() <= 1.0
    n = datasets.normalize(fem)
    # LEAF's background 1.0 -> inverted to 0 -> standardised to -mean/std
    np.testing.assert_allclose(n.x_train, ((1 - fem.x_train) - 0.0378) / 0.1631, rtol=1e-5, atol=1e-5)
    assert n.transform.startswith("1 - x") and n.x_train.dtype == np.float32
    assert datasets.normalize(n) is n  # never applied twice
    c = datasets.normalize(datasets.load_cifar10(FIX / "cifar10"))
    raw = datasets.load_cifar10(FIX / "cifar10")
    np.testing.assert_allclose(c.x_test[:, 2], (raw.x_test[:, 2] - 0.4465) / 0.2616, rtol=1e-5, atol=1e-5)
    digits = datasets.load_digits()
    assert datasets.normalize(digits) is digits  # the built-in experiment's inputs stay as documented
    assert datasets.load_dataset("mnist", data_dir=str(FIX / "mnist"), normalized=True).transform != "raw"
    info = n.describe()
    assert info["writers"] == len(np.unique(fem.writers)) and info["train_samples"] == len(fem.y_train)


def test_idx_rejects_bad_files(tmp_path):
    good = bytes([0, 0, 8, 1]) + struct.pack(">I", 3) + b"\x01\x02\x03"
    (tmp_path / "ok").write_bytes(good)
    assert datasets.read_idx(tmp_path / "ok").tolist() == [1, 2, 3]
    for name, blob in (("short", good[:-1]), ("magic", b"\x01" + good[1:]),
                       ("huge", bytes([0, 0, 8, 1]) + struct.pack(">I", 2**31) + b"\x00")):
        (tmp_path / name).write_bytes(blob)
        with pytest.raises(FormatError):
            datasets.read_idx(tmp_path / name)


def test_builtin_data():
    d = datasets.load_digits(seed=0)
    assert d.x_train.shape[1:] == (1, 8, 8) and len(d.y_train) + len(d.y_test) == 1797
    s = datasets.synthetic(0.5, 0.5, clients=5, seed=3)
    assert s.x_train.shape[1] == 60 and set(np.unique(s.writers)) == set(range(5))
    s2 = datasets.synthetic(0.5, 0.5, clients=5, seed=3)
    np.testing.assert_array_equal(s.x_train, s2.x_train)


def test_partitions():
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(10), 100)
    parts = partition.iid(1000, 10, 100, rng)
    assert sorted(np.concatenate(parts).tolist()) == list(range(1000))  # disjoint when it fits
    parts = partition.iid(1000, 30, 100, rng)
    assert all(len(p) == 100 and len(np.unique(p)) == 100 for p in parts)
    parts = partition.noniid_classes(labels, 20, rng, classes_per_client=5, min_size=300, max_size=450)
    for p in parts:
        assert len(np.unique(labels[p])) <= 5 and 300 <= len(p) <= 450 and len(np.unique(p)) == len(p)
    parts = partition.dirichlet(labels, 10, 0.3, rng)
    assert sorted(np.concatenate(parts).tolist()) == list(range(1000))
    with pytest.raises(InputError):
        partition.natural(None, 3)
    with pytest.raises(InputError):
        partition.make_partition("bogus", labels, 3, rng)
