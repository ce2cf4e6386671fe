"""The prepared-claims checkpoint: round trip, corruption and version checks, set-aside."""

from __future__ import annotations

import asyncio
import hashlib
import json
import stat
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from thunder_dra import fsutil
from thunder_dra.plugin.state import checkpoint as ck


def _claim(uid: str = "uid-1", **overrides: object) -> ck.PreparedClaim:
    values: dict[str, object] = {
        "uid": uid,
        "namespace": "team-a",
        "name": f"claim-{uid}",
        "consumer": ck.Consumer(kind="pod", name="trainer-0"),
        "zone_name": "us-east",
        "zone_id": "zone-123",
        "gpu_type": "A6000",
        "gpu_count": 2,
        "enrollment_token_id": "etok-1",
        "client_id": "client-1",
        "devices": (
            ck.PreparedDevice(
                pool_name="us-east/a6000",
                device_name="a6000-0",
                request_names=("gpu",),
                cdi_device_ids=(f"thundercompute.com/gpu=claim-{uid}",),
            ),
        ),
        "paths": (f"/var/lib/kubelet/plugins/thundercompute.com/claims/{uid}",),
        "state": ck.ClaimState.PREPARED,
    }
    values.update(overrides)
    return ck.PreparedClaim(**values)


async def test_round_trip(tmp_path: Path) -> None:
    store = ck.CheckpointStore(tmp_path / "state")
    await store.put(_claim("uid-1"))
    await store.put(_claim("uid-2", consumer=ck.Consumer(kind="vm", name="vm-a")))
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600
    assert stat.S_IMODE(store.path.parent.stat().st_mode) == 0o700

    reloaded = ck.CheckpointStore(tmp_path / "state")
    loaded = await reloaded.load()
    assert loaded == store.current
    assert sorted(loaded.claims) == ["uid-1", "uid-2"]
    assert loaded.claims["uid-2"].consumer.kind == "vm"
    assert reloaded.current == loaded


async def test_file_format_is_versioned_and_checksummed(tmp_path: Path) -> None:
    store = ck.CheckpointStore(tmp_path)
    await store.put(_claim())
    document = json.loads(store.path.read_text())
    assert set(document) == {"version", "checksum", "payload"}
    assert document["version"] == ck.CHECKPOINT_VERSION
    canonical = json.dumps(document["payload"], sort_keys=True, separators=(",", ":")).encode()
    assert document["checksum"] == hashlib.sha256(canonical).hexdigest()
    claim = document["payload"]["claims"]["uid-1"]
    assert claim["gpuType"] == "A6000"
    assert claim["enrollmentTokenId"] == "etok-1"
    assert claim["devices"][0]["cdiDeviceIds"] == ["thundercompute.com/gpu=claim-uid-1"]


async def test_missing_file_is_an_empty_checkpoint(tmp_path: Path) -> None:
    assert await ck.CheckpointStore(tmp_path).load() == ck.Checkpoint()


def _rewrite(path: Path, edit: object) -> None:
    document = json.loads(path.read_text())
    edit(document)  # type: ignore[operator]
    path.write_text(json.dumps(document))


async def test_edited_payload_is_detected(tmp_path: Path) -> None:
    store = ck.CheckpointStore(tmp_path)
    await store.put(_claim())

    def edit(document: dict[str, object]) -> None:
        document["payload"]["claims"]["uid-1"]["gpuCount"] = 8  # type: ignore[index]

    _rewrite(store.path, edit)
    with pytest.raises(ck.CheckpointCorruptError, match="checksum mismatch") as info:
        await ck.CheckpointStore(tmp_path).load()
    assert str(store.path) in str(info.value)


async def test_truncated_file_is_detected(tmp_path: Path) -> None:
    store = ck.CheckpointStore(tmp_path)
    await store.put(_claim())
    store.path.write_bytes(store.path.read_bytes()[:40])
    with pytest.raises(ck.CheckpointCorruptError, match="not valid JSON"):
        await ck.CheckpointStore(tmp_path).load()


async def test_schema_violation_with_a_valid_checksum_is_detected(tmp_path: Path) -> None:
    payload = {"claims": {"uid-1": {"uid": "uid-1", "enrollmentToken": "secret"}}}
    document = {"version": 1, "checksum": ck.payload_checksum(payload), "payload": payload}
    path = tmp_path / ck.CHECKPOINT_FILE_NAME
    path.write_text(json.dumps(document))
    with pytest.raises(ck.CheckpointCorruptError, match="schema"):
        await ck.CheckpointStore(tmp_path).load()


async def test_version_mismatch(tmp_path: Path) -> None:
    store = ck.CheckpointStore(tmp_path)
    await store.put(_claim())
    _rewrite(store.path, lambda d: d.__setitem__("version", 2))
    with pytest.raises(ck.CheckpointVersionError, match="format version 2"):
        await ck.CheckpointStore(tmp_path).load()
    # An intact file of another version is not set aside: the caller must decide.
    with pytest.raises(ck.CheckpointVersionError):
        await ck.CheckpointStore(tmp_path).load_or_set_aside()
    assert store.path.exists()


async def test_corrupt_checkpoint_is_set_aside_not_dropped(tmp_path: Path) -> None:
    store = ck.CheckpointStore(tmp_path)
    await store.put(_claim())
    store.path.write_text("{broken")
    fresh = ck.CheckpointStore(tmp_path)
    loaded, moved = await fresh.load_or_set_aside()
    assert loaded == ck.Checkpoint()
    assert moved is not None
    assert moved.read_text() == "{broken"
    assert moved.name.startswith("checkpoint.json.corrupt-")
    assert not store.path.exists()
    await fresh.put(_claim("uid-9"))
    assert sorted((await ck.CheckpointStore(tmp_path).load()).claims) == ["uid-9"]


async def test_drop(tmp_path: Path) -> None:
    store = ck.CheckpointStore(tmp_path)
    await store.put(_claim("uid-1"))
    await store.put(_claim("uid-2"))
    await store.drop("uid-1")
    await store.drop("never-there")
    assert sorted((await ck.CheckpointStore(tmp_path).load()).claims) == ["uid-2"]


async def test_concurrent_updates_are_all_kept(tmp_path: Path) -> None:
    store = ck.CheckpointStore(tmp_path)
    await asyncio.gather(*(store.put(_claim(f"uid-{i}")) for i in range(20)))
    assert len((await ck.CheckpointStore(tmp_path).load()).claims) == 20


def test_no_field_can_hold_a_token() -> None:
    data = _claim().model_dump(by_alias=True)
    data["enrollmentToken"] = "tr_secret"
    with pytest.raises(ValidationError):
        ck.PreparedClaim.model_validate(data)
    fields = {name.lower() for name in ck.PreparedClaim.model_fields}
    assert {f for f in fields if "token" in f} == {"enrollment_token_id"}


async def test_concurrent_updates_share_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writes = 0
    real = fsutil.write_atomic

    def counting(path: Path, data: bytes | str, *, mode: int = 0o644) -> None:
        nonlocal writes
        writes += 1
        real(path, data, mode=mode)

    monkeypatch.setattr(fsutil, "write_atomic", counting)
    store = ck.CheckpointStore(tmp_path)
    await asyncio.gather(*(store.put(_claim(f"uid-{i}")) for i in range(20)))
    assert writes <= 3
    assert len((await ck.CheckpointStore(tmp_path).load()).claims) == 20


async def test_a_failed_write_is_reported_and_undone_in_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ck.CheckpointStore(tmp_path)
    real = fsutil.write_atomic

    def full(path: Path, data: bytes | str, *, mode: int = 0o644) -> None:
        raise OSError("no space left on device")

    monkeypatch.setattr(fsutil, "write_atomic", full)
    with pytest.raises(OSError, match="no space"):
        await store.put(_claim("uid-1"))
    assert store.current.claims == {}
    monkeypatch.setattr(fsutil, "write_atomic", real)
    await store.put(_claim("uid-2"))
    assert sorted((await ck.CheckpointStore(tmp_path).load()).claims) == ["uid-2"]


async def test_a_drop_fsyncs_the_directories_it_asks_for_before_the_file_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ck.CheckpointStore(tmp_path / "state")
    await store.put(_claim("uid-1"))
    await store.put(_claim("uid-2"))
    removed_from = [tmp_path / "cdi", tmp_path / "claims"]
    for directory in removed_from:
        directory.mkdir()
    events: list[str] = []
    real_dir, real_write = fsutil.fsync_dir, fsutil.write_atomic

    def fsync_dir(path: Path) -> None:
        if path in removed_from:  # not the checkpoint's own directory, which writes sync
            events.append(f"fsync {path.name}")
        real_dir(path)

    fail = [True]

    def write_atomic(path: Path, data: bytes | str, *, mode: int = 0o644) -> None:
        if fail.pop() if fail else False:
            raise OSError("no space left on device")
        events.append(f"write {path.name}")
        real_write(path, data, mode=mode)

    monkeypatch.setattr(fsutil, "fsync_dir", fsync_dir)
    monkeypatch.setattr(fsutil, "write_atomic", write_atomic)
    # The write fails: the drop is undone, and the directories wait for the next write.
    with pytest.raises(OSError, match="no space"):
        await store.drop("uid-1", synced_first=removed_from)
    assert sorted(store.current.claims) == ["uid-1", "uid-2"]
    events.clear()
    await store.drop("uid-2")
    assert events == ["fsync cdi", "fsync claims", "write checkpoint.json"]
    events.clear()
    # Then a drop asks for them, is written, and the next write has nothing to sync.
    await store.drop("uid-1", synced_first=removed_from)
    await store.put(_claim("uid-3"))
    assert events == [
        "fsync cdi",
        "fsync claims",
        "write checkpoint.json",
        "write checkpoint.json",
    ]
    assert sorted((await ck.CheckpointStore(tmp_path / "state").load()).claims) == ["uid-3"]


# A checkpoint as the daemon wrote it before the claim model was consolidated: a pod's
# prepared claim and a VM's claim interrupted mid-unprepare. An upgraded daemon must read
# it and write it back byte for byte.
EARLIER_FILE = (
    b'{"checksum":"2181ecbb3ec4dd68a0646dfe18d77f0952870c11218fc5dfc22756ca10ff1543","'
    b'payload":{"claims":{"uid-pod":{"clientId":"client-1","consumer":{"kind":"pod","n'
    b'ame":"trainer-0"},"devices":[{"cdiDeviceIds":["thundercompute.com/gpu=claim-uid-'
    b'pod"],"deviceName":"a6000-0","poolName":"us-east/a6000","requestNames":["gpu"]},'
    b'{"cdiDeviceIds":["thundercompute.com/gpu=claim-uid-pod"],"deviceName":"a6000-1",'
    b'"poolName":"us-east/a6000","requestNames":["gpu"]}],"enrollmentTokenId":"etok-1"'
    b',"gpuCount":2,"gpuType":"A6000","name":"train","namespace":"team-a","paths":["/s'
    b'/claims/uid-pod","/s/claims/uid-pod/config.json","/cdi/thundercompute.com-gpu_cl'
    b'aim-uid-pod.json","/s/libthunder/sha256/ab/libthunder.so"],"secretName":null,"st'
    b'ate":"prepared","uid":"uid-pod","zoneId":"zone-123","zoneName":"US East"},"uid-v'
    b'm":{"clientId":null,"consumer":{"kind":"vm","name":"desk-vm"},"devices":[{"cdiDe'
    b'viceIds":[],"deviceName":"a6000-2","poolName":"us-east/a6000","requestNames":["g'
    b'pu"]}],"enrollmentTokenId":"etok-2","gpuCount":1,"gpuType":"A6000","name":"desk"'
    b',"namespace":"team-b","paths":[],"secretName":"desk-thunder-setup","state":"unpr'
    b'eparing","uid":"uid-vm","zoneId":"zone-123","zoneName":"US East"}}},"version":1}'
    b"\n"
)


async def test_a_checkpoint_written_by_the_earlier_daemon_reads_and_writes_back_unchanged(
    tmp_path: Path,
) -> None:
    (tmp_path / ck.CHECKPOINT_FILE_NAME).write_bytes(EARLIER_FILE)
    store = ck.CheckpointStore(tmp_path)
    loaded = await store.load()
    pod, vm = loaded.claims["uid-pod"], loaded.claims["uid-vm"]
    assert pod.state is ck.ClaimState.PREPARED
    assert pod.hostname == "trainer-0"
    assert pod.library == Path("/s/libthunder/sha256/ab/libthunder.so")
    assert [d.device_name for d in pod.devices] == ["a6000-0", "a6000-1"]
    assert vm.is_vm
    assert vm.state is ck.ClaimState.UNPREPARING
    assert vm.library is None
    assert ck.encode_checkpoint(loaded) == EARLIER_FILE
    await store.save(loaded)
    assert store.path.read_bytes() == EARLIER_FILE


class _Reads:
    """Counts the checkpoint file's reads."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        real = ck._read_identified

        def counted(path: Path) -> tuple[bytes, ck.FileIdentity | None]:
            self.count += 1
            return real(path)

        monkeypatch.setattr(ck, "_read_identified", counted)


async def test_a_file_unchanged_since_this_store_wrote_it_is_not_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads = _Reads(monkeypatch)
    store = ck.CheckpointStore(tmp_path)
    await store.put(_claim("uid-1"))
    assert sorted((await store.load()).claims) == ["uid-1"]
    assert sorted((await store.load()).claims) == ["uid-1"]
    assert reads.count == 0
    assert store.found
    # A store that read the file (a daemon's start) does not read it twice either.
    other = ck.CheckpointStore(tmp_path)
    await other.load()
    await other.load()
    assert reads.count == 1


async def test_a_file_another_daemon_replaced_is_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads = _Reads(monkeypatch)
    mine, theirs = ck.CheckpointStore(tmp_path), ck.CheckpointStore(tmp_path)
    await mine.put(_claim("uid-1"))
    await theirs.load()
    await theirs.put(_claim("uid-2"))  # a new file, renamed over the old one
    assert sorted((await mine.load()).claims) == ["uid-1", "uid-2"]
    assert sorted(mine.current.claims) == ["uid-1", "uid-2"]
    assert reads.count == 2


async def test_a_file_changed_in_place_is_read_again(tmp_path: Path) -> None:
    store = ck.CheckpointStore(tmp_path)
    await store.put(_claim("uid-1"))
    store.path.write_bytes(store.path.read_bytes()[:40])  # same inode, new size and times
    with pytest.raises(ck.CheckpointCorruptError):
        await store.load()
    store.path.unlink()
    assert (await store.load()).claims == {}
    assert not store.found


async def test_after_a_failed_write_the_file_is_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ck.CheckpointStore(tmp_path)
    await store.put(_claim("uid-1"))
    real = fsutil.write_atomic

    def half(path: Path, data: bytes | str, *, mode: int = 0o644) -> None:
        real(path, data, mode=mode)  # the file is replaced, then the write reports failure
        raise OSError("input/output error")

    monkeypatch.setattr(fsutil, "write_atomic", half)
    with pytest.raises(OSError, match="input/output"):
        await store.put(_claim("uid-2"))
    monkeypatch.setattr(fsutil, "write_atomic", real)
    reads = _Reads(monkeypatch)
    assert sorted((await store.load()).claims) == ["uid-1", "uid-2"]
    assert reads.count == 1


_TEXT = st.text(min_size=1, max_size=12)  # any code point: ensure_ascii=False keeps them


@st.composite
def _claims(draw: st.DrawFn) -> ck.PreparedClaim:
    uid = draw(st.sampled_from(["a", "b", "c", "é", "Z", "uid-1", "uid-10", "uid-2"]))
    return _claim(
        uid,
        name=draw(_TEXT),
        consumer=ck.Consumer(kind=draw(st.sampled_from(["pod", "vm"])), name=draw(_TEXT)),
        gpu_count=draw(st.integers(1, 64)),
        client_id=draw(st.none() | _TEXT),
        state=draw(st.sampled_from(list(ck.ClaimState))),
    )


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), _claims()), max_size=30))
def test_claims_encoded_once_give_exactly_the_canonical_file(
    steps: list[tuple[bool, ck.PreparedClaim]],
) -> None:
    """Whatever sequence of puts and drops, the store's reuse of encoded claims writes
    byte for byte what encoding the whole checkpoint afresh writes."""
    encoded = ck.EncodedClaims()
    checkpoint = ck.Checkpoint()
    for put, claim in steps:
        checkpoint = checkpoint.with_claim(claim) if put else checkpoint.without_claim(claim.uid)
        reused = ck.encode_checkpoint(checkpoint, encoded)
        assert reused == ck.encode_checkpoint(checkpoint)
        document = json.loads(reused)
        assert reused == ck._canonical(document) + b"\n"
        assert ck.decode_checkpoint(reused, Path("checkpoint.json")) == checkpoint
