"""The DDP communication hook on CPU with gloo: world size 1 in this process (exact expected
gradients, error feedback, byte counts), and 2 processes on 127.0.0.1 (identical replicas, falling loss)."""

import json
import os
import platform
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import mucsc

torch = pytest.importorskip("torch", reason="torch not installed")
dist = pytest.importorskip("torch.distributed", reason="torch.distributed not available")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch built without gloo", allow_module_level=True)

from mucsc.ddp import MucscHookState, mucsc_hook  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def group():
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3))


def _batch(i):
    g = torch.Generator().manual_seed(i)
    return torch.randn(16, 20, generator=g), torch.randint(0, 3, (16,), generator=g)


def _grads_after_step(ddp, i):
    ddp.zero_grad()
    x, y = _batch(i)
    torch.nn.functional.cross_entropy(ddp(x), y).backward()
    return [p.grad.detach().clone() for p in ddp.parameters()]


def test_state_validates():
    with pytest.raises(mucsc.UnknownCodecError):
        MucscHookState(None, codec="nope")
    with pytest.raises(mucsc.ParameterError):
        MucscHookState(None, z=0)
    with pytest.raises(mucsc.ParameterError, match="start_iter"):
        MucscHookState(None, codec="topk", start_iter=1)   # error feedback needs rebuilt buckets
    assert MucscHookState(None, codec="topk").error_feedback
    assert not MucscHookState(None, codec="mucsc").error_feedback
    assert MucscHookState(None, codec="mucsc", start_iter=0).start_iter == 0


def test_state_keeps_the_heap_unless_told_not_to():
    """The training process keeps freed memory mapped (mucsc.heap) where glibc takes it; opt-out."""
    assert MucscHookState(None, keep_heap=False).heap_kept is False
    assert MucscHookState(None).heap_kept is (platform.libc_ver()[0] == "glibc")
    if hasattr(mucsc, "Compressor"):  # issue 8's compressors: DGC's own momentum memory
        assert MucscHookState(None, codec="dgc", keep=0.1, momentum=0.5).error_feedback
        with pytest.raises(mucsc.ParameterError):
            MucscHookState(None, codec="dgc", momentum=1.5)
    with pytest.raises(mucsc.ParameterError):
        MucscHookState(None, compress="fast")


def test_the_hooks_own_encoding_defaults():
    """Zstd level 1 and packed IDs unless given; codecs without an id_coding, or that refuse packed
    IDs with their other parameters, keep theirs."""
    state = MucscHookState(None, codec="mucsc", z=16)
    assert state.compress == 1 and state.params == {"z": 16, "id_coding": "packed"}
    given = MucscHookState(None, codec="mucsc", z=16, id_coding="auto", compress="auto")
    assert given.compress == "auto" and given.params == {"z": 16, "id_coding": "auto"}
    assert MucscHookState(None, codec="topk", keep=0.1).params == {"keep": 0.1}
    assert MucscHookState(None, codec="mucsc", rounding="dithered").params == {"rounding": "dithered"}
    x = np.random.default_rng(0).normal(size=5000).astype(np.float32)
    blob = MucscHookState(None, codec="mucsc", z=16).encode_bucket(x, 0, 0, 0)
    info = mucsc.inspect(blob)
    assert "IDS_" in {s.tag for s in info.sections} and "IDSL" not in {s.tag for s in info.sections}


def test_world_size_one_matches_the_codec(group):
    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp = DDP(_model())
    state = MucscHookState(group, codec="mucsc", seed=5, start_iter=2, z=8)
    ddp.register_comm_hook(state, mucsc_hook)
    plain = _model()
    for i in range(4):
        got = _grads_after_step(ddp, i)
        plain.zero_grad()
        x, y = _batch(i)
        torch.nn.functional.cross_entropy(plain(x), y).backward()
        exact = [p.grad for p in plain.parameters()]
        if i < 2:  # plain allreduce over one rank: the gradient itself
            assert all(torch.equal(a, b) for a, b in zip(got, exact))
        else:      # one rank: the decoded own message, lossy and unbiased
            assert any(not torch.equal(a, b) for a, b in zip(got, exact))
            err = torch.cat([(a - b).reshape(-1) for a, b in zip(got, exact)])
            ref = torch.cat([b.reshape(-1) for b in exact])
            assert float(err.norm()) < 0.5 * float(ref.norm())   # one codebook per bucket, Z = 8
        with torch.no_grad():
            for p, q in zip(plain.parameters(), ddp.parameters()):
                p.copy_(q)
    assert state.iter == 4
    st = state.stats
    d = sum(p.numel() for p in ddp.parameters())
    assert st.allreduce_bytes == 2 * 4 * d
    assert st.raw_bucket_bytes == 2 * 4 * d and st.compressed_buckets >= 2
    assert 0 < st.message_bytes < st.raw_bucket_bytes / 2
    # one rank: its length, its message, and from the second compressed iteration on the slot's slack
    assert 0 <= st.sent_bytes - (st.message_bytes + 8 * st.compressed_buckets) <= 2 * 64 + st.message_bytes // 128
    assert st.ratio > 2


def test_world_size_one_exact_message_and_error_feedback(group):
    """One parameter (one bucket): the bucket gets exactly decode(encode(g + residual)) with the
    documented seed, and the new residual is what was not sent."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    lin = torch.nn.Linear(20, 3, bias=False)
    ddp = DDP(lin)
    state = MucscHookState(group, codec="topk", seed=1, start_iter=2, keep=0.1)
    assert state.error_feedback
    ddp.register_comm_hook(state, mucsc_hook)
    residual = np.zeros(lin.weight.numel(), np.float32)
    for i in range(5):
        seed = state.message_seed(0, 0)
        ddp.zero_grad()
        x, _ = _batch(i)
        w_before = lin.weight.detach().clone()
        (ddp(x) ** 2).mean().backward()
        g = (2 * (x @ w_before.T) / (x.shape[0] * 3)).T @ x  # d/dW mean((xW^T)^2)
        got = lin.weight.grad.numpy().ravel()
        if i < 2:
            assert np.allclose(got, g.numpy().ravel(), atol=1e-6) and not state.residuals
            continue
        corrected = g.numpy().ravel() + residual
        want = mucsc.decode(mucsc.encode(corrected.astype(np.float32), "topk", seed=seed, keep=0.1))
        assert np.allclose(got, want, atol=1e-6)
        assert np.count_nonzero(got) == np.count_nonzero(want) > 0
        residual = corrected - want
        assert np.allclose(state.residuals[0], residual, atol=1e-6)
        with torch.no_grad():
            lin.weight.sub_(0.1 * lin.weight.grad)


def test_the_bucket_is_the_decoded_message_bit_for_bit(group, monkeypatch):
    """World 1: the bucket becomes exactly decode(the message sent), whether the rank's own decode
    comes from the encoder's lookup (mucsc) or from the bytes (qsgd), with the bucket encoded in place."""
    import mucsc.ddp as hook_module
    from torch.nn.parallel import DistributedDataParallel as DDP

    sent = []
    real = hook_module._gather_messages
    monkeypatch.setattr(hook_module, "_gather_messages", lambda blob, *a: sent.append(blob) or real(blob, *a))
    for codec, params in [("mucsc", {"z": 8}), ("qsgd", {"s": 4})]:
        ddp = DDP(_model())  # one bucket: the iteration's last, run inline
        state = MucscHookState(group, codec=codec, seed=5, start_iter=0, **params)
        ddp.register_comm_hook(state, mucsc_hook)
        sent.clear()
        got = np.concatenate([g.numpy().ravel() for g in _grads_after_step(ddp, 0)])
        want = mucsc.decode(sent[0])
        assert len(sent) == 1 and np.sort(got).tobytes() == np.sort(want).tobytes()


def _train_grads(group, overlap, steps=4):
    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp = DDP(_model(), bucket_cap_mb=0.0005)  # two buckets after the rebuild: one on the worker
    state = MucscHookState(group, codec="mucsc", seed=5, start_iter=2, z=8, overlap=overlap)
    ddp.register_comm_hook(state, mucsc_hook)
    out = []
    for i in range(steps):
        out.append(_grads_after_step(ddp, i))
        with torch.no_grad():
            for p in ddp.parameters():
                p.sub_(0.1 * p.grad)
    state.close()
    return out, state.stats


def test_one_all_gather_per_bucket_once_the_slot_fits(group, monkeypatch):
    """The first compressed iteration gathers lengths then messages; later ones one slot that holds the
    length and the message (a second all-gather only for what overflows the slot)."""
    import mucsc.ddp as hook_module

    calls = []
    real = hook_module._all_gather
    monkeypatch.setattr(hook_module, "_all_gather", lambda mine, *a: calls.append(mine.numel()) or real(mine, *a))
    slots: dict[int, tuple[int, int]] = {}
    blob = mucsc.encode(np.linspace(-1, 1, 1000, dtype=np.float32), "mucsc", z=16)
    messages, sent = hook_module._gather_messages(blob, slots, 0, 1 << 20, 1, group, "cpu")
    assert [bytes(m) for m in messages] == [blob] and sent == 8 + len(blob) and calls == [8, len(blob)]
    cap, slack = slots[0]
    assert cap == len(blob) + slack and slack > 0
    calls.clear()
    messages, sent = hook_module._gather_messages(blob, slots, 0, 1 << 20, 1, group, "cpu")
    assert [bytes(m) for m in messages] == [blob] and sent == 8 + cap and calls == [8 + cap]
    calls.clear()
    longer = blob + bytes(cap)  # overflows the slot: the rest follows in a second all-gather
    messages, sent = hook_module._gather_messages(longer, slots, 0, 1 << 20, 1, group, "cpu")
    assert [bytes(m) for m in messages] == [longer] and len(calls) == 2 and sent == 8 + len(longer)
    assert slots[0] == (len(longer) + 2 * slack, 2 * slack)  # an overflow doubles the slack


def test_a_declared_length_over_the_limit_is_refused(group, monkeypatch):
    import mucsc.ddp as hook_module

    def forged(mine, world, group, device):
        out = mine.numpy().copy()[None, :]
        out[0, :8] = np.array([1 << 40], dtype="<i8").view(np.uint8)
        return out

    monkeypatch.setattr(hook_module, "_all_gather", forged)
    with pytest.raises(mucsc.FormatError, match="declared"):
        hook_module._gather_messages(b"x" * 100, {}, 0, 1 << 20, 1, group, "cpu")


def test_overlapped_hook_gives_the_inline_hooks_gradients(group):
    """The worker thread changes when the work runs, not what it computes: same gradients, same bytes."""
    got, st = _train_grads(group, overlap=True)
    want, st_inline = _train_grads(group, overlap=False)
    assert all(torch.equal(a, b) for ga, gb in zip(got, want) for a, b in zip(ga, gb))
    assert st == st_inline and st.compressed_buckets > 0


def test_hook_returns_before_the_bucket_is_compressed(group):
    """The future DDP gets for a bucket is still pending while the worker encodes: backward is not held
    up.  The iteration's last bucket (nothing of backward left) runs in the hook, after the worker's."""
    import threading

    from torch.nn.parallel import DistributedDataParallel as DDP

    release = threading.Event()
    release.set()

    class Held(MucscHookState):
        def encode_bucket_decoded(self, flat, bucket_index, rank, iteration=None):
            assert release.wait(60), "the hook never returned"
            return super().encode_bucket_decoded(flat, bucket_index, rank, iteration)

    pending, last = [], []

    def watching_hook(state, bucket):
        if bucket.is_last():
            fut = mucsc_hook(state, bucket)
            last.append(fut.done())
            return fut
        release.clear()
        fut = mucsc_hook(state, bucket)
        pending.append(fut.done())
        release.set()
        return fut

    ddp = DDP(_model(), bucket_cap_mb=0.0005)  # two buckets once DDP has rebuilt them
    state = Held(group, codec="mucsc", seed=5, start_iter=0, z=8)
    ddp.register_comm_hook(state, watching_hook)
    for i in range(3):
        _grads_after_step(ddp, i)
    state.close()
    assert pending and not any(pending)
    assert last == [True] * 3
    assert state.stats.compressed_buckets == len(pending) + len(last)


def test_worker_errors_reach_backward(group):
    """An error on the worker thread fails the training step; it is never swallowed."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    class Broken(MucscHookState):
        def encode_bucket_decoded(self, flat, bucket_index, rank, iteration=None):
            raise mucsc.InputError("bucket 0 changed size (test)")

    ddp = DDP(_model())
    state = Broken(group, codec="mucsc", seed=5, start_iter=0, z=8)
    ddp.register_comm_hook(state, mucsc_hook)
    with pytest.raises(Exception, match="changed size"):
        _grads_after_step(ddp, 0)
    state.close()


_WORKER = textwrap.dedent("""
    import json, sys
    import torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from mucsc.ddp import MucscHookState, mucsc_hook

    rank, port, out, codec = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(10, 256), torch.nn.Tanh(), torch.nn.Linear(256, 1024), torch.nn.Tanh(),
                                torch.nn.Linear(1024, 1))
    ddp = DDP(model, bucket_cap_mb=0.25)   # > 1 MiB of gradients: several buckets after the rebuild
    params = {"z": 16} if codec == "mucsc" else {"keep": 0.2}
    state = MucscHookState(None, codec=codec, seed=3, start_iter=2, **params)
    ddp.register_comm_hook(state, mucsc_hook)
    g = torch.Generator().manual_seed(42)
    w_true = torch.randn(10, 1, generator=g)
    X = torch.randn(256, 10, generator=g)
    Y = X @ w_true
    mine = slice(rank * 128, (rank + 1) * 128)   # each rank its own half of the data
    opt = torch.optim.SGD(ddp.parameters(), lr=0.02)
    losses = []
    for it in range(40):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(X[mine]), Y[mine])
        loss.backward()
        opt.step()
        with torch.no_grad():
            losses.append(float(torch.nn.functional.mse_loss(model(X), Y)))
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    json.dump({"losses": losses, "params": flat.numpy().tobytes().hex(), "message_bytes": state.stats.message_bytes,
               "raw": state.stats.raw_bucket_bytes, "buckets": state.stats.compressed_buckets,
               "allreduce": state.stats.allreduce_bytes}, open(out, "w"))
    dist.barrier()   # neither rank tears gloo down while the other still talks to it
    dist.destroy_process_group()
""")


@pytest.mark.slow
@pytest.mark.parametrize("codec", ["mucsc", "topk"])
def test_two_processes_identical_replicas_and_falling_loss(tmp_path, codec):
    script = tmp_path / "worker.py"
    script.write_text(_WORKER)
    port = str(_free_port())
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, str(script), str(r), port, str(tmp_path / f"r{r}.json"), codec],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for r in range(2)]
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=240)[0].decode(errors="replace"))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("DDP workers did not finish within 240 s")
    assert all(p.returncode == 0 for p in procs), "\n".join(outs)
    r0, r1 = (json.loads((tmp_path / f"r{r}.json").read_text()) for r in range(2))
    assert r0["params"] == r1["params"]              # bitwise identical replicas
    assert r0["losses"] == r1["losses"]
    losses = r0["losses"]
    assert losses[-1] < 0.5 * losses[0]
    assert r0["buckets"] > 38 and r0["buckets"] % 38 == 0  # several buckets in each of 38 compressed iterations
    assert r0["allreduce"] > 0
    assert 0 < r0["message_bytes"] < r0["raw"]
