"""``make push``'s checks that need no registry: which registries get plain http, which
tags it accepts, and that a malformed tag stops it before anything is contacted."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

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


def _pushed(name: str, repository: str, digit: str) -> release_push.Pushed:
    reference = f"127.0.0.1:5000/thunder-compute/{repository}:0.1.0-20261202T000000Z"
    return release_push.Pushed(name, reference, "sha256:" + digit * 64)


def test_the_pushed_chart_names_the_pushed_images_by_tag_and_digest() -> None:
    values_file = Path(release_push.CHART / "values.yaml")
    pushed = {
        "operator": _pushed("operator", "thunder-device-plugin-operator", "a"),
        "daemon": _pushed("daemon", "thunder-device-plugin", "b"),
    }
    values = yaml.safe_load(release_push.pinned_values(values_file.read_text(), pushed))
    assert values["operator"]["image"] == {
        "repository": "127.0.0.1:5000/thunder-compute/thunder-device-plugin-operator",
        "tag": "0.1.0-20261202T000000Z",
        "digest": "sha256:" + "a" * 64,
        "pullPolicy": "IfNotPresent",
    }
    assert values["daemon"]["image"]["repository"].endswith("/thunder-device-plugin")
    assert values["daemon"]["image"]["digest"] == "sha256:" + "b" * 64
    # Everything else, comments included, is as the chart has it.
    original = yaml.safe_load(values_file.read_text())
    for key in ("operator", "daemon"):
        values[key].pop("image")
        original[key].pop("image")
    assert values == original
    assert release_push.pinned_values(values_file.read_text(), pushed).count("#") == (
        values_file.read_text().count("#")
    )


def test_an_image_the_values_do_not_name_stops_the_push() -> None:
    pushed = {"operator": _pushed("operator", "something-else", "a")}
    with pytest.raises(release_push.PushError, match="something-else"):
        release_push.pinned_values(Path(release_push.CHART / "values.yaml").read_text(), pushed)
