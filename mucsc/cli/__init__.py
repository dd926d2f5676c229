"""The ``mucsc`` command (click): ``main`` (compress, decompress, info, test), ``rate`` (sizes per codec)
and, imported only when run, ``mucsc sim`` from :mod:`mucsc.fedsim.cli` (``lazy``).

``codec_options`` makes the codec options of ``compress`` from the codecs' typed ``Params`` fields,
``defaults`` picks the model / update / shared mode, ``report`` and ``errors`` word the output and the
exit codes, ``auth_options`` the signing options.

May import: the public API (``import mucsc``, never ``mucsc.codec``: tests/test_codec_objects.py),
:mod:`mucsc.update`, :mod:`mucsc.tensorfiles`, the utility modules (:mod:`mucsc.errors`,
:mod:`mucsc.optional`, :mod:`mucsc.progress`, :mod:`mucsc.texttable`); the simulator only by name,
through ``lazy``.  Nothing imports the CLI.
"""
