"""``python -m rl8``: the same as the ``rl8`` command (see :mod:`rl8.cli.main`)."""

import sys

from rl8.cli import main

if __name__ == "__main__":
    sys.exit(main())
