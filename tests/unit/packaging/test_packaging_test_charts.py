"""The pod and VM test charts, used as the seed shows them."""

from __future__ import annotations

import subprocess

import pytest

from tests.unit.packaging.chartkit import POD_CHART, VM_CHART, RenderError, helm, render
from thunder_dra.kube import naming


def test_test_charts_lint() -> None:
    done = subprocess.run(
        [helm(), "lint", "--strict", str(POD_CHART), str(VM_CHART)],
        check=False,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout


def test_pod_chart_is_the_seeds_claim_template_and_pod() -> None:
    m = render(
        "--set", "gpu.type=A6000", "--set", "gpu.count=2", chart=POD_CHART, release="thunder-pod"
    )
    template = m.one("ResourceClaimTemplate", "thunder-pod-gpu")
    request = template["spec"]["spec"]["devices"]["requests"][0]
    assert request == {
        "name": "gpu",
        "exactly": {
            "deviceClassName": "thunder-gpu-a6000",
            "allocationMode": "ExactCount",
            "count": 2,
        },
    }
    pod = m.one("Pod", "thunder-pod-gpu")
    assert pod["spec"]["resourceClaims"] == [
        {"name": "gpu", "resourceClaimTemplateName": "thunder-pod-gpu"}
    ]
    assert pod["spec"]["containers"][0]["resources"]["claims"] == [
        {"name": "gpu", "request": "gpu"}
    ]
    assert pod["spec"]["containers"][0]["image"] == "ubuntu:24.04"


@pytest.mark.parametrize("model", ["A6000", "H100", "NVIDIA RTX 6000 Ada", "l4", "A100_80GB"])
def test_device_class_name_follows_the_operators_naming(model: str) -> None:
    m = render("--set", f"gpu.type={model}", chart=POD_CHART)
    name = m.one("ResourceClaimTemplate")["spec"]["spec"]["devices"]["requests"][0]["exactly"][
        "deviceClassName"
    ]
    assert name == naming.device_class_name("thunder-gpu-", naming.dns_label(model))


def test_vm_chart_is_the_seeds_claim_and_vm_with_disk_and_network() -> None:
    m = render(
        "--set", "gpu.type=A6000", "--set", "gpu.count=1", chart=VM_CHART, release="thunder-vm"
    )
    claim = m.one("ResourceClaim", "thunder-vm-claim")
    assert claim["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] == (
        "thunder-gpu-a6000"
    )
    vm = m.one("VirtualMachine", "thunder-vm")
    spec = vm["spec"]["template"]["spec"]
    assert spec["resourceClaims"] == [{"name": "gpu", "resourceClaimName": "thunder-vm-claim"}]
    volumes = {v["name"]: v for v in spec["volumes"]}
    # The Secret is written while the claim is prepared, after the pod's volumes are
    # mounted: it must not be required for the VM to start.
    assert volumes["thunder-setup"]["secret"] == {
        "secretName": "thunder-vm-claim-thunder-setup",
        "optional": True,
    }
    assert "containerDisk" in volumes["rootdisk"]
    assert spec["domain"]["devices"]["filesystems"] == [{"name": "thunder-setup", "virtiofs": {}}]
    assert spec["networks"] == [{"name": "default", "pod": {}}]
    assert spec["domain"]["devices"]["interfaces"][0]["masquerade"] == {}
    assert "gpus" not in spec["domain"]["devices"], "the GPU is reached over the network"
    user_data = volumes["cloudinitdisk"]["cloudInitNoCloud"]["userData"]
    assert "[ thunder-setup, /mnt/thunder-setup, virtiofs ]" in user_data
    assert "install-thunder-client.sh" in user_data
    assert vm["spec"]["runStrategy"] == "Always"


def test_test_chart_typos_fail() -> None:
    with pytest.raises(RenderError, match="gpu"):
        render("--set", "gpu.cout=2", chart=POD_CHART)
    with pytest.raises(RenderError, match="memroy"):
        render("--set", "vm.memroy=2Gi", chart=VM_CHART)
