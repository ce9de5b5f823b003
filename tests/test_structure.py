"""The package's shape: public names exactly as listed, private modules marked private,
nothing outside the pool touching its privates, modules of a readable size."""

from __future__ import annotations

import ast
import importlib
import pathlib
import pkgutil

import pytest

import aenvs

PACKAGE = pathlib.Path(aenvs.__file__).parent
PUBLIC_MODULES = {
    "aenvs",
    "aenvs.executors",
    "aenvs.gymnasium",
    "aenvs.sb3",
    "aenvs.testing",
    "aenvs.torchrl",
    "aenvs.cli",
}
# modules over ~500 lines, and why they may be for now (the structure issue's note says more)
LONG_MODULES = {
    # the pool's documented API: its public methods' signatures and docstrings (with examples)
    # are ~375 of its lines; the work behind them lives in the other aenvs/_pool modules
    "aenvs/_pool/core.py": 580,
    # gymnasium's VectorEnv API, each method with its docstring and example (~175 lines);
    # the work behind them lives in aenvs/_vector
    "aenvs/gymnasium.py": 560,
}


def _modules() -> list[str]:
    return ["aenvs", *(info.name for info in pkgutil.walk_packages(aenvs.__path__, "aenvs."))]


def test_every_implementation_module_is_private() -> None:
    public = {
        name
        for name in _modules()
        if not any(part.startswith("_") for part in name.split(".")) and name != "aenvs.__main__"
    }
    assert public <= PUBLIC_MODULES, f"public modules not meant to be: {sorted(public - PUBLIC_MODULES)}"


@pytest.mark.parametrize("name", sorted(PUBLIC_MODULES - {"aenvs.cli", "aenvs.torchrl"}))
def test_all_lists_exactly_the_public_names(name: str) -> None:
    module = importlib.import_module(name)
    listed = list(module.__all__)
    assert listed == sorted(listed), f"{name}.__all__ is not sorted"
    for attribute in listed:
        assert getattr(module, attribute) is not None, f"{name}.{attribute} is listed but missing"
    defined = {
        attribute
        for attribute, value in vars(module).items()
        if not attribute.startswith("_")
        and getattr(value, "__module__", None) == name  # defined there, not imported
    }
    assert defined <= set(listed), f"{name} has public names not in __all__: {sorted(defined - set(listed))}"


def _touches_pool_privates(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not node.attr.startswith("_") or node.attr.startswith("__"):
            continue
        owner = node.value
        owner_name = (
            owner.id
            if isinstance(owner, ast.Name)
            else owner.attr
            if isinstance(owner, ast.Attribute)
            else ""
        )
        if owner_name.lstrip("_") == "pool":
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_nothing_outside_the_pool_touches_its_privates() -> None:
    offenders = {}
    for path in PACKAGE.rglob("*.py"):
        if path.is_relative_to(PACKAGE / "_pool"):
            continue
        found = _touches_pool_privates(ast.parse(path.read_text()))
        if found:
            offenders[str(path.relative_to(PACKAGE.parent))] = found
    assert not offenders, offenders


def test_the_check_finds_a_private_access() -> None:
    assert _touches_pool_privates(ast.parse("self._pool._closed = True\npool._ready\npool.step()"))
    assert len(_touches_pool_privates(ast.parse("self._pool._closed = True\npool._ready\npool.step()"))) == 2


def test_modules_stay_readable_in_one_sitting() -> None:
    too_long = {}
    for path in PACKAGE.rglob("*.py"):
        relative = str(path.relative_to(PACKAGE.parent))
        lines = len(path.read_text().splitlines())
        if lines > LONG_MODULES.get(relative, 520):
            too_long[relative] = lines
    assert not too_long, f"modules over their bound (about 500 lines): {too_long}"
