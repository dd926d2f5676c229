"""Command-line options generated from the codec registry, so a new codec needs no CLI edit.

Every field of every registered codec's ``Params`` dataclass becomes one option (``z`` -> ``--z``,
``keep_ratio`` -> ``--keep-ratio``; a name that clashes with a fixed option of the command gets a
``--param-`` prefix), typed from the field (``mucsc.Codec.param_specs()``: a ``Literal`` is a
``Choice``, a number with a range an ``IntRange`` / ``FloatRange``, a bool a ``--name/--no-name``
flag) with the field's help text.  A field several codecs share takes the union of their choices and
their common range; the chosen codec's ``make_params`` still validates.  Fields rate control sets
(resolved levels: ``cli`` false in the spec) are not options.  Options the chosen codec does not have
are a usage error that lists the ones it has.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

import click

from mucsc import available_codecs, codec_class
from mucsc.cli import defaults


class ErrorBound(click.ParamType):
    """``--max-error`` / ``--error-cap``: a fraction or a percentage (0.01, 1%), above 0 and below 100%."""

    name = "ERR"

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        if isinstance(value, float):
            return value
        return defaults.parse_error(value, param.opts[0] if param is not None else "--max-error")


# command-line spellings the annotation cannot give (a percentage for a relative error)
_TYPES: dict[str, click.ParamType] = {"max_error": ErrorBound(), "error_cap": ErrorBound()}


@dataclasses.dataclass(frozen=True)
class CodecParam:
    """One codec parameter as the command line sees it."""

    field: str  # the Params field name
    dest: str  # the click parameter name (python identifier)
    flag: str  # the option as typed, e.g. "--keep"
    specs: tuple[tuple[str, Any], ...]  # (codec name, its mucsc.Codec.param_specs() entry for the field)

    @property
    def codecs(self) -> tuple[tuple[str, Any], ...]:
        """(codec name, its default) for each codec with this field."""
        return tuple((c, s.default) for c, s in self.specs)


def _cli_specs(codec: str) -> dict[str, Any]:
    """``codec``'s parameters a user sets (not the levels rate control resolves a goal to)."""
    return {f: s for f, s in codec_class(codec).param_specs().items() if s.cli}


def codec_params(reserved: Iterable[str] = ()) -> dict[str, CodecParam]:
    """All parameters of all registered codecs, by field name."""
    reserved = set(reserved)
    found: dict[str, list[tuple[str, Any]]] = {}
    for name in available_codecs():
        for field, spec in _cli_specs(name).items():
            found.setdefault(field, []).append((name, spec))
    out = {}
    for field, uses in sorted(found.items()):
        opt = field.replace("_", "-")
        if field in reserved or opt in reserved:
            opt = f"param-{opt}"
        out[field] = CodecParam(field, f"codec_param_{field}", f"--{opt}", tuple(uses))
    return out


def click_options(params: Mapping[str, CodecParam], modes: Mapping[str, str] | None = None) -> list[click.Option]:
    """One click option per codec parameter, each defaulting to None (= the codec's own default);
    ``modes``: what a command's own modes use instead, by field (shown before the codecs' defaults)."""
    opts = []
    for p in params.values():
        specs = [s for _, s in p.specs]
        help_text = _help(p, (modes or {}).get(p.field))
        if all(s.kind is bool for s in specs):
            name = p.flag[2:]
            opts.append(click.Option([f"--{name}/--no-{name}", p.dest], default=None, help=help_text))
        else:
            opts.append(click.Option([p.flag, p.dest], default=None, type=_type(p.field, specs), help=help_text))
    return opts


def _type(field: str, specs: list[Any]) -> click.ParamType:
    """The click type of a field: its own spelling, the union of its choices, a common range, or its kind."""
    if field in _TYPES:
        return _TYPES[field]
    kinds = {s.kind for s in specs}
    if all(s.choices for s in specs):
        return click.Choice(list(dict.fromkeys(c for s in specs for c in s.choices)))
    if len(kinds) != 1 or kinds & {object}:
        return click.STRING
    kind = kinds.pop()
    ranges = {(s.min, s.max, s.min_open) for s in specs}
    if kind in (int, float) and len(ranges) == 1 and ranges != {(None, None, False)}:
        lo, hi, lo_open = ranges.pop()
        return (click.IntRange if kind is int else click.FloatRange)(lo, hi, min_open=lo_open)
    return click.types.convert_type(kind)


def _help(p: CodecParam, mode: str | None) -> str:
    """The field's help (per codec where they differ), what the command's modes use, every codec's default."""
    by_help: dict[str, list[str]] = {}
    for c, s in p.specs:
        if s.help:
            by_help.setdefault(s.help, []).append(c)
    helps = list(by_help) if len(by_help) < 2 else [f"{', '.join(cs)}: {h}" for h, cs in by_help.items()]
    defaults_text = "; ".join(filter(None, [mode, ", ".join(f"{c} {_shown(s.default)}" for c, s in p.specs)]))
    return "; ".join(helps + [f"defaults: {defaults_text}."]) if helps else f"Defaults: {defaults_text}."


def _shown(default: Any) -> str:
    return "auto" if default is None else str(default)


def chosen_params(codec: str, values: Mapping[str, Any], params: Mapping[str, CodecParam]) -> dict[str, Any]:
    """The codec keyword arguments the user gave, checked against ``codec``'s fields (UsageError)."""
    fields = set(_cli_specs(codec))
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
        flags = [params[f].flag for f in _cli_specs(name) if f in params]
        lines.append(f"  {name}: {cls.summary or ''}" + (f" [{', '.join(flags)}]" if flags else ""))
    return "\b\n" + "\n".join(lines)
