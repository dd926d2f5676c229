"""mucsc.update: the one sign convention (update = new - base), layout and fingerprint checks."""

import numpy as np
import pytest

import mucsc
from mucsc.update import (
    BaseMismatchError,
    UpdateError,
    apply_update,
    make_update,
    squared_norm,
    widen_bfloat16,
)


def _model(seed):
    rng = np.random.default_rng(seed)
    return {"w": rng.normal(size=(6, 5)).astype(np.float32), "b": rng.normal(size=5).astype(np.float64),
            "steps": np.array([seed], dtype=np.int64)}


def test_update_is_new_minus_base_and_applies_back():
    base, new = _model(1), _model(2)
    upd = make_update(new, base)
    np.testing.assert_array_equal(upd["w"], new["w"] - base["w"])
    assert upd["w"].dtype == np.float32 and upd["b"].dtype == np.float64
    assert upd["steps"][0] == 2  # non-float tensors carry the new values
    back = apply_update(base, upd, expect=mucsc.fingerprint(base))
    for k in new:
        np.testing.assert_allclose(back[k], new[k], rtol=1e-6, atol=1e-6)
    assert list(back) == list(upd)


def test_in_place_only_when_asked():
    base, new = _model(1), _model(2)
    kept = new["w"].copy()
    make_update(new, base)
    np.testing.assert_array_equal(new["w"], kept)
    upd = make_update(new, base, in_place=True)
    assert upd["w"] is new["w"]


def test_layout_and_fingerprint_errors_name_the_problem():
    base, new = _model(1), _model(2)
    with pytest.raises(UpdateError, match=r"OLD: does not match NEW: tensors 'x' only in NEW"):
        make_update({**new, "x": np.zeros(2, np.float32)}, base, names=("NEW", "OLD"))
    with pytest.raises(UpdateError, match=r"tensor 'w' has shape \[6, 5\], new has \[30\]"):
        make_update({**new, "w": new["w"].reshape(-1)}, base)
    with pytest.raises(UpdateError, match=r"tensor 'b' is float64, new has float32"):
        make_update({**new, "b": new["b"].astype(np.float32)}, base)
    upd = make_update(new, base)
    with pytest.raises(BaseMismatchError) as info:
        apply_update(_model(3), upd, expect=mucsc.fingerprint(base))
    assert info.value.expected == mucsc.fingerprint(base) and info.value.got == mucsc.fingerprint(_model(3))
    assert isinstance(info.value, mucsc.InputError)


def test_squared_norm_counts_float_tensors_in_float64():
    t = {"a": np.full(3, 1e-30, np.float32), "i": np.array([7], np.int64)}
    assert squared_norm(t) == pytest.approx(3 * float(np.float32(1e-30)) ** 2, rel=1e-12)


def test_bfloat16_differences_and_widening():
    torch = pytest.importorskip("torch")
    base = {"w": torch.tensor([1.0, 2.0], dtype=torch.bfloat16)}
    new = {"w": torch.tensor([1.5, 1.0], dtype=torch.bfloat16)}
    upd = make_update(new, base)
    assert upd["w"].dtype == torch.bfloat16 and upd["w"].tolist() == [0.5, -1.0]
    wide, names = widen_bfloat16(apply_update(base, upd))
    assert names == ["w"] and wide["w"].dtype == np.float32 and wide["w"].tolist() == [1.5, 1.0]
