"""The OLM install of the bundle, and an OLM upgrade from the last release, on a real node.

OLM v0 runs as its two operators (``hack.olm``: olm and catalog, built from the pinned
modules) against the node's control plane. The catalogs are what ``make catalog``
writes (``release.catalog``): bundles stamped with their release version
(``<version>-<commit time>``) and the images of that release, served by ``opm serve`` for
a CatalogSource of ``spec.address``. The README's OLM commands run as written: the
Secret from a token file, ``config/olm`` (CatalogSource, OperatorGroup, Subscription)
with the CatalogSource's address pointed at the test's opm, and the ThunderCluster of
``config/samples`` with the fake Thunder's URLs and the release's daemon image. The
Subscription also hands the operator ``SSL_CERT_FILE``, the cluster CA the fake Thunder's
certificate comes from, as the chart tests' ``extraEnv`` does.

In order:
- the catalog holds only the last release (``release/last-release``, its images built
  by its own tree and imported into the node); OLM installs it and its CSV Succeeds;
- the fake Thunder serves a zone, a pod holding a claim for one GPU runs and keeps
  reading its files;
- the CatalogSource then points at a catalog of both releases, this one replacing the
  last: OLM upgrades the operator on its own (``installPlanApproval: Automatic``), the
  new CSV Succeeds and the old one is gone, and once OLM has issued the new CSV its own
  webhook certificate the Deployment has rolled out with it; the ThunderCluster then
  names this release's daemon image, as docs/upgrading.md says; the held pod kept
  running and reading its files, and no prepare failed;
- the operator serves its webhook with the certificate OLM made (the apiserver calls it
  and it refuses a bad ThunderCluster) and has applied the admission policies itself;
- a new pod with a claim runs with the injected files; no enrollment leaked;
- the ThunderCluster deleted, then the Subscription and the CSV as OLM's docs say:
  what remains is what the README's OLM uninstall says.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import socket
import ssl
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509

from hack import image as image_builder
from hack import olm as olm_tools
from hack import supervise
from hack.fake_host import FakeHost
from hack.fake_thunder import start_fake_thunder
from hack.node import launcher
from hack.node.chart import (
    API_TOKEN,
    INJECTED,
    NAMESPACE,
    README,
    REPO,
    SA_CA,
    Install,
    check_injected,
    running,
    wait,
)
from hack.node.chart import _forget_earlier_install as forget_earlier_install
from hack.node.chart import _wait_no_daemon_pods as wait_no_daemon_pods
from hack.node.last_release import LastRelease, last_release
from hack.node.launcher import Node
from release import catalog as release_catalog
from release import push as release_push
from release.bundle import BUNDLE, PACKAGE, kustomize, project_version
from tests.e2e.node.conftest import pod_logs, run_pod, stock_pod
from thunder_dra.controllers.process.policies import operator_identity, rendered

SUBSCRIPTION = "thunder-device-plugin"
CATALOG_SOURCE = "thunder-device-plugin"
WEBHOOK_SECRET = "thunder-operator-service-cert"  # OLM's: <Deployment>-service-cert
HELD_POD = "held-through-olm-upgrade"
DRIVER_LABEL = "app.kubernetes.io/name=thunder-dra-driver"
CRDS = ("clients.thundercompute.com", "thunderclusters.thundercompute.com")
# The ClusterRoles OLM makes for each CRD a CSV owns, which stay with the CRDs.
CRD_ROLES = tuple(
    f"{crd}-v1alpha1-{verb}" for crd in CRDS for verb in ("admin", "crdview", "edit", "view")
)
# The held pod prints what it reads of its files every second, until it is deleted.
READER = r"""
while true; do
  keys=$(python3 -c 'import json; print(sorted(json.load(open("/etc/thunder/config.json"))))')
  echo "tick $(date +%s) $(sha256sum /etc/thunder/libthunder.so | cut -c1-16) $keys"
  sleep 1
done
"""


def _ca_hash(metadata: dict[str, Any]) -> str | None:
    """The ``olmcahash`` annotation OLM puts on its Secret and the pods it rolls out: the
    SHA-256 of the CA it issued, in hex."""
    found = (metadata.get("annotations") or {}).get("olmcahash")
    return str(found) if found else None


def _pem_certs(pem: bytes) -> list[x509.Certificate]:
    try:
        return x509.load_pem_x509_certificates(pem) if pem.strip() else []
    except ValueError:
        return []


@dataclass
class OlmInstall:
    install: Install
    olm: olm_tools.Olm
    last: LastRelease
    previous: release_catalog.Release
    current: release_catalog.Release
    workdir: Path

    @property
    def node(self) -> Node:
        return self.install.node

    def csv(self, name: str) -> dict[str, Any] | None:
        found = self.install.get("csv", "-n", NAMESPACE, name)
        return found if isinstance(found, dict) else None

    def csv_phase(self, name: str) -> str:
        return str(((self.csv(name) or {}).get("status") or {}).get("phase", ""))

    def rolled_out(self, image: str) -> bool:
        """Whether the operator Deployment runs ``image`` and has finished rolling out."""
        deployment = self.install.get("deployment", "-n", NAMESPACE, "thunder-operator") or {}
        spec, status = deployment.get("spec") or {}, deployment.get("status") or {}
        containers = ((spec.get("template") or {}).get("spec") or {}).get("containers") or []
        replicas = spec.get("replicas", 1)
        return (
            [c.get("image") for c in containers] == [image]
            and status.get("observedGeneration") == deployment["metadata"].get("generation")
            and status.get("updatedReplicas") == replicas
            and status.get("availableReplicas") == replicas
            and status.get("replicas") == replicas
        )

    def wait_csv_succeeded(
        self, release: release_catalog.Release, timeout: float = 420
    ) -> dict[str, Any]:
        """Until the release's CSV is Succeeded and its operator Deployment has rolled out
        (OLM has been seen to report a new CSV's phase before it installed it)."""
        name = release.csv_name

        def succeeded() -> dict[str, Any] | None:
            self.olm.alive()
            csv = self.csv(name)
            if self.csv_phase(name) != "Succeeded" or not self.rolled_out(release.operator_image):
                return None
            return csv

        try:
            csv = wait(succeeded, f"CSV {name} to reach Succeeded", timeout)
            # Kept with the run's files, for a release note to quote.
            listed = self.node.kubectl("get", "csv", "-n", NAMESPACE, "-o", "wide")
            (self.workdir / f"csv-{name}.txt").write_text(listed)
            return csv
        except TimeoutError as err:
            csv = self.csv(name) or {}
            sub = self.install.get("subscription", "-n", NAMESPACE, SUBSCRIPTION) or {}
            raise AssertionError(
                f"{err}\nCSV status: {json.dumps(csv.get('status'), indent=1)[-3000:]}\n"
                f"Subscription status: {json.dumps(sub.get('status'), indent=1)[-2000:]}\n"
                f"olm: {supervise.log_tail(self.olm.log('olm'), 20)}\n"
                f"catalog: {supervise.log_tail(self.olm.log('catalog'), 20)}"
            ) from err

    def webhook_certificate_settled(self, release: release_catalog.Release) -> bool:
        """Whether the release's CSV has its own webhook certificate everywhere: the Secret
        belongs to the CSV, the CSV's webhook configurations carry the Secret's CA, and the
        Deployment has rolled out pods of that CA (docs/upgrading.md: OLM issues a new
        certificate once the replaced CSV and the Secret it owned are gone)."""
        secret = self.install.get("secret", "-n", NAMESPACE, WEBHOOK_SECRET) or {}
        metadata = secret.get("metadata") or {}
        owners = [o.get("name") for o in metadata.get("ownerReferences") or []]
        ca_hash = _ca_hash(metadata)
        if release.csv_name not in owners or not ca_hash:
            return False
        configs = self.install.get(
            "validatingwebhookconfigurations", "-l", f"olm.owner={release.csv_name}"
        ) or {"items": []}
        bundles = [
            base64.b64decode(hook.get("clientConfig", {}).get("caBundle") or "")
            for config in configs["items"]
            for hook in config.get("webhooks") or []
        ]
        if not bundles or any(hashlib.sha256(b).hexdigest() != ca_hash for b in bundles):
            return False
        deployment = self.install.get("deployment", "-n", NAMESPACE, "thunder-operator") or {}
        template = ((deployment.get("spec") or {}).get("template") or {}).get("metadata") or {}
        if _ca_hash(template) != ca_hash:
            return False
        return self.rolled_out(release.operator_image)

    def webhook_trust(self) -> str:
        """What the apiserver trusts for the webhook beside what the operator's pods serve:
        the webhook configurations' CAs, OLM's Secret, the Deployment's and pods' CA hashes
        and each pod's served certificate, for a certificate error to be read."""
        lines = []
        configs = self.install.get("validatingwebhookconfigurations") or {"items": []}
        for config in configs["items"]:
            for hook in config.get("webhooks") or []:
                bundle = base64.b64decode(hook.get("clientConfig", {}).get("caBundle") or "")
                issuers = [c.issuer.rfc4514_string() for c in _pem_certs(bundle)]
                lines.append(f"webhook configuration {config['metadata']['name']} "
                             f"{hook['name']}: CA {issuers}")  # fmt: skip
        secrets = self.install.get("secret", "-n", NAMESPACE) or {"items": []}
        for secret in secrets["items"]:
            data = secret.get("data") or {}
            if "tls.crt" not in data:
                continue
            served = _pem_certs(base64.b64decode(data["tls.crt"]))
            ca = _pem_certs(base64.b64decode(data.get("olmCAKey", "")))
            lines.append(
                f"secret {secret['metadata']['name']}: cert issuer "
                f"{[c.issuer.rfc4514_string() for c in served]}, olmCAKey "
                f"{[c.subject.rfc4514_string() for c in ca]}, annotations "
                f"{secret['metadata'].get('annotations')}, owners "
                f"{[o['name'] for o in secret['metadata'].get('ownerReferences') or []]}"
            )
        deployment = self.install.get("deployment", "-n", NAMESPACE, "thunder-operator") or {}
        template = ((deployment.get("spec") or {}).get("template") or {}).get("metadata") or {}
        lines.append(
            f"deployment template olmcahash {_ca_hash(template)}, status {deployment.get('status')}"
        )
        for pod in self.install.operator_pods():
            ip = (pod.get("status") or {}).get("podIP")
            issuer = "?"
            if ip:
                context = ssl.create_default_context()
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
                try:
                    with (
                        socket.create_connection((ip, 9443), timeout=5) as raw,
                        context.wrap_socket(raw) as tls,
                    ):
                        der = tls.getpeercert(binary_form=True) or b""
                    issuer = x509.load_der_x509_certificate(der).issuer.rfc4514_string()
                except (OSError, ValueError) as err:
                    issuer = f"unreachable: {err}"
            lines.append(
                f"pod {pod['metadata']['name']} ip {ip} deleting "
                f"{bool(pod['metadata'].get('deletionTimestamp'))} olmcahash "
                f"{_ca_hash(pod['metadata'])} serves cert of {issuer}"
            )
        endpoints = self.install.get("endpointslices", "-n", NAMESPACE) or {"items": []}
        for eps in endpoints["items"]:
            found = [(e.get("addresses"), e.get("conditions")) for e in eps.get("endpoints") or []]
            lines.append(f"endpointslice {eps['metadata']['name']}: {found}")
        return "\n".join(lines)


def commit_stamp(commit: str) -> str:
    """A commit's time in the release tags' form (UTC, ``%Y%m%dT%H%M%SZ``)."""
    done = subprocess.run(
        ["git", "-C", str(REPO), "log", "-1", "--format=%cd",
         "--date=format-local:%Y%m%dT%H%M%SZ", commit],
        env={**os.environ, "TZ": "UTC"}, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return done.stdout.strip()


def readme_olm_commands() -> list[str]:
    """The README's OLM install commands (the sh block that applies config/olm), joined
    continuation lines, comments dropped."""
    section = README.read_text().split("\n## Install\n", 1)[1]
    blocks = [b for b in section.split("```sh\n")[1:] if "config/olm" in b.split("```")[0]]
    assert blocks, "README.md's Install section has no sh block applying config/olm"
    text = blocks[0].split("```", 1)[0].replace("\\\n", " ")
    lines = [line.split("#", 1)[0].strip() for line in text.splitlines()]
    return [" ".join(line.split()) for line in lines if line]


def _kubectl(node: Node, *args: str, stdin: str | None = None) -> str:
    done = subprocess.run(
        [str(node.cluster.bin_dir / "kubectl"), *args],
        input=stdin,
        env={**os.environ, "KUBECONFIG": str(node.cluster.kubeconfig)},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
    return done.stdout + done.stderr


def olm_objects(address: str, env: list[dict[str, str]]) -> str:
    """config/olm as kustomize builds it, the CatalogSource at ``address`` and the
    Subscription handing the operator ``env``."""
    documents = kustomize(REPO / "config" / "olm")
    for doc in documents:
        if doc["kind"] == "CatalogSource":
            doc["spec"]["address"] = address
        if doc["kind"] == "Subscription":
            doc["spec"]["config"] = {"env": env}
    return yaml.safe_dump_all(documents)


def thundercluster(install: Install, daemon: image_builder.BuiltImage) -> dict[str, Any]:
    sample = yaml.safe_load(
        (REPO / "config" / "samples" / "thundercompute_v1alpha1_thundercluster.yaml").read_text()
    )
    repository, tag = daemon.ref.rsplit(":", 1)
    fake = install.fake
    sample["spec"]["thunder"].update(
        {"apiURL": fake.base_url, "artifactBaseURL": fake.artifact_base_url,
         "telemetryURL": fake.base_url, "secretNamespace": NAMESPACE}
    )  # fmt: skip
    sample["spec"]["operator"]["reconcileInterval"] = "5s"
    sample["spec"]["daemon"]["image"] = {"repository": repository, "tag": tag}
    sample["spec"]["daemon"]["extraEnv"] = [{"name": "SSL_CERT_FILE", "value": SA_CA}]
    return dict(sample)


@pytest.fixture(scope="module")
def olm_install(
    real_node: Node,
    node_images: dict[str, image_builder.BuiltImage],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[OlmInstall]:
    why = olm_tools.unavailable()
    assert why is None, why
    node = real_node
    workdir = tmp_path_factory.mktemp("olm")
    last = last_release()
    for component in ("operator", "daemon"):
        node.import_image(last.images[component].archive)
    previous = release_catalog.Release(
        last.bundle,
        f"{last.version}-{commit_stamp(last.commit)}",
        last.images["operator"].ref,
        last.images["daemon"].ref,
    )
    current = release_catalog.Release(
        BUNDLE,
        release_push.default_tag(project_version()),
        node_images["operator"].ref,
        node_images["daemon"].ref,
    )
    release_catalog.build([previous], workdir / "catalog-last")
    release_catalog.build([previous, current], workdir / "catalog-both")

    wait_no_daemon_pods(node)
    forget_earlier_install(node)
    FakeHost(node.fake_host_dir).set_nvidia(gpus=["NVIDIA RTX A6000"] * 4, gpu_type="A6000")
    cert = node.cluster.server_certs[launcher.BRIDGE_CERT]
    with (
        olm_tools.Olm(node.cluster, workdir / "olm") as olm,
        olm_tools.CatalogServer(workdir / "catalog-last", workdir, "opm-last") as served,
        start_fake_thunder(
            tokens=[API_TOKEN],
            listen=f"{launcher.BRIDGE_IP}:0",
            tls=(cert.cert, cert.key),
            ca_file=node.cluster.ca_cert,
            log_path=workdir / "fake-thunder.log",
        ) as fake,
    ):
        install = Install(node, fake, node_images, "", workdir)
        olm_install = OlmInstall(install, olm, last, previous, current, workdir)
        try:
            _readme_olm_install(olm_install, served.address)
            yield olm_install
        finally:
            _remove(node)


def _readme_olm_install(olm_install: OlmInstall, address: str) -> None:
    """The README's OLM install commands, as written but for the token file's path, the
    CatalogSource's address (and the operator's SSL_CERT_FILE) and the ThunderCluster's
    fake Thunder and daemon image."""
    install, node = olm_install.install, olm_install.node
    token_file = olm_install.workdir / "thunder-api-token"
    token_file.touch(mode=0o600)
    token_file.write_text(API_TOKEN + "\n")
    env = [{"name": "SSL_CERT_FILE", "value": SA_CA}]
    for command in readme_olm_commands():
        argv = command.split()
        if argv[0] in ("make", "opm"):
            # make catalog and opm serve: the fixture did both with their code
            # (release.catalog.build, hack.olm.CatalogServer) for the last release.
            continue
        assert argv[0] == "kubectl", command
        if argv[1:3] == ["create", "namespace"] and node.kubectl(
            "get", "namespace", argv[3], "--ignore-not-found"
        ):
            node.kubectl("-n", argv[3], "delete", "secret", "--all")
        elif argv[1:] == ["apply", "-k", "config/olm"]:
            _kubectl(node, "apply", "-f", "-", stdin=olm_objects(address, env))
        elif argv[1:] == ["apply", "-k", "config/samples"]:
            olm_install.wait_csv_succeeded(olm_install.previous)
            daemon = olm_install.last.images["daemon"]
            install.apply("thundercluster", thundercluster(install, daemon))
        else:
            _kubectl(node, *[a.replace("./thunder-api-token", str(token_file)) for a in argv[1:]])


def _remove(node: Node) -> None:
    """Everything of the OLM install, what the README says stays too, so the node's later
    modules (Helm installs) find none of it: the operator's admission policies would
    refuse their daemon's Client writes, and OLM's managed fields on the CRDs would
    conflict with their server-side applies."""
    node.kubectl("delete", "pods", "--all", "-n", "default", "--wait=true", check=False)
    node.kubectl("delete", "thunderclusters", "--all", "--timeout=90s", check=False)
    node.kubectl("delete", "-n", NAMESPACE, "subscriptions", "--all", check=False)
    node.kubectl("delete", "-n", NAMESPACE, "csv", "--all", "--timeout=90s", check=False)
    node.kubectl("delete", "-n", NAMESPACE, "catalogsources,operatorgroups", "--all",
                 check=False)  # fmt: skip
    wait_no_daemon_pods(node)
    node.kubectl("delete", "validatingadmissionpolicies,validatingadmissionpolicybindings",
                 "-l", DRIVER_LABEL, check=False)  # fmt: skip
    node.kubectl("delete", "clusterroles", *CRD_ROLES, "--ignore-not-found", check=False)
    node.kubectl("delete", "crd", *CRDS, "--ignore-not-found", "--timeout=90s", check=False)


def test_the_readme_names_the_olm_install_commands() -> None:
    commands = readme_olm_commands()
    assert "kubectl apply -k config/olm" in commands
    assert "kubectl apply -k config/samples" in commands
    assert commands.index("kubectl apply -k config/olm") < commands.index(
        "kubectl apply -k config/samples"
    )


def test_olm_installs_the_last_release_and_its_csv_succeeds(olm_install: OlmInstall) -> None:
    csv = olm_install.wait_csv_succeeded(olm_install.previous)
    assert csv["spec"]["version"] == olm_install.previous.version
    deployment = olm_install.install.get("deployment", "-n", NAMESPACE, "thunder-operator")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == olm_install.previous.operator_image
    assert {"name": "SSL_CERT_FILE", "value": SA_CA} in container["env"]


def test_a_pod_holding_a_claim_runs_under_the_last_release(olm_install: OlmInstall) -> None:
    install = olm_install.install
    enrolled = wait(install.enrolled_host, "the serving node registered with Thunder", 300)
    assert (enrolled["gpuType"], enrolled["gpuCount"]) == ("A6000", 4)
    zone = wait(install.zone_id, "the node's zone in Thunder")
    install.fake.admin.set_targets(zone, {"A6000": 1.0})
    wait(lambda: install.get("deviceclass", "thunder-gpu-a6000"), "DeviceClass thunder-gpu-a6000")
    install.apply("pod-held", _gpu_pod(install, HELD_POD, READER, gpus=1))
    pod = wait(lambda: running(install, HELD_POD), "the held pod running", 240)
    ticks = wait(lambda: _ticks(install, HELD_POD), "the held pod reading")
    assert ticks, pod


def _gpu_pod(install: Install, name: str, script: str, gpus: int) -> dict[str, Any]:
    """A stock pod running ``script`` with a claim for ``gpus`` A6000s, from a
    ResourceClaimTemplate of its own name (applied here)."""
    request = {
        "name": "gpu",
        "exactly": {"deviceClassName": "thunder-gpu-a6000", "allocationMode": "ExactCount",
                    "count": gpus},
    }  # fmt: skip
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"spec": {"devices": {"requests": [request]}}},
    }
    install.apply(f"claim-template-{name}", template)
    return stock_pod(
        name,
        install.images["stock"].ref,
        script,
        container={"resources": {"claims": [{"name": "gpu", "request": "gpu"}]}},
        resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": name}],
    )


def _ticks(install: Install, name: str) -> list[str]:
    logs = install.node.kubectl("logs", "-n", "default", name, check=False)
    return [line for line in logs.splitlines() if line.startswith("tick ") and "clientId" in line]


def test_olm_upgrades_to_this_release_while_the_claim_is_held(olm_install: OlmInstall) -> None:
    install, node = olm_install.install, olm_install.node
    kubelet_lines = len(node.logs("kubelet").splitlines())
    before = len(_ticks(install, HELD_POD))
    with olm_tools.CatalogServer(
        olm_install.workdir / "catalog-both", olm_install.workdir, "opm-both"
    ) as served:
        # A new release reaches the catalog: the CatalogSource now reads one that has it.
        patch = {"spec": {"address": served.address}}
        node.kubectl("patch", "catalogsource", "-n", NAMESPACE, CATALOG_SOURCE,
                     "--type=merge", "-p", json.dumps(patch))  # fmt: skip
        csv = olm_install.wait_csv_succeeded(olm_install.current, timeout=600)
        assert csv["spec"]["replaces"] == olm_install.previous.csv_name
        wait(lambda: olm_install.csv(olm_install.previous.csv_name) is None,
             "the last release's CSV removed")  # fmt: skip
        sub = install.get("subscription", "-n", NAMESPACE, SUBSCRIPTION)
        assert sub["status"]["installedCSV"] == olm_install.current.csv_name
    # OLM issues the new CSV a certificate of its own once the old CSV, and the Secret it
    # owned, are gone, and rolls the Deployment a second time: until then a pod still
    # serving the old certificate can refuse the apiserver (docs/upgrading.md).
    try:
        wait(lambda: olm_install.webhook_certificate_settled(olm_install.current),
             "the new CSV's own webhook certificate rolled out", timeout=300)  # fmt: skip
    except TimeoutError as err:
        raise AssertionError(f"{err}\n{olm_install.webhook_trust()}") from err
    node.kubectl("rollout", "status", "-n", NAMESPACE, "deployment/thunder-operator",
                 "--timeout=300s", timeout=320)  # fmt: skip
    deployment = install.get("deployment", "-n", NAMESPACE, "thunder-operator")
    image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == olm_install.current.operator_image
    pods = [p for p in install.operator_pods() if not p["metadata"].get("deletionTimestamp")]
    assert [p["spec"]["containers"][0]["image"] for p in pods] == [image], pods

    # As docs/upgrading.md says: the ThunderCluster names the new daemon image.
    repository, tag = olm_install.current.daemon_image.rsplit(":", 1)
    daemon = {"spec": {"daemon": {"image": {"repository": repository, "tag": tag}}}}
    try:
        node.kubectl("patch", "thundercluster", "thunder", "--type=merge", "-p", json.dumps(daemon))
    except launcher.NodeError as err:
        raise AssertionError(f"{err}\n{olm_install.webhook_trust()}") from err

    def new_daemon_ready() -> dict[str, Any] | None:
        pod = install.ready_daemon_pod()
        if pod and pod["spec"]["containers"][0]["image"] == olm_install.current.daemon_image:
            return pod
        return None

    wait(new_daemon_ready, "a Ready daemon pod of this release", timeout=300)
    # The held pod kept running and reading its files through both upgrades.
    assert running(install, HELD_POD)
    wait(lambda: len(_ticks(install, HELD_POD)) > before + 5,
         "the held pod still reading its files")  # fmt: skip
    assert install.failed_prepares("default", kubelet_lines, (HELD_POD,)) == []


def test_the_webhook_serves_olms_certificate_and_answers_the_apiserver(
    olm_install: OlmInstall,
) -> None:
    install, node = olm_install.install, olm_install.node
    configs = install.get("validatingwebhookconfigurations", "-l",
                          f"olm.owner={olm_install.current.csv_name}")  # fmt: skip
    hooks = [hook for config in configs["items"] for hook in config["webhooks"]]
    assert {hook["name"] for hook in hooks} >= {"thunderclusters.thundercompute.com"}
    assert all(hook["clientConfig"].get("caBundle") for hook in hooks), hooks
    done = subprocess.run(
        [str(node.cluster.bin_dir / "kubectl"), f"--kubeconfig={node.cluster.kubeconfig}",
         "create", "-f", "-"],
        input=yaml.safe_dump({
            "apiVersion": "thundercompute.com/v1alpha1",
            "kind": "ThunderCluster",
            "metadata": {"name": "by-hand"},
            "spec": {"daemon": {"nodeSelector": {"not a label key": "x"}}},
        }),
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode != 0
    assert 'admission webhook "thunderclusters.thundercompute.com' in done.stderr, (
        f"{done.stderr}\n{olm_install.webhook_trust()}"
    )
    assert "spec.daemon.nodeSelector" in done.stderr


def test_the_operator_applied_the_admission_policies_itself(olm_install: OlmInstall) -> None:
    install = olm_install.install
    wanted = rendered(operator_identity(NAMESPACE, "thunder-daemon", "thunder-operator"))
    assert wanted
    for obj in wanted:
        resource = {
            "ValidatingAdmissionPolicy": "validatingadmissionpolicies",
            "ValidatingAdmissionPolicyBinding": "validatingadmissionpolicybindings",
        }[obj["kind"]]
        found = install.get(resource, obj["metadata"]["name"])
        assert found, f"{obj['kind']} {obj['metadata']['name']} is missing"
        assert found["metadata"]["labels"] == obj["metadata"]["labels"]
        if obj["kind"] == "ValidatingAdmissionPolicyBinding":
            assert found["spec"]["policyName"] == obj["spec"]["policyName"]
        else:
            assert found["spec"]["validations"] == obj["spec"]["validations"]


def test_a_new_claim_runs_after_the_upgrade_and_nothing_leaks(olm_install: OlmInstall) -> None:
    install = olm_install.install
    manifest = _gpu_pod(install, "after-olm-upgrade", INJECTED, gpus=2)
    pod = run_pod(install.node, manifest, timeout=240)
    logs = pod_logs(install.node, "after-olm-upgrade")
    assert pod["status"]["phase"] == "Succeeded", logs
    check_injected(install, logs)
    for name in ("after-olm-upgrade", HELD_POD):
        install.node.kubectl("delete", "pod", name, "--wait=true", "--timeout=120s")
        install.node.kubectl("delete", "resourceclaimtemplate", name, "--wait=true")
    install.wait_claims_gone("default")
    wait(lambda: not install.cdi_specs(), "the claims' CDI specs removed")
    assert install.fake.admin.leaks() == []


def _helms(obj: dict[str, Any]) -> bool:
    """An earlier module's Helm release left it (``helm test``'s hook objects stay after
    ``helm uninstall``): not the OLM install's."""
    return (obj["metadata"].get("labels") or {}).get("app.kubernetes.io/managed-by") == "Helm"


def _ours(install: Install) -> dict[str, list[str]]:
    """The driver's objects left in the cluster by the OLM install, by kind."""
    left: dict[str, list[str]] = {}
    for kind in ("deployments", "daemonsets", "services", "serviceaccounts", "roles",
                 "rolebindings", "secrets", "configmaps"):  # fmt: skip
        found = install.get(kind, "-n", NAMESPACE) or {"items": []}
        names = [o["metadata"]["name"] for o in found["items"]
                 if not o["metadata"]["name"].startswith("kube-root-ca")
                 and o["metadata"]["name"] != "default" and not _helms(o)]  # fmt: skip
        if names:
            left[kind] = sorted(names)
    for kind in ("clusterroles", "clusterrolebindings", "validatingwebhookconfigurations",
                 "validatingadmissionpolicies", "validatingadmissionpolicybindings",
                 "deviceclasses", "resourceslices", "customresourcedefinitions"):  # fmt: skip
        found = install.get(kind) or {"items": []}
        names = [
            # An OperatorGroup's roles end in a hash of OLM's.
            re.sub(r"^(olm\.og\.[^.]+\.[a-z]+)-\w+$", r"\1", o["metadata"]["name"])
            for o in found["items"]
            if not _helms(o)
            and (
                "thunder" in o["metadata"]["name"]
                or "thundercompute.com" in json.dumps(o.get("spec", {}).get("driver", ""))
                or (o["metadata"].get("labels") or {}).get("olm.owner", "").startswith(PACKAGE)
            )
        ]
        if names:
            left[kind] = sorted(names)
    return left


def readme_olm_uninstall() -> str:
    """The README's OLM uninstall commands: the sh block that deletes the Subscription."""
    section = README.read_text().split("\n## Uninstall\n", 1)[1]
    blocks = [b.split("```", 1)[0] for b in section.split("```sh\n")[1:]]
    found = [b for b in blocks if "delete subscription" in b]
    assert len(found) == 1, "README.md's Uninstall section has no OLM block"
    return found[0]


def test_removing_the_subscription_and_csv_leaves_what_the_readme_says(
    olm_install: OlmInstall,
) -> None:
    install, node = olm_install.install, olm_install.node
    # The README's commands, run by a shell as written, with the node cluster's kubectl.
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", readme_olm_uninstall()],
        env={**os.environ, "KUBECONFIG": str(node.cluster.kubeconfig),
             "PATH": f"{node.cluster.bin_dir}:{os.environ['PATH']}"},
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert olm_install.csv(olm_install.current.csv_name) is None
    wait_no_daemon_pods(node)

    def settled() -> dict[str, list[str]] | None:
        left = _ours(install)
        return left if left == expected_leftovers() else None

    try:
        wait(settled, "only what the README lists left", timeout=180)
    except TimeoutError as err:
        raise AssertionError(f"{err}: {json.dumps(_ours(install), indent=1)}") from err


def expected_leftovers() -> dict[str, Any]:
    """What the README's OLM uninstall says stays."""
    policies = rendered(operator_identity(NAMESPACE, "thunder-daemon", "thunder-operator"))
    return {
        "secrets": ["thunder-api"],
        "validatingadmissionpolicies": sorted(
            p["metadata"]["name"] for p in policies if p["kind"] == "ValidatingAdmissionPolicy"
        ),
        "validatingadmissionpolicybindings": sorted(
            p["metadata"]["name"]
            for p in policies
            if p["kind"] == "ValidatingAdmissionPolicyBinding"
        ),
        "customresourcedefinitions": list(CRDS),
        # OLM's roles for the CRDs, and the OperatorGroup's, which go with it.
        "clusterroles": sorted(
            [*CRD_ROLES, *(f"olm.og.{PACKAGE}.{verb}" for verb in ("admin", "edit", "view"))]
        ),
    }
