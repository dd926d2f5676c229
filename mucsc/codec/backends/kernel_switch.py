"""A family of Triton kernels' on/off state in this process: each variant (device, dtypes, ...) is
self-checked against the reference path once before its first use, and the first failure turns the
family off for good, with one warning (the torch path then writes the same bytes)."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Hashable


class KernelSwitch:
    """Which variants passed their self-check, and why the kernels were turned off (if they were)."""

    def __init__(self, what: str, fallback: str):
        self.what, self.fallback = what, fallback  # the warning's words: "the ... are disabled (...); <fallback>"
        self.disabled: str | None = None  # None, or why the kernels were turned off
        self._checked: dict[Hashable, bool] = {}
        self._lock = threading.Lock()
        # one first use (compile + probes) at a time: groups encode on several threads
        self._check_lock = threading.Lock()

    def ready(self, variant: Hashable, check: Callable[[], bool]) -> bool:
        """Whether ``variant`` may run: it passed ``check`` (run once, the first time) and the kernels
        are not off."""
        if not self._checked.get(variant):
            with self._check_lock:
                if self.disabled is not None or (not self._checked.get(variant) and not check()):
                    return False
        return True

    def passed(self, variant: Hashable) -> None:
        """Remember that ``variant``'s self-check matched the reference."""
        self._checked[variant] = True

    @property
    def checked(self) -> bool:
        """Whether any variant passed its self-check."""
        return bool(self._checked)

    def disable(self, why: str) -> None:
        """Turn the kernels off for this process, with one warning."""
        with self._lock:
            if self.disabled is not None:
                return
            self.disabled = why
        warnings.warn(f"mucsc: {self.what} disabled ({why}); {self.fallback}", RuntimeWarning, stacklevel=3)

    def reset(self) -> None:
        """Forget the self-check results and re-enable the kernels (tests)."""
        with self._lock:
            self.disabled = None
            self._checked.clear()
