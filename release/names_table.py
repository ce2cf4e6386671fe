# Generates the table in docs/install-names.md (between the names-table markers): the name
# every object of the driver gets in each install path, and why where they differ.
#
#   .venv/bin/python -m release.names_table            # rewrite the table
#   .venv/bin/python -m release.names_table --check    # exit 1 if the table is stale
"""One name per object: what Helm, kustomize, OLM and the operator's defaults call each thing.

Sources, each read as the install path itself would produce it:

- **Helm**: ``helm template`` of the chart with its defaults, the release name
  ``thunder-device-plugin`` and the namespace ``thunder-system`` (the README's install
  command); hooks (``helm test``, the uninstall hook) are left out: they are the chart's
  own helpers, not part of the installed driver;
- **kustomize**: ``kubectl kustomize config/default`` and, for the ThunderCluster,
  ``config/samples``;
- **OLM**: the bundle in ``bundle/manifests`` (the CSV's deployment, permissions,
  webhook definitions and ``alm-examples``, and the other manifests);
- **code defaults**: ``python -m thunder_dra.controllers`` with no flag and no variable
  (``thunder_dra.controllers.process.options``), the ThunderCluster model's defaults, and
  the daemon DaemonSet exactly as the operator renders it
  (``thunder_dra.controllers.workload.daemonset``); every DaemonSet the renderer names is
  a row, so a new one shows up without an edit here.

Each row is one object (or one label); a cell is the name that path gives it, or empty
when that path has no such object. Where the non-empty cells differ, ``WHY`` must say
why (the unit test fails otherwise, and when a reason is left for a row whose names
agree).
"""

from __future__ import annotations

import argparse
import inspect
import json
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml

from hack.cluster import binaries
from thunder_dra.api.thundercluster import ThunderClusterSpec
from thunder_dra.controllers.process import options
from thunder_dra.controllers.shared.ownership import ThunderClusterRef
from thunder_dra.controllers.workload import daemonset
from thunder_dra.kube import admissionpolicy, naming

REPO: Final = Path(__file__).resolve().parents[1]
CHART: Final = REPO / "charts" / "thunder-device-plugin"
KUSTOMIZE: Final = REPO / "config" / "default"
SAMPLES: Final = REPO / "config" / "samples"
BUNDLE: Final = REPO / "bundle" / "manifests"
DOC: Final = REPO / "docs" / "install-names.md"
START: Final = "<!-- names-table:begin -->"
END: Final = "<!-- names-table:end -->"
RELEASE: Final = "thunder-device-plugin"
"""The release name the README installs the chart under."""
NAMESPACE: Final = "thunder-system"
"""The namespace the README installs the chart into."""
PATHS: Final = ("helm", "kustomize", "olm", "code")
HEADERS: Final = {
    "helm": f"Helm (release `{RELEASE}`)",
    "kustomize": "kustomize (`config/default`)",
    "olm": "OLM (`bundle/`)",
    "code": "code defaults",
}
COMPONENT: Final = naming.LABEL_COMPONENT
HOOK: Final = "helm.sh/hook"
POLICIES: Final = "validatingadmissionpolicies"
OLM_GENERATES: Final = "(named by OLM)"
"""The cell of an object OLM creates itself from the CSV, under a name of its own."""

_HELM_PREFIX: Final = (
    "Helm prefixes the names with the chart's full name, made from the release name the "
    "user picks; kustomize and OLM install one driver per cluster under fixed `thunder-` "
    "names."
)
_OLM_RBAC: Final = (
    "OLM creates the roles and bindings of the CSV's permissions under names of its own."
)
_OLM_WEBHOOK: Final = (
    "OLM makes the webhook's Service, serving certificate and configuration itself, from "
    "the CSV's `webhookdefinitions`."
)
WHY: Final[Mapping[str, str]] = {
    "operator-sa": _HELM_PREFIX,
    "daemon-sa": _HELM_PREFIX,
    "operator-clusterrole": f"{_HELM_PREFIX} {_OLM_RBAC}",
    "operator-clusterrolebinding": f"{_HELM_PREFIX} {_OLM_RBAC}",
    "daemon-clusterrole": f"{_HELM_PREFIX} {_OLM_RBAC}",
    "daemon-clusterrolebinding": f"{_HELM_PREFIX} {_OLM_RBAC}",
    "operator-role": f"{_HELM_PREFIX} {_OLM_RBAC}",
    "operator-rolebinding": f"{_HELM_PREFIX} {_OLM_RBAC}",
    "deployment": _HELM_PREFIX,
    "metrics-service": _HELM_PREFIX,
    "webhook-service": f"{_HELM_PREFIX} {_OLM_WEBHOOK}",
    "webhook-secret": (
        f"{_HELM_PREFIX} With kustomize, cert-manager's Certificate writes it. {_OLM_WEBHOOK}"
    ),
    "webhook-configuration": (
        "Cluster-scoped, so Helm adds the namespace too (`<full name>-<namespace>`): two "
        f"releases in two namespaces never share it. kustomize ships one. {_OLM_WEBHOOK}"
    ),
    "admission-policies": (
        "Cluster-scoped, so Helm adds the namespace too (`<full name>-<namespace>-`). "
        "kustomize ships the policies the operator applies itself under OLM "
        "(`--apply-admission-policies`), under the same names."
    ),
    "label-managed-by": (
        "Each tool marks what it applies: `Helm`, `kustomize`; the bundle sets none (OLM "
        "keeps labels of its own); the operator marks what it creates itself (the "
        "DaemonSets it renders for the daemon, and the admission policies it applies under "
        "OLM)."
    ),
}


class NamesError(RuntimeError):
    """An install path did not render, or renders something the table cannot place."""


@dataclass(frozen=True, slots=True)
class Row:
    key: str
    what: str
    names: Mapping[str, str]
    """Install path -> its name ("" when that path has no such object)."""

    @property
    def differs(self) -> bool:
        return len({name for name in self.names.values() if name}) > 1


Objects = list[dict[str, Any]]


def _run(cmd: Sequence[str]) -> str:
    proc = subprocess.run(list(cmd), capture_output=True, text=True, check=False, cwd=REPO)
    if proc.returncode != 0:
        raise NamesError(f"{' '.join(cmd)} failed: {proc.stderr.strip()}")
    return proc.stdout


def _objects(text: str) -> Objects:
    return [d for d in yaml.safe_load_all(text) if isinstance(d, dict)]


def render_helm(chart: Path = CHART) -> Objects:
    """The chart with defaults, as the README installs it; hooks left out."""
    text = _run(
        [str(binaries() / "helm"), "template", RELEASE, str(chart), "--namespace", NAMESPACE]
    )
    return [o for o in _objects(text) if HOOK not in (o["metadata"].get("annotations") or {})]


def render_kustomize(folder: Path) -> Objects:
    return _objects(_run([str(binaries() / "kubectl"), "kustomize", str(folder)]))


def read_bundle(folder: Path = BUNDLE) -> Objects:
    found: Objects = []
    for path in sorted(folder.glob("*.yaml")):
        found += _objects(path.read_text())
    return found


# -- picking objects out of a rendering ---------------------------------------------------


def _of(objects: Objects, kind: str, component: str | None = None) -> Objects:
    out = [o for o in objects if o.get("kind") == kind]
    if component is not None:
        out = [o for o in out if (o["metadata"].get("labels") or {}).get(COMPONENT) == component]
    return out


def _one_name(objects: Objects, kind: str, component: str | None = None) -> str:
    found = _of(objects, kind, component)
    if len(found) > 1:
        names = sorted(o["metadata"]["name"] for o in found)
        raise NamesError(f"more than one {kind} of component {component}: {names}")
    return str(found[0]["metadata"]["name"]) if found else ""


def _pod_spec(deployment: Mapping[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return spec


def _env(pod: Mapping[str, Any], name: str) -> str:
    for container in pod.get("containers") or []:
        for var in container.get("env") or []:
            if var.get("name") == name and "value" in var:
                return str(var["value"])
    return ""


def _tls_secret(pod: Mapping[str, Any]) -> str:
    mounted = {
        str(m["name"])
        for c in pod.get("containers") or []
        for m in c.get("volumeMounts") or []
        if "serving-certs" in str(m.get("mountPath", ""))
    }
    for volume in pod.get("volumes") or []:
        if volume.get("name") in mounted and "secret" in volume:
            return str(volume["secret"]["secretName"])
    return ""


def _metrics_service(objects: Objects) -> str:
    found = [
        o
        for o in _of(objects, "Service")
        if any(p.get("name") == "metrics" for p in o["spec"].get("ports") or [])
    ]
    return str(found[0]["metadata"]["name"]) if len(found) == 1 else ""


def _webhook_service(objects: Objects) -> str:
    names = {
        str(w["clientConfig"]["service"]["name"])
        for c in _of(objects, "ValidatingWebhookConfiguration")
        for w in c.get("webhooks") or []
        if "service" in w.get("clientConfig", {})
    }
    if len(names) > 1:
        raise NamesError(f"the webhooks call more than one Service: {sorted(names)}")
    return names.pop() if names else ""


def policy_prefix(names: Iterable[str]) -> str:
    """The common prefix of the six policy names (``<prefix>-<suffix>``)."""
    prefixes: set[str] = set()
    suffixes: set[str] = set()
    for name in names:
        matched = [s for s in admissionpolicy.SUFFIXES if name.endswith("-" + s)]
        if not matched:
            raise NamesError(f"admission policy {name} ends in none of the driver's suffixes")
        suffix = max(matched, key=len)
        suffixes.add(suffix)
        prefixes.add(name[: -len(suffix) - 1])
    if not prefixes:
        return ""
    if len(prefixes) != 1 or suffixes != set(admissionpolicy.SUFFIXES):
        raise NamesError(f"the policies share no prefix or miss one: {sorted(prefixes)}")
    return f"{prefixes.pop()}-"


def _policies(objects: Objects) -> str:
    policies = [str(o["metadata"]["name"]) for o in _of(objects, admissionpolicy.POLICY_KIND)]
    bindings = [str(o["metadata"]["name"]) for o in _of(objects, admissionpolicy.BINDING_KIND)]
    if sorted(policies) != sorted(bindings):
        raise NamesError(f"policies and bindings are named apart: {policies} {bindings}")
    return policy_prefix(policies)


def _label(objects: Objects, key: str) -> str:
    values = {
        str((o["metadata"].get("labels") or {})[key])
        for o in objects
        if key in (o["metadata"].get("labels") or {}) and o.get("kind") != "Namespace"
    }
    return ", ".join(sorted(values))


def _cluster(examples: Objects) -> dict[str, str]:
    """The ThunderCluster's name, token Secret, driver name and DeviceClass prefix, the
    CRD's defaults where the object leaves them out (the model's defaults are the CRD's)."""
    found = [o for o in examples if o.get("kind") == "ThunderCluster"]
    if not found:
        return {}
    if len(found) > 1:
        raise NamesError("more than one ThunderCluster")
    doc = found[0]
    spec = ThunderClusterSpec.model_validate(doc.get("spec") or {})
    return {
        "thundercluster": str(doc["metadata"]["name"]),
        "token-secret": spec.thunder.secret_name,
        "driver": spec.operator.driver_name,
        "device-class-prefix": spec.operator.device_class_prefix,
    }


# -- each install path ---------------------------------------------------------------------


def _installed(objects: Objects, examples: Objects, namespace: str) -> dict[str, str]:
    """The names a path of plain manifests (Helm, kustomize) gives."""
    deployments = _of(objects, "Deployment", naming.COMPONENT_OPERATOR)
    if len(deployments) != 1:
        raise NamesError(f"expected one operator Deployment, got {len(deployments)}")
    pod = _pod_spec(deployments[0])
    names = {
        "namespace": namespace,
        "operator-sa": str(pod.get("serviceAccountName", "")),
        "daemon-sa": _env(pod, "THUNDER_DAEMON_SERVICE_ACCOUNT"),
        "deployment": str(deployments[0]["metadata"]["name"]),
        "metrics-service": _metrics_service(objects),
        "webhook-service": _webhook_service(objects),
        "webhook-configuration": _one_name(objects, "ValidatingWebhookConfiguration"),
        "webhook-secret": _tls_secret(pod),
        "lease": _env(pod, "THUNDER_LEADER_ELECTION_LEASE"),
        "admission-policies": _policies(objects),
        "label-name": _label(objects, naming.LABEL_APP_NAME),
        "label-part-of": _label(objects, "app.kubernetes.io/part-of"),
        "label-managed-by": _label(objects, naming.LABEL_MANAGED_BY),
    }
    for component in (naming.COMPONENT_OPERATOR, naming.COMPONENT_DAEMON):
        for kind in ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"):
            names[f"{component}-{kind.lower()}"] = _one_name(objects, kind, component)
    names.update(_cluster(examples))
    cluster_env = _env(pod, "THUNDER_CLUSTER_NAME")
    if cluster_env and names.get("thundercluster") not in ("", None, cluster_env):
        raise NamesError(
            f"the operator reconciles ThunderCluster {cluster_env}, "
            f"the install creates {names.get('thundercluster')}"
        )
    return names


def helm_names(chart: Path = CHART) -> dict[str, str]:
    objects = render_helm(chart)
    return _installed(objects, objects, NAMESPACE)


def kustomize_names(default: Path = KUSTOMIZE, samples: Path = SAMPLES) -> dict[str, str]:
    objects = render_kustomize(default)
    (namespace,) = [o["metadata"]["name"] for o in objects if o.get("kind") == "Namespace"]
    return _installed(objects, render_kustomize(samples), str(namespace))


def olm_names(folder: Path = BUNDLE) -> dict[str, str]:
    objects = read_bundle(folder)
    csvs = [o for o in objects if o.get("kind") == "ClusterServiceVersion"]
    if len(csvs) != 1:
        raise NamesError(f"expected one ClusterServiceVersion in {folder}, got {len(csvs)}")
    csv = csvs[0]
    install = csv["spec"]["install"]["spec"]
    (deployment,) = install["deployments"]
    pod = _pod_spec(deployment)
    others = [o for o in objects if o.get("kind") != "ClusterServiceVersion"]
    examples = [
        o for o in json.loads(csv["metadata"]["annotations"]["alm-examples"]) if isinstance(o, dict)
    ]
    listed = [
        name
        for p in install.get("clusterPermissions") or []
        for rule in p["rules"]
        if POLICIES in rule.get("resources", [])
        for name in rule.get("resourceNames") or []
    ]
    labels = [{"metadata": {"labels": deployment.get("label") or {}}}, *others]
    names = {
        "namespace": str(
            csv["metadata"]["annotations"].get("operators.operatorframework.io/suggested-namespace")
            or ""
        ),
        "operator-sa": str(pod.get("serviceAccountName", "")),
        "daemon-sa": _env(pod, "THUNDER_DAEMON_SERVICE_ACCOUNT"),
        "deployment": str(deployment["name"]),
        "metrics-service": _metrics_service(others),
        "webhook-service": OLM_GENERATES if csv["spec"].get("webhookdefinitions") else "",
        "webhook-configuration": OLM_GENERATES if csv["spec"].get("webhookdefinitions") else "",
        "webhook-secret": OLM_GENERATES if csv["spec"].get("webhookdefinitions") else "",
        "lease": _env(pod, "THUNDER_LEADER_ELECTION_LEASE"),
        "admission-policies": policy_prefix(listed),
        "label-name": _label(labels, naming.LABEL_APP_NAME),
        "label-part-of": _label(labels, "app.kubernetes.io/part-of"),
        "label-managed-by": _label(labels, naming.LABEL_MANAGED_BY),
    }
    sas = {p["serviceAccountName"] for p in install.get("clusterPermissions") or []}
    sas |= {p["serviceAccountName"] for p in install.get("permissions") or []}
    for component, sa in (
        (naming.COMPONENT_OPERATOR, names["operator-sa"]),
        (naming.COMPONENT_DAEMON, names["daemon-sa"]),
    ):
        cluster = any(
            p["serviceAccountName"] == sa for p in install.get("clusterPermissions") or []
        )
        local = any(p["serviceAccountName"] == sa for p in install.get("permissions") or [])
        names[f"{component}-clusterrole"] = OLM_GENERATES if cluster else ""
        names[f"{component}-clusterrolebinding"] = OLM_GENERATES if cluster else ""
        names[f"{component}-role"] = OLM_GENERATES if local else ""
        names[f"{component}-rolebinding"] = OLM_GENERATES if local else ""
    if not {names["operator-sa"], names["daemon-sa"]} <= sas:
        raise NamesError(f"the CSV grants nothing to one of its ServiceAccounts: {sorted(sas)}")
    names.update(_cluster(examples))
    return names


def _call_renderer(render: Callable[..., Any], spec: ThunderClusterSpec) -> list[dict[str, Any]]:
    """Call a DaemonSet renderer with what it asks for, by parameter name."""
    owner = ThunderClusterRef(name="thunder", uid="00000000-0000-0000-0000-000000000000")
    offered: dict[str, Any] = {
        "spec": spec,
        "namespace": options.DEFAULT_NAMESPACE,
        "owner": owner,
        "service_account": options.DEFAULT_DAEMON_SERVICE_ACCOUNT,
    }
    kwargs: dict[str, Any] = {}
    for name, parameter in inspect.signature(render).parameters.items():
        if name in offered:
            kwargs[name] = offered[name]
        elif parameter.default is inspect.Parameter.empty and parameter.kind not in (
            inspect.Parameter.VAR_POSITIONAL,
            inspect.Parameter.VAR_KEYWORD,
        ):
            raise NamesError(f"daemonset.{render.__name__} asks for {name}, unknown here")
    rendered = render(**kwargs)
    return list(rendered) if isinstance(rendered, list | tuple) else [rendered]


def _rendered_daemon_sets(spec: ThunderClusterSpec) -> list[dict[str, Any]]:
    """What every ``render*`` function of the DaemonSet module returns for ``spec``."""
    return [
        body
        for attribute, value in vars(daemonset).items()
        if attribute.startswith("render")
        and inspect.isfunction(value)
        and value.__module__ == daemonset.__name__
        for body in _call_renderer(value, spec)
        if isinstance(body, dict) and body.get("kind") == "DaemonSet"
    ]


def _role(body: Mapping[str, Any]) -> str:
    labels = body["spec"]["template"]["metadata"].get("labels") or {}
    roles = [str(v) for k, v in labels.items() if k.endswith("/daemon-role")]
    return roles[0] if roles else ""


def daemon_sets() -> dict[str, str]:
    """Every DaemonSet the operator renders, by the renderer's own names, and its node role
    ("" when the pods carry none): what ``render`` (and any other ``render*`` function of
    the module) returns for the default spec, and every ``*DAEMONSET_NAME`` constant."""
    found: dict[str, str] = {}
    for body in _rendered_daemon_sets(ThunderClusterSpec()):
        found[str(body["metadata"]["name"])] = _role(body)
    for attribute, value in vars(daemonset).items():
        if attribute.endswith("DAEMONSET_NAME") and isinstance(value, str):
            found.setdefault(value, "")
    if not found:
        raise NamesError("the operator renders no DaemonSet")
    return dict(sorted(found.items()))


def token_key() -> str:
    """The key of the token Secret the daemon pods read, as the operator renders them."""
    spec = ThunderClusterSpec()
    keys = {
        str(var["valueFrom"]["secretKeyRef"]["key"])
        for body in _rendered_daemon_sets(spec)
        for container in body["spec"]["template"]["spec"]["containers"]
        for var in container.get("env") or []
        if var.get("valueFrom", {}).get("secretKeyRef", {}).get("name") == spec.thunder.secret_name
    }
    if len(keys) != 1:
        raise NamesError(f"the daemon reads the token Secret by {sorted(keys) or 'no key'}")
    return keys.pop()


def code_names() -> dict[str, str]:
    """``python -m thunder_dra.controllers`` with no flag and no variable."""
    parsed = options.parse_options([], environ={})
    spec = ThunderClusterSpec()
    identity = admissionpolicy.Identity(
        namespace=parsed.namespace,
        daemon_service_account=parsed.daemon_service_account,
        operator_service_account=parsed.operator_service_account,
        name_prefix=admissionpolicy.OPERATOR_PREFIX,
    )
    return {
        "namespace": parsed.namespace,
        "operator-sa": parsed.operator_service_account,
        "daemon-sa": parsed.daemon_service_account,
        "lease": parsed.lease_name,
        "admission-policies": policy_prefix(identity.policy_names()),
        "thundercluster": parsed.cluster_name,
        "token-secret": spec.thunder.secret_name,
        "driver": spec.operator.driver_name,
        "device-class-prefix": spec.operator.device_class_prefix,
        "label-name": naming.APP_NAME,
        "label-managed-by": naming.MANAGED_BY,
    }


# -- the table ----------------------------------------------------------------------------

OBJECTS: Final = (
    ("namespace", "Namespace"),
    ("operator-sa", "ServiceAccount of the operator"),
    ("daemon-sa", "ServiceAccount of the daemon"),
    ("operator-clusterrole", "ClusterRole of the operator"),
    ("operator-clusterrolebinding", "ClusterRoleBinding of the operator"),
    ("operator-role", "Role of the operator (its namespace)"),
    ("operator-rolebinding", "RoleBinding of the operator (its namespace)"),
    ("daemon-clusterrole", "ClusterRole of the daemon"),
    ("daemon-clusterrolebinding", "ClusterRoleBinding of the daemon"),
    ("daemon-role", "Role of the daemon (its namespace)"),
    ("daemon-rolebinding", "RoleBinding of the daemon (its namespace)"),
    ("deployment", "Deployment of the operator"),
    ("metrics-service", "Service of the operator's metrics"),
    ("webhook-service", "Service of the webhook"),
    ("webhook-configuration", "ValidatingWebhookConfiguration"),
    ("webhook-secret", "Secret of the webhook's serving certificate"),
    ("lease", "Lease of the leader election"),
    ("thundercluster", "ThunderCluster"),
    ("token-secret", "Secret of the Thunder API token"),
    ("admission-policies", "ValidatingAdmissionPolicies and their bindings (name prefix)"),
    ("device-class-prefix", "DeviceClass name prefix"),
    ("driver", "DRA driver name"),
    ("label-name", f"label `{naming.LABEL_APP_NAME}`"),
    ("label-part-of", "label `app.kubernetes.io/part-of`"),
    ("label-managed-by", f"label `{naming.LABEL_MANAGED_BY}`"),
)


def rows(
    helm: Mapping[str, str],
    kustomize: Mapping[str, str],
    olm: Mapping[str, str],
    code: Mapping[str, str],
) -> list[Row]:
    by_path = {"helm": helm, "kustomize": kustomize, "olm": olm, "code": code}
    out = [
        Row(key, what, {p: by_path[p].get(key, "") for p in PATHS})
        for key, what in OBJECTS
        if any(by_path[p].get(key) for p in PATHS)
    ]
    # Run-time objects: the operator renders them the same in every install path.
    key = token_key()
    out.insert(
        [r.key for r in out].index("token-secret") + 1,
        Row("token-key", "key of the token in that Secret", dict.fromkeys(PATHS, key)),
    )
    for name, role in daemon_sets().items():
        what = "DaemonSet of the daemon" + (f" on {role} nodes" if role else "")
        out.append(
            Row(
                f"daemonset-{name}",
                f"{what} (rendered by the operator)",
                dict.fromkeys(PATHS, name),
            )
        )
    return out


def all_rows() -> list[Row]:
    return rows(helm_names(), kustomize_names(), olm_names(), code_names())


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("<", "\\<")


def table(found: Sequence[Row], why: Mapping[str, str] = WHY) -> str:
    head = " | ".join(HEADERS[p] for p in PATHS)
    lines = [f"| object | {head} | why they differ |", "|" + " --- |" * (len(PATHS) + 2)]
    for row in found:
        cells = " | ".join(
            (f"`{row.names[p]}`" if row.names[p] != OLM_GENERATES else row.names[p])
            if row.names[p]
            else ""
            for p in PATHS
        )
        reason = _cell(why.get(row.key, "")) if row.differs else ""
        lines.append(f"| {row.what} | {cells} | {reason} |")
    return "\n".join(lines) + "\n"


def unexplained(found: Sequence[Row], why: Mapping[str, str] = WHY) -> list[str]:
    """Rows whose names differ with no reason given, and reasons left for rows that agree."""
    problems = [
        f"{r.key}: {dict(r.names)} differ, WHY has no reason"
        for r in found
        if r.differs and not why.get(r.key)
    ]
    keys = {r.key for r in found if r.differs}
    problems += [f"{k}: WHY gives a reason, the names agree" for k in why if k not in keys]
    return problems


def replace(doc: str, generated: str) -> str:
    if doc.count(START) != 1 or doc.count(END) != 1:
        raise NamesError(f"{DOC.name} needs one {START} and one {END}")
    head, rest = doc.split(START)
    _, tail = rest.split(END)
    return f"{head}{START}\n{generated}{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--doc", type=Path, default=DOC)
    parser.add_argument("--check", action="store_true", help="fail if the table is stale")
    args = parser.parse_args(argv)
    doc: Path = args.doc
    current = doc.read_text()
    try:
        found = all_rows()
        problems = unexplained(found)
        if problems:
            raise NamesError("names differ without a reason:\n  " + "\n  ".join(problems))
        wanted = replace(current, table(found))
    except NamesError as err:
        print(err, file=sys.stderr)
        return 1
    if args.check:
        if current != wanted:
            print(
                f"the names table in {doc} is out of date with the chart, config/, the "
                "bundle or the operator's defaults: run `.venv/bin/python -m "
                "release.names_table`",
                file=sys.stderr,
            )
            return 1
        print(f"the names table in {doc} is up to date")
        return 0
    if current != wanted:
        doc.write_text(wanted)
    print(f"wrote the names table in {doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
