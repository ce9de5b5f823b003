"""The documentation site's checks of the API reference (mkdocs.yml loads this file twice).

- As a griffe extension (the python handler's ``extensions``): once griffe has loaded
  ``aenvs``, every docstring's Sphinx roles (``:class:`~aenvs.SerialEnv```) become
  cross-references, rendered as links where the target is on the site and as plain code
  where it is not; a role whose target names nothing in aenvs is a warning. ``Example:``
  sections are read as griffe's ``Examples:`` (so their ``>>>`` lines render as code).
  And every public name (the ``__all__`` of the modules in ``PUBLIC_MODULES``) and every
  public method of a public class (inherited ones included: the reference renders them)
  must have a docstring, its own or the one it overrides. (Properties are not checked.)
- As a mkdocs hook (``hooks``): every public name must be rendered by some ``:::`` block
  of the reference pages, and no page but the architecture page's module list names an
  implementation module (``aenvs._pool``, ``aenvs/executors/_process.py``): they move.

Warnings fail ``mkdocs build --strict`` (``make docs-build``, part of ``make test``).
"""

from __future__ import annotations

import builtins
import html
import logging
import re
from pathlib import Path
from typing import Any

import griffe

log = logging.getLogger("mkdocs.plugins.aenvs_api")

# The modules whose __all__ is the public API (aenvs.cli is the console script: its
# commands are documented as a guide page, not as an API).
PUBLIC_MODULES = (
    "aenvs",
    "aenvs.executors",
    "aenvs.gymnasium",
    "aenvs.sb3",
    "aenvs.torchrl",
    "aenvs.testing",
)

EXAMPLE = re.compile(r"^Example:[ \t]*$", re.MULTILINE)  # griffe reads only "Examples:" as a section
ROLE = re.compile(r":(?:py:)?(class|func|meth|mod|data|attr|exc|obj|const):`(~?)([^`<]*?)(?:\s*<([^`>]+)>)?`")


# -- the public API --------------------------------------------------------------------------


def _target(obj: griffe.Object | griffe.Alias) -> griffe.Object | None:
    try:
        return obj.final_target if isinstance(obj, griffe.Alias) else obj
    except (griffe.AliasResolutionError, griffe.CyclicAliasError):
        return None  # defined outside aenvs (and not loaded)


def _inherited_docstring(cls: griffe.Class, name: str) -> bool:
    """Whether a base class of ``cls`` documents a member ``name`` (that ``cls`` overrides)."""
    try:
        bases = cls.mro()
    except (griffe.AliasResolutionError, ValueError):
        bases = []
    for base in bases:
        member = base.members.get(name)
        target = _target(member) if member is not None else None
        if target is not None and target.docstring:
            return True
    return False


def public_api(package: griffe.Module) -> dict[str, tuple[griffe.Object, griffe.Class | None]]:
    """Public path -> (object, the class it is a member of) for every public name, and every
    public method of each public class (inherited ones included)."""
    api: dict[str, tuple[griffe.Object, griffe.Class | None]] = {}
    for module_path in PUBLIC_MODULES:
        module = package if module_path == package.path else package[module_path.removeprefix("aenvs.")]
        for name in sorted(module.exports or ()):
            obj = _target(module[name])
            if obj is None:
                continue
            path = f"{module_path}.{name}"
            api[path] = (obj, None)
            if isinstance(obj, griffe.Class):
                for member_name, member in obj.all_members.items():
                    target = None if member_name.startswith("_") else _target(member)
                    if isinstance(target, griffe.Function) and "property" not in target.labels:
                        api[f"{path}.{member_name}"] = (target, obj)
    return api


def check_docstrings(api: dict[str, tuple[griffe.Object, griffe.Class | None]]) -> None:
    """A warning for each public object without a docstring (once per object, whichever
    public paths show it)."""
    paths: dict[str, list[str]] = {}
    for path, (obj, _) in api.items():
        paths.setdefault(obj.path, []).append(path)
    for public_paths in paths.values():
        obj, owner = api[public_paths[0]]
        name = public_paths[0].rsplit(".", 1)[1]
        if obj.docstring or (owner is not None and _inherited_docstring(owner, name)):
            continue
        also = f" (also {', '.join(public_paths[1:])})" if public_paths[1:] else ""
        log.warning(
            f"{public_paths[0]}{also} has no docstring (defined at {obj.relative_filepath}:{obj.lineno})"
        )


# -- Sphinx roles -> cross-references ----------------------------------------------------------


def _resolve(obj: griffe.Object, target: str) -> str | None:
    """The full path ``target`` names from ``obj``'s docstring, None if it names nothing;
    targets outside aenvs are returned as written (they are not checked)."""
    collection = obj.modules_collection
    target = target.lstrip(".")
    try:
        collection[target]
        return target
    except KeyError:
        pass
    first, _, rest = target.partition(".")
    try:
        path = obj.resolve(first) + (f".{rest}" if rest else "")
    except griffe.NameResolutionError:
        if first == "aenvs":
            return None
        if rest or hasattr(builtins, first) or _has_outside_bases(obj):
            return target  # another package's name, or a member inherited from one
        return None
    if not path.startswith("aenvs."):
        return path  # an import from another package
    try:
        collection[path]
    except KeyError:
        return None
    return path


def _has_outside_bases(obj: griffe.Object) -> bool:
    """Whether the class ``obj`` is (or is in) has a base class griffe has not loaded."""
    cls: griffe.Object | None = obj
    while cls is not None and not isinstance(cls, griffe.Class):
        cls = cls.parent
    if cls is None:
        return False
    try:
        cls.mro()
    except (griffe.AliasResolutionError, ValueError):
        return True
    return any(_target(base) is None for base in cls.resolved_bases) or len(cls.resolved_bases) < len(
        cls.bases
    )


def _rewrite(obj: griffe.Object, public: set[str]) -> None:
    docstring = obj.docstring
    if docstring is None:
        return
    docstring.value = EXAMPLE.sub("Examples:", docstring.value)
    if ":`" not in docstring.value:
        return

    def replace(match: re.Match[str]) -> str:
        role, tilde, text, explicit = match.groups()
        target = (explicit or text).strip()
        resolved = _resolve(obj, target)
        if resolved is None:
            if obj.path in public:
                log.warning(f"{obj.path}: the docstring's :{role}:`{target}` names nothing in aenvs")
            resolved = target
        if explicit:
            title = text.strip()
        else:
            title = target.rsplit(".", 1)[-1] if tilde else target
            title += "()" if role in {"func", "meth"} else ""
        return f'<autoref identifier="{html.escape(resolved)}" optional><code>{html.escape(title)}</code></autoref>'

    docstring.value = ROLE.sub(replace, docstring.value)


def _walk(obj: griffe.Object) -> Any:
    yield obj
    for member in obj.members.values():
        if not member.is_alias and isinstance(member, griffe.Object):
            yield from _walk(member)


class AenvsApi(griffe.Extension):
    """Checks docstrings and turns Sphinx roles into cross-references, once aenvs is loaded."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        if pkg.name != "aenvs":
            return
        api = public_api(pkg)
        check_docstrings(api)
        public = {obj.path for obj, _ in api.values()} | set(PUBLIC_MODULES)
        for obj in _walk(pkg):
            _rewrite(obj, public)


# -- mkdocs hooks: every public name is on a reference page ------------------------------------

_rendered: set[str] = set()
_IDENTIFIER = re.compile(r"^:::\s+(\S+)", re.MULTILINE)


def on_pre_build(config: Any) -> None:
    _rendered.clear()


_PRIVATE_MODULE = re.compile(r"\baenvs[./](?:executors[./])?_[a-z]\w*")
_MAY_NAME_MODULES = {"architecture.md"}  # its module list, marked "as of this commit"


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    _rendered.update(_IDENTIFIER.findall(markdown))
    if page.file.src_uri not in _MAY_NAME_MODULES:
        for name in sorted(set(_PRIVATE_MODULE.findall(markdown))):
            log.warning(f"{page.file.src_uri} names the implementation module {name}: use public names")
    return markdown


def on_post_build(config: Any) -> None:
    root = Path(config["config_file_path"]).parent
    package = griffe.load("aenvs", search_paths=[str(root / "src")], resolve_aliases=False)
    assert isinstance(package, griffe.Module)
    for module_path in PUBLIC_MODULES:
        module = package if module_path == "aenvs" else package[module_path.removeprefix("aenvs.")]
        for name in module.exports or ():
            path = f"{module_path}.{name}"
            if path not in _rendered and module_path not in _rendered:
                log.warning(f"{path} is public but no reference page renders it (a '::: {path}' block)")
