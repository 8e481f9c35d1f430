"""``python -m rl8.cli``: the same as the ``rl8`` command."""

import sys

from rl8.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
