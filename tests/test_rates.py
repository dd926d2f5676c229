"""The paper's compression-rate formulas (eq. CompressionRateofMUCSC, eq. CompressRateB) against the
real codecs' message sizes (issue 3, "Paper check"), and the ``mucsc rate`` command."""

import json

import numpy as np
import pytest
from click.testing import CliRunner

import mucsc
from mucsc.cli.rate import rate
from mucsc.codec.api import rates

D_ALLCNN = 1_369_738


def test_allcnn_dimension():
    assert rates.allcnn_parameter_count() == D_ALLCNN
    torch = pytest.importorskip("torch")  # noqa: F841
    from mucsc.fedsim.models import all_cnn
    assert sum(p.numel() for p in all_cnn().parameters()) == D_ALLCNN


def test_formulas_against_the_papers_numbers():
    d = D_ALLCNN
    # section VI-A: "the computed uplink/downlink compression rate is 10.67/8.0" (mean ceil(log2 Z_U) = 3)
    up = np.mean([rates.paper_mucsc_bytes(d, z) for z in (4, 8, 16)])
    assert 4 * d / up == pytest.approx(32 / 3, rel=1e-3)
    assert 4 * d / rates.paper_mucsc_bytes(d, 16) == pytest.approx(8.0, rel=1e-3)
    # eq. CompressionRateofMUCSC with Z_U in {4, 8, 16}: 14.88; the paper's table lists 14.54, which is
    # the formula with ceil(log2 Z_U) = 4 for every client (Z_U = 16)
    assert rates.paper_mucsc_rate(d, (4, 8, 16), 16, 0.1) == pytest.approx(14.88, abs=0.005)
    assert rates.paper_mucsc_rate(d, 16, 16, 0.1) == pytest.approx(14.54, abs=0.005)
    # eq. CompressRateB, d0 = 0.01 d, Z = 256: the paper's table says 196.57
    assert rates.paper_bmucsc_rate(d, 0.01 * d, 256, 256, 0.1) == pytest.approx(196.57, rel=2e-4)
    # the d >> Z limits of both equations
    assert rates.paper_mucsc_rate(10**12, 4, 16, 0.1) == pytest.approx(16 * 4 / (2 * 0.1 + 4), rel=1e-6)


@pytest.fixture(scope="module")
def allcnn_rows():
    return {r.label: r for r in rates.paper_check(D_ALLCNN, (4, 8, 16), 16, 0.1, 0.01, 256)}


def test_fixed_width_modes_reproduce_the_formulas(allcnn_rows):
    rows = list(allcnn_rows.values())
    m_formula, m_off, m_auto, b_formula, b_paper, b_auto = rows
    assert m_formula.kind == b_formula.kind == "formula"
    assert abs(m_off.rate / m_formula.rate - 1) < 0.01  # measured -0.05%
    assert abs(b_paper.rate / b_formula.rate - 1) < 0.01  # measured -0.96% (framing of ~490 bytes)
    # ... and the compact modes beat them
    assert m_auto.rate > m_formula.rate * 1.05
    assert b_auto.rate > b_formula.rate * 1.5


def test_fixed_width_payload_is_the_papers_count():
    """Without framing, the sections hold exactly the paper's bytes (up to rounding to whole bytes)."""
    d, d0, z = 200_003, 2001, 256
    x = np.random.default_rng(0).standard_normal(d).astype(np.float32)
    info = mucsc.inspect(mucsc.encode(x, "bmucsc", keep=d0 / d - 1e-9, z=z, positions="paper", compress="off"))
    payload = sum(s.raw_bytes for s in info.sections if s.tag != "HEAD")
    assert 0 <= payload - rates.paper_bmucsc_bytes(d, d0, z) < 2
    for zz in (4, 8, 16):
        info = mucsc.inspect(mucsc.encode(x, "mucsc", z=zz, compress="off"))
        payload = sum(s.raw_bytes for s in info.sections if s.tag != "HEAD")
        assert 0 <= payload - rates.paper_mucsc_bytes(d, zz) < 1


def test_message_bytes_formula_matches_spec_example():
    # FORMAT.md 4.2: 24 + (32 + H + pad(H)) + sum(32 + B + pad(B)) + 4
    assert rates.message_bytes(5, [3, 8]) == 24 + 32 + 5 + 3 + 32 + 3 + 5 + 32 + 8 + 4
    assert mucsc.plugin.ceil_log2(1) == 0 and mucsc.plugin.ceil_log2(2) == 1 and mucsc.plugin.ceil_log2(1_300_000) == 21
    assert mucsc.plugin.ceil_log2(1 << 20) == 20 and mucsc.plugin.ceil_log2((1 << 20) + 1) == 21


def test_rate_command_json():
    res = CliRunner().invoke(rate, ["--dim", "20000", "--zu", "4", "--zu", "16", "--json", "--baselines"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["d"] == 20000 and out["z_u"] == [4, 16] and len(out["rows"]) == 6
    assert out["rows"][0]["rate"] == pytest.approx(rates.paper_mucsc_rate(20000, (4, 16), 16, 0.1))
    assert {b["codec"] for b in out["baselines"]} >= {"none", "stc", "qsgd s=15"}
    none = next(b for b in out["baselines"] if b["codec"] == "none")
    assert none["formula_payload"] == 80000 and 80000 < none["measured_off"] < 80000 + 400
    # every registered codec has its rows, from the registry (no list to edit when a codec is added)
    assert {name for name, _ in rates.baselines()} == set(mucsc.available_codecs())
    assert ("dgc", {"positions": "paper"}) in rates.baselines() and ("qsgd", {"s": 255}) in rates.baselines()
    assert len(out["baselines"]) == len(rates.baselines())


def test_rate_command_text():
    res = CliRunner().invoke(rate, ["--dim", "5000"])
    assert res.exit_code == 0, res.output
    assert "MUCSC, the paper's formula" in res.output and "B-MUCSC, the paper's formula" in res.output
    assert "eq." not in res.output and "CompressionRateofMUCSC" not in res.output  # words, not LaTeX labels
    assert "eq." not in CliRunner().invoke(rate, ["--dim", "5000", "--baselines", "--json"]).output
    bad = CliRunner().invoke(rate, ["--dim", "5000", "--kn", "0"])
    assert bad.exit_code == 2
