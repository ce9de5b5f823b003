"""What `make package` checks in dist/ after the build: the wheel holds the aenvs package and
nothing else; the sdist holds every tracked file of the folders the tests need (MANIFEST.in)."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

SDIST_FOLDERS = ["tests", "examples", "benchmarks"]


def main(dist: Path) -> str | None:
    (wheel,) = dist.glob("*.whl")
    (sdist,) = dist.glob("*.tar.gz")
    names = zipfile.ZipFile(wheel).namelist()
    other = [n for n in names if not n.startswith(("aenvs/", "aenvs-"))]
    if other:
        return f"the wheel holds more than aenvs: {other}"
    with tarfile.open(sdist) as tar:
        held = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    tracked = subprocess.run(
        ["git", "ls-files", *SDIST_FOLDERS], capture_output=True, text=True, check=True
    ).stdout.split()
    missing = sorted(set(tracked) - held)
    if not tracked or missing:
        return f"the sdist lacks tracked files of {SDIST_FOLDERS}: {missing or 'all'}"
    return None


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "dist")))
