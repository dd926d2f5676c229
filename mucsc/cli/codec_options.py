"""Command-line options generated from the codec registry, so a new codec needs no CLI edit.

Every field of every registered codec's ``Params`` dataclass becomes one option (``z`` -> ``--z``,
``keep_ratio`` -> ``--keep-ratio``; a name that clashes with a fixed option of the command gets a
``--param-`` prefix).  Bool fields become ``--name/--no-name`` flags; the others take a string that the
codec's own ``make_params`` coerces and validates.  Options the chosen codec does not have are a usage
error that lists the ones it has.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

import click

from mucsc import available_codecs, codec_class

_METAVARS = {"int": "INT", "float": "FLOAT", "str": "TEXT"}


@dataclasses.dataclass(frozen=True)
class CodecParam:
    """One codec parameter as the command line sees it."""

    field: str  # the Params field name
    dest: str  # the click parameter name (python identifier)
    flag: str  # the option as typed, e.g. "--keep"
    kind: str  # "int", "float", "str", "bool" or the raw annotation
    codecs: tuple[tuple[str, Any], ...]  # (codec name, its default)


def codec_params(reserved: Iterable[str] = ()) -> dict[str, CodecParam]:
    """All parameters of all registered codecs, by field name."""
    reserved = set(reserved)
    found: dict[str, list[tuple[str, str, Any]]] = {}
    for name in available_codecs():
        for f in dataclasses.fields(codec_class(name).Params):
            if not f.metadata.get("cli", True):  # set by rate control (resolved levels), not by a user
                continue
            kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
            found.setdefault(f.name, []).append((name, kind.replace(" ", ""), _default(f)))
    out = {}
    for field, uses in sorted(found.items()):
        opt = field.replace("_", "-")
        dest = f"codec_param_{field}"
        if field in reserved or opt in reserved:
            opt = f"param-{opt}"
        kinds = {k for _, k, _ in uses}
        kind = kinds.pop() if len(kinds) == 1 else "str"
        out[field] = CodecParam(field, dest, f"--{opt}", kind, tuple((c, d) for c, _, d in uses))
    return out


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return None


def click_options(params: Mapping[str, CodecParam], modes: Mapping[str, str] | None = None) -> list[click.Option]:
    """One click option per codec parameter, each defaulting to None (= the codec's own default);
    ``modes``: what a command's own modes use instead, by field (shown first in the help)."""
    opts = []
    for p in params.values():
        defaults = "; ".join(filter(None, [(modes or {}).get(p.field), ", ".join(f"{c} {d}" for c, d in p.codecs)]))
        help_text = f"Codec parameter; defaults: {defaults}."
        if p.kind == "bool":
            name = p.flag[2:]
            opts.append(click.Option([f"--{name}/--no-{name}", p.dest], default=None, help=help_text))
        else:
            opts.append(click.Option([p.flag, p.dest], default=None, type=str,
                                     metavar=_METAVARS.get(p.kind, "VALUE"), help=help_text))
    return opts


def chosen_params(codec: str, values: Mapping[str, Any], params: Mapping[str, CodecParam]) -> dict[str, Any]:
    """The codec keyword arguments the user gave, checked against ``codec``'s fields (UsageError)."""
    fields = {f.name for f in dataclasses.fields(codec_class(codec).Params)}
    given = {p.field: values[p.dest] for p in params.values() if values.get(p.dest) is not None}
    wrong = sorted(params[f].flag for f in given if f not in fields)
    if wrong:
        has = ", ".join(params[f].flag for f in sorted(fields) if f in params) or "none"
        raise click.UsageError(f"{', '.join(wrong)}: not a parameter of codec {codec!r} "
                               f"(its options: {has})")
    return given


def codecs_epilog(params: Mapping[str, CodecParam]) -> str:
    """A help paragraph listing every codec, its summary and its options."""
    lines = ["Codecs (--codec NAME) and their options:"]
    for name in available_codecs():
        cls = codec_class(name)
        flags = [params[f.name].flag for f in dataclasses.fields(cls.Params) if f.name in params]
        lines.append(f"  {name}: {cls.summary or ''}" + (f" [{', '.join(flags)}]" if flags else ""))
    return "\b\n" + "\n".join(lines)
