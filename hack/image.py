"""Build the operator and daemon images as OCI archives without docker.

The Dockerfiles in ``containers/`` stay the one definition: this builder reads each
one's final stage (the Debian suite and Python version of its base image, the Debian
packages it installs, its ENV, LABEL, USER, EXPOSE and ENTRYPOINT, and the users it
creates) and builds the same image from Debian packages with ``mmdebstrap``, the
project's wheels (``pip wheel`` with the pins of ``constraints.txt``, as the
Dockerfiles' build stage does) and ``umoci``, which packs the layers: one Debian root
filesystem shared by all images (our base packages plus every Dockerfile's own), then
the wheels and accounts. Debian's ``python3`` of the same suite gives the same Python
minor version as the Dockerfiles' ``python:<minor>-slim-<suite>`` base.

Results are cached by content under ``${XDG_CACHE_HOME:-~/.cache}/thunder-dra/images``:
a change to the sources, the pins, a Dockerfile or ``BUILDER_VERSION`` makes a new key.

    python -m hack.image build      # build what is missing, print name=path lines
    python -m hack.image print      # only print them (the archives may not exist yet)

Needs root (mmdebstrap and umoci unpack a root filesystem) and the Debian packages
``mmdebstrap`` and ``umoci`` (``hack/build-node-tools.sh --debs`` installs them).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONTAINERS = REPO / "containers"
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "thunder-dra" / "images"
REGISTRY = "localhost/thunder-compute"
# Part of the cache key: bump it whenever a change here changes what the images contain.
BUILDER_VERSION = "1"
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Debian packages every image gets: the interpreter (and `python` for the entrypoint)
# and the CA bundle, which the Dockerfiles' python:*-slim base already carries.
BASE_PACKAGES = ("python3", "python-is-python3", "ca-certificates")
# What the images are called: image name in the chart -> Dockerfile.
IMAGES = {
    "operator": ("thunder-device-plugin-operator", "operator.Dockerfile"),
    "daemon": ("thunder-device-plugin", "daemon.Dockerfile"),
}


class ImageError(RuntimeError):
    """A Dockerfile this builder cannot follow, or a build step that failed."""


@dataclass
class ImageDefinition:
    """The final stage of one Dockerfile, as far as the image's contents go."""

    dockerfile: Path
    suite: str
    python: str
    packages: list[str] = field(default_factory=list)
    env: list[str] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    user: str = "0:0"
    exposed: list[str] = field(default_factory=list)
    entrypoint: list[str] = field(default_factory=list)
    account_commands: list[list[str]] = field(default_factory=list)


def _logical_lines(text: str) -> list[str]:
    lines: list[str] = []
    current = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        lines.append((current + stripped).strip())
        current = ""
    if current:
        lines.append(current.strip())
    return lines


def _pairs(text: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in shlex.split(text))


def parse_dockerfile(path: Path, version: str) -> ImageDefinition:
    """Read the final stage of ``path``, substituting ``${VERSION}`` with ``version``."""
    lines = _logical_lines(path.read_text())
    args: dict[str, str] = {}
    stages: list[list[str]] = []
    for line in lines:
        word, _, rest = line.partition(" ")
        if word.upper() == "ARG" and not stages:
            name, _, default = rest.partition("=")
            args[name.strip()] = default.strip().strip('"')
        if word.upper() == "FROM":
            stages.append([line])
        elif stages:
            stages[-1].append(line)
    if not stages:
        raise ImageError(f"{path}: no FROM line")
    final = stages[-1]
    base = final[0].split()[1]
    base = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), ""), base)
    m = re.fullmatch(r"python:(\d+\.\d+)(?:\.\d+)?-slim-(\w+)", base)
    if not m:
        raise ImageError(
            f"{path}: base image {base!r} is not python:<minor>-slim-<debian suite>, "
            "the only kind this builder can reproduce from Debian packages"
        )
    image = ImageDefinition(dockerfile=path, suite=m.group(2), python=m.group(1))
    for line in final[1:]:
        word, _, rest = line.partition(" ")
        word = word.upper()
        rest = rest.replace("${VERSION}", version)
        if word == "ENV":
            image.env += [f"{k}={v}" for k, v in _pairs(rest).items()]
        elif word == "LABEL":
            image.labels.update(_pairs(rest))
        elif word == "USER":
            image.user = rest.strip()
        elif word == "EXPOSE":
            image.exposed += [p if "/" in p else f"{p}/tcp" for p in rest.split()]
        elif word == "ENTRYPOINT":
            image.entrypoint = json.loads(rest)
        elif word == "RUN":
            body = re.sub(r"^(--mount=\S+\s+)+", "", rest)
            for command in re.split(r"\s*&&\s*", body):
                argv = shlex.split(command)
                if argv[:2] == ["apt-get", "install"]:
                    image.packages += [a for a in argv[2:] if not a.startswith("-")]
                elif argv and argv[0] in ("groupadd", "useradd"):
                    image.account_commands.append(argv)
                elif argv and argv[0] not in ("apt-get", "rm", "pip"):
                    raise ImageError(f"{path}: this builder does not follow RUN step {command!r}")
    if not image.entrypoint:
        raise ImageError(f"{path}: no ENTRYPOINT in the final stage")
    return image


def project_version() -> str:
    m = re.search(r'^version = "(.*)"', (REPO / "pyproject.toml").read_text(), re.M)
    if not m:
        raise ImageError("pyproject.toml: no version")
    return m.group(1)


def _project_files() -> list[Path]:
    files = [REPO / "pyproject.toml", REPO / "constraints.txt", REPO / "README.md"]
    files += sorted(
        p
        for p in (REPO / "thunder_dra").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    )
    return files


def content_key(project_only: bool = False) -> str:
    """Hash of what goes into the images: the project, the Dockerfiles, the builder version."""
    files = _project_files()
    digest = hashlib.sha256()
    if not project_only:
        files += sorted(CONTAINERS.glob("*.Dockerfile"))
        digest.update(f"builder {BUILDER_VERSION}\0".encode())
    for path in files:
        digest.update(str(path.relative_to(REPO)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class BuiltImage:
    component: str
    ref: str
    archive: Path


def planned() -> dict[str, BuiltImage]:
    key = content_key()
    version = os.environ.get("BUILD_VERSION") or project_version()
    tag = f"{version}-{key[:12]}"
    out = CACHE / key
    return {
        component: BuiltImage(component, f"{REGISTRY}/{name}:{tag}", out / f"{component}.oci.tar")
        for component, (name, _) in IMAGES.items()
    }


def _run(argv: list[str], **kwargs: object) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, **kwargs)  # type: ignore[call-overload]
    if proc.returncode != 0:
        raise ImageError(
            f"{argv[0]} failed ({proc.returncode}): {' '.join(argv)}\n{proc.stderr[-3000:]}"
        )


def unavailable() -> str | None:
    """Why images cannot be built here, or None when they can."""
    if os.geteuid() != 0:
        return "building the images needs root (mmdebstrap and umoci unpack a root filesystem)"
    for tool, package in (("mmdebstrap", "mmdebstrap"), ("umoci", "umoci")):
        if shutil.which(tool) is None:
            return f"{tool} is missing (Debian package {package}; hack/build-node-tools.sh --debs)"
    return None


def _wheels(version: str, work: Path) -> Path:
    """The project and its pinned dependencies as wheels, as the Dockerfiles' build stage does."""
    cache = CACHE / "wheels" / f"{content_key(project_only=True)}-{version}"
    if cache.is_dir():
        return cache
    src = work / "src"
    src.mkdir()
    for name in ("pyproject.toml", "constraints.txt", "README.md"):
        shutil.copy2(REPO / name, src / name)
    shutil.copytree(
        REPO / "thunder_dra", src / "thunder_dra", ignore=shutil.ignore_patterns("__pycache__")
    )
    pyproject = src / "pyproject.toml"
    pyproject.write_text(
        re.sub(
            r'^version = ".*"', f'version = "{version}"', pyproject.read_text(), count=1, flags=re.M
        )
    )
    constraints = work / "constraints.txt"
    constraints.write_text(
        "".join(
            line + "\n"
            for line in (REPO / "constraints.txt").read_text().splitlines()
            if not re.match(r"^(#|-e )", line)
        )
    )
    tmp = Path(tempfile.mkdtemp(dir=work, prefix="wheels-"))
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--wheel-dir",
            str(tmp),
            "-c",
            str(constraints),
            str(src),
        ]
    )
    cache.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(tmp), cache)
    return cache


def base_packages() -> list[str]:
    """The Debian packages of the images' shared base: ours plus every Dockerfile's own."""
    wanted = set(BASE_PACKAGES)
    for _, dockerfile in IMAGES.values():
        wanted |= set(parse_dockerfile(CONTAINERS / dockerfile, "0").packages)
    return sorted(wanted)


def _base_rootfs(image: ImageDefinition) -> Path:
    """A Debian root filesystem (tar) with ``base_packages()``, shared by all images."""
    packages = base_packages()
    key = hashlib.sha256(f"{image.suite} {' '.join(packages)}".encode()).hexdigest()[:16]
    tar = CACHE / "rootfs" / f"{image.suite}-{key}.tar"
    if tar.is_file():
        return tar
    tar.parent.mkdir(parents=True, exist_ok=True)
    tmp = tar.with_suffix(f".tmp{os.getpid()}.tar")
    _run(
        [
            "mmdebstrap",
            "--variant=minbase",
            "--quiet",
            f"--include={','.join(packages)}",
            image.suite,
            str(tmp),
        ]
    )
    tmp.rename(tar)
    return tar


def _check_python(rootfs: Path, image: ImageDefinition) -> None:
    python = rootfs / "usr" / "bin" / f"python{image.python}"
    if not python.exists():
        raise ImageError(
            f"{image.dockerfile}: Debian {image.suite}'s python3 is not Python {image.python} "
            f"(no {python.relative_to(rootfs)})"
        )


def _pack(layout: Path, target: BuiltImage) -> None:
    """Write the OCI layout as an archive whose index names the image ``target.ref``."""
    _run(["umoci", "gc", "--layout", str(layout)])
    index_path = layout / "index.json"
    index = json.loads(index_path.read_text())
    for manifest in index.get("manifests", []):
        annotations = manifest.setdefault("annotations", {})
        annotations["org.opencontainers.image.ref.name"] = target.ref
        annotations["io.containerd.image.name"] = target.ref
    index_path.write_text(json.dumps(index))
    target.archive.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.archive.with_suffix(f".tmp{os.getpid()}")
    _run(["tar", "-C", str(layout), "--sort=name", "--owner=0", "--group=0", "--numeric-owner",
          "--mtime=@0", "-cf", str(tmp), "."])  # fmt: skip
    tmp.rename(target.archive)


def _stock_definition() -> ImageDefinition:
    operator = parse_dockerfile(CONTAINERS / IMAGES["operator"][1], "0")
    return ImageDefinition(
        dockerfile=operator.dockerfile, suite=operator.suite, python=operator.python
    )


def stock_image() -> BuiltImage:
    """A stock Debian image (the images' base, no Thunder files): what a user's pod runs."""
    image = _stock_definition()
    key = hashlib.sha256(f"{image.suite} {' '.join(base_packages())}".encode()).hexdigest()[:12]
    return BuiltImage(
        "stock", f"{REGISTRY}/debian:{image.suite}-{key}", CACHE / "stock" / f"{key}.oci.tar"
    )


def build_stock(work: Path) -> BuiltImage:
    target = stock_image()
    if target.archive.is_file():
        return target
    image = _stock_definition()
    base = _base_rootfs(image)
    layout, bundle = work / "stock-layout", work / "stock-bundle"
    ref = f"{layout}:build"
    _run(["umoci", "init", "--layout", str(layout)])
    _run(["umoci", "new", "--image", ref])
    _run(["umoci", "unpack", "--image", ref, str(bundle)])
    _run(["tar", "-C", str(bundle / "rootfs"), "-xf", str(base)])
    _run(["umoci", "repack", "--image", ref, "--history.comment",
          f"debian {image.suite} minbase + {' '.join(base_packages())}", str(bundle)])  # fmt: skip
    _run(["umoci", "config", "--image", ref, "--no-history", "--config.user", "0:0",
          "--config.env", PATH_ENV, "--config.cmd", "/bin/sh"])  # fmt: skip
    _pack(layout, target)
    return target


def kubectl_image(kubectl: Path, version: str) -> BuiltImage:
    """The stock Debian image plus ``kubectl``: what the chart's ``helm test`` Pod runs."""
    digest = hashlib.sha256()
    with kubectl.open("rb") as binary:
        for chunk in iter(lambda: binary.read(1 << 20), b""):
            digest.update(chunk)
    digest.update(stock_image().ref.encode())
    key = digest.hexdigest()[:12]
    return BuiltImage(
        "kubectl", f"{REGISTRY}/kubectl:{version}-{key}", CACHE / "kubectl" / f"{key}.oci.tar"
    )


def build_kubectl(kubectl: Path, version: str) -> BuiltImage:
    target = kubectl_image(kubectl, version)
    if target.archive.is_file():
        return target
    why = unavailable()
    if why:
        raise ImageError(why)
    image = _stock_definition()
    base = _base_rootfs(image)
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE, prefix=".build-") as tmp:
        layout, bundle = Path(tmp) / "layout", Path(tmp) / "bundle"
        ref = f"{layout}:build"
        _run(["umoci", "init", "--layout", str(layout)])
        _run(["umoci", "new", "--image", ref])
        _run(["umoci", "unpack", "--image", ref, str(bundle)])
        _run(["tar", "-C", str(bundle / "rootfs"), "-xf", str(base)])
        shutil.copy2(kubectl, bundle / "rootfs" / "usr" / "local" / "bin" / "kubectl")
        _run(["umoci", "repack", "--image", ref, "--history.comment",
              f"debian {image.suite} minbase + kubectl {version}", str(bundle)])  # fmt: skip
        _run(["umoci", "config", "--image", ref, "--no-history", "--config.user", "65532:65532",
              "--config.env", PATH_ENV, "--config.cmd", "kubectl"])  # fmt: skip
        _pack(layout, target)
    return target


def build_one(component: str, target: BuiltImage, wheels: Path, work: Path) -> None:
    _, dockerfile = IMAGES[component]
    version = target.ref.rsplit(":", 1)[1].rsplit("-", 1)[0]
    image = parse_dockerfile(CONTAINERS / dockerfile, version)
    base = _base_rootfs(image)
    layout = work / f"{component}-layout"
    bundle = work / f"{component}-bundle"
    tag = "build"
    ref = f"{layout}:{tag}"
    _run(["umoci", "init", "--layout", str(layout)])
    _run(["umoci", "new", "--image", ref])
    _run(["umoci", "unpack", "--image", ref, str(bundle)])
    rootfs = bundle / "rootfs"
    _run(["tar", "-C", str(rootfs), "-xf", str(base)])
    _check_python(rootfs, image)
    _run(["umoci", "repack", "--image", ref, "--history.comment",
          f"debian {image.suite} minbase + {' '.join(base_packages())}",
          str(bundle)])  # fmt: skip
    site = rootfs / "usr" / "local" / "lib" / f"python{image.python}" / "dist-packages"
    site.mkdir(parents=True, exist_ok=True)
    _run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-compile",
         "--find-links", str(wheels), "--target", str(site), "thunder-device-plugin"]
    )  # fmt: skip
    shutil.rmtree(site / "bin", ignore_errors=True)
    for argv in image.account_commands:
        _run(["chroot", str(rootfs), *argv])
    _run(["umoci", "repack", "--image", ref, "--history.comment",
          "thunder-device-plugin wheels and accounts", str(bundle)])  # fmt: skip
    config = [
        "umoci",
        "config",
        "--image",
        ref,
        "--no-history",
        "--author",
        "thunder-device-plugin",
    ]
    config += ["--config.user", image.user, "--config.env", PATH_ENV]
    for env in image.env:
        config += ["--config.env", env]
    for port in image.exposed:
        config += ["--config.exposedports", port]
    for arg in image.entrypoint:
        config += ["--config.entrypoint", arg]
    for key, value in image.labels.items():
        config += ["--config.label", f"{key}={value}"]
        config += ["--manifest.annotation", f"{key}={value}"]
    config += ["--manifest.annotation", f"org.opencontainers.image.ref.name={target.ref}"]
    _run(config)
    _pack(layout, target)


def build() -> dict[str, BuiltImage]:
    why = unavailable()
    if why:
        raise ImageError(why)
    targets = planned()
    missing = {c: t for c, t in targets.items() if not t.archive.is_file()}
    if not missing and stock_image().archive.is_file():
        return targets
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE, prefix=".build-") as tmp:
        work = Path(tmp)
        version = next(iter(targets.values())).ref.rsplit(":", 1)[1].rsplit("-", 1)[0]
        wheels = _wheels(version, work)
        for component, target in missing.items():
            build_one(component, target, wheels, work)
        build_stock(work)
    return targets


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hack.image", description=__doc__.split("\n")[0]
    )
    parser.add_argument("action", choices=("build", "print"))
    args = parser.parse_args(argv)
    try:
        targets = build() if args.action == "build" else planned()
    except ImageError as err:
        print(f"make image: {err}", file=sys.stderr)
        return 2
    for component, target in {**targets, "stock": stock_image()}.items():
        print(f"{component}={target.ref} {target.archive}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
