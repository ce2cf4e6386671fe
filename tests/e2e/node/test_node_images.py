"""The images ``make image`` builds without docker: they start, and they agree with the Dockerfiles.

Each image's entrypoint runs with ``--help`` through runc, as the image's own user.
The agreement test reads the Dockerfiles here (not through the builder's parser) and
checks the built images against them: Debian suite and Python minor version of the
base image, the Debian packages installed, the user, the entrypoint, the labels and
exposed ports, and the installed Python distributions (exactly the project and the
closure of its runtime requirements, at the versions this repository pins, the set
the Dockerfiles' ``pip wheel -c constraints.txt`` installs).
"""

from __future__ import annotations

import json
import re
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from hack import image as image_builder
from tests.support.oci import OciImage, open_archive, run_image

REPO = Path(__file__).resolve().parents[3]
WHY = image_builder.unavailable()
pytestmark = pytest.mark.skipif(WHY is not None, reason=str(WHY))

DOCKERFILES = {"operator": "operator.Dockerfile", "daemon": "daemon.Dockerfile"}
HELP_WORDS = {"operator": "thunder-operator", "daemon": "thunder-daemon"}


@pytest.fixture(scope="module")
def built() -> dict[str, image_builder.BuiltImage]:
    return image_builder.build()


@pytest.fixture
def opened(
    built: dict[str, image_builder.BuiltImage], tmp_path: Path, request: pytest.FixtureRequest
) -> tuple[str, OciImage]:
    component = str(request.param)
    return component, open_archive(built[component].archive, tmp_path)


def _dockerfile(component: str) -> dict[str, object]:
    text = (REPO / "containers" / DOCKERFILES[component]).read_text()
    joined = re.sub(r"\\\n\s*", " ", text)
    final = joined[joined.rindex("\nFROM ") :]
    base = re.search(r"^ARG PYTHON_IMAGE=python:(\d+\.\d+)-slim-(\w+)$", joined, re.M)
    assert base, "the Dockerfile's base is python:<minor>-slim-<suite>"
    apt = re.search(
        r"apt-get install -y --no-install-recommends ([\w .+-]+?)\s*(&&|$)", final, re.M
    )
    labels = dict(re.findall(r'(org\.opencontainers\.image\.\w+)="([^"]*)"', final))
    exposed = re.findall(r"^EXPOSE (.+)$", final, re.M)
    return {
        "python": base.group(1),
        "suite": base.group(2),
        "packages": apt.group(1).split() if apt else [],
        "user": re.findall(r"^USER (\S+)$", final, re.M)[-1],
        "entrypoint": json.loads(re.findall(r"^ENTRYPOINT (.+)$", final, re.M)[-1]),
        "labels": labels,
        "exposed": sorted(f"{p}/tcp" for line in exposed for p in line.split()),
    }


def _runtime_closure() -> dict[str, str]:
    """The project's runtime requirements, transitively, at the versions installed here."""
    want: dict[str, str] = {
        canonicalize_name("thunder-device-plugin"): metadata.version("thunder-device-plugin")
    }
    todo = ["thunder-device-plugin"]
    while todo:
        dist = metadata.distribution(todo.pop())
        for raw in dist.requires or []:
            req = Requirement(raw)
            if req.marker and not req.marker.evaluate({"extra": ""}):
                continue
            name = canonicalize_name(req.name)
            if name not in want:
                want[name] = metadata.version(req.name)
                todo.append(req.name)
    return want


def _pins() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.-]+)==(\S+)$", line.strip())
        if m:
            pins[canonicalize_name(m.group(1))] = m.group(2)
    return pins


PROBE = r"""
import json, sys
from importlib import metadata
os_release = dict(
    line.split("=", 1) for line in open("/etc/os-release").read().splitlines() if "=" in line
)
dists = {
    d.metadata["Name"]: d.version
    for d in metadata.distributions()
    if "/usr/local/lib/" in str(getattr(d, "_path", ""))
}
print(json.dumps({
    "python": "%d.%d" % sys.version_info[:2],
    "codename": os_release.get("VERSION_CODENAME", "").strip('"'),
    "dists": dists,
}))
"""


@pytest.mark.parametrize("opened", ["operator", "daemon"], indirect=True)
def test_entrypoint_help_runs_through_runc(opened: tuple[str, OciImage], tmp_path: Path) -> None:
    component, image = opened
    run = run_image(image, tmp_path, ["--help"])
    assert run.returncode == 0, run.stderr
    assert "usage:" in run.stdout
    assert HELP_WORDS[component] in run.stdout
    expected_user = _dockerfile(component)["user"]
    uid, gid = str(expected_user).split(":")
    assert (run.process["user"]["uid"], run.process["user"]["gid"]) == (int(uid), int(gid))


@pytest.mark.parametrize("opened", ["operator", "daemon"], indirect=True)
def test_image_agrees_with_its_dockerfile(opened: tuple[str, OciImage], tmp_path: Path) -> None:
    component, image = opened
    want = _dockerfile(component)
    config = image.config["config"]
    assert config["User"] == want["user"]
    assert config["Entrypoint"] == want["entrypoint"]
    labels = want["labels"]
    assert isinstance(labels, dict)
    version = labels.pop("org.opencontainers.image.version")
    assert version == "${VERSION}"
    for key, value in labels.items():
        assert config["Labels"][key] == value, key
    assert config["Labels"]["org.opencontainers.image.version"] == metadata.version(
        "thunder-device-plugin"
    )
    assert sorted(config.get("ExposedPorts") or {}) == want["exposed"]

    probe = run_image(image, tmp_path, [], replace_args=["python", "-c", PROBE])
    assert probe.returncode == 0, probe.stderr
    seen = json.loads(probe.stdout)
    assert seen["codename"] == want["suite"]
    assert seen["python"] == want["python"]
    installed = {canonicalize_name(k): v for k, v in seen["dists"].items()}
    assert installed == _runtime_closure()
    pins = _pins()
    for name, installed_version in installed.items():
        if name != "thunder-device-plugin":
            assert pins.get(name) == installed_version, name

    packages = want["packages"]
    assert isinstance(packages, list)
    if packages:
        dpkg = run_image(
            image,
            tmp_path,
            [],
            replace_args=["dpkg-query", "-W", "-f", "${Package} ${Status}\n", *packages],
        )
        assert dpkg.returncode == 0, dpkg.stderr
        for package in packages:
            assert f"{package} install ok installed" in dpkg.stdout
