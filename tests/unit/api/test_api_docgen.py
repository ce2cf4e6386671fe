"""docs/configuration.md is generated from the models and must not drift."""

from __future__ import annotations

from pathlib import Path

from thunder_dra.api.docgen import main, render

REPO = Path(__file__).resolve().parents[3]
DOC = REPO / "docs" / "configuration.md"


def test_configuration_reference_matches_the_models() -> None:
    assert DOC.read_text(encoding="utf-8") == render(), (
        "regenerate with: python -m thunder_dra.api.docgen"
    )


def test_check_mode(tmp_path: Path) -> None:
    out = tmp_path / "configuration.md"
    assert main(["--check", "--out", str(out)]) == 1
    assert main(["--out", str(out)]) == 0
    assert main(["--check", "--out", str(out)]) == 0


def test_reference_states_every_seed_setting_with_its_default() -> None:
    text = render()
    for path, default in [
        ("spec.thunder.secretName", '"thunder-api"'),
        ("spec.thunder.apiURL", '"https://registry.thundercompute.com"'),
        ("spec.thunder.artifactBaseURL", '"https://get.thundercompute.com"'),
        ("spec.thunder.telemetryURL", '"https://telemetry.thundercompute.com:2096"'),
        ("spec.operator.extendedResourcePrefix", '"thundercompute.com/gpu-"'),
        ("spec.operator.reconcileInterval", '"60s"'),
        ("spec.operator.orphanGracePeriod", '"5m"'),
        ("spec.nvidia.minDriverVersion", "610"),
        ("spec.kubelet.pluginDirRoot", '"/var/lib/kubelet/plugins"'),
        ("spec.daemon.thunderdPortRange.start", "32000"),
    ]:
        row = next(line for line in text.splitlines() if line.startswith(f"| `{path}` |"))
        assert f"`{default}`" in row, row
    assert "THUNDER_API_TOKEN" in text
    assert "status.orphanedSince" in text
