"""Goals chosen from the sorted summary (mucsc.codec.ratecontrol.summary_search): the message meets
the goal exactly (budget, error bound), the planner's one encoding is the message's, and the model's
J and counts are what eq. 7 and 8-9 give on the data."""

import dataclasses

import numpy as np
import pytest

import mucsc
from mucsc.codec.numerics import allocate, centroids
from mucsc.codec.numerics.summary import Summary
from mucsc.codec.ratecontrol import planner, summary_search
from mucsc.codec.ratecontrol.goal import Goal

pytestmark = pytest.mark.backends  # .ci/run's torch and numpy passes run it too

D = summary_search.MIN_ELEMENTS + 1000


def _x(kind: str) -> np.ndarray:
    rng = np.random.default_rng(11)
    return (rng.standard_t(3, D) if kind == "t3" else rng.normal(size=D)).astype(np.float32)


@pytest.mark.parametrize("kind", ["gauss", "t3"])
@pytest.mark.parametrize("bits", [0.3, 2.0, 5.0])
def test_budget_is_met_and_nearly_filled(kind, bits):
    x = _x(kind)
    blob, st = mucsc.encode_with_stats(x, "mucsc", bits=bits)
    assert len(blob) <= bits * D / 8
    if bits >= 2:  # many levels: the step moves them continuously and fills the budget (few: it jumps)
        assert len(blob) >= 0.99 * bits * D / 8
    (g,) = st.groups
    assert g.config["levels_by"] == "uniform" and g.config["id_coding"] == "rans"


@pytest.mark.parametrize("kind", ["gauss", "t3"])
@pytest.mark.parametrize("bound", [0.3, 0.05, 0.01])
def test_error_bound_is_met_closely(kind, bound):
    x = _x(kind)
    blob, st = mucsc.encode_with_stats(x, "mucsc", max_error=bound)
    rel = np.sqrt(st.groups[0].stats["J"] / float(np.dot(x.astype(np.float64), x)))
    assert 0.99 * bound <= rel <= bound
    y = mucsc.decode(blob)
    assert np.linalg.norm(y - x) / np.linalg.norm(x) < 1.1 * bound


def test_model_matches_the_data():
    x = _x("t3")
    lo, hi = float(x.min()), float(x.max())
    levels = np.concatenate(([lo], np.linspace(-3, 3, 13), [hi]))
    J, counts = Summary(x, lo, hi).stats(levels)
    assert J == pytest.approx(centroids.variance_J(x, levels), rel=1e-9)
    k = np.clip(np.searchsorted(levels, x, side="right") - 1, 0, levels.size - 2)
    a, b = levels[k], levels[k + 1]
    p = (x - a) / (b - a)  # eq. 7: the chance of the upper level
    expected = np.bincount(k, 1 - p, levels.size) + np.bincount(k + 1, p, levels.size)
    assert np.allclose(counts, expected, rtol=1e-9, atol=1e-6)


def test_the_planned_encoding_is_the_message():
    x = _x("gauss")
    a = mucsc.encode(x, "mucsc", bits=2.0, seed=5)
    codec = mucsc.get_codec("mucsc", bits=2.0)
    enc = codec.encode_array(x, np.random.default_rng([5, 0]))  # planned alone: the same encoding
    fixed = mucsc.inspect(a).groups[0].params
    assert enc.params == fixed


class _Sparse:
    """A search of estimated options 16 bytes apart whose exact sizes are 992 bytes larger (subsampled
    counts: the round-1 FEMNIST update at bits=0.5 was such a case)."""

    estimates = True

    def __init__(self, n: int):
        self.x, self.norm2 = np.zeros(n), 1.0
        self.options = [allocate.Option(8 + 16 * i, 1e6 / (8 + 16 * i), _Key(8 + 16 * i)) for i in range(5_300)]

    def sweep(self, stop, goal):
        pass

    def refine(self, best, ok, better):
        return best

    refine_z = refine

    def exact(self, o):
        return dataclasses.replace(o, bytes=o.bytes + 992)

    def floor_note(self, o):
        return ""


@dataclasses.dataclass(frozen=True)
class _Key:
    size: int
    params: tuple = ()


@pytest.mark.parametrize("total", range(83_000, 83_016))
def test_an_estimate_far_under_its_exact_size_is_not_chosen_again(total):
    # The check after the split used to lower the goal by the overshoot only; a choice sitting below
    # the goal by more than that was chosen again each time, and after 8 checks the planner fell back
    # to the cheapest option (a z = 3 message of 0.02 bits per element at bits=0.5).
    codec = mucsc.get_codec("mucsc", size=total)
    ctx = planner.PlanContext(None, 10**6, 0, None, lambda params: 0)
    (o,) = planner.plan_goal(codec, Goal("size", total), [_Sparse(10**6)], ctx)
    assert total - 16 < o.bytes + 992 <= total
