"""The imports of thunder_dra run one way (``hack/layers.py``, ``make layers``): no circle
of modules anywhere, no circle of subpackages in the operator or the daemon, nothing
importing a higher layer. The checker itself is tested on small packages written here."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from hack import layers


def _tree(root: Path, files: dict[str, str]) -> Path:
    """A package ``thunder_dra`` under ``root`` with ``files`` (every folder a package)."""
    for name, text in {"thunder_dra/__init__.py": "", **files}.items():
        path = root / name
        for folder in reversed(path.relative_to(root).parents):
            if folder != Path("."):
                (root / folder).mkdir(exist_ok=True)
                (root / folder / "__init__.py").touch()
        path.write_text(textwrap.dedent(text))
    return root


def test_the_package_imports_run_one_way() -> None:
    report = layers.check(layers.build_graph())
    assert not report.failed, "\n".join(report.lines)


def test_the_report_has_a_line_per_package_with_its_module_count() -> None:
    graph = layers.build_graph()
    lines = layers.check(graph).lines
    plugin = len(graph.modules_in("thunder_dra.plugin"))
    assert any(
        line.startswith("thunder_dra.plugin ")
        and f"{plugin} modules" in line
        and line.endswith("no cycles")
        for line in lines
    ), lines
    assert any(line.startswith("thunder_dra.controllers ") for line in lines), lines


def test_a_lazy_import_closing_a_circle_is_a_circle(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "thunder_dra/plugin/state/locks.py": """
                def later():
                    from thunder_dra.plugin import daemon
                    return daemon
            """,
            "thunder_dra/plugin/daemon.py": "from thunder_dra.plugin.state import locks\n",
        },
    )
    report = layers.check(layers.build_graph(root))
    assert report.failed
    text = "\n".join(report.lines)
    assert "thunder_dra.plugin.daemon -> thunder_dra.plugin.state.locks -> " in text
    assert "thunder_dra/plugin/state/locks.py:3: thunder_dra.plugin.state.locks imports" in text
    assert "(layer 1) imports thunder_dra.plugin.daemon (layer 7), a higher layer" in text


def test_an_import_for_type_checking_counts(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "thunder_dra/controllers/shared/status.py": """
                from typing import TYPE_CHECKING
                if TYPE_CHECKING:
                    from ..process.main import Operator
            """,
            "thunder_dra/controllers/process/main.py": """
                from thunder_dra.controllers.shared.status import write
            """,
        },
    )
    graph = layers.build_graph(root)
    [cycle] = layers.module_cycles(graph)
    assert cycle.members == (
        "thunder_dra.controllers.process.main",
        "thunder_dra.controllers.shared.status",
    )


def test_subpackages_in_a_circle_fail_without_a_module_circle(tmp_path: Path) -> None:
    # files.library -> claims.allocation -> files.cdi: no module imports itself back,
    # yet files and claims need each other.
    root = _tree(
        tmp_path,
        {
            "thunder_dra/plugin/files/cdi.py": "",
            "thunder_dra/plugin/files/library.py": "from ..claims.allocation import Error\n",
            "thunder_dra/plugin/claims/allocation.py": "from ..files import cdi\n",
        },
    )
    graph = layers.build_graph(root)
    assert layers.module_cycles(graph) == []
    [cycle] = layers.unit_cycles(graph, "thunder_dra.plugin")
    assert cycle.path == (
        "thunder_dra.plugin.claims",
        "thunder_dra.plugin.files",
        "thunder_dra.plugin.claims",
    )
    report = layers.check(graph)
    assert report.failed
    assert "  2 in one circle: thunder_dra.plugin.claims, thunder_dra.plugin.files" in report.lines


@pytest.mark.parametrize(
    ("module", "text", "found"),
    [
        (
            "thunder_dra/api/client.py",
            "import thunder_dra.kube.naming\n",
            "thunder_dra.api.client (layer 1) imports thunder_dra.kube.naming (layer 2)",
        ),
        (
            "thunder_dra/fsutil.py",
            "from thunder_dra.plugin import daemon\n",
            "thunder_dra.fsutil (layer 0) imports thunder_dra.plugin.daemon (layer 3)",
        ),
        (
            "thunder_dra/plugin/node/enrollment.py",
            "from thunder_dra.plugin.claims.rollback import Undo\n",
            "thunder_dra.plugin.node.enrollment (layer 4) imports "
            "thunder_dra.plugin.claims.rollback (layer 5)",
        ),
    ],
)
def test_an_import_of_a_higher_layer_fails(
    tmp_path: Path, module: str, text: str, found: str
) -> None:
    root = _tree(
        tmp_path,
        {
            module: text,
            "thunder_dra/kube/naming.py": "",
            "thunder_dra/plugin/daemon.py": "",
            "thunder_dra/plugin/claims/rollback.py": "",
        },
    )
    report = layers.check(layers.build_graph(root))
    assert report.failed
    assert any(found in line for line in report.lines), report.lines


def test_a_package_in_no_layer_fails_until_it_is_placed(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"thunder_dra/plugin/gadgets/thing.py": ""})
    report = layers.check(layers.build_graph(root))
    assert report.failed
    assert any("thunder_dra.plugin.gadgets is in no layer" in line for line in report.lines)


def test_relative_imports_resolve_to_the_module_they_name(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "thunder_dra/plugin/claims/prepare.py": """
                from . import records
                from .rollback import Undo
                from ..state import checkpoint
                from .. import metrics
                import thunder_dra.plugin.files.cdi as cdi
            """,
            "thunder_dra/plugin/claims/records.py": "",
            "thunder_dra/plugin/claims/rollback.py": "",
            "thunder_dra/plugin/state/checkpoint.py": "",
            "thunder_dra/plugin/metrics.py": "",
            "thunder_dra/plugin/files/cdi.py": "",
            "thunder_dra/plugin/claims/__init__.py": "from .records import X\n",
        },
    )
    graph = layers.build_graph(root)
    targets = [edge.target for edge in graph.imports["thunder_dra.plugin.claims.prepare"]]
    assert targets == [
        "thunder_dra.plugin.claims.records",
        "thunder_dra.plugin.claims.rollback",
        "thunder_dra.plugin.state.checkpoint",
        "thunder_dra.plugin.metrics",
        "thunder_dra.plugin.files.cdi",
    ]
    package = [edge.target for edge in graph.imports["thunder_dra.plugin.claims"]]
    assert package == ["thunder_dra.plugin.claims.records"]


def test_the_command_prints_its_report_and_exits_by_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert layers.main([]) == 0
    out = capsys.readouterr().out
    assert "no upward imports" in out
    root = _tree(
        tmp_path,
        {
            "thunder_dra/plugin/files/library.py": "from ..claims import allocation\n",
            "thunder_dra/plugin/claims/allocation.py": "from ..files import library\n",
        },
    )
    assert layers.main(["--root", str(root)]) == 1
    out = capsys.readouterr().out
    assert "thunder_dra.plugin.claims.allocation -> thunder_dra.plugin.files.library" in out
