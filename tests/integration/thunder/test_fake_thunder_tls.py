"""The fake Thunder over https: what pods on a real node reach (the driver refuses plain
http to anything but loopback). Its certificate comes from a test CA; the admin client
trusts that CA; the installer it serves declares an https artifact base."""

from __future__ import annotations

import ssl
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from hack.cluster.pki import CertificateAuthority
from hack.fake_thunder import start_fake_thunder


def test_the_fake_serves_https_with_the_given_certificate(tmp_path: Path) -> None:
    ca = CertificateAuthority(tmp_path)
    pair = ca.issue("fake", "fake-thunder", ip_addresses=("127.0.0.1",), server=True)
    with start_fake_thunder(tls=(pair.cert, pair.key), ca_file=ca.cert_path) as fake:
        assert fake.base_url.startswith("https://127.0.0.1:")
        zone = fake.admin.add_zone("us-east")
        assert zone
        context = ssl.create_default_context(cafile=str(ca.cert_path))
        with urllib.request.urlopen(fake.installer_url, context=context, timeout=10) as answer:
            script = answer.read().decode()
        assert f"default_artifact_base_url='{fake.artifact_base_url}'" in script
        assert fake.artifact_base_url.startswith("https://")
        # A client that does not trust the CA is refused.
        with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
            urllib.request.urlopen(fake.installer_url, timeout=10)
