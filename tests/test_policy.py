"""The grouping policy (mucsc.Policy): per-tensor codebooks, lossless carriers, pooled small tensors,
per-tensor error targets, and the per-tensor quality figures of encode_with_stats."""

from __future__ import annotations

import numpy as np
import pytest

import mucsc
from mucsc.codec.wire import container as fmt
from mucsc.codec.api.policy import encode_within, fp16_exact
from mucsc.errors import FormatError, ParameterError


def weights(seed=0):
    """A small model-like state_dict: heavy-tailed weights, an offset bias, a zero bias, int buffers."""
    rng = np.random.default_rng(seed)
    return {
        "conv.weight": (rng.standard_t(4, size=(32, 16, 3, 3)) * 0.05).astype(np.float32),
        "conv.bias": (rng.normal(size=32) * 0.01 + 0.5).astype(np.float32),
        "fc.weight": (rng.normal(size=(256, 512)) * 0.02).astype(np.float32),
        "fc.bias": np.zeros(256, np.float32),
        "bn.num_batches_tracked": np.array(17, np.int64),
        "bn.count": np.array([3], np.int64),
    }


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / np.linalg.norm(b)


@pytest.mark.parametrize("target", [0.005, 0.01, 0.05])
def test_every_float_tensor_meets_the_target_and_zeros_are_exact(target):
    sd = weights()
    blob, st = mucsc.encode_with_stats(sd, policy=mucsc.Policy(max_error=target))
    out = mucsc.decode(blob)
    for k, v in sd.items():
        if v.dtype.kind == "f" and np.any(v):
            assert rel(out[k], v) <= target, k
        else:
            assert np.array_equal(out[k], v), k
    measured = {t.name: t.rel_error for t in st.tensors}
    for k, v in sd.items():
        if np.any(v):
            assert measured[k] == pytest.approx(rel(out[k], v) if v.dtype.kind == "f" else 0.0, abs=1e-9)


@pytest.mark.parametrize("scale", [1e-30, 1e20])
def test_tiny_and_huge_float32_tensors_are_coded_within_the_target(scale):
    """||x|| in float64: a float32 dot product underflows (1e-30: the tensor looked all-zero and was
    stored raw) or overflows (1e20: every error bound looked met) for such tensors."""
    x = (np.random.default_rng(3).normal(size=20_000) * scale).astype(np.float32)
    blob, st = mucsc.encode_with_stats({"w": x}, policy=mucsc.Policy(max_error=0.01))
    assert st.tensors[0].codec == "mucsc" and len(blob) < x.nbytes / 3
    assert rel(mucsc.decode(blob)["w"], x) <= 0.01


def test_model_default_ratio_on_float32_weights():
    rng = np.random.default_rng(1)
    sd = {f"layer{i}.weight": (rng.standard_t(5, size=(512, 512)) * 0.03).astype(np.float32) for i in range(3)}
    sd.update({f"layer{i}.bias": (rng.normal(size=512) * 0.01).astype(np.float32) for i in range(3)})
    blob, st = mucsc.encode_with_stats(sd, policy=mucsc.Policy(max_error=0.01))
    assert st.ratio >= 3.5
    assert max(t.rel_error for t in st.tensors) <= 0.01


def test_small_tensors_never_cost_more_than_stored_as_they_are():
    sd = {"w": np.random.default_rng(2).normal(size=4096).astype(np.float32),
          "tiny.bias": np.array([0.1, -0.2], np.float32), **{f"step{i}": np.array(i, np.int64) for i in range(6)}}
    info = mucsc.inspect(mucsc.encode(sd, z=256, policy=mucsc.Policy()))
    groups = {g.records: g for g in info.groups}
    assert groups[("w",)].codec == "mucsc"
    ints = [g for g in info.groups if "step0" in g.records][0]
    assert ints.codec == "raw" and ints.records == tuple(f"step{i}" for i in range(6))  # one group, not six
    bias = [g for g in info.groups if "tiny.bias" in g.records][0]
    assert bias.codec in ("raw", "fp16") and bias.bytes <= 32 + 8
    assert info.version == "1.1"  # a pooled raw group is a 1.1 feature


def test_a_message_without_pooled_groups_stays_1_0():
    sd = {"w": np.random.default_rng(3).normal(size=2048).astype(np.float32), "n": np.array([1], np.int64)}
    blob = mucsc.encode(sd, policy=mucsc.Policy(max_error=0.01))
    assert blob[9] == 0 and mucsc.inspect(blob).version == "1.0"


def test_pooled_raw_group_in_a_1_0_message_is_rejected():
    blob = bytearray(mucsc.encode({"a": np.arange(2), "b": np.arange(3)}, "raw", policy=mucsc.Policy()))
    assert blob[9] == 1
    blob[9] = 0
    blob[-4:] = (__import__("zlib").crc32(bytes(blob[:-4]))).to_bytes(4, "little")
    with pytest.raises(FormatError, match="1.1"):
        mucsc.decode(bytes(blob))


def test_update_policy_keeps_codec_z_and_exact_carriers():
    rng = np.random.default_rng(4)
    upd = {"w": rng.normal(size=(256, 256)).astype(np.float32) * 1e-3, "frozen": np.zeros(100, np.float32),
           "b": rng.normal(size=300).astype(np.float32) * 1e-4}
    blob, st = mucsc.encode_with_stats(upd, z=16, policy=mucsc.Policy(lossy_fp16=False))
    info = mucsc.inspect(blob)
    w = [g for g in info.groups if g.records == ("w",)][0]
    assert w.codec == "mucsc" and w.params["z"] == 16
    out = mucsc.decode(blob)
    assert np.array_equal(out["frozen"], upd["frozen"])
    assert st.ratio >= 8


def test_shared_grouping_reports_per_tensor_damage():
    sd = weights()
    _, st = mucsc.encode_with_stats(sd, z=16)  # the paper's flattened vector
    by = {t.name: t for t in st.tensors}
    assert by["fc.bias"].rel_error is None and by["fc.bias"].abs_error > 0  # zeros decode to noise
    assert by["bn.count"].rel_error == 0.0 and by["bn.count"].codec == "raw"
    assert len({t.bits_per_element for t in st.tensors if t.codec == "mucsc"}) == 1


def test_deterministic_and_seeded():
    sd = weights()
    a = mucsc.encode(sd, seed=5, policy=mucsc.Policy(max_error=0.01))
    assert a == mucsc.encode(sd, seed=5, policy=mucsc.Policy(max_error=0.01))
    assert a != mucsc.encode(sd, seed=6, policy=mucsc.Policy(max_error=0.01))


def test_bad_policy_parameters():
    for bad in (0, 1, -0.1, float("nan"), True, "1%"):
        with pytest.raises(ParameterError):
            mucsc.Policy(max_error=bad)
    with pytest.raises(ParameterError, match="no max_error parameter"):
        mucsc.encode(weights(), "qsgd", policy=mucsc.Policy(max_error=0.01))


def test_per_tensor_target_uses_the_codecs_own_choice_of_z():
    """The policy's Z is the mucsc codec's max_error choice (mucsc.codec.numerics.allocate), measured too."""
    x = np.random.default_rng(7).normal(size=20000).astype(np.float32)
    codec = mucsc.get_codec("mucsc").for_container(compressing=True)
    for target in (0.01, 0.05):
        c, enc = encode_within(x, codec, target, lambda a: np.random.default_rng(a))
        alone = mucsc.inspect(mucsc.encode(x, max_error=target, seed=0)).groups[0].params["z"]
        assert enc.params["z"] == alone
        y = mucsc.get_codec("mucsc").decode_array(x.size, enc.params, {s.tag: memoryview(s.tobytes()).cast("B")
                                                                       for s in enc.sections}, np.dtype("f4"))
        assert rel(y, x) <= target


def test_measured_error_overshoot_is_retried_tighter():
    x = np.random.default_rng(8).normal(size=60).astype(np.float32)  # few elements: error strays from J
    codec = mucsc.get_codec("mucsc").for_container(compressing=True)
    for seed in range(10):
        found = encode_within(x, codec, 0.02, lambda a, s=seed: np.random.default_rng([s, a]))
        if found is not None:
            c, enc = found
            y = type(c).decode_array(x.size, enc.params, {s.tag: memoryview(s.tobytes()).cast("B")
                                                          for s in enc.sections}, np.dtype("f4"))
            assert rel(y, x) <= 0.02


def test_fp16_exact():
    assert fp16_exact(np.array([0.5, -2.0, 0.0, -0.0], np.float32))
    assert not fp16_exact(np.array([0.1], np.float32))
    assert not fp16_exact(np.array([1e6], np.float32))
    # checked a chunk at a time: the first value float16 misses decides, wherever it lies
    exact = np.random.default_rng(0).integers(-2048, 2048, 200_000).astype(np.float32) / 64
    exact[150_000] = -0.0
    assert fp16_exact(exact) and fp16_exact(exact.astype(np.float64))
    for at in (0, 1023, 1024, 70_000, 199_999):
        y = exact.copy()
        y[at] = 1.0 + 2.0 ** -12  # between two float16 values
        assert not fp16_exact(y) and not fp16_exact(y.astype(np.float64))


def test_stats_tensors_in_record_order_and_to_dict():
    sd = weights()
    blob, st = mucsc.encode_with_stats(sd, policy=mucsc.Policy(max_error=0.01))
    assert [t.name for t in st.tensors] == list(sd)
    d = st.to_dict()["tensors"][0]
    assert set(d) >= {"name", "dtype", "shape", "codec", "bits_per_element", "rel_error"}
    # a policy's message needs nothing newer than 1.1 (a writer stamps the lowest version that reads it)
    assert mucsc.inspect(blob).version in ("1.0", "1.1") and fmt.MINOR >= 1


def test_vectors_as_fp16_within_their_bound_and_named_tensors_exact():
    """Model mode's 1-D rule (fp16 within vector_max_error, else raw) and ``lossless`` globs."""
    sd = weights()
    sd["ln.weight"] = (1 + 0.05 * np.random.default_rng(3).normal(size=512)).astype(np.float32)
    sd["tiny.bias"] = np.full(300, 1e-6, np.float32)  # fp16 subnormals: ~1.7% off, so raw
    policy = mucsc.Policy(max_error=0.05, vector_max_error=0.001, lossless=("fc.w*",))
    blob, stats = mucsc.encode_with_stats(sd, policy=policy)
    out = mucsc.decode(blob)
    by = {t.name: t for t in stats.tensors}
    assert by["ln.weight"].codec == "fp16" and rel(out["ln.weight"], sd["ln.weight"]) <= 0.001
    assert by["conv.bias"].codec == "fp16" and by["tiny.bias"].codec == "raw"
    assert np.array_equal(out["tiny.bias"], sd["tiny.bias"])
    assert by["fc.weight"].codec == "raw" and np.array_equal(out["fc.weight"], sd["fc.weight"])
    assert by["conv.weight"].codec == "mucsc"  # not named, not 1-D: coded
    plain = {t.name: t for t in mucsc.encode_with_stats(sd, policy=mucsc.Policy(max_error=0.05))[1].tensors}
    assert plain["ln.weight"].codec == "mucsc" and plain["fc.weight"].codec == "mucsc"


def test_bad_vector_bound_and_lossless_patterns():
    for bad in (0, 1, float("inf"), True):
        with pytest.raises(ParameterError, match="vector_max_error"):
            mucsc.Policy(vector_max_error=bad)
    for bad in ("fc.*", ("",), (3,)):
        with pytest.raises(ParameterError, match="glob"):
            mucsc.Policy(lossless=bad)
    assert mucsc.Policy(lossless=["a*"]).lossless == ("a*",)
