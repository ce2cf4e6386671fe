"""The main chart: lint, and what it renders for defaults and each common set-up."""

from __future__ import annotations

import base64
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa

from tests.unit.packaging.chartkit import (
    CHART,
    NAMESPACE,
    Manifests,
    RenderError,
    env_of,
    helm,
    render,
)
from thunder_dra.webhooks import validate_thundercluster

MATRIX = {
    "defaults": [],
    "cert-manager": ["--set", "webhook.certManager.enabled=true"],
    "service-monitor": ["--set", "metrics.serviceMonitor.enabled=true"],
    "claims-only": ["--set", "operator.extendedResourcePrefix="],
    "custom-secret": ["--set", "thunder.secretName=thunder-credentials"],
    **{f"examples/{p.name}": ["-f", str(p)] for p in sorted((CHART / "examples").glob("*.yaml"))},
}


@pytest.fixture(scope="module", params=sorted(MATRIX))
def rendered(request: pytest.FixtureRequest) -> tuple[str, Manifests]:
    name = str(request.param)
    return name, render(*MATRIX[name])


def test_chart_lints_strictly() -> None:
    done = subprocess.run(
        [helm(), "lint", "--strict", str(CHART)], check=False, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_set_up_renders_the_whole_install(rendered: tuple[str, Manifests]) -> None:
    name, m = rendered
    assert {
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "Deployment",
        "Service",
        "ValidatingWebhookConfiguration",
        "ThunderCluster",
        "Pod",
    } <= m.kinds(), name
    for obj in m.objects:
        assert obj["metadata"]["labels"]["app.kubernetes.io/name"] == "thunder-dra-driver"


def test_the_rendered_thundercluster_passes_the_webhooks_own_validation(
    rendered: tuple[str, Manifests],
) -> None:
    # The chart's CREATE is not sent to the webhook during install, so what the chart
    # renders must be exactly what the webhook would accept.
    name, m = rendered
    cluster = m.one("ThunderCluster")
    assert validate_thundercluster(cluster) == [], name
    assert cluster["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    assert cluster["spec"]["thunder"]["secretNamespace"] == NAMESPACE


def test_the_operator_runs_hardened_with_probes_and_tracing_off() -> None:
    m = render()
    deploy = m.one("Deployment")
    pod = deploy["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert container["resources"]["requests"] == {"cpu": "100m", "memory": "128Mi"}
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"health": 8081, "metrics": 8080, "webhook": 9443}
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert container[probe]["httpGet"]["port"] == "health"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    env = env_of(container)
    assert env["OTEL_SDK_DISABLED"] == "true"
    assert env["OTEL_TRACES_EXPORTER"] == "none"
    assert env["THUNDER_WEBHOOK_PORT"] == "9443"
    assert env["THUNDER_HEALTH_PORT"] == "8081"
    assert env["THUNDER_CLUSTER_NAME"] == "thunder"
    assert env["THUNDER_DAEMON_SERVICE_ACCOUNT"] == "tdp-thunder-device-plugin-daemon"
    assert "THUNDER_API_TOKEN" not in env
    assert deploy["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


def test_tracing_is_switched_on_with_the_standard_variables() -> None:
    m = render(
        "--set",
        "operator.otel.enabled=true",
        "--set",
        "operator.otel.endpoint=http://collector:4317",
    )
    env = env_of(m.one("Deployment")["spec"]["template"]["spec"]["containers"][0])
    assert env["OTEL_SDK_DISABLED"] == "false"
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://collector:4317"


def _key_matches(cert: x509.Certificate, ca: x509.Certificate) -> None:
    key = ca.public_key()
    signature, data = cert.signature, cert.tbs_certificate_bytes
    algorithm = cert.signature_hash_algorithm
    assert algorithm is not None
    if isinstance(key, rsa.RSAPublicKey):
        key.verify(signature, data, padding.PKCS1v15(), algorithm)
    else:
        assert isinstance(key, ec.EllipticCurvePublicKey)
        key.verify(signature, data, ec.ECDSA(algorithm))


def test_generated_webhook_certificate_is_for_the_service_and_signed_by_the_ca_bundle() -> None:
    m = render()
    secret = m.one("Secret", "tdp-thunder-device-plugin-webhook-tls")
    config = m.one("ValidatingWebhookConfiguration")
    bundles = {w["clientConfig"]["caBundle"] for w in config["webhooks"]}
    assert bundles == {secret["data"]["ca.crt"]}
    ca = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["ca.crt"]))
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    dns = set(names.get_values_for_type(x509.DNSName))
    assert "tdp-thunder-device-plugin-webhook.thunder-system.svc" in dns
    _key_matches(cert, ca)
    deploy = m.one("Deployment")
    volumes = {v["name"]: v for v in deploy["spec"]["template"]["spec"]["volumes"]}
    assert volumes["webhook-tls"]["secret"]["secretName"] == secret["metadata"]["name"]
    assert "checksum/webhook-tls" in deploy["spec"]["template"]["metadata"]["annotations"]


def test_generated_webhook_keys_are_ecdsa_p256_like_cert_managers() -> None:
    """The chart's own CA and serving keys are ECDSA P-256, as the cert-manager path asks
    for: the same kind of key whichever way the certificate comes, and a render that does
    not spend its time generating RSA keys on every install, upgrade and template."""
    secret = render().one("Secret", "tdp-thunder-device-plugin-webhook-tls")
    ca = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["ca.crt"]))
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    key = serialization.load_pem_private_key(base64.b64decode(secret["data"]["tls.key"]), None)
    for public in (ca.public_key(), cert.public_key(), key.public_key()):
        assert isinstance(public, ec.EllipticCurvePublicKey)
        assert public.curve.name == "secp256r1"
    assert key.public_key() == cert.public_key()
    assert ca.public_key() != cert.public_key()
    issuer = render("--set", "webhook.certManager.enabled=true").one("Certificate")
    assert issuer["spec"]["privateKey"]["algorithm"] == "ECDSA"


def test_cert_manager_issues_the_certificate_instead() -> None:
    m = render("--set", "webhook.certManager.enabled=true")
    assert not m.of_kind("Secret")
    cert = m.one("Certificate")
    assert cert["spec"]["secretName"] == "tdp-thunder-device-plugin-webhook-tls"
    assert m.one("Issuer")["spec"] == {"selfSigned": {}}
    config = m.one("ValidatingWebhookConfiguration")
    assert (
        config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
        == "thunder-system/tdp-thunder-device-plugin-webhook-tls"
    )
    assert all("caBundle" not in w["clientConfig"] for w in config["webhooks"])


def test_webhook_fails_closed_and_exempts_only_the_chart_install_and_the_driver() -> None:
    config = render().one("ValidatingWebhookConfiguration")
    hooks = {w["name"]: w for w in config["webhooks"]}
    tc, client = hooks["thunderclusters.thundercompute.com"], hooks["clients.thundercompute.com"]
    for hook in (tc, client):
        assert hook["failurePolicy"] == "Fail"
        assert hook["rules"][0]["operations"] == ["CREATE", "UPDATE"]
    condition = tc["matchConditions"][0]["expression"]
    assert "request.operation == 'CREATE'" in condition
    assert "'app.kubernetes.io/managed-by'].orValue('') == 'Helm'" in condition
    assert f".name('{config['metadata']['name']}').check('delete').allowed()" in condition
    exempt = client["matchConditions"][0]["expression"]
    assert "system:serviceaccount:thunder-system:tdp-thunder-device-plugin-daemon" in exempt
    assert "system:serviceaccount:thunder-system:tdp-thunder-device-plugin-operator" in exempt


def test_webhook_can_be_disabled() -> None:
    m = render("--set", "webhook.enabled=false")
    assert not m.of_kind("ValidatingWebhookConfiguration")
    env = env_of(m.one("Deployment")["spec"]["template"]["spec"]["containers"][0])
    assert "THUNDER_WEBHOOK_PORT" not in env


def test_service_monitor_scrapes_the_metrics_service() -> None:
    m = render("--set", "metrics.serviceMonitor.enabled=true")
    monitor = m.one("ServiceMonitor")
    service = m.one("Service", "tdp-thunder-device-plugin-metrics")
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    assert service["spec"]["ports"][0]["name"] == "metrics"
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= m.one("Deployment")["spec"]["template"]["metadata"]["labels"].items()
    assert not render().of_kind("ServiceMonitor")


def test_empty_extended_resource_prefix_reaches_the_thundercluster() -> None:
    spec = render("--set", "operator.extendedResourcePrefix=").one("ThunderCluster")["spec"]
    assert spec["operator"]["extendedResourcePrefix"] == ""


def test_custom_secret_name_reaches_the_thundercluster_and_rbac() -> None:
    m = render("--set", "thunder.secretName=thunder-credentials")
    assert m.one("ThunderCluster")["spec"]["thunder"]["secretName"] == "thunder-credentials"
    role = m.one("Role")
    secret_rules = [r for r in role["rules"] if "secrets" in r["resources"]]
    assert secret_rules == [
        {
            "apiGroups": [""],
            "resources": ["secrets"],
            "resourceNames": ["thunder-credentials"],
            "verbs": ["get"],
        }
    ]


def _allows(rules: list[dict[str, Any]], group: str, resource: str, verb: str) -> bool:
    return any(
        group in r.get("apiGroups", [])
        and resource in r.get("resources", [])
        and verb in r.get("verbs", [])
        for r in rules
    )


def test_the_daemon_cannot_publish_inventory() -> None:
    m = render()
    daemon = m.one("ClusterRole", "tdp-thunder-device-plugin-daemon")["rules"]
    for resource in ("resourceslices", "deviceclasses"):
        for verb in ("create", "update", "patch", "delete", "deletecollection"):
            assert not _allows(daemon, "resource.k8s.io", resource, verb), (resource, verb)
    assert _allows(daemon, "resource.k8s.io", "resourceclaims", "get")
    assert _allows(daemon, "", "secrets", "create")
    # Setup Secrets are written, never read: the API token reaches it through the
    # kubelet (secretKeyRef), and the admission policies limit what it may write.
    for verb in ("get", "list", "watch"):
        assert not _allows(daemon, "", "secrets", verb), verb
    assert _allows(daemon, "thundercompute.com", "clients", "create")
    assert not _allows(daemon, "thundercompute.com", "clients/finalizers", "update")
    assert not _allows(daemon, "apps", "daemonsets", "create")
    operator = m.one("ClusterRole", "tdp-thunder-device-plugin-operator")["rules"]
    for verb in ("list", "create", "update", "delete"):
        assert _allows(operator, "resource.k8s.io", "resourceslices", verb)
        assert _allows(operator, "resource.k8s.io", "deviceclasses", verb)
    # Publishing never patches nor deletes in bulk.
    for verb in ("patch", "deletecollection"):
        assert not _allows(operator, "resource.k8s.io", "deviceclasses", verb)
    # Cluster-wide, the operator reads no Secrets; only the token Secret in its namespace.
    assert not _allows(operator, "", "secrets", "get")
    accounts = {
        b["metadata"]["name"]: b["subjects"][0]["name"] for b in m.of_kind("ClusterRoleBinding")
    }
    assert (
        accounts["tdp-thunder-device-plugin-daemon"]
        != accounts["tdp-thunder-device-plugin-operator"]
    )


def test_the_api_token_is_never_a_value() -> None:
    with pytest.raises(RenderError, match="token"):
        render("--set", "thunder.token=abc")
    with pytest.raises(RenderError, match="extraEnv"):
        render("--set", "daemon.extraEnv[0].name=THUNDER_API_TOKEN")


def test_a_second_thundercluster_is_refused_at_install_time_only_in_a_cluster() -> None:
    # Without a cluster `lookup` finds nothing, so rendering works; the refusal is
    # exercised by the integration test against the local control plane.
    assert render().one("ThunderCluster")["metadata"]["name"] == "thunder"


@pytest.mark.parametrize(
    ("value", "ok"),
    [("5s", True), ("4s", False), ("24h", True), ("24h1s", False), ("1h30m", True)],
)
def test_reconcile_interval_bounds_match_the_model(value: str, ok: bool) -> None:
    spec = {"operator": {"reconcileInterval": value}}
    model_ok = validate_thundercluster({"metadata": {"name": "t"}, "spec": spec}) == []
    assert model_ok is ok
    if ok:
        render("--set", f"operator.reconcileInterval={value}")
    else:
        with pytest.raises(RenderError, match=r"operator\.reconcileInterval: must be between"):
            render("--set", f"operator.reconcileInterval={value}")


@pytest.mark.parametrize(("value", "ok"), [("30s", True), ("29s", False), ("168h", True)])
def test_orphan_grace_period_bounds_match_the_model(value: str, ok: bool) -> None:
    spec = {"operator": {"orphanGracePeriod": value}}
    assert (validate_thundercluster({"metadata": {"name": "t"}, "spec": spec}) == []) is ok
    if ok:
        render("--set", f"operator.orphanGracePeriod={value}")
    else:
        with pytest.raises(RenderError, match="must be between 30s and 168h"):
            render("--set", f"operator.orphanGracePeriod={value}")


def test_port_range_order_is_checked_like_the_model() -> None:
    with pytest.raises(RenderError, match=r"daemon\.thunderdPortRange"):
        render(
            "--set",
            "daemon.thunderdPortRange.start=32100",
            "--set",
            "daemon.thunderdPortRange.end=32100",
        )


def test_notes_tell_the_next_steps(tmp_path: Path) -> None:
    # helm template leaves NOTES.txt out: render it through `tpl` in a copy of the chart.
    copy = tmp_path / "chart"
    shutil.copytree(CHART, copy)
    (copy / "templates" / "NOTES.txt").rename(copy / "notes-source.txt")
    (copy / "templates" / "notes-probe.yaml").write_text(
        'kind: NotesProbe\ntext: {{ tpl (.Files.Get "notes-source.txt") . | toJson }}\n'
    )
    notes = str(render(chart=copy).one("NotesProbe")["text"])
    assert "helm test tdp -n thunder-system" in notes
    assert "kubectl get deviceclasses -l app.kubernetes.io/name=thunder-dra-driver" in notes
    assert "thundercompute.com/node=true" in notes
    # Without a cluster `lookup` finds no Secret, so the notes say how to create it.
    assert "create secret generic thunder-api" in notes
