"""The README's install from an OCI registry, on a real node.

A registry runs on 127.0.0.1 (``hack.registry``, as ``make push`` targets it);
``make push``'s code (``release.push``) pushes the operator and daemon images ``make
image`` built and the chart, whose values then name those images by registry
reference, tag and digest. The README's registry commands run as written: the CRDs
from ``helm show crds oci://...`` applied server-side, then ``helm install oci://...
--version <chart version>`` (``--plain-http`` for the loopback registry, as the README
says), with no image setting: the test's values only point the chart at the fake
Thunder and the kubectl image of ``helm test``.

The node's containerd pulls the operator and daemon images by the digests the chart
pins, over plain http as it does for a loopback address with no configuration, and the
pods run under the registry's references. The images pushed are the archives ``make
image`` built with one more label in their configuration (the push's tag), so their
configurations and manifests exist nowhere but in the registry: the registry's own log
shows containerd fetching each. (Their layers are the ones the node imported for the
other modules under local names; containerd, addressing content by digest, fetches only
what it lacks. The images keep IDs of their own, so the node's imported images, which
the later modules run, keep their names.)

Then, in order: the pushed tags are immutable; the operator and the daemon run the
pinned images; the daemon enrolls the node and ``helm test`` passes; a pod with a
ResourceClaim for two GPUs runs with the injected files; no enrollment leaked.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from hack import image as image_builder
from hack.fake_host import FakeHost
from hack.fake_thunder import start_fake_thunder
from hack.node import launcher
from hack.node.chart import (
    API_TOKEN,
    INJECTED,
    NAMESPACE,
    README,
    RELEASE,
    Install,
    chart_values,
    check_injected,
    wait,
)
from hack.node.chart import _forget_earlier_install as forget_earlier_install
from hack.node.chart import _wait_no_daemon_pods as wait_no_daemon_pods
from hack.node.launcher import Node
from hack.registry import Registry
from hack.registry import unavailable as registry_unavailable
from release import push as release_push
from tests.e2e.node.conftest import pod_logs, run_pod, stock_pod

PULLED = ("operator", "daemon")


@dataclass
class RegistryInstall:
    install: Install
    registry: Registry
    pushed: dict[str, release_push.Pushed]
    chart_version: str
    tag: str


def readme_registry_commands(registry: str, chart_version: str) -> list[str]:
    """The README's commands for an install from a registry, placeholders filled in, one
    string per command (the first is a pipe)."""
    section = README.read_text().split("\n## Install\n", 1)[1]
    blocks = re.findall(r"```sh\n(.*?)```", section, re.S)
    block = next(b for b in blocks if "oci://<registry>" in b)
    text = block.replace("\\\n", " ").replace("<registry>", registry)
    text = text.replace("<chart version>", chart_version)
    return [" ".join(line.split()) for line in text.splitlines() if line.strip()]


def _blob(blobs: Path, value: dict[str, Any]) -> tuple[str, int]:
    body = json.dumps(value, separators=(",", ":")).encode()
    digest = hashlib.sha256(body).hexdigest()
    (blobs / digest).write_bytes(body)
    return f"sha256:{digest}", len(body)


def _labelled(archive: Path, workdir: Path, note: str) -> Path:
    """A copy of an OCI archive whose image configuration carries one more label: the
    same layers under a configuration and a manifest no store has seen, so the image has
    an ID of its own (the runtime keys images by their configuration's digest, and a
    pulled image with the ID of an imported one would take the imported one's name)."""
    layout = workdir / archive.stem
    with tarfile.open(archive) as tar:
        tar.extractall(layout, filter="data")
    index = json.loads((layout / "index.json").read_text())
    entry = index["manifests"][0]
    blobs = layout / "blobs" / "sha256"
    manifest = json.loads((blobs / entry["digest"].split(":", 1)[1]).read_text())
    config = json.loads((blobs / manifest["config"]["digest"].split(":", 1)[1]).read_text())
    labels = config.setdefault("config", {}).setdefault("Labels", {}) or {}
    labels["thundercompute.com/registry-install-test"] = note
    config["config"]["Labels"] = labels
    digest, size = _blob(blobs, config)
    manifest["config"].update({"digest": digest, "size": size})
    digest, size = _blob(blobs, manifest)
    entry.update({"digest": digest, "size": size})
    (layout / "index.json").write_text(json.dumps(index))
    out = workdir / archive.name
    with tarfile.open(out, "w") as tar:
        tar.add(layout, arcname=".")
    return out


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    why = registry_unavailable()
    assert why is None, why
    with Registry(tmp_path_factory.mktemp("registry")) as started:
        yield started


def _run(node: Node, argv: list[str], stdin: str | None = None) -> str:
    tools = {"helm": node.cluster.bin_dir / "helm", "kubectl": node.cluster.bin_dir / "kubectl"}
    done = subprocess.run(
        [str(tools[argv[0]]), *argv[1:]],
        input=stdin,
        env={**os.environ, "KUBECONFIG": str(node.cluster.kubeconfig)},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, f"{' '.join(argv)}: {done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


@pytest.fixture(scope="module")
def from_registry(
    real_node: Node,
    node_images: dict[str, image_builder.BuiltImage],
    registry: Registry,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[RegistryInstall]:
    workdir = tmp_path_factory.mktemp("registry-install")
    node = real_node
    helm = node.cluster.bin_dir / "helm"
    version = node_images["operator"].ref.rsplit(":", 1)[1].rsplit("-", 1)[0]
    tag = release_push.default_tag(version)
    repository = f"{registry.host}/thunder-compute"
    to_push = {
        component: image_builder.BuiltImage(
            component, node_images[component].ref,
            _labelled(node_images[component].archive, workdir, tag),
        )
        for component in PULLED
    }  # fmt: skip
    pushed = {p.name: p for p in release_push.push(repository, tag, to_push, helm)}
    chart_version = release_push.chart_metadata()["version"]

    wait_no_daemon_pods(node)
    forget_earlier_install(node)
    FakeHost(node.fake_host_dir).set_nvidia(gpus=["NVIDIA RTX A6000"] * 4, gpu_type="A6000")
    cert = node.cluster.server_certs[launcher.BRIDGE_CERT]
    with start_fake_thunder(
        tokens=[API_TOKEN],
        listen=f"{launcher.BRIDGE_IP}:0",
        tls=(cert.cert, cert.key),
        ca_file=node.cluster.ca_cert,
        log_path=workdir / "fake-thunder.log",
    ) as fake:
        # The chart's values name the pushed images: the test's leave them alone.
        values = chart_values(fake, node_images)
        for component in PULLED:
            del values[component]["image"]
        install = Install(node, fake, node_images, "", workdir, values)
        values_file = workdir / "values.yaml"
        values_file.write_text(yaml.safe_dump(values))
        token_file = workdir / "token"
        token_file.touch(mode=0o600)
        token_file.write_text(API_TOKEN + "\n")
        if not node.kubectl("get", "namespace", NAMESPACE, "--ignore-not-found"):
            node.kubectl("create", "namespace", NAMESPACE)
        node.kubectl("-n", NAMESPACE, "delete", "secret", "thunder-api", "--ignore-not-found")
        node.kubectl(
            "-n", NAMESPACE, "create", "secret", "generic", "thunder-api",
            f"--from-file=THUNDER_API_TOKEN={token_file}",
        )  # fmt: skip
        crds, helm_install = readme_registry_commands(repository, chart_version)
        show, apply = (part.split() for part in crds.split("|"))
        shown = _run(node, [*show, "--plain-http"])
        # helm's "Pulled:" and "Digest:" lines are not YAML; keep the documents.
        documents = shown[shown.index("apiVersion:") :] if "apiVersion:" in shown else shown
        _run(node, apply, stdin=re.sub(r"(?m)^(Pulled|Digest): .*$", "", documents))
        install.install_output = _run(
            node,
            [*helm_install.split(), "--plain-http", "-f", str(values_file),
             "--wait", "--timeout", "5m"],
        )  # fmt: skip
        # Kept with the run's files, for a release note to quote.
        (workdir / "helm-install-oci.txt").write_text(install.install_output)
        try:
            yield RegistryInstall(install, registry, pushed, chart_version, tag)
        finally:
            node.kubectl("delete", "thunderclusters", "--all", "--timeout=60s", check=False)
            install.helm("uninstall", RELEASE, "-n", NAMESPACE, "--wait", check=False)
            wait_no_daemon_pods(node)


def test_the_readme_names_the_registry_install_commands() -> None:
    crds, helm_install = readme_registry_commands("r.example/x", "1.2.3")
    assert crds.startswith("helm show crds oci://r.example/x/charts/thunder-device-plugin")
    assert crds.endswith("| kubectl apply --server-side -f -")
    assert helm_install == (
        f"helm install {RELEASE} oci://r.example/x/charts/thunder-device-plugin "
        f"--version 1.2.3 --namespace {NAMESPACE}"
    )


def test_the_pushed_tags_are_immutable(
    from_registry: RegistryInstall, node_images: dict[str, image_builder.BuiltImage]
) -> None:
    registry, tag = from_registry.registry, from_registry.tag
    assert registry.tags("thunder-compute/thunder-device-plugin-operator") == [tag]
    assert registry.tags("thunder-compute/thunder-device-plugin") == [tag]
    assert registry.tags("thunder-compute/charts/thunder-device-plugin") == [
        from_registry.chart_version
    ]
    with pytest.raises(release_push.PushError, match="tags are immutable"):
        release_push.push(
            f"{registry.host}/thunder-compute",
            tag,
            node_images,
            from_registry.install.node.cluster.bin_dir / "helm",
        )


def _manifest_fetches(log: Path, repository: str, digest: str) -> int:
    """GETs of the manifest by containerd, from the registry's access log."""
    wanted = f'"GET /v2/{repository}/manifests/{digest} HTTP/1.1" 200'
    return sum(
        1
        for line in log.read_text(errors="replace").splitlines()
        if wanted in line and '"containerd/' in line
    )


def test_containerd_pulls_the_pinned_images_from_the_registry(
    from_registry: RegistryInstall,
) -> None:
    install = from_registry.install
    assert "STATUS: deployed" in install.install_output, install.install_output
    daemon = wait(install.ready_daemon_pod, "a Ready daemon pod", timeout=300)
    operator = install.operator_pods()[0]
    host = from_registry.registry.host
    for component, pod in (("operator", operator), ("daemon", daemon)):
        pushed = from_registry.pushed[component]
        pinned = f"{pushed.reference.rsplit(':', 1)[0]}@{pushed.digest}"
        assert pod["spec"]["containers"][0]["image"] == pinned
        status = pod["status"]["containerStatuses"][0]
        assert status["imageID"] == pinned, status
        repository = pushed.reference.removeprefix(f"{host}/").rsplit(":", 1)[0]
        fetched = _manifest_fetches(from_registry.registry.log, repository, pushed.digest)
        assert fetched >= 1, f"the registry served no manifest of {pinned}"


def test_the_daemon_enrolls_the_node_and_helm_test_passes(from_registry: RegistryInstall) -> None:
    install = from_registry.install
    enrolled = wait(install.enrolled_host, "the serving node registered with Thunder", 240)
    assert (enrolled["gpuType"], enrolled["gpuCount"]) == ("A6000", 4)
    zone = wait(install.zone_id, "the node's zone in Thunder")
    install.fake.admin.set_targets(zone, {"A6000": 1.5})
    wait(lambda: install.get("deviceclass", "thunder-gpu-a6000"), "DeviceClass thunder-gpu-a6000")
    out = install.helm("test", RELEASE, "-n", NAMESPACE, "--timeout", "3m")
    assert "Phase:          Succeeded" in out, out
    assert "Failed" not in out, out


def test_a_pod_with_a_resourceclaim_runs_with_the_injected_files(
    from_registry: RegistryInstall,
) -> None:
    install = from_registry.install
    request = {
        "name": "gpu",
        "exactly": {"deviceClassName": "thunder-gpu-a6000", "allocationMode": "ExactCount",
                    "count": 2},
    }  # fmt: skip
    template: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "registry-two-a6000", "namespace": "default"},
        "spec": {"spec": {"devices": {"requests": [request]}}},
    }
    install.apply("registry-claim-template", template)
    manifest = stock_pod(
        "from-registry",
        install.images["stock"].ref,
        INJECTED,
        container={"resources": {"claims": [{"name": "gpu", "request": "gpu"}]}},
        resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": "registry-two-a6000"}],
    )
    pod = run_pod(install.node, manifest, timeout=240)
    logs = pod_logs(install.node, "from-registry")
    assert pod["status"]["phase"] == "Succeeded", logs
    check_injected(install, logs)
    install.node.kubectl("delete", "pod", "from-registry", "--wait=true")
    install.node.kubectl("delete", "resourceclaimtemplate", "registry-two-a6000", "--wait=true")
    install.wait_claims_gone("default")
    wait(lambda: not install.cdi_specs(), "the claim's CDI spec removed")
    assert install.fake.admin.leaks() == []


def test_the_nodes_imported_images_still_run_under_their_own_names(
    from_registry: RegistryInstall,
) -> None:
    # The later real-node modules run the imported images (pullPolicy Never): pulling
    # the registry's images must have left them as they were.
    install = from_registry.install
    for component in PULLED:
        name = f"imported-{component}"
        pod = run_pod(
            install.node,
            stock_pod(name, install.images[component].ref, "echo imported image runs"),
            timeout=120,
        )
        assert pod["status"]["phase"] == "Succeeded", pod["status"]
        assert "imported image runs" in pod_logs(install.node, name)
        install.node.kubectl("delete", "pod", name, "--wait=true")
