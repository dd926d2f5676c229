"""Helpers for tests that run the ``mucsc`` command in-process (click's CliRunner)."""

from __future__ import annotations

from click.testing import CliRunner, Result

from mucsc.cli.main import main


def run(args, code: int = 0) -> Result:
    """``mucsc ARGS`` in this process; a library exception that escaped the CLI's error mapping is
    re-raised (a traceback is a bug), and the exit status must be ``code``."""
    result = CliRunner().invoke(main, [str(a) for a in args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    return result
