"""Rate control on bmucsc: bits= / size= / max_error= choose the keep fraction and the kept set's
coding; floors are refused with errors that name them (docs/codecs.md "Rate control")."""

import math

import numpy as np
import pytest

import mucsc
from mucsc.codec.codecs import bmucsc as B
from mucsc.codec.ratecontrol import sparse_search

from clitools import run
from mucsc.errors import ParameterError


def heavy(n, seed=0):
    return np.random.default_rng(seed).standard_t(3, n).astype(np.float32)


def rel(J, x):
    return math.sqrt(J / float(x.astype(np.float64) @ x))


@pytest.mark.parametrize("bits", [0.3, 1.0, 2.5])
def test_bits_meets_the_budget_and_beats_every_fixed_setting_that_fits(bits):
    x = heavy(20000, 1)
    blob, st = mucsc.encode_with_stats(x, "bmucsc", bits=bits)
    assert 8 * len(blob) <= bits * x.size
    g = mucsc.inspect(blob).groups[0].params
    assert g["keep"] in sparse_search.KEEP_LADDER and g["k"] == math.ceil(g["keep"] * x.size)
    y = mucsc.decode(blob)  # the header is all a decoder needs
    assert y.shape == x.shape and np.isfinite(y).all()
    for keep in (0.01, 0.05, 0.2):
        for z in (4, 16, 256):
            b2, s2 = mucsc.encode_with_stats(x, "bmucsc", keep=keep, z=z)
            if 8 * len(b2) <= bits * x.size:
                # the budget sweep of one keep stops when the kept set's J is NEGLIGIBLE next to the bias
                assert st.J <= s2.J * (1 + sparse_search.NEGLIGIBLE)


def test_more_bits_lower_J_and_the_goal_is_deterministic():
    x = heavy(20000, 2)
    Js = [mucsc.encode_with_stats(x, "bmucsc", bits=b)[1].J for b in (0.2, 0.5, 1.5)]
    assert all(a > b for a, b in zip(Js, Js[1:]))
    assert mucsc.encode(x, "bmucsc", bits=0.5, seed=3) == mucsc.encode(x, "bmucsc", bits=0.5, seed=3)


def test_given_keep_is_kept_and_only_the_coding_is_chosen():
    x = heavy(20000, 3)
    blob, st = mucsc.encode_with_stats(x, "bmucsc", keep=0.05, bits=0.6)
    assert 8 * len(blob) <= 0.6 * x.size
    p = mucsc.inspect(blob).groups[0].params
    assert p["keep"] == 0.05 and p["k"] == 1000
    # J is at least the mean replacement's (the error floor of a fixed keep)
    k, pos, kept, rest_sum = B.select(x, 0.05)
    assert st.J >= B.rest_bias(x, pos, B.rest_mean(x.size, k, rest_sum))


def test_size_meets_the_budget():
    x = heavy(20000, 4)
    for size in (1500, 4000):
        blob = mucsc.encode(x, "bmucsc", size=size, compress="off")
        assert len(blob) <= size


@pytest.mark.parametrize("e", [0.6, 0.3, 0.05])
def test_max_error_is_met(e):
    x = heavy(20000, 5)
    blob, st = mucsc.encode_with_stats(x, "bmucsc", max_error=e)
    assert rel(st.J, x) <= e
    # the cheapest: every fixed setting meeting the bound costs at least as much
    for keep in (0.01, 0.1, 0.5):
        for z in (16, 256):
            b2, s2 = mucsc.encode_with_stats(x, "bmucsc", keep=keep, z=z)
            if rel(s2.J, x) <= e:
                assert len(blob) <= len(b2)


def test_max_error_per_tensor_and_a_budget_split_across_tensors():
    rng = np.random.default_rng(6)
    data = {"a": heavy(8000, 6), "b": rng.normal(size=3000).astype(np.float32) * 1e-3, "n": np.arange(3)}
    blob, st = mucsc.encode_with_stats(data, "bmucsc", max_error=0.2, shared=False)
    for g in st.groups:
        if g.codec == "bmucsc":
            assert rel(g.stats["J"], data[g.records[0]]) <= 0.2
    blob = mucsc.encode(data, "bmucsc", bits=1.0, shared=False)
    assert 8 * len(blob) <= 1.0 * 11003
    assert {g.codec for g in mucsc.inspect(blob).groups} >= {"bmucsc"}


def test_infeasible_requests_name_their_floor():
    x = heavy(20000, 7)
    with pytest.raises(ParameterError, match=r"below the smallest bmucsc message.*positions \d+ bytes, the mean 4"):
        mucsc.encode(x, "bmucsc", bits=0.02)
    with pytest.raises(ParameterError, match="below the smallest bmucsc message"):
        mucsc.encode(x, "bmucsc", size=300)
    # a fixed keep: the mean replacement of the rest is the error floor
    with pytest.raises(ParameterError, match=r"keep=0.01: replacing the other 19800 elements by their mean alone "
                                             r"gives relative error 0\.\d+"):
        mucsc.encode(x, "bmucsc", keep=0.01, max_error=0.3)


@pytest.mark.parametrize("kw", [dict(z=8, bits=1), dict(bits=1, max_error=0.1), dict(size=100, max_error=0.1),
                                dict(bits=0), dict(max_error=-1), dict(size=0), dict(id_coding="huffman")])
def test_bad_goals(kw):
    with pytest.raises(ParameterError, match="bmucsc"):
        mucsc.get_codec("bmucsc", **kw)


def test_defaults_and_fixed_z_messages_unchanged_by_the_goal_fields():
    c = mucsc.get_codec("bmucsc")
    assert c.params.keep_fraction == 0.01 and c.params.fixed_z == 256 and c.params.target == "z"
    assert c.paper_bytes(10_000) == mucsc.get_codec("bmucsc", keep=0.01, z=256).paper_bytes(10_000)
    assert mucsc.get_codec("bmucsc", bits=1).paper_bytes(10_000) is None
    x = heavy(5000, 8)
    assert mucsc.encode(x, "bmucsc", seed=1) == mucsc.encode(x, "bmucsc", keep=0.01, z=256, seed=1)


def test_a_goal_replaces_the_presets_z_and_keep():
    cls = mucsc.codec_class("bmucsc")
    assert cls.with_preset({"z": 256, "keep": 0.01}, {"bits": 1.0}) == {"bits": 1.0}
    assert cls.with_preset({"z": 256, "keep": 0.01}, {"bits": 1.0, "keep": 0.1}) == {"bits": 1.0, "keep": 0.1}
    assert cls.with_preset({"z": 256, "keep": 0.01}, {"z": 16}) == {"z": 16, "keep": 0.01}


def test_direct_encode_array_uses_the_group_budget():
    x = heavy(20000, 9)
    codec = mucsc.get_codec("bmucsc", bits=1.0).for_container(compressing=True)
    a = codec.encode_array(x, np.random.default_rng(0))
    b = codec.encode_array(x, np.random.default_rng(0))
    assert a.params == b.params and [bytes(s.tobytes()) for s in a.sections] == [bytes(s.tobytes()) for s in b.sections]
    assert a.params["keep"] in sparse_search.KEEP_LADDER


def test_cli_bits_size_and_max_error_with_bmucsc(tmp_path):
    x = heavy(40000, 10)
    src = tmp_path / "u.npy"
    np.save(src, x)
    run(["compress", src, "-o", tmp_path / "b.mucsc", "--codec", "bmucsc", "--bits", "0.5", "-q"])
    blob = (tmp_path / "b.mucsc").read_bytes()
    assert 8 * len(blob) <= 0.5 * x.size and mucsc.inspect(blob).groups[0].codec == "bmucsc"
    run(["compress", src, "-o", tmp_path / "s.mucsc", "--codec", "bmucsc", "--size", "3000", "-q"])
    assert (tmp_path / "s.mucsc").stat().st_size <= 3000
    run(["compress", src, "-o", tmp_path / "e.mucsc", "--codec", "bmucsc", "--max-error", "20%", "-q"])
    y = mucsc.decode((tmp_path / "e.mucsc").read_bytes())
    assert np.linalg.norm(y - x) / np.linalg.norm(x) <= 0.2 * 1.05  # the measured error (policy checks it)
    r = run(["compress", src, "-o", tmp_path / "f.mucsc", "--codec", "bmucsc", "--bits", "0.01"], code=2)
    assert "below the smallest bmucsc message" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "f.mucsc").exists()
