"""Syntax rules for Kubernetes names and Thunder URLs, as plain predicates.

These mirror `k8s.io/apimachinery/pkg/util/validation` (DNS labels and subdomains,
label values, qualified names) and `IsExtendedResourceName` from
`k8s.io/kubernetes/pkg/apis/core/helper`, so the models reject what the API server
would reject, with our own field paths in the message.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Final
from urllib.parse import urlsplit

DNS_LABEL_MAX: Final = 63
DNS_SUBDOMAIN_MAX: Final = 253
QUALIFIED_NAME_MAX: Final = 63
LABEL_VALUE_MAX: Final = 63

_LABEL = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?"
DNS_LABEL_PATTERN: Final = rf"^{_LABEL}$"
DNS_SUBDOMAIN_PATTERN: Final = rf"^{_LABEL}(?:\.{_LABEL})*$"
_QUALIFIED_PART = r"(?:[A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
QUALIFIED_NAME_PATTERN: Final = rf"^(?:{_LABEL}(?:\.{_LABEL})*/)?{_QUALIFIED_PART}$"
LABEL_VALUE_PATTERN: Final = rf"^(?:{_QUALIFIED_PART})?$"

_DNS_LABEL_RE: Final = re.compile(DNS_LABEL_PATTERN)
_DNS_SUBDOMAIN_RE: Final = re.compile(DNS_SUBDOMAIN_PATTERN)
_QUALIFIED_PART_RE: Final = re.compile(rf"^{_QUALIFIED_PART}$")
_LABEL_VALUE_RE: Final = re.compile(LABEL_VALUE_PATTERN)

_REQUESTS_PREFIX: Final = "requests."
_NATIVE_DOMAIN: Final = "kubernetes.io/"


def is_dns_label(value: str) -> bool:
    """RFC 1123 label: lower-case alphanumerics and '-', at most 63 characters."""
    return len(value) <= DNS_LABEL_MAX and _DNS_LABEL_RE.fullmatch(value) is not None


def is_dns_subdomain(value: str) -> bool:
    """RFC 1123 subdomain: dot-separated labels, at most 253 characters."""
    return len(value) <= DNS_SUBDOMAIN_MAX and _DNS_SUBDOMAIN_RE.fullmatch(value) is not None


def is_label_value(value: str) -> bool:
    """A label value: empty, or up to 63 alphanumerics, '-', '_' and '.' inside."""
    return len(value) <= LABEL_VALUE_MAX and _LABEL_VALUE_RE.fullmatch(value) is not None


def is_qualified_name(value: str) -> bool:
    """A label key or annotation key: an optional DNS-subdomain prefix, '/', a name."""
    prefix, slash, name = value.rpartition("/")
    if slash and not is_dns_subdomain(prefix):
        return False
    return len(name) <= QUALIFIED_NAME_MAX and _QUALIFIED_PART_RE.fullmatch(name) is not None


def extended_resource_name_problem(value: str) -> str | None:
    """Why `value` is not an extended resource name, or None when it is one.

    Kubernetes accepts a name when it is not native (it has a `domain/` prefix outside
    `kubernetes.io`), does not start with `requests.`, and `requests.<name>` is a
    qualified name (the form resource quotas use).
    """
    if "/" not in value:
        return "needs a domain prefix, as in example.com/gpu"
    if _NATIVE_DOMAIN in value:
        return "must not be in the kubernetes.io domain, which is reserved for native resources"
    if value.startswith(_REQUESTS_PREFIX):
        return "must not start with 'requests.'"
    if not is_qualified_name(_REQUESTS_PREFIX + value):
        return (
            "must be a qualified name: a DNS subdomain, '/', then at most 63 letters, "
            "digits, '-', '_' or '.' starting and ending with a letter or digit"
        )
    return None


def is_loopback_host(host: str) -> bool:
    """Whether `host` names this machine: localhost, 127.0.0.0/8 or ::1."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def url_problem(value: str) -> str | None:
    """Why `value` is not an acceptable Thunder endpoint, or None when it is one.

    Tokens travel to these endpoints, so plain http is refused except to a loopback
    address, where a local fake Thunder or a port-forward runs in tests.
    """
    try:
        parts = urlsplit(value)
        host = parts.hostname
        _ = parts.port  # raises on a malformed or out-of-range port
    except ValueError as exc:
        return f"is not a valid URL ({exc})"
    if parts.scheme not in ("https", "http") or not host:
        return "must be an absolute https:// URL"
    if parts.username or parts.password:
        return "must not carry credentials; the API token comes from the Secret"
    if parts.query or parts.fragment:
        return "must not have a query or fragment"
    if parts.scheme == "http" and not is_loopback_host(host):
        return "must use https (http is allowed only for localhost, 127.0.0.0/8 and ::1)"
    return None
