"""The goal search's shortcuts give what the plain computations give (bytes pinned separately in
tests/test_goal_digests.py): the solver cache across Z, and one rounding for both ID codings of a Z."""

import numpy as np
import pytest

from mucsc.codec.numerics import centroids
from mucsc.codec.codecs.clusters import ClusterTrials
from mucsc.codec.codecs.mucsc import MucscParams
from mucsc.codec.ratecontrol.search import ClusterSearch


@pytest.mark.parametrize("kind", ["t3", "few", "subsampled"])
def test_solver_cache_gives_the_same_levels_for_every_z(kind, monkeypatch):
    rng = np.random.default_rng(4)
    if kind == "few":
        x = rng.choice(np.array([-1.5, 0.0, 0.25, 2.0, 7.0], np.float32), 6000)
    else:
        x = rng.standard_t(3, 30000).astype(np.float32)
    if kind == "subsampled":  # the weighted-subsample path at a test's size
        monkeypatch.setattr(centroids, "FULL_SORT_MAX", 4096)
        monkeypatch.setattr(centroids, "SUBSAMPLE", 2048)
    cache: dict = {}
    for z in (2, 3, 4, 5, 8, 16, 40, 256, 300, 1000, 4):  # revisits too
        assert np.array_equal(centroids.solve(x, z, cache=cache), centroids.solve(x, z))
    assert cache  # it was used


def test_one_rounding_serves_both_id_codings():
    x = np.random.default_rng(5).laplace(size=20000).astype(np.float32)
    p = MucscParams()

    def group():
        return ClusterSearch(ClusterTrials(x, p), lambda: np.random.default_rng([7, 0]), 3)

    g = group()
    packed = g.measure(12, coding="packed")
    shared = g.measure(12, coding="rans")  # from the packed measurement's IDs
    assert not g._stash
    fresh = group().measure(12, coding="rans")  # solved and rounded again
    assert shared == fresh and packed != shared
    assert [o.key.coding for o in g.options] == ["packed", "rans"]
