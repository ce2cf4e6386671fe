"""``make push``'s checks that need no registry: which registries get plain http, which
tags it accepts, and that a malformed tag stops it before anything is contacted."""

from __future__ import annotations

from pathlib import Path

import pytest

from hack import image as image_builder
from release import push as release_push


@pytest.mark.parametrize(
    ("registry", "loopback"),
    [
        ("127.0.0.1:5000/thunder-compute", True),
        ("127.0.0.1:5000", True),
        ("localhost:5000/x", True),
        ("[::1]:5000/x", True),
        ("ghcr.io/thunder-compute", False),
        ("10.0.0.1:5000/x", False),
        ("registry.example.com:443/a/b", False),
    ],
)
def test_only_a_loopback_registry_gets_plain_http(registry: str, loopback: bool) -> None:
    assert release_push.is_loopback(registry) is loopback


def test_the_default_tag_is_the_version_and_a_utc_time() -> None:
    tag = release_push.default_tag("0.1.0")
    assert release_push.TAG_PATTERN.match(tag), tag
    assert tag.startswith("0.1.0-")


@pytest.mark.parametrize("tag", ["latest", "0.1.0", "0.1.0-20261130", "v0.1.0-20261130T000000Z"])
def test_a_tag_that_is_not_version_and_utc_time_is_refused_before_any_push(
    tag: str, tmp_path: Path
) -> None:
    missing = {
        c: image_builder.BuiltImage(c, f"localhost/thunder-compute/{c}:x", tmp_path / "none")
        for c in ("operator", "daemon")
    }
    with pytest.raises(release_push.PushError, match="is not <version>-<UTC time>"):
        release_push.push("127.0.0.1:1/x", tag, missing, tmp_path / "no-helm")
