"""The webhook's TLS server: kopf's `WebhookServer` with a given or self-signed certificate.

In a cluster the certificate comes from a mounted `kubernetes.io/tls` Secret (the chart
generates one, or cert-manager does) and kopf reloads it when the files change. Without
one, a self-signed certificate is made for `--webhook-host` (and localhost/127.0.0.1)
with the `cryptography` package, which is already a dependency; kopf's own generator
needs `certbuilder`, which is not. Its key is written with mode 0600 to a private
temporary directory and removed at exit. `--webhook-ca-dump` writes the CA bundle a
ValidatingWebhookConfiguration must carry.
"""

from __future__ import annotations

import datetime
import ipaddress
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import kopf
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

SELF_SIGNED_VALIDITY = datetime.timedelta(days=365)


def self_signed_certificate(hostnames: Iterable[str]) -> tuple[bytes, bytes]:
    """A self-signed serving certificate (PEM) for `hostnames` and its key (PEM)."""
    names = list(dict.fromkeys(name for name in hostnames if name))
    if not names:
        raise ValueError("a certificate needs at least one host name or IP")
    alternative: list[x509.GeneralName] = []
    for name in names:
        try:
            alternative.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            alternative.append(x509.DNSName(name))
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + SELF_SIGNED_VALIDITY)
        .add_extension(x509.SubjectAlternativeName(alternative), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return certificate.public_bytes(serialization.Encoding.PEM), key_pem


class ListeningWebhookServer(kopf.WebhookServer):
    """kopf's server that also reports when it is listening (for /readyz)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.listening = False

    async def __call__(self, fn: Any) -> AsyncIterator[Any]:
        async for client_config in super().__call__(fn):
            self.listening = True
            yield client_config


class WebhookTLS:
    """The certificate files of the webhook server, made up if none are given."""

    def __init__(
        self,
        *,
        host: str = "",
        cert_file: Path | None = None,
        key_file: Path | None = None,
        ca_file: Path | None = None,
    ) -> None:
        self.host = host
        self._tempdir: Path | None = None
        self.cert_file = cert_file
        self.key_file = key_file
        self.ca_file = ca_file
        if cert_file is None or key_file is None:
            self._tempdir = Path(tempfile.mkdtemp(prefix="thunder-webhook-"))
            cert, key = self_signed_certificate([host, "localhost", "127.0.0.1"])
            self.cert_file = self._tempdir / "tls.crt"
            self.key_file = self._tempdir / "tls.key"
            self.cert_file.write_bytes(cert)
            self.key_file.touch(mode=0o600)
            self.key_file.write_bytes(key)
            self.ca_file = None

    def server(
        self, *, listen: str, port: int, ca_dump: Path | None = None
    ) -> ListeningWebhookServer:
        return ListeningWebhookServer(
            addr=listen,
            port=port,
            host=self.host or None,
            certfile=str(self.cert_file),
            pkeyfile=str(self.key_file),
            cafile=str(self.ca_file) if self.ca_file else None,
            cadump=str(ca_dump) if ca_dump else None,
        )

    def cleanup(self) -> None:
        if self._tempdir is not None:
            shutil.rmtree(self._tempdir, ignore_errors=True)
            self._tempdir = None
