"""``python -m benchmarks [OPTIONS]`` from a checkout's root: the same as ``aenvs bench [OPTIONS]``."""

import sys

from benchmarks.harness import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
