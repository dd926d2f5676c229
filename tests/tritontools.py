"""Triton's interpreter for the tests: the kernels on CPU tensors, probed once per kernel module and process.

Where the interpreter cannot run a module's kernels (a triton or numpy release it does not support), the tests
that need it are skipped with the probe's reason instead of failing; and no kernel switch is left disabled for
later tests: a self-check that failed under the interpreter, or in an earlier test, is forgotten before and after
each test that uses the interpreter, so a CUDA run's kernels keep their own self-check.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from types import ModuleType

import pytest

#: kernel module name -> None (the interpreter runs its kernels) or why it cannot
_PROBED: dict[str, str | None] = {}


def _switches() -> list[ModuleType]:
    from mucsc.codec.backends import triton_lanes, triton_round

    return [triton_round, triton_lanes]


def _enable_all() -> None:
    for m in _switches():
        if m.disabled_reason() is not None:
            m.reset()


def interpreter(monkeypatch: pytest.MonkeyPatch, module: ModuleType, probe: Callable[[], bool]) -> Iterator[None]:
    """A fixture body: TRITON_INTERPRET=1 and MUCSC_TRITON=1 for the test, after ``probe()`` (``module``'s
    self-check on CPU tensors) passed once in this process; else the test is skipped with the reason."""
    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("MUCSC_TRITON", "1")
    _enable_all()
    key = module.__name__
    if key not in _PROBED:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the switch's one warning: the reason is kept below
            ok = probe()
        _PROBED[key] = None if ok else (module.disabled_reason() or "its self-check failed")
        _enable_all()
    if _PROBED[key] is not None:
        pytest.skip(f"Triton's interpreter cannot run {key.rsplit('.', 1)[-1]}'s kernels here: {_PROBED[key]}")
    try:
        yield
    finally:
        _enable_all()
