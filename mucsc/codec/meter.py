"""A tick per trial encoding of a goal's search, for the API's progress hook.

A goal (``bits=``, ``size=``, ``max_error=``) is met by trial encodings whose number is not known in
advance (tens for one tensor, each a pass over it), so one long tensor would otherwise hold a progress
bar still for its whole search.  The API sets a callable for the duration of one tensor's search
(:func:`ticking`) and each trial calls :func:`tick`.  A context variable: a concurrent call on
another thread sees its own callable or none.  A leaf module, open to every codec layer.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator

_on_tick: contextvars.ContextVar[Callable[[], None] | None] = contextvars.ContextVar("mucsc_meter", default=None)


def tick() -> None:
    """One more trial encoding done (nothing happens outside :func:`ticking`)."""
    f = _on_tick.get()
    if f is not None:
        f()


@contextlib.contextmanager
def ticking(on_tick: Callable[[], None] | None) -> Iterator[None]:
    """:func:`tick` calls ``on_tick`` inside this block (None: does nothing)."""
    token = _on_tick.set(on_tick)
    try:
        yield
    finally:
        _on_tick.reset(token)
