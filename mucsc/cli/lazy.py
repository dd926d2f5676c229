"""A click group whose subcommands may live in modules imported only when the command is run.

Why: ``mucsc sim`` needs torch and ``mucsc rate`` the whole codec zoo; ``mucsc --help`` and
``mucsc compress x.npy`` must import neither.  Help lists a lazy command from its static one-line
description (the module is located with ``importlib.util.find_spec``, never executed); a command whose
module is missing is left out, and one whose module fails to import gives a one-line usage error.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Mapping

import click


class LazyGroup(click.Group):
    """``lazy_subcommands``: {name: ("package.module:attribute", "one-line help")}."""

    def __init__(self, *args, lazy_subcommands: Mapping[str, tuple[str, str]] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.lazy_subcommands = dict(lazy_subcommands or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        lazy = [name for name, (target, _) in self.lazy_subcommands.items() if _module_exists(target)]
        return sorted(set(super().list_commands(ctx)) | set(lazy))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.lazy_subcommands and cmd_name not in self.commands:
            return self._load(ctx, cmd_name)
        return super().get_command(ctx, cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """Like click's, but lazy commands show their static help instead of being imported."""
        rows = []
        for name in self.list_commands(ctx):
            if name in self.lazy_subcommands and name not in self.commands:
                rows.append((name, self.lazy_subcommands[name][1]))
                continue
            cmd = self.commands.get(name)
            if cmd is not None and not cmd.hidden:
                rows.append((name, cmd.get_short_help_str(formatter.width - 6 - len(name))))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def _load(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = self.lazy_subcommands[cmd_name][0]
        module_name, _, attr = target.partition(":")
        if not _module_exists(target):
            return None  # click reports "No such command"
        try:
            module = importlib.import_module(module_name)
            cmd = getattr(module, attr)
        except ImportError as exc:
            raise click.UsageError(
                f"the {cmd_name!r} command is not available: {exc} "
                "(for the simulator: pip install 'mucsc[sim]')", ctx) from None
        except AttributeError:
            raise click.UsageError(
                f"the {cmd_name!r} command is not available: {module_name} has no {attr!r}", ctx) from None
        if not isinstance(cmd, click.Command):
            raise click.UsageError(f"the {cmd_name!r} command is not available: {target} is not a "
                                   "click command", ctx)
        return cmd


def _module_exists(target: str) -> bool:
    module_name = target.partition(":")[0]
    try:
        return importlib.util.find_spec(module_name) is not None
    except (ImportError, ValueError):  # a parent package is missing or broken
        return False
