"""``python -m mucsc.cli``: the same as the ``mucsc`` command."""

from mucsc.cli.main import main

if __name__ == "__main__":
    main(prog_name="mucsc")
