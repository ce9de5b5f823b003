"""What the TorchRL interop tests share: importing torchrl, which only the torchrl venv has.

``make test`` runs the tests marked ``torchrl`` (every module here sets ``pytestmark``) in
a venv of their own, ``.venv-torchrl`` (torchrl pins tensordict < 0.15; the main venv has
the newest), with ``AENVS_REQUIRE_TORCHRL=1``: there a missing or broken torchrl fails
the tests instead of skipping them. Elsewhere (a plain ``pytest`` in the main venv) they
skip.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest

REQUIRED = os.environ.get("AENVS_REQUIRE_TORCHRL") == "1"


def import_torchrl(name: str = "torchrl") -> ModuleType:
    """Import ``name`` (a torchrl module), or skip the test where torchrl is not installed."""
    if REQUIRED:
        return importlib.import_module(name)
    return pytest.importorskip(name)


def collector_class() -> type:
    """TorchRL's single-process collector: ``SyncDataCollector``, named ``Collector`` since 0.14."""
    collectors = import_torchrl("torchrl.collectors")
    return getattr(collectors, "SyncDataCollector", None) or collectors.Collector
