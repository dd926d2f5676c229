"""Issue 36's CPU targets: what one message costs on the torch backend's device path (aten ops and host
round-trips, counted by tests/devicetools.py on CPU tensors, the same code a GPU runs), and the same bytes
as the host path.  The torch path is selected for CPU tensors by ``kernels.TORCH`` (what
``MUCSC_BACKEND=torch`` sets) in each test, so the file runs once (tests/test_ci_selection.py)."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

pytest.importorskip("torch")
import torch  # noqa: E402

import mucsc  # noqa: E402
from mucsc.codec import kernels  # noqa: E402
from mucsc.codec.backends import ordered_sum, torch_summary, torch_transfer, triton_round  # noqa: E402

from devicetools import count, state  # noqa: E402


# (aten ops, host round-trips) per encode, issue 36
TARGETS = {"mucsc": (60, 4), "bmucsc": (80, 6)}
VECTOR_TARGET = (40, 3)
GROWTH = 1.25  # ALL-CNN's 18 tensors against LeNet's 8


@pytest.fixture
def device_path(monkeypatch):
    """CPU tensors take the torch backend (the device path), its torch ops (no Triton interpreter)."""
    if triton_round.mode() != "auto":
        pytest.skip(f"MUCSC_TRITON={triton_round.mode()}: the counts are the torch ops' (auto mode)")
    monkeypatch.setattr(kernels, "TORCH", True)


def _encode(x, codec, **kw):
    kw = {"z": 16, **kw} if codec == "mucsc" else kw
    return mucsc.encode(x, codec, seed=0, **kw)


def _host(x):
    return {k: v.numpy() for k, v in x.items()} if isinstance(x, dict) else x.numpy()


@pytest.mark.parametrize("codec", ["mucsc", "bmucsc"])
def test_lenet_message_within_issue_36_targets(device_path, codec):
    x = state("lenet")
    ops, trips = TARGETS[codec]
    c = count(lambda: _encode(x, codec))
    assert c.ops <= ops and c.trips <= trips, (c.ops, c.trips, c.by_op.most_common(12), dict(c.calls))


@pytest.mark.parametrize("codec", ["mucsc", "bmucsc"])
def test_op_count_does_not_grow_with_the_tensors(device_path, codec):
    """ALL-CNN's 18 tensors cost at most 1.25x LeNet's 8: no per-tensor loop on the device path."""
    lenet, allcnn = state("lenet"), state("allcnn")
    small = count(lambda: _encode(lenet, codec)).ops
    big = count(lambda: _encode(allcnn, codec)).ops
    assert big <= GROWTH * small, (big, small)


def test_vector_within_issue_36_targets(device_path):
    x = torch.randn(1_000_000, generator=torch.Generator().manual_seed(1))
    c = count(lambda: _encode(x, "mucsc"))
    assert c.ops <= VECTOR_TARGET[0] and c.trips <= VECTOR_TARGET[1], \
        (c.ops, c.trips, c.by_op.most_common(12))


@pytest.mark.parametrize("codec,kw", [("mucsc", {}), ("mucsc", {"shared": False}), ("bmucsc", {}),
                                      ("mucsc", {"compress": "off"}), ("bmucsc", {"keep": 0.05})])
def test_device_path_writes_the_host_bytes(device_path, codec, kw):
    x = state("lenet")
    assert _encode(x, codec, **kw) == _encode(_host(x), codec, **kw)


@pytest.mark.parametrize("n", [5, 1000, 300_000, 1_000_001])
def test_vector_sizes_write_the_host_bytes(device_path, n):
    """Small (the solver reads every element) and sampled vectors, odd lengths (a half word, a half byte)."""
    x = torch.randn(n, generator=torch.Generator().manual_seed(n)) * 3
    for codec in ("mucsc", "bmucsc"):
        assert _encode(x, codec) == _encode(x.numpy(), codec)


@pytest.mark.parametrize("room", [(4, 4096), (0, 16)])
def test_heavy_tails_and_zeros_write_the_host_bytes(device_path, monkeypatch, room):
    """Heavy tails, zeros in a tail (then taken from the device in index order, as the host orders
    -0.0 and +0.0), and (room 0) more tail elements than the summary's top-k holds: the exact fallbacks."""
    monkeypatch.setattr(torch_summary, "TAIL_ROOM", room[0])
    monkeypatch.setattr(torch_summary, "TAIL_SLACK", room[1])
    g = np.random.default_rng(3)
    heavy = np.where(g.random(600_000) < 0.05, g.standard_cauchy(600_000) * 1e3, g.normal(size=600_000))
    zeros = np.abs(g.normal(size=600_000)).astype(np.float32) + 1
    zeros[g.random(600_000) < 0.001] = 0.0  # in the low tail: +0.0 and -0.0
    zeros[np.flatnonzero(zeros == 0)[::2]] = -0.0
    for x in (heavy.astype(np.float32), zeros, heavy):
        assert _encode(torch.from_numpy(x), "mucsc") == _encode(x, "mucsc")


def test_ties_at_the_kth_magnitude_take_the_exact_path(device_path):
    x = np.round(np.random.default_rng(4).normal(size=50_000), 1).astype(np.float32)  # many equal magnitudes
    assert _encode(torch.from_numpy(x), "bmucsc") == _encode(x, "bmucsc")
    sparse = np.zeros(50_000, np.float32)
    sparse[::1000] = 1.5  # fewer non-zeros than kept
    assert _encode(torch.from_numpy(sparse), "bmucsc") == _encode(sparse, "bmucsc")


def test_a_bad_tensor_is_named_after_one_joined_check(device_path):
    x = state("lenet")
    x["7.bias"] = x["7.bias"].clone()
    x["7.bias"][3] = float("nan")
    with pytest.raises(mucsc.InputError, match="7.bias"):
        _encode(x, "mucsc")
    x["7.bias"][3] = float("inf")
    with pytest.raises(mucsc.InputError, match="7.bias"):
        _encode(x, "mucsc", centroid_dtype="float16")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: the sync audit runs on a GPU")
@pytest.mark.parametrize("codec", ["mucsc", "bmucsc"])
def test_device_path_syncs_only_at_its_fetches(monkeypatch, codec):
    """Under ``torch.cuda.set_sync_debug_mode("error")`` the encode of a CUDA state_dict synchronises
    only where it fetches (torch_transfer.fetch / fetch_list) and where the message writer copies the
    finished sections out."""
    x = state("lenet", "cuda")
    _encode(x, codec)  # first use: kernels compiled and self-checked (they synchronise)

    def lifted(f):
        def g(*a, **k):
            mode = torch.cuda.get_sync_debug_mode()
            torch.cuda.set_sync_debug_mode(0)
            try:
                return f(*a, **k)
            finally:
                torch.cuda.set_sync_debug_mode(mode)
        return g

    # the fetches, the writer's copy of the finished sections, and B-MUCSC's float64 sums in numpy's
    # order (pairwise_sum64: its buffer sums read once per sum)
    for module, name in ((torch_transfer, "fetch"), (torch_transfer, "fetch_list"), (torch_transfer, "copy_out"),
                         (torch_transfer, "to_host"), (ordered_sum, "pairwise_sum64")):
        monkeypatch.setattr(module, name, lifted(getattr(module, name)))
    torch.cuda.set_sync_debug_mode("error")
    try:
        _encode(x, codec)
    finally:
        torch.cuda.set_sync_debug_mode(0)
