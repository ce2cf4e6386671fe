# Generates the OLM bundle in bundle/ from config/: the ClusterServiceVersion (install
# strategy, permissions and webhook definitions from the kustomize output of
# config/manifests, alm-examples from config/samples and config/samples/internal,
# spec/status descriptors from the CRD schemas), the CRDs (copies of crds/), the metrics
# Service, metadata/annotations.yaml and bundle.Dockerfile.
# OLM cannot install ValidatingAdmissionPolicies, so the CSV starts the operator with
# THUNDER_APPLY_ADMISSION_POLICIES=1 and grants it exactly the policies and bindings of
# thunder_dra/kube/admissionpolicy.py, which it then applies itself.
#
#   .venv/bin/python -m release.bundle            # write bundle/ (make bundle)
#   .venv/bin/python -m release.bundle --check    # exit 1 if bundle/ differs from config/
#
# kubectl (with its built-in kustomize) comes from hack/build-tools.sh, or $KUBECTL.
"""OLM bundle generation from the kustomize manifests in config/."""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final

import yaml

from thunder_dra.kube.admissionpolicy import OPERATOR_PREFIX, Identity

REPO: Final = Path(__file__).resolve().parents[1]
BUNDLE: Final = REPO / "bundle"
PACKAGE: Final = "thunder-device-plugin"
CHANNEL: Final = "candidate"
MATURITY: Final = "alpha"
OPERATOR_DEPLOYMENT: Final = "thunder-operator"
OPERATOR_SA: Final = "thunder-operator"
DAEMON_SA: Final = "thunder-daemon"
MIN_KUBE_VERSION: Final = "1.34.0"
ICON: Final = REPO / "config" / "manifests" / "icon.svg"
CHART_VALUES: Final = REPO / "charts" / "thunder-device-plugin" / "values.yaml"
GROUP: Final = "thundercompute.com"
# Objects users do not create by hand; the console hides them.
INTERNAL_OBJECTS: Final = ["clients.thundercompute.com"]

DESCRIPTION: Final = """\
Thunder Device Plugin attaches Thunder Compute GPUs to Kubernetes pods and KubeVirt
virtual machines through Dynamic Resource Allocation (`resource.k8s.io/v1`). Thunder
GPUs are reached over the network, so they are pooled per zone rather than pinned to
a node: a pod on any node of a zone can use any GPU the zone serves.

## How it works

* The **operator** reads Thunder inventory and publishes one ResourceSlice pool per
  zone and GPU model, one device per published GPU, and one DeviceClass per model
  (`thunder-gpu-<model>`, with the extended resource `thundercompute.com/gpu-<model>`).
  It also runs the node daemon and revokes enrollments whose claims are gone.
* The **node daemon** (a DaemonSet the operator renders) serves the DRA kubelet
  plugin: it enrolls a Thunder client per claim and makes the Thunder client library
  available to each container through CDI, or writes a setup Secret for KubeVirt VMs.

## Before you install

1. Kubernetes 1.34 or newer (1.36 or newer, or the `DRAExtendedResource` gate, to
   request GPUs with `resources.limits`).
2. A Secret `thunder-api` in the operator's namespace with your Thunder API token:
   `kubectl -n <namespace> create secret generic thunder-api \\
   --from-literal=THUNDER_API_TOKEN=<token>`.
3. GPU-serving nodes labelled `thundercompute.com/node=true` and
   `topology.kubernetes.io/zone=<zone>`.

## After you install

Create the cluster's one **ThunderCluster** (the example holds every default), then:

```
kubectl get deviceclasses -l app.kubernetes.io/name=thunder-dra-driver \\
  -o custom-columns=CLASS:.metadata.name,RESOURCE:.spec.extendedResourceName
```

Request GPUs with a ResourceClaim naming the class, or with
`resources.limits: {thundercompute.com/gpu-a6000: 2}`.
"""

SPEC_X: Final[dict[tuple[str, ...], list[str]]] = {
    ("thunder", "secretName"): ["urn:alm:descriptor:io.kubernetes:Secret"],
    ("daemon", "nodeSelector"): ["urn:alm:descriptor:com.tectonic.ui:selector:core:v1:Node"],
    ("daemon", "tolerations"): ["urn:alm:descriptor:com.tectonic.ui:tolerations"],
    ("daemon", "resources"): ["urn:alm:descriptor:com.tectonic.ui:resourceRequirements"],
    ("daemon", "image", "pullPolicy"): ["urn:alm:descriptor:com.tectonic.ui:imagePullPolicy"],
}
STATUS_X: Final[dict[tuple[str, ...], list[str]]] = {
    ("conditions",): ["urn:alm:descriptor:io.kubernetes.conditions"],
}


def kubectl() -> str:
    explicit = os.environ.get("KUBECTL")
    if explicit:
        return explicit
    bin_dir = subprocess.run(
        [str(REPO / "hack" / "build-tools.sh")], check=True, capture_output=True, text=True
    ).stdout.strip()
    return str(Path(bin_dir) / "kubectl")


def kustomize(directory: Path) -> list[dict[str, Any]]:
    out = subprocess.run(
        [kubectl(), "kustomize", str(directory)], check=True, capture_output=True, text=True
    ).stdout
    # libyaml when PyYAML has it: the same documents in a tenth of the time.
    loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return [doc for doc in yaml.load_all(out, Loader=loader) if doc]


def internal_samples() -> list[dict[str, Any]]:
    """Examples of the objects only the driver creates (for alm-examples alone)."""
    folder = REPO / "config" / "samples" / "internal"
    return [yaml.safe_load(p.read_text()) for p in sorted(folder.glob("*.yaml"))]


def project_version() -> str:
    for line in (REPO / "pyproject.toml").read_text().splitlines():
        if line.startswith("version"):
            return line.split("=", 1)[1].strip().strip('"')
    raise SystemExit("no version in pyproject.toml")


def _title(name: str) -> str:
    words: list[str] = []
    current = ""
    for ch in name:
        if ch.isupper() and current and not current[-1].isupper():
            words.append(current)
            current = ch
        else:
            current += ch
    words.append(current)
    text = " ".join(words)
    for short, long in (("U R L", "URL"), ("I P", "IP")):
        text = text.replace(short, long)
    return text[:1].upper() + text[1:]


def _leaves(
    schema: Mapping[str, Any], path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], Mapping[str, Any]]]:
    """Descriptor-worthy fields: scalars, lists and maps; objects are walked into."""
    props: Mapping[str, Any] = schema.get("properties", {})
    for name, sub in props.items():
        here = (*path, name)
        if sub.get("type") == "object" and "properties" in sub and here not in SPEC_X:
            yield from _leaves(sub, here)
        else:
            yield here, sub


def _x_descriptors(path: tuple[str, ...], sub: Mapping[str, Any], status: bool) -> list[str]:
    table = STATUS_X if status else SPEC_X
    if path in table:
        return list(table[path])
    if status:
        return ["urn:alm:descriptor:text"]
    kind = sub.get("type")
    if kind == "integer":
        return ["urn:alm:descriptor:com.tectonic.ui:number"]
    if kind == "boolean":
        return ["urn:alm:descriptor:com.tectonic.ui:booleanSwitch"]
    if kind == "string" and "enum" in sub:
        options = [f"urn:alm:descriptor:com.tectonic.ui:select:{v}" for v in sub["enum"]]
        return options
    if kind == "string":
        return ["urn:alm:descriptor:com.tectonic.ui:text"]
    return ["urn:alm:descriptor:com.tectonic.ui:advanced"]


def descriptors(crd: Mapping[str, Any], part: str) -> list[dict[str, Any]]:
    version = crd["spec"]["versions"][0]
    schema = version["schema"]["openAPIV3Schema"]["properties"].get(part, {})
    out = []
    for path, sub in _leaves(schema):
        if part == "status" and path in (("pools",),):
            continue
        description = " ".join(str(sub.get("description", "")).split())
        out.append(
            {
                "path": ".".join(path),
                "displayName": _title(path[-1]),
                "description": description,
                "x-descriptors": _x_descriptors(path, sub, part == "status"),
            }
        )
    return out


def owned_crd(
    crd: Mapping[str, Any], display: str, resources: list[dict[str, str]]
) -> dict[str, Any]:
    version = crd["spec"]["versions"][0]
    description = " ".join(str(version["schema"]["openAPIV3Schema"]["description"]).split())
    entry: dict[str, Any] = {
        "name": crd["metadata"]["name"],
        "version": version["name"],
        "kind": crd["spec"]["names"]["kind"],
        "displayName": display,
        "description": description,
    }
    if resources:
        entry["resources"] = resources
    if crd["spec"]["group"] == GROUP:
        spec = descriptors(crd, "spec")
        status = descriptors(crd, "status")
        if spec:
            entry["specDescriptors"] = spec
        if status:
            entry["statusDescriptors"] = status
    return entry


def _rules_for(
    objects: list[dict[str, Any]], role_kind: str, binding_kind: str
) -> list[dict[str, Any]]:
    roles = {o["metadata"]["name"]: o for o in objects if o["kind"] == role_kind}
    by_sa: dict[str, list[dict[str, Any]]] = {}
    for binding in (o for o in objects if o["kind"] == binding_kind):
        role = roles.get(binding["roleRef"]["name"])
        if role is None:
            continue
        for subject in binding["subjects"]:
            if subject["kind"] == "ServiceAccount":
                by_sa.setdefault(subject["name"], []).extend(role["rules"])
    return [{"serviceAccountName": sa, "rules": rules} for sa, rules in sorted(by_sa.items())]


def webhook_definitions(
    objects: list[dict[str, Any]], deployment: Mapping[str, Any]
) -> list[dict[str, Any]]:
    ports = {
        p["name"]: p["containerPort"]
        for c in deployment["spec"]["template"]["spec"]["containers"]
        for p in c.get("ports", [])
    }
    defs = []
    for config in (o for o in objects if o["kind"] == "ValidatingWebhookConfiguration"):
        for hook in config["webhooks"]:
            service = hook["clientConfig"]["service"]
            entry: dict[str, Any] = {
                "type": "ValidatingAdmissionWebhook",
                "generateName": hook["name"],
                "deploymentName": OPERATOR_DEPLOYMENT,
                "containerPort": service.get("port", 443),
                "targetPort": ports["webhook"],
                "webhookPath": service["path"],
                "admissionReviewVersions": hook["admissionReviewVersions"],
                "sideEffects": hook["sideEffects"],
                "failurePolicy": hook["failurePolicy"],
                "matchPolicy": hook.get("matchPolicy", "Equivalent"),
                "timeoutSeconds": hook.get("timeoutSeconds", 10),
                "rules": hook["rules"],
            }
            defs.append(entry)
    return defs


# Kinds config/manifests must not hold: OLM would drop them silently.
UNSHIPPABLE_KINDS: Final = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
POLICY_ENV: Final = [
    {"name": "THUNDER_APPLY_ADMISSION_POLICIES", "value": "1"},
    {"name": "THUNDER_OPERATOR_SERVICE_ACCOUNT", "value": OPERATOR_SA},
]


def policy_rules() -> list[dict[str, Any]]:
    """What the operator needs to apply its admission policies, and nothing else."""
    names = Identity("", DAEMON_SA, OPERATOR_SA, OPERATOR_PREFIX).policy_names()
    group = ["admissionregistration.k8s.io"]
    resources = ["validatingadmissionpolicies", "validatingadmissionpolicybindings"]
    return [
        # create cannot be limited by name (the object does not exist yet).
        {"apiGroups": group, "resources": resources, "verbs": ["create"]},
        {
            "apiGroups": group,
            "resources": resources,
            "resourceNames": names,
            "verbs": ["get", "update"],
        },
    ]


def _with_policy_env(deployment: Mapping[str, Any]) -> dict[str, Any]:
    spec = json.loads(json.dumps(deployment["spec"]))
    container = spec["template"]["spec"]["containers"][0]
    present = {e["name"] for e in container.get("env", [])}
    container["env"] = [
        *container.get("env", []),
        *(e for e in POLICY_ENV if e["name"] not in present),
    ]
    return dict(spec)


def daemon_image() -> str:
    values = yaml.safe_load(CHART_VALUES.read_text())
    image = values["daemon"]["image"]
    return f"{image['repository']}:{image['tag']}"


def build_csv(
    objects: list[dict[str, Any]], samples: list[dict[str, Any]], version: str
) -> dict[str, Any]:
    deployment = next(
        o
        for o in objects
        if o["kind"] == "Deployment" and o["metadata"]["name"] == OPERATOR_DEPLOYMENT
    )
    operator_image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
    crds = {o["metadata"]["name"]: o for o in objects if o["kind"] == "CustomResourceDefinition"}
    icon = base64.b64encode(ICON.read_bytes()).decode()
    thunder = [
        owned_crd(
            crds[f"thunderclusters.{GROUP}"],
            "Thunder Cluster",
            [
                {"kind": "DaemonSet", "name": "", "version": "v1"},
                {"kind": "ResourceSlice", "name": "", "version": "v1"},
                {"kind": "DeviceClass", "name": "", "version": "v1"},
            ],
        ),
        owned_crd(
            crds[f"clients.{GROUP}"],
            "Thunder Client",
            [{"kind": "ResourceClaim", "name": "", "version": "v1"}],
        ),
    ]
    annotations = {
        "alm-examples": json.dumps(samples, indent=2),
        "capabilities": "Basic Install",
        "categories": "AI/Machine Learning",
        "containerImage": operator_image,
        "description": "Thunder Compute network GPUs for pods and KubeVirt VMs through "
        "Dynamic Resource Allocation, pooled per zone.",
        "operators.operatorframework.io/internal-objects": json.dumps(INTERNAL_OBJECTS),
        "operators.operatorframework.io/suggested-namespace": "thunder-system",
        "repository": "https://github.com/thunder-compute/thunder-device-plugin",
        "support": "Thunder Compute",
    }
    unshippable = sorted({o["kind"] for o in objects if o["kind"] in UNSHIPPABLE_KINDS})
    if unshippable:
        raise SystemExit(f"config/manifests holds {', '.join(unshippable)}: OLM cannot ship it")
    spec_deployment = {
        "name": OPERATOR_DEPLOYMENT,
        "label": deployment["metadata"].get("labels", {}),
        "spec": _with_policy_env(deployment),
    }
    cluster_permissions = _rules_for(objects, "ClusterRole", "ClusterRoleBinding")
    for entry in cluster_permissions:
        if entry["serviceAccountName"] == OPERATOR_SA:
            entry["rules"] = [*entry["rules"], *policy_rules()]
    return {
        "apiVersion": "operators.coreos.com/v1alpha1",
        "kind": "ClusterServiceVersion",
        "metadata": {
            "name": f"{PACKAGE}.v{version}",
            "namespace": "placeholder",
            "annotations": annotations,
        },
        "spec": {
            "displayName": "Thunder Device Plugin",
            "description": DESCRIPTION,
            "version": version,
            "minKubeVersion": MIN_KUBE_VERSION,
            "maturity": MATURITY,
            "keywords": ["gpu", "dra", "dynamic-resource-allocation", "kubevirt", "thunder"],
            "links": [
                {
                    "name": "Source",
                    "url": "https://github.com/thunder-compute/thunder-device-plugin",
                },
                {"name": "Thunder Compute", "url": "https://www.thundercompute.com"},
            ],
            "maintainers": [{"name": "Thunder Compute", "email": "support@thundercompute.com"}],
            "provider": {"name": "Thunder Compute", "url": "https://www.thundercompute.com"},
            "icon": [{"base64data": icon, "mediatype": "image/svg+xml"}],
            "installModes": [
                {"type": "OwnNamespace", "supported": False},
                {"type": "SingleNamespace", "supported": False},
                {"type": "MultiNamespace", "supported": False},
                {"type": "AllNamespaces", "supported": True},
            ],
            "customresourcedefinitions": {"owned": thunder},
            "install": {
                "strategy": "deployment",
                "spec": {
                    "clusterPermissions": cluster_permissions,
                    "permissions": _rules_for(objects, "Role", "RoleBinding"),
                    "deployments": [spec_deployment],
                },
            },
            "webhookdefinitions": webhook_definitions(objects, deployment),
            "relatedImages": [
                {"name": "operator", "image": operator_image},
                {"name": "daemon", "image": daemon_image()},
            ],
        },
    }


# What OLM installs from the bundle besides the CSV and CRDs.
EXTRA_KINDS: Final = ("Service",)
SKIPPED_SERVICES: Final = ("thunder-webhook",)  # OLM makes the webhook Service itself


def extra_manifests(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out = {}
    for obj in objects:
        if obj["kind"] not in EXTRA_KINDS or obj["metadata"]["name"] in SKIPPED_SERVICES:
            continue
        clean = json.loads(json.dumps(obj))
        clean["metadata"].pop("namespace", None)
        api = obj["apiVersion"].replace("/", "_")
        name = f"{obj['metadata']['name']}_{api}_{obj['kind'].lower()}"
        out[f"{name}.yaml"] = clean
    return out


ANNOTATIONS: Final = {
    "operators.operatorframework.io.bundle.mediatype.v1": "registry+v1",
    "operators.operatorframework.io.bundle.manifests.v1": "manifests/",
    "operators.operatorframework.io.bundle.metadata.v1": "metadata/",
    "operators.operatorframework.io.bundle.package.v1": PACKAGE,
    "operators.operatorframework.io.bundle.channels.v1": CHANNEL,
    "operators.operatorframework.io.bundle.channel.default.v1": CHANNEL,
}

DOCKERFILE_HEAD: Final = """\
# The OLM bundle image (generated by release/bundle.py), built from bundle/:
#   docker build -f bundle/bundle.Dockerfile -t <registry>/thunder-device-plugin-bundle:<v> bundle/
FROM scratch
"""

HEADER: Final = "# Generated by release/bundle.py from config/ (make bundle). Do not edit.\n"


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the description, alm-examples) as readable literal blocks."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def _dump(obj: Any) -> str:
    return HEADER + yaml.dump(obj, Dumper=_Dumper, sort_keys=False, width=100)


def render(out: Path) -> None:
    """Write the whole bundle into ``out`` (a fresh directory)."""
    objects = kustomize(REPO / "config" / "manifests")
    samples = kustomize(REPO / "config" / "samples") + internal_samples()
    version = project_version()
    manifests = out / "manifests"
    metadata = out / "metadata"
    manifests.mkdir(parents=True)
    metadata.mkdir(parents=True)
    csv = build_csv(objects, samples, version)
    (manifests / f"{PACKAGE}.clusterserviceversion.yaml").write_text(_dump(csv))
    for source in sorted((REPO / "crds").glob("*.yaml")):
        shutil.copyfile(source, manifests / source.name)
    for name, obj in extra_manifests(objects).items():
        (manifests / name).write_text(_dump(obj))
    (metadata / "annotations.yaml").write_text(_dump({"annotations": ANNOTATIONS}))
    labels = "".join(f"LABEL {k}={v}\n" for k, v in ANNOTATIONS.items())
    (out / "bundle.Dockerfile").write_text(
        DOCKERFILE_HEAD + labels + "COPY manifests /manifests/\nCOPY metadata /metadata/\n"
    )


def _files(root: Path) -> dict[str, bytes]:
    files = sorted(p for p in root.rglob("*") if p.is_file())
    return {str(p.relative_to(root)): p.read_bytes() for p in files}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if bundle/ is stale")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp) / "bundle"
        render(fresh)
        wanted, have = _files(fresh), _files(BUNDLE)
        if args.check:
            stale = sorted(k for k in wanted.keys() | have.keys() if wanted.get(k) != have.get(k))
            if stale:
                print(
                    "bundle/ is out of date with config/ (run `make bundle`): " + ", ".join(stale),
                    file=sys.stderr,
                )
                return 1
            print("bundle/ is up to date")
            return 0
        for name in have.keys() - wanted.keys():
            (BUNDLE / name).unlink()
        for name, data in wanted.items():
            target = BUNDLE / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
    print(f"wrote {BUNDLE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
