"""The FedAvg simulator behind ``mucsc sim`` (paper section VI): data sets, partitions and models, one
local-SGD and evaluation loop (``training``), the compressed up/down links (``transport``,
``updates``), the engines that run a sweep (``engines``: built-in, Flower), its typed settings
(``config.SimConfig``), the reports and the command (``cli``).

May import: the public API (``import mucsc``, never ``mucsc.codec``: tests/test_codec_objects.py),
:mod:`mucsc.flower` (the Flower engine), the utility modules (:mod:`mucsc.errors`,
:mod:`mucsc.progress`, :mod:`mucsc.texttable`) and torch; only the CLI imports it (lazily).
"""
