"""The webhook certificate under GitOps: renders that do not change from one to the next.

Argo CD and Flux render the chart with `helm template` (or helm without cluster access),
where `lookup` finds nothing, so the chart's own certificate is minted anew at every
render. webhook.tls.existingSecret (with webhook.tls.caBundle) and cert-manager are the
two paths whose output is the same every time. These tests call helm directly, twice,
since chartkit.render caches one output per command line.
"""

from __future__ import annotations

import base64
import subprocess

import pytest

from tests.unit.packaging.chartkit import CHART, NAMESPACE, RenderError, helm, render

CA_PEM = (
    b"-----BEGIN CERTIFICATE-----\n"
    b"MIIBkTCCATegAwIBAgIUTHISISNOTAREALCA0000000000000wCgYIKoZIzj0EAwIw\n"
    b"-----END CERTIFICATE-----\n"
)
CA_BUNDLE = base64.b64encode(CA_PEM).decode()
EXISTING = [
    "--set",
    "webhook.tls.existingSecret=webhook-serving",
    "--set",
    f"webhook.tls.caBundle={CA_BUNDLE}",
]


def _template(*args: str) -> str:
    command = [helm(), "template", "tdp", str(CHART), "--namespace", NAMESPACE, *args]
    return subprocess.run(command, check=True, capture_output=True, text=True).stdout


def test_the_charts_own_certificate_changes_at_every_render_without_a_cluster() -> None:
    """Why the two paths below exist: `lookup` is empty under `helm template`."""
    assert _template() != _template()


@pytest.mark.parametrize(
    "args",
    [EXISTING, ["--set", "webhook.certManager.enabled=true"]],
    ids=["existing-secret", "cert-manager"],
)
def test_the_gitops_paths_render_the_same_every_time(args: list[str]) -> None:
    assert _template(*args) == _template(*args)


def test_an_existing_secret_is_mounted_and_its_ca_is_the_bundle() -> None:
    m = render(*EXISTING)
    assert not m.of_kind("Secret"), "the chart must not render a certificate of its own"
    assert not m.of_kind("Certificate")
    config = m.one("ValidatingWebhookConfiguration")
    assert [w["clientConfig"]["caBundle"] for w in config["webhooks"]] == [CA_BUNDLE] * 2
    assert "annotations" not in config["metadata"]
    deploy = m.one("Deployment")
    volumes = {v["name"]: v for v in deploy["spec"]["template"]["spec"]["volumes"]}
    assert volumes["webhook-tls"]["secret"]["secretName"] == "webhook-serving"


def test_a_new_ca_bundle_rolls_the_operator() -> None:
    def checksum(*args: str) -> str:
        deploy = render(*args).one("Deployment")
        return str(deploy["spec"]["template"]["metadata"]["annotations"]["checksum/webhook-tls"])

    other = base64.b64encode(CA_PEM.replace(b"THISIS", b"ANOTHR")).decode()
    changed = [*EXISTING[:2], "--set", f"webhook.tls.caBundle={other}"]
    assert checksum(*EXISTING) == checksum(*EXISTING)
    assert checksum(*EXISTING) != checksum(*changed)


def test_an_existing_secret_needs_its_ca_bundle() -> None:
    with pytest.raises(RenderError) as caught:
        render("--set", "webhook.tls.existingSecret=webhook-serving")
    message = str(caught.value)
    assert "webhook.tls.caBundle: required with webhook.tls.existingSecret" in message
    assert "kubectl -n thunder-system get secret webhook-serving" in message


def test_an_existing_secret_and_cert_manager_exclude_each_other() -> None:
    with pytest.raises(RenderError) as caught:
        render(*EXISTING, "--set", "webhook.certManager.enabled=true")
    assert "choose one source of the webhook's certificate" in str(caught.value)


def test_the_ca_bundle_must_be_base64() -> None:
    with pytest.raises(RenderError) as caught:
        render(*EXISTING[:2], "--set", "webhook.tls.caBundle=not base64!")
    assert "caBundle" in str(caught.value)
