"""``python -m aenvs``: the ``aenvs`` command line."""

import sys

from aenvs.cli import main

if __name__ == "__main__":
    sys.exit(main())
