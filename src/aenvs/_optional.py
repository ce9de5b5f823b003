"""Optional dependencies: importing one that is not installed says which extra of aenvs brings it.

``import aenvs`` needs none of them; each is imported through :func:`require` by the one
module that uses it, when that module is first imported or used.

Example:
    >>> import sys
    >>> sys.modules["not_installed"] = None  # what an absent package looks like to import
    >>> require("not_installed", extra="serve", feature="this example")
    Traceback (most recent call last):
    ...
    aenvs._optional.MissingExtraError: this example needs not_installed, which is not installed: pip install 'aenvs[serve]'
    >>> del sys.modules["not_installed"]
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["MissingExtraError", "require"]


class MissingExtraError(ModuleNotFoundError):
    """An optional dependency is not installed; the message names the extra that installs it.

    A ``ModuleNotFoundError`` (``name`` is the missing package), so ``except ImportError``
    and ``pytest.importorskip`` treat it as they treat any missing module.

    Example:
        >>> error = MissingExtraError("ray", extra="ray", feature="the ray executor")
        >>> error.name, str(error)
        ('ray', "the ray executor needs ray, which is not installed: pip install 'aenvs[ray]'")
    """

    def __init__(self, package: str, *, extra: str, feature: str) -> None:
        super().__init__(
            f"{feature} needs {package}, which is not installed: pip install 'aenvs[{extra}]'", name=package
        )
        self.extra = extra


def require(module: str, *, extra: str, feature: str) -> ModuleType:
    """``import module``, or a :class:`MissingExtraError` that names ``extra`` when the package
    is not installed (a package that is there but lacks a dependency of its own raises as is).

    Example:
        >>> require("json", extra="serve", feature="this example").__name__
        'json'
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        package = module.partition(".")[0]
        if exc.name is None or exc.name.partition(".")[0] != package:
            raise
        raise MissingExtraError(package, extra=extra, feature=feature) from exc
