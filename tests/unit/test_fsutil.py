"""Atomic writes: a reader sees the old file or the new one, never a partial one."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from thunder_dra import fsutil


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_write_atomic_creates_file_with_content_and_mode(tmp_path: Path) -> None:
    target = tmp_path / "spec.json"
    fsutil.write_atomic(target, '{"a": 1}\n', mode=0o640)
    assert target.read_text() == '{"a": 1}\n'
    assert _mode(target) == 0o640
    assert os.listdir(tmp_path) == ["spec.json"]


def test_write_atomic_replaces_existing_file(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    target.write_bytes(b"old")
    fsutil.write_atomic(target, b"new", mode=0o600)
    assert target.read_bytes() == b"new"
    assert _mode(target) == 0o600


@pytest.mark.parametrize("failing", ["os.fsync", "os.replace"])
def test_failed_write_keeps_old_content_and_leaves_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    target = tmp_path / "checkpoint.json"
    target.write_bytes(b"old content")

    def boom(*args: object, **kwargs: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(failing, boom)
    with pytest.raises(OSError, match="disk full"):
        fsutil.write_atomic(target, b"new content that never lands")
    monkeypatch.undo()
    assert target.read_bytes() == b"old content"
    assert os.listdir(tmp_path) == ["checkpoint.json"]


def test_failed_first_write_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(fd: int) -> None:
        raise OSError("io error")

    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(OSError, match="io error"):
        fsutil.write_atomic(tmp_path / "new.json", b"x")
    monkeypatch.undo()
    assert os.listdir(tmp_path) == []


def test_temp_names_are_invisible_to_cdi_and_plugin_watchers(tmp_path: Path) -> None:
    for name in ("a.json", "b.yaml", "c"):
        tmp = fsutil.temp_path_for(tmp_path / name)
        assert tmp.parent == tmp_path
        assert tmp.name.startswith(".")
        assert not tmp.name.endswith((".json", ".yaml"))
        assert fsutil.is_temp_name(tmp.name)
    assert not fsutil.is_temp_name("a.json")


def test_remove_if_exists(tmp_path: Path) -> None:
    target = tmp_path / "gone.json"
    target.write_text("x")
    assert fsutil.remove_if_exists(target) is True
    assert not target.exists()
    assert fsutil.remove_if_exists(target) is False


def test_ensure_dir_sets_exact_mode_despite_umask(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        created = tmp_path / "a" / "b"
        fsutil.ensure_dir(created, 0o755)
    finally:
        os.umask(old)
    assert created.is_dir()
    assert _mode(created) == 0o755
    created.chmod(0o777)
    fsutil.ensure_dir(created, 0o700)
    assert _mode(created) == 0o700


def test_ensure_dir_refuses_a_file(tmp_path: Path) -> None:
    clash = tmp_path / "claim"
    clash.write_text("not a dir")
    with pytest.raises(FileExistsError):
        fsutil.ensure_dir(clash)


def test_move_aside_keeps_the_file_under_a_name_nobody_loads(tmp_path: Path) -> None:
    target = tmp_path / "checkpoint.json"
    target.write_text("garbage")
    moved = fsutil.move_aside(target)
    assert not target.exists()
    assert moved.parent == tmp_path
    assert moved.name.startswith("checkpoint.json.corrupt-")
    assert not moved.name.endswith(".json")
    assert moved.read_text() == "garbage"


async def test_async_wrappers(tmp_path: Path) -> None:
    directory = tmp_path / "d"
    await fsutil.ensure_dir_async(directory, 0o700)
    target = directory / "f.json"
    await fsutil.write_atomic_async(target, b"data", mode=0o644)
    assert await fsutil.read_bytes_async(target) == b"data"
    moved = await fsutil.move_aside_async(target, "old")
    assert moved.name.startswith("f.json.old-")
    assert await fsutil.remove_if_exists_async(moved) is True
    assert await fsutil.remove_if_exists_async(moved) is False
