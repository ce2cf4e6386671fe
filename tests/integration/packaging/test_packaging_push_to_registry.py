"""``make push`` against a real registry: the test platform's registry on 127.0.0.1
(``hack.registry``, Debian's docker-registry), the operator and daemon images from the
OCI archives ``make image`` built, and the chart as an OCI artifact. What was pushed is
what the registry serves, by tag and by digest, the chart's values name the pushed images
by tag and digest (a render pins them by digest), and a tag is never pushed twice."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from hack import image as image_builder
from hack.registry import Registry
from hack.registry import unavailable as registry_unavailable
from release import push as release_push

MANIFEST_TYPES = ", ".join(
    (
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    )
)


def _built_images() -> dict[str, image_builder.BuiltImage]:
    images = image_builder.planned()
    missing = [str(b.archive) for b in images.values() if not b.archive.is_file()]
    assert not missing, f"no image archive at {', '.join(missing)}: make image builds them"
    return {component: images[component] for component in ("operator", "daemon")}


def test_make_push_fills_a_registry_that_serves_what_was_pushed_and_keeps_tags(
    tmp_path: Path,
) -> None:
    why = registry_unavailable()
    assert why is None, why
    images = _built_images()
    helm = release_push.helm_binary()
    tag = release_push.default_tag(image_builder.project_version())
    with Registry(tmp_path / "registry") as registry:
        target = f"{registry.host}/thunder-compute"
        pushed = release_push.push(target, tag, images, helm)

        assert [p.name for p in pushed] == ["operator", "daemon", "chart"]
        for artifact in pushed:
            assert re.fullmatch(r"sha256:[0-9a-f]{64}", artifact.digest), artifact
        for artifact in pushed[:2]:
            repository = artifact.reference.removeprefix(f"{registry.host}/").rsplit(":", 1)[0]
            assert registry.tags(repository) == [tag]
            manifest = f"/v2/{repository}/manifests/{artifact.digest}"
            by_digest = registry.get(manifest, MANIFEST_TYPES)
            assert by_digest is not None, f"{artifact.reference}@{artifact.digest} not served"
        chart = pushed[2]
        meta = release_push.chart_metadata()
        assert chart.reference == f"{target}/charts/{meta['name']}:{meta['version']}"
        shown = subprocess.run(
            [str(helm), "show", "chart", f"oci://{target}/charts/{meta['name']}",
             "--version", meta["version"], "--plain-http"],
            capture_output=True, text=True, check=False, timeout=120,
        )  # fmt: skip
        assert shown.returncode == 0, shown.stderr
        assert f"version: {meta['version']}" in shown.stdout

        # The pushed chart names the pushed images, by tag and digest, and renders them
        # pinned by digest with no image setting.
        values = subprocess.run(
            [str(helm), "show", "values", f"oci://{target}/charts/{meta['name']}",
             "--version", meta["version"], "--plain-http"],
            capture_output=True, text=True, check=False, timeout=120,
        )  # fmt: skip
        assert values.returncode == 0, values.stderr
        recorded = yaml.safe_load(values.stdout)
        for artifact in pushed[:2]:
            repository, pushed_tag = artifact.reference.rsplit(":", 1)
            image = recorded[artifact.name]["image"]
            assert (image["repository"], image["tag"], image["digest"]) == (
                repository,
                pushed_tag,
                artifact.digest,
            )
        rendered = subprocess.run(
            [str(helm), "template", "r", f"oci://{target}/charts/{meta['name']}",
             "--version", meta["version"], "--plain-http"],
            capture_output=True, text=True, check=False, timeout=120,
        )  # fmt: skip
        assert rendered.returncode == 0, rendered.stderr
        operator, daemon = pushed[0], pushed[1]
        pinned = f"{operator.reference.rsplit(':', 1)[0]}@{operator.digest}"
        assert pinned in rendered.stdout, f"the operator Deployment does not run {pinned}"
        # The daemon's DaemonSet is the operator's rendering, from the ThunderCluster.
        objects = [o for o in yaml.safe_load_all(rendered.stdout) if o]
        cluster = next(o for o in objects if o["kind"] == "ThunderCluster")
        repository, pushed_tag = daemon.reference.rsplit(":", 1)
        assert cluster["spec"]["daemon"]["image"] | {"pullPolicy": ""} == {
            "repository": repository,
            "tag": pushed_tag,
            "digest": daemon.digest,
            "pullPolicy": "",
        }
        assert "ghcr.io/thunder-compute" not in rendered.stdout

        with pytest.raises(release_push.PushError, match="immutable") as refused:
            release_push.push(target, tag, images, helm)
        assert all(artifact.reference in str(refused.value) for artifact in pushed)
