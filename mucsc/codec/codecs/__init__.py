"""Built-in codecs.  Every module in this package registers its codec(s) on import; they are found
automatically, so adding a codec is adding a module."""

import importlib
import pkgutil

for _mod in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    if not _mod.startswith("_"):
        importlib.import_module(f"{__name__}.{_mod}")
