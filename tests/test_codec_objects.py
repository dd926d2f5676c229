"""Codec objects as the single source of truth: encode by object or by name gives the same bytes;
each codec states its section sizes, paper formula, limits, bias and error-feedback memory; the
outer layers (CLI, simulator) use only the public API."""

import json
import re
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import mucsc
from mucsc.cli.main import main
from mucsc.errors import ParameterError, SizeError

ROOT = Path(__file__).resolve().parent.parent


def _x(n=5000, seed=0):
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32)


@pytest.mark.parametrize("name,params", [("mucsc", {"z": 8}), ("bmucsc", {"keep": 0.05, "z": 16}),
                                         ("stc", {}), ("qsgd", {"s": 3}), ("none", {})])
@pytest.mark.parametrize("compress", ["auto", "off"])
def test_object_and_name_give_the_same_bytes(name, params, compress):
    x = _x()
    codec = mucsc.get_codec(name, **params)
    assert mucsc.encode(x, codec, seed=3, compress=compress) == mucsc.encode(x, name, seed=3, compress=compress,
                                                                             **params)
    blob, stats = mucsc.encode_with_stats(x, codec, seed=3, compress=compress)
    assert blob == mucsc.encode(x, codec, seed=3, compress=compress) and stats.message_bytes == len(blob)


def test_object_with_extra_params_is_refused():
    with pytest.raises(ParameterError, match="get_codec"):
        mucsc.encode(_x(), mucsc.get_codec("mucsc"), z=4)
    with pytest.raises(ParameterError):
        mucsc.encode(_x(), 42)


def test_codec_objects_are_values():
    a, b = mucsc.get_codec("mucsc", z=8), mucsc.get_codec("mucsc", z="8")
    assert a == b and hash(a) == hash(b) and a != mucsc.get_codec("mucsc", z=16)
    assert a.replace(z=4) == mucsc.get_codec("mucsc", z=4) and a.params.z == 8
    with pytest.raises(ParameterError):
        a.replace(z=1)
    assert a.for_container(compressing=True).params.id_packing == "aligned"
    assert a.for_container(compressing=False).params.id_packing == "tight"


def test_bias_and_default_error_feedback():
    for name in mucsc.available_codecs():
        codec = mucsc.get_codec(name)
        assert codec.biased == (not (codec.unbiased or codec.lossless))
        assert mucsc.Compressor(codec).error_feedback == codec.biased
    assert not mucsc.get_codec("mucsc").biased and mucsc.get_codec("topk").biased


def test_paper_bytes_only_where_the_paper_has_a_formula():
    d = 1_369_738
    assert mucsc.get_codec("mucsc", z=16).paper_bytes(d) == 4 / 8 * d + 4 * 16
    b = mucsc.get_codec("bmucsc", keep=0.01, z=256).paper_bytes(d)
    assert b == (8 + mucsc.plugin.ceil_log2(d)) / 8 * 13698 + 4 * 256 + 4
    assert all(mucsc.get_codec(n).paper_bytes(d) is None for n in ("none", "qsgd", "stc", "dgc", "signsgd"))


def test_section_sizes_estimate_and_data_dependence():
    topk = mucsc.get_codec("topk", keep=0.01)
    with pytest.raises(SizeError, match="data-dependent"):
        topk.section_sizes(10_000)
    est = topk.section_sizes(10_000, estimate=True)
    assert est["VALS"] == 400 and 0 < est["INDX"] <= 10_000 // 8
    x = _x(10_000)
    measured = {s.tag: s.raw_bytes for s in mucsc.inspect(mucsc.encode(x, topk, compress="off")).sections[1:]}
    assert measured["VALS"] == est["VALS"] and abs(measured["INDX"] - est["INDX"]) < 0.1 * est["INDX"]
    with pytest.raises(SizeError):
        mucsc.get_codec("qsgd", coding="elias").section_sizes(100)
    with pytest.raises(SizeError):
        mucsc.get_codec("mucsc", z=8, id_packing="aligned").section_sizes(100)


def test_one_z_range_everywhere():
    lo, hi = mucsc.Z_RANGE
    for name in ("mucsc", "bmucsc"):
        assert mucsc.codec_class(name).limits["z"] == mucsc.Z_RANGE
        mucsc.get_codec(name, z=lo), mucsc.get_codec(name, z=hi)
        for bad in (lo - 1, hi + 1):
            with pytest.raises(ParameterError):
                mucsc.get_codec(name, z=bad)
    from mucsc.fedsim.config import SimConfig  # the simulator's Z_U / Z_D checks use the same range
    SimConfig(z_up=(lo, hi), z_down=hi)
    with pytest.raises(mucsc.InputError):
        SimConfig(z_down=hi + 1)


def test_cli_reports_the_resolved_parameters(tmp_path):
    src = tmp_path / "x.npy"
    np.save(src, _x(2000))
    res = CliRunner().invoke(main, ["compress", str(src), "--z", "8", "--json"])
    assert res.exit_code == 0, res.output
    params = json.loads(res.stdout)["params"]
    assert params["z"] == 8 and params["id_packing"] == "aligned"
    res = CliRunner().invoke(main, ["compress", str(src), "--z", "8", "--compress", "off", "-f"])
    assert res.exit_code == 0, res.output
    assert "id_packing=tight" in res.output and "id_packing=auto" not in res.output


def test_outer_layers_use_only_the_public_api():
    """No import of the codec's internals under mucsc/cli or mucsc/fedsim (issue 8)."""
    internal = re.compile(r"^\s*(from|import)\s+mucsc\.codec\b", re.M)
    for layer in ("cli", "fedsim"):
        for path in sorted((ROOT / "mucsc" / layer).rglob("*.py")):
            found = internal.findall(path.read_text())
            assert not found, f"{path.relative_to(ROOT)} imports codec internals"


def test_group_stats_show_what_each_group_resolved():
    """GroupStats.config: the group codec's parameters with its encoding's choices filled in (a
    goal's z, id_coding "auto" -> packed/rans, positions "auto" -> the code used)."""
    x = np.random.default_rng(5).standard_normal(20000).astype(np.float32)
    _, st = mucsc.encode_with_stats(x, mucsc.get_codec("mucsc", z=8))
    assert st.groups[0].config["z"] == 8 and st.groups[0].config["id_coding"] == "packed"
    blob, st = mucsc.encode_with_stats(x, mucsc.get_codec("mucsc", bits=2))
    cfg, hdr = st.groups[0].config, mucsc.inspect(blob).groups[0].params
    assert cfg["z"] == hdr["z"] and cfg["id_coding"] == hdr.get("id_coding", "packed") and cfg["bits"] is None
    blob, st = mucsc.encode_with_stats(x, "topk", keep=0.05)
    assert st.groups[0].config["positions"] == mucsc.inspect(blob).groups[0].params["pos"] != "auto"
    blob, st = mucsc.encode_with_stats(x, "bmucsc", z=16, positions="paper")
    assert st.groups[0].config["positions"] == "paper" and st.groups[0].config["keep"] == 0.01
