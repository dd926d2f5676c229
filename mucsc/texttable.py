"""Aligned plain-text tables: the one printer behind ``mucsc compress`` / ``info``'s reports and
``mucsc sim``'s summary table.  A utility module beside the layers (like ``progress``): any layer
above the codec may import it; it imports nothing of mucsc."""

from __future__ import annotations

from collections.abc import Sequence


def text_table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[bool],
               rule: bool = False) -> list[str]:
    """Lines of aligned columns, two spaces apart, right-aligned where ``right``, without trailing
    blanks; ``rule``: a line of dashes under the headers."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right)).rstrip()

    dashes = [line(["-" * w for w in widths])] if rule else []
    return [line(headers), *dashes, *(line(r) for r in rows)]
