"""Push the operator and daemon images and the chart to an OCI registry (``make push``).

The images are the OCI archives ``make image`` builds (``python -m hack.image print``
lists them), copied with ``skopeo`` (``oci-archive:`` to ``docker://``); no docker. The
chart is packaged with ``helm package`` and pushed as an OCI artifact with ``helm push``
to ``<registry>/charts/thunder-device-plugin:<chart version>``, where ``helm install
oci://<registry>/charts/thunder-device-plugin --version <chart version>`` finds it.

The chart pushed records the images it goes with: its ``values.yaml`` names the pushed
repositories, their tag and their digest (``operator.image`` and ``daemon.image``), so
``helm install oci://...`` runs exactly the images pushed with it, pinned by digest,
with no image setting (``pinned_values``). The chart in the tree keeps its defaults.

Tags are immutable: the images' tag is ``<version>-<UTC time>`` (by default the project
version and the commit time of ``HEAD``, ``0.1.0-20261130T000000Z``), and a tag (or
chart version) the registry already has is never pushed over: the push stops before
copying anything. A registry on a loopback address (``127.0.0.1:PORT``, ``localhost``)
is spoken to over plain http; any other only over https.

    python -m release.push --registry 127.0.0.1:5000/thunder-compute [--tag TAG]

Prints one line per pushed artifact: its reference and its digest.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from hack import image as image_builder

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "charts" / "thunder-device-plugin"
TOOLS_SCRIPT = REPO / "hack" / "build-tools.sh"
DEFAULT_REGISTRY = "ghcr.io/thunder-compute"
# <version>-<UTC time>: 0.1.0-20261130T000000Z (the version may carry a pre-release part).
TAG_PATTERN = re.compile(r"^[0-9]+\.[0-9]+\.[0-9]+[0-9A-Za-z.]*-[0-9]{8}T[0-9]{6}Z$")
# What skopeo says when the registry has no manifest under the tag (distribution's
# MANIFEST_UNKNOWN / NAME_UNKNOWN errors).
_ABSENT = ("manifest unknown", "name unknown", "not found")


class PushError(RuntimeError):
    """A push that must not (tag taken, tag malformed) or could not go ahead."""


@dataclass(frozen=True)
class Pushed:
    """One artifact in the registry: ``<reference>@<digest>`` pulls exactly it."""

    name: str
    reference: str
    digest: str


def is_loopback(registry: str) -> bool:
    """Whether the registry's host (``host[:port][/path]``) is a loopback address."""
    host = registry.split("/", 1)[0]
    if host.startswith("["):
        host = host[1:].split("]", 1)[0]
    elif host.count(":") == 1:
        host = host.split(":", 1)[0]
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def default_tag(version: str) -> str:
    """``<version>-<commit time of HEAD, UTC>`` (now, outside a git checkout)."""
    done = subprocess.run(
        ["git", "log", "-1", "--format=%cd", "--date=format-local:%Y%m%dT%H%M%SZ"],
        cwd=REPO,
        env={**os.environ, "TZ": "UTC"},
        capture_output=True,
        text=True,
        check=False,
    )
    stamp = done.stdout.strip()
    if done.returncode != 0 or not stamp:
        from datetime import UTC, datetime

        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    return f"{version}-{stamp}"


def helm_binary() -> Path:
    if os.environ.get("HELM"):
        return Path(os.environ["HELM"])
    done = subprocess.run(
        [str(TOOLS_SCRIPT), "--print"], capture_output=True, text=True, check=True
    )
    return Path(done.stdout.strip()) / "helm"


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False)


def _failed(what: str, done: subprocess.CompletedProcess[str]) -> PushError:
    return PushError(f"{what} failed ({done.returncode}): {(done.stderr or done.stdout).strip()}")


class Pusher:
    """Pushes to one registry (``host[:port]/path``) with skopeo and helm."""

    def __init__(self, registry: str, helm: Path) -> None:
        self.registry = registry.rstrip("/")
        self.helm = helm
        self.plain_http = is_loopback(self.registry)
        self.skopeo = shutil.which("skopeo")
        if self.skopeo is None:
            raise PushError("skopeo is not on PATH (hack/ensure-registry.sh installs it)")

    def _tls(self, flag: str) -> list[str]:
        return [f"{flag}=false"] if self.plain_http else []

    def exists(self, reference: str) -> bool:
        """Whether the registry has a manifest under ``reference`` (``host/repo:tag``)."""
        assert self.skopeo is not None
        done = _run(
            [self.skopeo, "inspect", "--raw", *self._tls("--tls-verify"), f"docker://{reference}"]
        )
        if done.returncode == 0:
            return True
        if any(text in done.stderr.lower() for text in _ABSENT):
            return False
        raise _failed(f"skopeo inspect {reference}", done)

    def push_image(self, name: str, archive: Path, reference: str, work: Path) -> Pushed:
        assert self.skopeo is not None
        digestfile = work / f"{name}.digest"
        done = _run(
            [self.skopeo, "copy", "--quiet", *self._tls("--dest-tls-verify"),
             "--digestfile", str(digestfile), f"oci-archive:{archive}", f"docker://{reference}"]
        )  # fmt: skip
        if done.returncode != 0:
            raise _failed(f"skopeo copy {archive} to {reference}", done)
        return Pushed(name, reference, digestfile.read_text().strip())

    def push_chart(self, package: Path, reference: str) -> Pushed:
        plain = ["--plain-http"] if self.plain_http else []
        done = _run([str(self.helm), "push", str(package), f"oci://{self.registry}/charts", *plain])
        if done.returncode != 0:
            raise _failed(f"helm push {package.name}", done)
        found = re.search(r"Digest:\s*(sha256:[0-9a-f]{64})", done.stdout + done.stderr)
        if found is None:
            raise PushError(f"helm push printed no digest: {done.stdout}{done.stderr}")
        return Pushed("chart", reference, found.group(1))


# The image blocks of values.yaml, found by their repository's last path part.
_IMAGE_BLOCK = re.compile(
    r"(?m)^(?P<indent> +)image:\n"
    r"(?P=indent)  repository: (?P<repository>\S+)\n"
    r"(?P=indent)  tag: (?P<tag>\S+)\n"
    r"(?P=indent)  digest: (?P<digest>\S+)\n"
)


def pinned_values(values: str, pushed: dict[str, Pushed]) -> str:
    """``values`` (the chart's values.yaml, comments kept) with the operator and daemon
    image blocks naming what was pushed: repository, tag and digest."""
    by_name = {p.reference.rsplit(":", 1)[0].rsplit("/", 1)[1]: p for p in pushed.values()}
    done: set[str] = set()

    def pin(found: re.Match[str]) -> str:
        name = found["repository"].rsplit("/", 1)[-1]
        artifact = by_name.get(name)
        if artifact is None:
            return found[0]
        done.add(name)
        repository, tag = artifact.reference.rsplit(":", 1)
        indent = found["indent"]
        return (
            f"{indent}image:\n{indent}  repository: {repository}\n"
            f'{indent}  tag: "{tag}"\n{indent}  digest: "{artifact.digest}"\n'
        )

    pinned = _IMAGE_BLOCK.sub(pin, values)
    missing = sorted(set(by_name) - done)
    if missing:
        raise PushError(f"values.yaml has no image block for {', '.join(missing)}")
    return pinned


def chart_metadata(chart: Path = CHART) -> dict[str, str]:
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    return {"name": str(meta["name"]), "version": str(meta["version"])}


def push(
    registry: str,
    tag: str,
    images: dict[str, image_builder.BuiltImage],
    helm: Path,
    chart: Path | None = CHART,
) -> list[Pushed]:
    """Push the operator and daemon archives as ``<registry>/<name>:<tag>`` and the chart
    (unless ``chart`` is None) as ``<registry>/charts/<chart>:<chart version>``; refuses,
    before pushing anything, a malformed tag or one the registry already has."""
    if not TAG_PATTERN.match(tag):
        raise PushError(
            f"image tag {tag!r} is not <version>-<UTC time> (e.g. 0.1.0-20261130T000000Z)"
        )
    pusher = Pusher(registry, helm)
    plan: list[tuple[str, Path, str]] = []
    for component in ("operator", "daemon"):
        built = images[component]
        if not built.archive.is_file():
            raise PushError(f"no {component} image at {built.archive} (make image builds it)")
        name = built.ref.rsplit(":", 1)[0].rsplit("/", 1)[1]
        plan.append((component, built.archive, f"{pusher.registry}/{name}:{tag}"))
    references = [p[2] for p in plan]
    if chart is not None:
        meta = chart_metadata(chart)
        chart_ref = f"{pusher.registry}/charts/{meta['name']}:{meta['version']}"
        references.append(chart_ref)
    taken = [ref for ref in references if pusher.exists(ref)]
    if taken:
        raise PushError(
            "tags are immutable and the registry already has "
            + ", ".join(taken)
            + ": push a new image tag (and chart version) instead"
        )
    pushed: list[Pushed] = []
    with tempfile.TemporaryDirectory(prefix="thunder-push-") as tmp:
        work = Path(tmp)
        for component, archive, reference in plan:
            pushed.append(pusher.push_image(component, archive, reference, work))
        if chart is None:
            return pushed
        pinned = work / "chart" / chart.name
        shutil.copytree(chart, pinned)
        values = pinned / "values.yaml"
        values.write_text(pinned_values(values.read_text(), {p.name: p for p in pushed}))
        done = _run([str(helm), "package", str(pinned), "--destination", str(work)])
        if done.returncode != 0:
            raise _failed("helm package", done)
        package = work / f"{meta['name']}-{meta['version']}.tgz"
        pushed.append(pusher.push_chart(package, chart_ref))
    return pushed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m release.push", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--registry", default=DEFAULT_REGISTRY, help=f"host[:port]/path ({DEFAULT_REGISTRY})"
    )
    parser.add_argument("--tag", help="image tag (default: <version>-<commit time, UTC>)")
    parser.add_argument(
        "--without-chart",
        action="store_true",
        help="push only the images (the chart version is already in the registry)",
    )
    args = parser.parse_args(argv)
    images = image_builder.planned()
    version = images["operator"].ref.rsplit(":", 1)[1].rsplit("-", 1)[0]
    try:
        pushed = push(
            args.registry,
            args.tag or default_tag(version),
            images,
            helm_binary(),
            None if args.without_chart else CHART,
        )
    except PushError as err:
        print(f"make push: {err}", file=sys.stderr)
        return 2
    for item in pushed:
        print(f"{item.name}: {item.reference}@{item.digest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
