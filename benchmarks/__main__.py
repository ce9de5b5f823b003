"""``python -m benchmarks [OPTIONS]`` from a checkout's root: the same as ``aenvs bench [OPTIONS]``."""

import sys

from aenvs.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
