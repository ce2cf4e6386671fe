# Checks that the imports of thunder_dra run one way, and prints a line per package:
#
#   .venv/bin/python -m hack.layers                                    # make layers
#
# It parses every module of thunder_dra/ with `ast` (nothing is imported) and fails when
#
# - modules import each other in a circle (anywhere in thunder_dra/);
# - the subpackages of thunder_dra/controllers/ or thunder_dra/plugin/ (and the modules
#   at their root) import each other in a circle, even when no module circle follows;
# - a module of a lower layer imports one of a higher layer. Bottom up: `fsutil`,
#   `version`, `backoff`, `spans`, `proto_gen`; `api`, `thunder`; `kube`, `process`; `controllers`,
#   `webhooks`, `plugin`. Inside the daemon: `metrics`, `errors`; `state`; `files`;
#   `config`; `node`; `claims`; `kubelet`; `daemon` and `__main__`. Inside the operator:
#   `shared`; `inventory`, `workload`, `reaper`; `process` and `__main__`;
# - a subpackage or top-level module is in no layer (a new one is placed here first).
#
# Every import statement counts: at module level, inside a function, under
# `if TYPE_CHECKING:`. A lazy import is the same dependency resolved later, and an import
# for type checking still means the lower module knows the higher one's types, so
# neither is a way around a layer. An import names the module it loads (`from pkg import
# name`: the submodule `pkg.name` when there is one, else `pkg`); the `__init__` of the
# packages above that module is not counted, or a package that re-exports its own modules
# (`thunder_dra.thunder`, `thunder_dra.api`) would be a circle with each of them.
#
# Exit status: 0 when the imports run one way, 1 naming each circle or upward import.
"""The import layers of thunder_dra: module and subpackage circles, upward imports."""

from __future__ import annotations

import argparse
import ast
import itertools
import sys
import textwrap
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT_PACKAGE = "thunder_dra"
REPO_ROOT = Path(__file__).resolve().parent.parent

# The layers of thunder_dra, bottom up: a package may import its own layer's and lower
# layers' packages, never a higher layer's. The root module `thunder_dra` (its
# `__init__`, which re-exports the version) sits at the bottom with `version`.
PACKAGE_LAYERS: tuple[tuple[str, ...], ...] = (
    ("", "fsutil", "version", "backoff", "spans", "proto_gen"),
    ("api", "thunder"),
    ("kube", "process"),
    ("controllers", "webhooks", "plugin"),
)

# The daemon's own layers, bottom up, by subpackage or module under thunder_dra/plugin/
# ("" is the package's `__init__`).
PLUGIN_LAYERS: tuple[tuple[str, ...], ...] = (
    ("", "metrics", "errors"),
    ("state",),
    ("files",),
    ("config",),
    ("node",),
    ("claims",),
    ("kubelet",),
    ("daemon", "__main__"),
)

# The operator's own layers, bottom up, by subpackage or module under
# thunder_dra/controllers/.
CONTROLLERS_LAYERS: tuple[tuple[str, ...], ...] = (
    ("", "shared"),
    ("inventory", "workload", "reaper"),
    ("process", "__main__"),
)

# Circles shown per set of modules that import each other (the shortest ones).
CIRCLES_SHOWN = 3

# The packages whose subpackages must not import each other in a circle.
UNIT_PACKAGES: tuple[str, ...] = (f"{ROOT_PACKAGE}.controllers", f"{ROOT_PACKAGE}.plugin")


@dataclass(frozen=True)
class Import:
    """One import statement's edge: `source` imports `target` at `line`."""

    source: str
    target: str
    line: int

    def where(self, graph: ModuleGraph) -> str:
        return f"{graph.paths[self.source]}:{self.line}"


@dataclass
class ModuleGraph:
    """The modules of a package and the imports between them (only its own modules)."""

    paths: dict[str, str] = field(default_factory=dict)
    imports: dict[str, list[Import]] = field(default_factory=dict)

    def modules_in(self, package: str) -> list[str]:
        return sorted(m for m in self.paths if m == package or m.startswith(package + "."))


def module_name(path: Path, base: Path) -> str:
    parts = list(path.relative_to(base).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(names: Iterable[str], known: Mapping[str, str]) -> str | None:
    """The longest of `names` that is a module of the package, if any."""
    for name in names:
        if name in known:
            return name
    return None


def _prefixes(dotted: str) -> list[str]:
    parts = dotted.split(".")
    return [".".join(parts[:i]) for i in range(len(parts), 0, -1)]


def imports_of(
    module: str, tree: ast.AST, known: Mapping[str, str], is_package: bool
) -> list[Import]:
    """Every import of one of the package's modules in `tree`, wherever it stands."""
    found: list[Import] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _resolve(_prefixes(alias.name), known)
                if target is not None:
                    found.append(Import(module, target, node.lineno))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                # A package's own `from . import x` starts at the package itself.
                drop = node.level - 1 if is_package else node.level
                anchor = anchor[: len(anchor) - drop] if drop else anchor
                base = ".".join([*anchor, base]) if base else ".".join(anchor)
            for alias in node.names:
                # `from pkg import sub` imports the submodule when there is one.
                candidates = [f"{base}.{alias.name}", *_prefixes(base)] if base else []
                target = _resolve(candidates, known)
                if target is not None:
                    found.append(Import(module, target, node.lineno))
    # `from x import (a, b)` is one statement: one edge per target and line.
    return sorted(
        {edge for edge in found if edge.target != module}, key=lambda e: (e.line, e.target)
    )


def build_graph(base: Path = REPO_ROOT, package: str = ROOT_PACKAGE) -> ModuleGraph:
    graph = ModuleGraph()
    files = sorted((base / package.replace(".", "/")).rglob("*.py"))
    for path in files:
        graph.paths[module_name(path, base)] = str(path.relative_to(base))
    for path in files:
        name = module_name(path, base)
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        graph.imports[name] = imports_of(name, tree, graph.paths, path.name == "__init__.py")
    return graph


def strongly_connected(nodes: Iterable[str], edges: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Tarjan's components with more than one node, each sorted, in a stable order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = 0

    for root in sorted(nodes):
        if root in index:
            continue
        # Iterative depth-first search: (node, its remaining successors).
        work: list[tuple[str, list[str]]] = []
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        work.append((root, sorted(edges.get(root, ()))))
        while work:
            node, successors = work[-1]
            if successors:
                succ = successors.pop()
                if succ not in index:
                    index[succ] = low[succ] = counter
                    counter += 1
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, sorted(edges.get(succ, ()))))
                elif succ in on_stack:
                    low[node] = min(low[node], index[succ])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return sorted(components)


def shortest_cycle(start: str, members: set[str], edges: Mapping[str, Iterable[str]]) -> list[str]:
    """The shortest path from `start` back to itself inside one component."""
    previous: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for succ in sorted(edges.get(node, ())):
            if succ not in members:
                continue
            if succ == start:
                path = [node]
                while path[-1] != start:
                    path.append(previous[path[-1]])
                return [*reversed(path), start]
            if succ not in previous:
                previous[succ] = node
                queue.append(succ)
    return [start, start]


@dataclass(frozen=True)
class Cycle:
    """A circle of modules or subpackages, with the import statements that close it."""

    members: tuple[str, ...]
    path: tuple[str, ...]
    evidence: tuple[Import, ...]

    def describe(self, graph: ModuleGraph) -> str:
        lines = [" -> ".join(self.path)]
        lines += [
            f"    {edge.where(graph)}: {edge.source} imports {edge.target}"
            for edge in self.evidence
        ]
        return "\n".join(lines)


def _cycles(
    component: Sequence[str],
    edges: Mapping[str, Iterable[str]],
    witness: Mapping[tuple[str, str], Import],
    label: Callable[[str], str] = str,
) -> list[Cycle]:
    """The shortest circles of a component, each taking in members the others missed, at
    most :data:`CIRCLES_SHOWN` of them (the members are all named anyway)."""
    members = tuple(label(m) for m in component)
    paths = sorted((shortest_cycle(m, set(component), edges) for m in component), key=len)
    cycles: list[Cycle] = []
    covered: set[str] = set()
    for path in paths:
        if len(cycles) == CIRCLES_SHOWN or covered.issuperset(path):
            continue
        covered.update(path)
        evidence = tuple(witness[(a, b)] for a, b in itertools.pairwise(path))
        cycles.append(Cycle(members, tuple(label(p) for p in path), evidence))
    return cycles


def module_cycles(graph: ModuleGraph, package: str = ROOT_PACKAGE) -> list[Cycle]:
    """Circles among the modules of `package`."""
    modules = graph.modules_in(package)
    inside = set(modules)
    edges: dict[str, set[str]] = {}
    witness: dict[tuple[str, str], Import] = {}
    for module in modules:
        for edge in graph.imports[module]:
            if edge.target in inside:
                edges.setdefault(module, set()).add(edge.target)
                witness.setdefault((module, edge.target), edge)
    return [c for comp in strongly_connected(modules, edges) for c in _cycles(comp, edges, witness)]


def unit_of(module: str, package: str) -> str:
    """The subpackage or root module of `package` holding `module` ("" for its `__init__`)."""
    rest = module[len(package) :].lstrip(".")
    return rest.split(".", 1)[0]


def unit_cycles(graph: ModuleGraph, package: str) -> list[Cycle]:
    """Circles among the subpackages (and root modules) of `package`."""
    modules = graph.modules_in(package)
    inside = set(modules)
    edges: dict[str, set[str]] = {}
    witness: dict[tuple[str, str], Import] = {}
    for module in modules:
        source = unit_of(module, package)
        for edge in graph.imports[module]:
            if edge.target not in inside:
                continue
            target = unit_of(edge.target, package)
            if target != source:
                edges.setdefault(source, set()).add(target)
                witness.setdefault((source, target), edge)
    units = sorted({unit_of(m, package) for m in modules})

    def label(unit: str) -> str:
        return f"{package}.{unit}" if unit else package

    return [
        c for comp in strongly_connected(units, edges) for c in _cycles(comp, edges, witness, label)
    ]


def _rank(layers: Sequence[Sequence[str]]) -> dict[str, int]:
    return {name: level for level, names in enumerate(layers) for name in names}


def upward_imports(graph: ModuleGraph, package: str, layers: Sequence[Sequence[str]]) -> list[str]:
    """Imports from a unit of `package` to a unit of a higher layer, and units no layer names."""
    rank = _rank(layers)
    problems: list[str] = []
    modules = graph.modules_in(package)
    for unit in sorted({unit_of(m, package) for m in modules} - set(rank)):
        problems.append(f"{package}.{unit} is in no layer of {package}: add it to hack/layers.py")
    for module in modules:
        source = unit_of(module, package)
        for edge in graph.imports[module]:
            if not (edge.target == package or edge.target.startswith(package + ".")):
                continue
            target = unit_of(edge.target, package)
            if source in rank and target in rank and rank[target] > rank[source]:
                problems.append(
                    f"{edge.where(graph)}: {module} (layer {rank[source]}) imports "
                    f"{edge.target} (layer {rank[target]}), a higher layer"
                )
    return problems


@dataclass
class Report:
    """A line per check, and whether any failed."""

    lines: list[str] = field(default_factory=list)
    failed: bool = False

    def cycles(self, name: str, size: str, cycles: Sequence[Cycle], graph: ModuleGraph) -> None:
        head = f"{name:<24} {size:<26}"
        if not cycles:
            self.lines.append(f"{head} no cycles")
            return
        self.failed = True
        components = {c.members for c in cycles}
        self.lines.append(f"{head} {len(components)} cycle(s):")
        for members in sorted(components):
            names = textwrap.wrap(", ".join(members), 96, break_on_hyphens=False)
            self.lines.append(f"  {len(members)} in one circle: {names[0]}")
            self.lines += [f"    {line}" for line in names[1:]]
            for cycle in cycles:
                if cycle.members == members:
                    self.lines += ["    " + line for line in cycle.describe(graph).splitlines()]

    def layers(self, name: str, order: Sequence[Sequence[str]], problems: Sequence[str]) -> None:
        shown = " | ".join(", ".join(n or "__init__" for n in names) for names in order)
        self.lines.append(f"{name:<24} layers (bottom up) {shown}")
        if not problems:
            self.lines.append(f"{'':<24} no upward imports")
            return
        self.failed = True
        self.lines.append(f"{'':<24} {len(problems)} upward import(s):")
        self.lines += [f"  {p}" for p in problems]


def check(graph: ModuleGraph) -> Report:
    """Every check on the package's imports."""
    report = Report()
    for package in UNIT_PACKAGES:
        modules = graph.modules_in(package)
        units = {unit_of(m, package) for m in modules}
        report.cycles(package, f"{len(modules)} modules", module_cycles(graph, package), graph)
        report.cycles("", f"{len(units)} subpackages/modules", unit_cycles(graph, package), graph)
    report.cycles(ROOT_PACKAGE, f"{len(graph.paths)} modules", module_cycles(graph), graph)
    report.layers(ROOT_PACKAGE, PACKAGE_LAYERS, upward_imports(graph, ROOT_PACKAGE, PACKAGE_LAYERS))
    controllers = f"{ROOT_PACKAGE}.controllers"
    report.layers(
        controllers, CONTROLLERS_LAYERS, upward_imports(graph, controllers, CONTROLLERS_LAYERS)
    )
    plugin = f"{ROOT_PACKAGE}.plugin"
    report.layers(plugin, PLUGIN_LAYERS, upward_imports(graph, plugin, PLUGIN_LAYERS))
    return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hack.layers", description=__doc__)
    parser.add_argument(
        "--root", type=Path, default=REPO_ROOT, help="the folder holding thunder_dra/"
    )
    args = parser.parse_args(argv)
    report = check(build_graph(args.root))
    print("\n".join(report.lines))
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
