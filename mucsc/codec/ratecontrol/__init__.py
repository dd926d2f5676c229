"""Rate control: goals (bits= / size= / max_error=) resolved to fixed codecs before encoding.

``goal`` (:class:`Goal`), ``search`` (one group's options by trial encodings of its clustering),
``sparse_search`` (bmucsc's: every keep fraction), ``dither_search`` (mucsc's dithered grid: the step), ``planner`` (:func:`plan`: one fixed codec per
group, the levels explicit in its parameters; :class:`PlanContext`), ``budget`` (a byte budget from
per-group summaries, each group encoded once: the shape a stream of tensors follows).  Codecs expose the measuring
protocol (``Codec.trials``); the search lives here, not in the codecs.

May import: :mod:`mucsc.codec.codecs`, :mod:`mucsc.codec.numerics`, :mod:`mucsc.codec.backends`,
:mod:`mucsc.codec.wire` (the container's stored section sizes), the leaf modules, :mod:`mucsc.errors`;
only the API imports it."""

from mucsc.codec.ratecontrol.goal import Goal  # noqa: F401
from mucsc.codec.ratecontrol.planner import PlanContext, needs_plan, plan  # noqa: F401
from mucsc.codec.ratecontrol import budget  # noqa: F401
