"""The README's install from an OCI registry, on a real node: nothing pre-imported.

A registry runs on 127.0.0.1 (``hack.registry``); ``make push``'s code
(``release.push``) pushes the operator and daemon images ``make image`` built and the
chart into it; then the Install section runs with the chart from the registry: the
CRDs from ``helm show crds oci://...`` and ``helm install oci://... --version
<chart version> --plain-http``, the image repositories pointed at the registry. The
node's containerd has no copy of the operator or daemon image (the shared node's
imported ones are removed first, content and all, and imported again after): it
pulls both from the registry, over plain http as it does for a loopback address with
no configuration.

Then, in order: the pushed tags are immutable (a second push is refused); the operator
Deployment and the daemon pod become Ready, running the images under the registry's
references and digests; `helm test` passes; a pod with a ResourceClaim for two GPUs
runs with the injected files; after it, the fake Thunder's audit shows no leaked
enrollment. The release is uninstalled when the module ends.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
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
    RELEASE,
    Install,
    chart_values,
    check_injected,
    merged,
    wait,
)
from hack.node.chart import _forget_earlier_install as forget_earlier_install
from hack.node.chart import _wait_no_daemon_pods as wait_no_daemon_pods
from hack.node.launcher import Node
from hack.registry import Registry
from release import push as release_push
from tests.e2e.node.conftest import pod_logs, run_pod, stock_pod

# The components the registry serves; the stock and kubectl images stay imported.
PULLED = ("operator", "daemon")
# What every image `make image` builds is called on the node before the test.
LOCAL_PREFIX = "localhost/thunder-compute/thunder-device-plugin"


@dataclass
class RegistryInstall:
    install: Install
    registry: Registry
    pushed: dict[str, release_push.Pushed]
    chart_url: str
    chart_version: str
    tag: str


def _images(node: Node) -> dict[str, str]:
    """The node's containerd images (k8s.io namespace): reference -> manifest digest."""
    out = subprocess.run(
        [*node.ctr(), "images", "ls"], capture_output=True, text=True, check=True
    ).stdout
    rows = [line.split() for line in out.splitlines()[1:] if line.strip()]
    return {row[0]: row[2] for row in rows}


def _without_local_copies(node: Node) -> dict[str, str]:
    """Remove the operator and daemon images the node imported, under every name they
    have (the runtime's own ``sha256:<id>`` names too), their content with them;
    returns the names removed, to put back."""
    images = _images(node)
    removed = {ref: digest for ref, digest in images.items() if ref.startswith(LOCAL_PREFIX)}
    digests = set(removed.values())
    names = [ref for ref, digest in images.items() if digest in digests]
    if names:
        subprocess.run(
            [*node.ctr(), "images", "rm", "--sync", *names], capture_output=True, check=True
        )
    wait(
        lambda: not digests & set(_images(node).values()),
        "the imported operator and daemon images gone from containerd",
        timeout=60,
    )
    return removed


def _restore(
    node: Node, images: dict[str, image_builder.BuiltImage], removed: dict[str, str]
) -> None:
    """Import the operator and daemon archives again, under the names they had. The
    pulled images stay (removing them while the runtime registers the imported names
    again can leave the kubelet without them)."""
    for component in PULLED:
        node.import_image(images[component].archive)
    present = _images(node)
    by_digest = {digest: ref for ref, digest in present.items() if ref.startswith(LOCAL_PREFIX)}
    for ref, digest in removed.items():
        if ref not in present and digest in by_digest:
            node.tag_image(by_digest[digest], ref)


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
    pushed = {p.name: p for p in release_push.push(repository, tag, node_images, helm)}
    chart_version = release_push.chart_metadata()["version"]
    chart_url = f"oci://{repository}/charts/thunder-device-plugin"

    wait_no_daemon_pods(node)
    removed = _without_local_copies(node)
    forget_earlier_install(node)
    FakeHost(node.fake_host_dir).set_nvidia(gpus=["NVIDIA RTX A6000"] * 4, gpu_type="A6000")
    cert = node.cluster.server_certs[launcher.BRIDGE_CERT]
    try:
        with start_fake_thunder(
            tokens=[API_TOKEN],
            listen=f"{launcher.BRIDGE_IP}:0",
            tls=(cert.cert, cert.key),
            ca_file=node.cluster.ca_cert,
            log_path=workdir / "fake-thunder.log",
        ) as fake:
            install = Install(node, fake, node_images, "", workdir)
            # The README's Install section, the chart from the registry.
            if not node.kubectl("get", "namespace", NAMESPACE, "--ignore-not-found"):
                node.kubectl("create", "namespace", NAMESPACE)
            secret = workdir / "secret.yaml"
            secret.touch(mode=0o600)
            secret.write_text(
                yaml.safe_dump(
                    {
                        "apiVersion": "v1",
                        "kind": "Secret",
                        "metadata": {"name": "thunder-api", "namespace": NAMESPACE},
                        "stringData": {"THUNDER_API_TOKEN": API_TOKEN},
                    }
                )
            )
            node.kubectl("apply", "-f", str(secret))
            crds = workdir / "crds.yaml"
            # As `helm show crds ... | kubectl apply -f -`: helm's stdout only (its
            # "Pulled:" and "Digest:" lines go to stderr).
            shown = subprocess.run(
                [str(helm), "show", "crds", chart_url, "--version", chart_version, "--plain-http"],
                env={**os.environ, "KUBECONFIG": str(node.cluster.kubeconfig)},
                capture_output=True, text=True, timeout=120, check=True,
            )  # fmt: skip
            crds.write_text(shown.stdout)
            node.kubectl("apply", "--server-side", "-f", str(crds))
            from_the_registry = {
                component: {
                    "image": {
                        "repository": pushed[component].reference.rsplit(":", 1)[0],
                        "tag": tag,
                        "pullPolicy": "IfNotPresent",
                    }
                }
                for component in PULLED
            }
            install.values = merged(chart_values(fake, node_images), from_the_registry)
            values = workdir / "values.yaml"
            values.write_text(yaml.safe_dump(install.values))
            install.install_output = install.helm(
                "install", RELEASE, chart_url, "--version", chart_version, "--plain-http",
                "--namespace", NAMESPACE, "-f", str(values), "--wait", "--timeout", "5m",
            )  # fmt: skip
            try:
                yield RegistryInstall(install, registry, pushed, chart_url, chart_version, tag)
            finally:
                node.kubectl("delete", "thunderclusters", "--all", "--timeout=60s", check=False)
                install.helm("uninstall", RELEASE, "-n", NAMESPACE, "--wait", check=False)
                wait_no_daemon_pods(node)
    finally:
        _restore(node, node_images, removed)


def test_the_pushed_tags_are_immutable(
    from_registry: RegistryInstall, node_images: dict[str, image_builder.BuiltImage]
) -> None:
    registry, tag = from_registry.registry, from_registry.tag
    assert registry.tags("thunder-compute/thunder-device-plugin-operator") == [tag]
    assert registry.tags("thunder-compute/thunder-device-plugin") == [tag]
    assert registry.tags("thunder-compute/charts/thunder-device-plugin") == [
        from_registry.chart_version
    ]
    for pushed in from_registry.pushed.values():
        assert pushed.digest.startswith("sha256:"), pushed
    with pytest.raises(release_push.PushError, match="tags are immutable"):
        release_push.push(
            f"{registry.host}/thunder-compute",
            tag,
            node_images,
            from_registry.install.node.cluster.bin_dir / "helm",
        )


def test_containerd_pulls_the_operator_and_daemon_images_from_the_registry(
    from_registry: RegistryInstall,
) -> None:
    install = from_registry.install
    assert "STATUS: deployed" in install.install_output, install.install_output
    deployment = install.get("deployments", "-n", NAMESPACE)["items"][0]
    assert deployment["status"].get("readyReplicas") == 1, deployment["status"]
    daemon = wait(install.ready_daemon_pod, "a Ready daemon pod", timeout=300)
    operator = install.operator_pods()[0]
    images = _images(install.node)
    assert not [ref for ref in images if ref.startswith(LOCAL_PREFIX)], images
    for component, pod in (("operator", operator), ("daemon", daemon)):
        pushed = from_registry.pushed[component]
        status = pod["status"]["containerStatuses"][0]
        assert status["image"] == pushed.reference, status
        repository = pushed.reference.rsplit(":", 1)[0]
        assert status["imageID"] == f"{repository}@{pushed.digest}", status
        assert images.get(pushed.reference) == pushed.digest, images


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
    wait(lambda: install.get("deviceclass", "thunder-gpu-a6000"), "DeviceClass thunder-gpu-a6000")
    claim: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "registry-two-a6000", "namespace": "default"},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu",
                            "exactly": {
                                "deviceClassName": "thunder-gpu-a6000",
                                "allocationMode": "ExactCount",
                                "count": 2,
                            },
                        }
                    ]
                }
            }
        },
    }
    install.apply("registry-claim-template", claim)
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


def test_after_the_pod_is_gone_no_enrollment_leaked(from_registry: RegistryInstall) -> None:
    install = from_registry.install
    install.wait_claims_gone("default")
    wait(lambda: not install.cdi_specs(), "the claim's CDI spec removed")
    assert install.fake.admin.leaks() == []
