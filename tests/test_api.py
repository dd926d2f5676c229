"""The public API: inputs of every dtype/shape/grouping, determinism, errors, size formula."""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

import mucsc
from mucsc.codec.wire import container as fmt
from mucsc.errors import InputError, ParameterError, UnknownCodecError

pytestmark = pytest.mark.backends  # .ci/run's torch and numpy passes run it too

torch = pytest.importorskip("torch")


def gauss(n, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).normal(size=n).astype(dtype)


def test_import_mucsc_does_not_import_torch():
    code = ("import sys, numpy as np, mucsc; b = mucsc.encode(np.ones(5, 'f4')); mucsc.decode(b); "
            "mucsc.inspect(b); mucsc.available_codecs(); print('torch' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if k != "MUCSC_BACKEND"}  # torch backend imports torch
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("shape", [(), (1,), (7,), (3, 5), (2, 3, 4), (0,), (4, 0, 2)])
def test_round_trip_dtype_and_shape(dtype, shape):
    x = gauss(max(1, math.prod(shape)), 1, dtype)[: math.prod(shape)].reshape(shape)
    y = mucsc.decode(mucsc.encode(x, z=4))
    assert y.dtype == dtype and y.shape == shape
    if x.size:
        assert y.min() >= x.min() - abs(x.min()) * 1e-3 - 1e-3 and y.max() <= x.max() + abs(x.max()) * 1e-3 + 1e-3


def test_torch_inputs_including_bfloat16():
    sd = {"w": torch.randn(4, 5), "h": torch.randn(3).half(), "b": torch.randn(6).to(torch.bfloat16),
          "steps": torch.tensor([3], dtype=torch.int64)}
    blob = mucsc.encode(sd, z=256)
    out = mucsc.decode(blob)
    assert out["b"].dtype == np.float32 and out["h"].dtype == np.float16 and out["steps"].dtype == np.int64
    assert out["steps"].tolist() == [3]
    t = mucsc.decode(blob, as_torch=True)
    assert t["b"].dtype == torch.bfloat16 and t["w"].shape == (4, 5) and t["steps"].dtype == torch.int64
    raw = mucsc.decode(mucsc.encode(sd, codec="raw"), as_torch=True)
    assert all(torch.equal(raw[k], sd[k]) for k in sd)


def test_shared_vs_per_tensor_groups():
    sd = {"a": gauss(100, 1), "b": gauss(50, 2) * 10, "n": np.arange(3)}
    shared = mucsc.inspect(mucsc.encode(sd, z=4))
    per = mucsc.inspect(mucsc.encode(sd, z=4, shared=False))
    assert [g.records for g in shared.groups] == [("a", "b"), ("n",)]
    assert [g.records for g in per.groups] == [("a",), ("b",), ("n",)]
    assert [g.codec for g in per.groups] == ["mucsc", "mucsc", "raw"]
    for blob in (mucsc.encode(sd, z=4), mucsc.encode(sd, z=4, shared=False)):
        out = mucsc.decode(blob)
        assert list(out) == ["a", "b", "n"] and out["n"].tolist() == [0, 1, 2]


def test_deterministic_and_seed_dependent():
    x = gauss(5000, 3)
    assert mucsc.encode(x, z=16, seed=5) == mucsc.encode(x, z=16, seed=5)
    assert mucsc.encode(x, z=16, seed=5) != mucsc.encode(x, z=16, seed=6)


def test_size_formula_fixed_width():
    for n, z in [(1, 16), (1000, 16), (1001, 5), (4096, 256), (333, 2)]:
        x = gauss(n, n)
        blob = mucsc.encode(x, z=z, compress="off")
        info = mucsc.inspect(blob)
        head = info.sections[0].stored_bytes
        k = info.groups[0].params["centroids"]
        w = math.ceil(math.log2(k)) if k > 1 else 0
        assert len(blob) == fmt.message_size([head, 4 * k, math.ceil(n * w / 8)])


def test_encode_with_stats_reports_exact_J():
    x = gauss(2000, 4)
    blob, st = mucsc.encode_with_stats(x, z=8)
    assert st.message_bytes == len(blob) and st.original_bytes == 8000 and st.elements == 2000
    assert st.J > 0 and st.ratio == 8000 / len(blob)
    json.dumps(st.to_dict())
    _, lossless = mucsc.encode_with_stats(x, codec="raw")
    assert lossless.J == 0


@pytest.mark.parametrize("bad, match", [
    (np.array([1.0, np.nan], np.float32), "NaN or Inf"),
    (np.array([1.0, np.inf]), "NaN or Inf"),
    (np.array(["a"]), "cannot be encoded"),
    (np.array([1 + 2j]), "cannot be encoded"),
    ("text", "expected a numpy array"),
    ({}, "empty"),
])
def test_bad_input(bad, match):
    with pytest.raises(InputError, match=match):
        mucsc.encode(bad)


def test_nan_names_the_tensor():
    with pytest.raises(InputError, match="'layer2'"):
        mucsc.encode({"layer1": gauss(3), "layer2": np.array([np.inf], np.float32)})


@pytest.mark.parametrize("kw, error, match", [
    (dict(z=1), ParameterError, "z must be"),
    (dict(z=65537), ParameterError, "z must be"),
    (dict(z="x"), ParameterError, "expects int"),
    (dict(zz=3), ParameterError, "no parameter 'zz'"),
    (dict(solver="magic"), ParameterError, "solver"),
    (dict(codec="zip"), UnknownCodecError, "unknown codec 'zip'"),
    (dict(seed=-1), ParameterError, "seed"),
    (dict(compress="max"), ParameterError, "compress"),
])
def test_bad_parameters(kw, error, match):
    with pytest.raises(error, match=match):
        mucsc.encode(gauss(10), **kw)


def test_integer_input_is_lossless_even_for_a_lossy_codec():
    x = np.arange(-50, 50, dtype=np.int16)
    y = mucsc.decode(mucsc.encode(x, z=2))
    assert y.dtype == np.int16 and np.array_equal(x, y)


def test_z_limits_accepted():
    x = gauss(70000, 9)
    for z in (2, 65536):
        y = mucsc.decode(mucsc.encode(x, z=z))
        assert y.shape == x.shape


def test_scalars_stay_zero_dimensional_as_torch():
    sd = {"s": np.array(1.5, np.float32), "b": torch.tensor(2.0, dtype=torch.bfloat16), "i": np.array(3)}
    out = mucsc.decode(mucsc.encode(sd, z=4), as_torch=True)
    assert all(out[k].shape == () for k in sd)


def test_adjacent_views_encode_like_separate_arrays():
    buf = gauss(300, 12)
    views = {"a": buf[:100].reshape(10, 10), "b": buf[100:120], "c": buf[120:]}
    copies = {k: v.copy() for k, v in views.items()}
    assert mucsc.encode(views, z=16) == mucsc.encode(copies, z=16)
    gapped = {"a": buf[:100], "c": buf[120:]}  # not adjacent: concatenated
    np.testing.assert_array_equal(np.concatenate(list(mucsc.decode(mucsc.encode(gapped, z=300)).values())),
                                  np.concatenate([buf[:100], buf[120:]]))


def test_aligned_id_packing_when_compressing():
    x = gauss(200_000, 13)
    # packed IDs (IDS_); the default may code them by lanes instead (format 1.2, tests/test_lanes.py)
    auto, tight = mucsc.encode(x, z=8, id_coding="packed"), mucsc.encode(x, z=8, id_packing="tight", id_coding="packed")
    off = mucsc.encode(x, z=8, compress="off")
    assert mucsc.inspect(auto).groups[0].params["id_bits"] == 4
    assert mucsc.inspect(off).groups[0].params["id_bits"] == 3
    assert mucsc.inspect(tight).groups[0].params["id_bits"] == 3
    assert len(auto) < 0.92 * len(tight)  # measured 2.46 vs 2.81 bits per ID
    for blob in (auto, tight, off):
        y = mucsc.decode(blob)
        assert np.unique(y).size <= 8
    # near-uniform ids: widening would not pay, stays tight
    u = np.random.default_rng(1).uniform(size=50_000).astype(np.float32)
    assert mucsc.inspect(mucsc.encode(u, z=8, id_coding="packed")).groups[0].params["id_bits"] == 3


def test_id_bits_too_small_is_rejected():
    from msgtools import build
    blob = mucsc.encode(gauss(100, 14), z=8, compress="off")
    msg = fmt.read_message(blob)
    head = json.loads(bytes(msg.payload(msg.sections[0])))
    head["groups"][0]["params"]["id_bits"] = 2
    secs = [(s.group, s.tag, bytes(msg.payload(s))) for s in msg.sections[1:]]
    with pytest.raises(mucsc.FormatError, match="id_bits"):
        mucsc.decode(build(fmt.canonical_json(head), secs))


# ---- the progress hook ------------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["shared", "per-tensor", "policy"])
def test_progress_hook_counts_elements_up_to_the_total_and_leaves_bytes_alone(how):
    rng = np.random.default_rng(5)
    data = {"a": rng.standard_normal(30_000).astype("f4"), "b": rng.standard_normal(500).astype("f4"),
            "n": np.arange(7)}
    kw = {"shared": how == "shared", "policy": mucsc.Policy(max_error=0.05) if how == "policy" else None}
    calls = []
    blob = mucsc.encode(data, "mucsc", seed=3, progress=lambda done, total: calls.append((done, total)), **kw)
    assert blob == mucsc.encode(data, "mucsc", seed=3, **kw)
    elements = sum(v.size for v in data.values())
    total = calls[0][1]
    assert total == elements * (2 if how == "policy" else 1)
    assert all(t == total for _, t in calls) and calls[-1][0] == total
    assert [d for d, _ in calls] == sorted(d for d, _ in calls) and len(calls) >= 2
    back = []
    mucsc.decode(blob, progress=lambda done, total: back.append((done, total)))
    assert back[-1] == (elements, elements) and len(back) >= 2


@pytest.mark.parametrize("rounding", ["nearest", "dithered"])
def test_progress_hook_moves_during_one_tensors_search(rounding):
    """One tensor under a per-tensor error bound is one long search of trial encodings: the hook moves
    during it (before the tensor's choice is made), monotone, and ends at the total."""
    x = np.random.default_rng(6).standard_normal(20_000).astype("f4")
    codec = mucsc.get_codec("mucsc", rounding=rounding)
    calls = []
    blob = mucsc.encode(x, codec, policy=mucsc.Policy(max_error=0.02),
                        progress=lambda done, total: calls.append((done, total)))
    assert blob == mucsc.encode(x, codec, policy=mucsc.Policy(max_error=0.02))
    done = [d for d, _ in calls]
    assert done == sorted(done) and calls[-1] == (2 * x.size, 2 * x.size)
    during = [d for d in done if 0 < d < x.size]  # the planning half, before the choice is made
    assert len(during) >= 3, calls


def test_progress_hook_must_be_callable():
    with pytest.raises(mucsc.ParameterError, match="progress must be a callable"):
        mucsc.encode(np.ones(4, "f4"), progress=1)
    with pytest.raises(mucsc.ParameterError, match="progress must be a callable"):
        mucsc.decode(mucsc.encode(np.ones(4, "f4")), progress="bar")


def test_header_check_remembers_only_headers_that_passed():
    """The writer's header check skips re-parsing a header that passed before (the same shapes and
    codec round after round) and never remembers one that failed."""
    from mucsc.codec.api import messages

    bad = fmt.Header((fmt.Record("w", "bogus", (3,)),), (fmt.Group("raw", {}, (0,), "bogus"),), "dict", {})
    for _ in range(2):
        with pytest.raises(InputError, match="header would be invalid"):
            messages._check_header(bad)
    assert bad.to_json() not in messages._VALID_HEADERS
    good = fmt.Header((fmt.Record("w", "float32", (3,)),), (fmt.Group("raw", {}, (0,), "float32"),), "dict", {})
    raw = messages._check_header(good)
    assert raw == good.to_json() and raw in messages._VALID_HEADERS
    assert len(messages._VALID_HEADERS) <= messages._VALID_HEADER_COUNT


def test_group_generator_is_default_rng_even_after_a_codec_spawned_from_it():
    """Group generators reuse a memoised SeedSequence([seed, gi]); a codec that spawns from its
    generator must not change what the next encode with the same seed draws or spawns."""
    from mucsc.codec.api import messages

    want = np.random.default_rng([7, 3])
    first = messages._group_rng(7, 3)
    assert first.random(4).tolist() == want.random(4).tolist()
    kids = [g.random() for g in first.spawn(2)]
    again = messages._group_rng(7, 3)
    assert again.random(4).tolist() == np.random.default_rng([7, 3]).random(4).tolist()
    assert [g.random() for g in again.spawn(2)] == kids
