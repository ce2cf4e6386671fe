"""What the images ship is product code only.

The images install `thunder_dra` and nothing else, so two things must hold of it:

- no module of it imports test or development code (`tests`, `hack`, `bench`, `ops`,
  `release`) or a test library (`pytest`, `hypothesis`): the import would fail in an
  image, or drag test machinery into the operator and the daemon. Every import
  statement counts, at module level, inside a function or under `if TYPE_CHECKING:`;
- every module of it is reached by an entry point the product runs. A module nothing
  reaches is a test double, a fixture or dead code, and belongs in `tests/support/`
  or `hack/`, or nowhere.

The entry points: the console scripts of pyproject.toml (`thunder-operator`,
`thunder-daemon`; the operator's process also serves the admission webhooks) and
their `python -m` twins, and the generators of `crds/` and `docs/configuration.md`
(`python -m thunder_dra.api.crdgen`, `python -m thunder_dra.api.docgen`), which stay in
the package because they derive both from the models, the single source of truth, and
`make crds` and the drift tests run them from there.

Modules are read with `ast`; nothing is imported.
"""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Final

import pytest

pytestmark = pytest.mark.unit

ROOT: Final = Path(__file__).resolve().parents[2]
PACKAGE: Final = "thunder_dra"
FORBIDDEN: Final = frozenset({"tests", "hack", "bench", "ops", "release", "pytest", "hypothesis"})
"""Top-level names no module of the package may import."""

GENERATORS: Final = ("thunder_dra.api.crdgen", "thunder_dra.api.docgen")

# None today: the daemon serves every kubelet protocol of proto/ (DRAResourceHealth too).
UNREACHED_ON_PURPOSE: Final[dict[str, str]] = {}
"""Modules no entry point reaches that the package keeps anyway, each with its reason."""


def package_modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its `__init__.py`)."""
    modules = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def imported_names(name: str, path: Path) -> Iterator[str]:
    """Every dotted name an import statement of the module names, relative ones resolved;
    `from a import b` yields both `a` and `a.b` (b may be a module or an attribute)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            yield module
            yield from (f"{module}.{alias.name}" for alias in node.names)


def _modules_named(dotted: str, modules: Mapping[str, Path]) -> Iterator[str]:
    """The package's modules an import of `dotted` runs: the module and its parents."""
    parts = dotted.split(".")
    for end in range(1, len(parts) + 1):
        prefix = ".".join(parts[:end])
        if prefix in modules:
            yield prefix


def reached(entry_points: Iterable[str], modules: Mapping[str, Path]) -> set[str]:
    seen: set[str] = set()
    pending = [m for entry in entry_points for m in _modules_named(entry, modules)]
    while pending:
        module = pending.pop()
        if module in seen:
            continue
        seen.add(module)
        for dotted in imported_names(module, modules[module]):
            pending.extend(_modules_named(dotted, modules))
    return seen


def entry_points(root: Path = ROOT) -> list[str]:
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    scripts = [target.partition(":")[0] for target in project["scripts"].values()]
    return sorted(
        {
            *scripts,
            "thunder_dra.controllers.__main__",
            "thunder_dra.plugin.__main__",
            *GENERATORS,
        }
    )


def forbidden_imports(modules: Mapping[str, Path]) -> list[str]:
    return sorted(
        {
            f"{name} imports {dotted}"
            for name, path in modules.items()
            for dotted in imported_names(name, path)
            if dotted.partition(".")[0] in FORBIDDEN
        }
    )


def test_the_entry_points_are_modules_of_the_package() -> None:
    modules = package_modules()
    assert [e for e in entry_points() if e not in modules] == []
    assert "thunder_dra.webhooks.admission" in reached(entry_points(), modules)


def test_no_module_of_the_package_imports_test_or_development_code() -> None:
    found = forbidden_imports(package_modules())
    assert not found, "the images would not run these imports:\n" + "\n".join(found)


def test_every_module_of_the_package_is_reached_by_an_entry_point() -> None:
    modules = package_modules()
    unreached = sorted(set(modules) - reached(entry_points(), modules) - set(UNREACHED_ON_PURPOSE))
    assert not unreached, (
        "no entry point imports these modules (move test code to tests/support/ or hack/, "
        "delete dead code):\n" + "\n".join(unreached)
    )


def test_every_module_kept_unreached_exists_and_is_still_unreached() -> None:
    modules = package_modules()
    assert set(UNREACHED_ON_PURPOSE) <= set(modules)
    assert set(UNREACHED_ON_PURPOSE).isdisjoint(reached(entry_points(), modules))


def test_the_check_sees_an_import_of_test_code_and_a_module_nothing_reaches(
    tmp_path: Path,
) -> None:
    # A copy of a small corner of the package, planted with both faults.
    package = tmp_path / PACKAGE
    (package / "plugin").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "plugin" / "__init__.py").write_text("")
    (package / "plugin" / "__main__.py").write_text(
        "from . import daemon\nif False:\n    from tests.support.fakekube import FakeKube\n"
    )
    (package / "plugin" / "daemon.py").write_text("def run() -> None:\n    import hypothesis\n")
    (package / "plugin" / "fixtures.py").write_text("")
    modules = package_modules(tmp_path)
    assert reached(["thunder_dra.plugin.__main__"], modules) == {
        "thunder_dra",
        "thunder_dra.plugin",
        "thunder_dra.plugin.__main__",
        "thunder_dra.plugin.daemon",
    }
    assert set(modules) - reached(["thunder_dra.plugin.__main__"], modules) == {
        "thunder_dra.plugin.fixtures"
    }
    assert forbidden_imports(modules) == [
        "thunder_dra.plugin.__main__ imports tests.support.fakekube",
        "thunder_dra.plugin.__main__ imports tests.support.fakekube.FakeKube",
        "thunder_dra.plugin.daemon imports hypothesis",
    ]
