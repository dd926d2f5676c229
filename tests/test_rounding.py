"""mucsc's ``rounding`` parameter: "nearest" (FORMAT.md 4.3.1) next to the default "stochastic"."""

import numpy as np
import pytest

import mucsc
from mucsc.codec.wire import container as fmt
from mucsc.codec.numerics import nearest
from mucsc.errors import ParameterError


def gauss(n, seed=0):
    return np.random.default_rng(seed).normal(size=n).astype(np.float32)


def heavy(n, seed=0):
    return np.random.default_rng(seed).standard_t(3, n).astype(np.float32)


def group_params(blob):
    return fmt.read_message(blob).header.groups[0].params


def test_rounding_is_validated():
    with pytest.raises(ParameterError, match="rounding must be one of stochastic, nearest, dithered"):
        mucsc.encode(gauss(10), "mucsc", rounding="floor")


def test_nearest_sends_each_element_to_its_nearest_level_and_reports_the_squared_error():
    x = heavy(5000, 1)
    blob, stats = mucsc.encode_with_stats(x, "mucsc", z=8, rounding="nearest")
    c = np.frombuffer(bytes(fmt.read_message(blob).payload(
        next(s for s in fmt.read_message(blob).sections if s.tag == "CENT"))), "<f4")
    y = mucsc.decode(blob)
    best = c[np.argmin(np.abs(x[:, None].astype(np.float64) - c[None, :]), axis=1)]
    assert np.array_equal(y, best)
    assert stats.J == pytest.approx(float(np.sum((y.astype(np.float64) - x) ** 2)), rel=1e-9)
    p = group_params(blob)
    assert p["rounding"] == "nearest" and p["solver"] == "lloyd-max" and p["centroids"] == 8
    assert fmt.read_message(blob).minor == 0  # packed IDs: the key is informative, still a 1.0 message
    assert mucsc.encode(x, "mucsc", z=8, rounding="nearest", seed=5) == blob  # draws nothing


def test_ties_go_to_the_lower_level():
    ids, err = nearest.assign(np.array([0.5, 1.5, 0.25], np.float32), np.array([0.0, 1.0, 2.0], np.float32))
    assert ids.tolist() == [0, 1, 0] and err == pytest.approx(0.25 + 0.25 + 0.0625)


def test_lloyd_max_levels_reach_the_known_gaussian_optimum():
    # Max (1960): the 4-level quantizer of N(0, 1) has mean squared error 0.1175
    x = np.random.default_rng(2).normal(size=400_000)
    c = nearest.lloyd_max(x, 4)
    assert nearest.assign(x, c)[1] / x.size == pytest.approx(0.1175, rel=0.01)


@pytest.mark.parametrize("data", [gauss, heavy])
def test_nearest_halves_the_error_of_stochastic_rounding_at_equal_z(data):
    x = data(20_000, 3)
    j = {r: mucsc.encode_with_stats(x, "mucsc", z=16, rounding=r)[1].J for r in ("stochastic", "nearest")}
    assert j["nearest"] < 0.7 * j["stochastic"]


def test_nearest_goals():
    x = heavy(20_000, 4)
    blob, stats = mucsc.encode_with_stats(x, "mucsc", bits=2, rounding="nearest")
    assert 8 * len(blob) <= 2 * x.size and group_params(blob)["rounding"] == "nearest"
    stoch = mucsc.encode_with_stats(x, "mucsc", bits=2)[1].J
    assert stats.J < stoch
    blob, stats = mucsc.encode_with_stats(x, "mucsc", max_error=0.02, rounding="nearest")
    y = mucsc.decode(blob)
    assert np.linalg.norm(y - x) <= 0.02 * np.linalg.norm(x)


def test_nearest_is_biased_so_it_gets_error_feedback():
    assert mucsc.get_codec("mucsc", rounding="nearest").biased
    assert not mucsc.get_codec("mucsc").biased


def test_nearest_same_bytes_from_a_torch_tensor():
    torch = pytest.importorskip("torch")
    x = gauss(3000, 5)
    assert (mucsc.encode(torch.from_numpy(x), "mucsc", z=8, rounding="nearest")
            == mucsc.encode(x, "mucsc", z=8, rounding="nearest"))
