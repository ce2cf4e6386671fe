"""CDI specs for prepared claims: one transient spec file per claim, one device per spec.

The container runtime applies a claim's spec when the kubelet hands it the CDI device ID
``thundercompute.com/gpu=claim-<claim uid>``. The spec only adds read-only bind mounts
and environment variables: no hooks, no device nodes, and never a token (the Thunder
credential reaches the container as the mounted ``config.json``, not through the spec).

Every host path in a spec is read by the runtime on the host, so callers pass host paths
(the daemon sees the plugin directory and the CDI directory at the same paths as the host).

The models reject unknown fields and only model the fields this project uses, so a spec
can never carry a field an older CDI library would refuse; ``cdiVersion`` is the lowest
version that supports the fields used, as CDI's ``MinimumRequiredVersion`` computes it.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from opentelemetry import trace
from pydantic import BaseModel, ConfigDict, Field, field_validator

from thunder_dra import fsutil
from thunder_dra.plugin.state.checkpoint import PreparedClaim
from thunder_dra.spans import step_span

CDI_VENDOR = "thundercompute.com"
CDI_CLASS = "gpu"
CDI_KIND = f"{CDI_VENDOR}/{CDI_CLASS}"
DEFAULT_CDI_DIR = Path("/var/run/cdi")
_tracer = trace.get_tracer(__name__)

CONFIG_CONTAINER_PATH = "/etc/thunder/config.json"
LIBTHUNDER_CONTAINER_PATH = "/etc/thunder/libthunder.so"
NVIDIA_SMI_CONTAINER_PATH = "/usr/local/bin/nvidia-smi"
# The dynamic loader's default directories on Debian/Ubuntu/musl and on RHEL-family glibc;
# mounting there means no LD_LIBRARY_PATH edit, which CDI could only overwrite.
LIBRARY_CONTAINER_DIRS = ("/usr/lib", "/usr/lib64")
CA_BUNDLE_CONTAINER_PATH = "/etc/ssl/certs/ca-certificates.crt"

MOUNT_TYPE = "bind"
READ_ONLY_BIND_OPTIONS = ("ro", "nosuid", "nodev", "bind")

# CDI spec versions, oldest first, with the field each one introduced that we can emit.
CDI_BASE_VERSION = "0.3.0"  # the earliest version current CDI libraries accept
CDI_MOUNT_TYPE_VERSION = "0.4.0"

_DEVICE_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SECRET_ENV_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|CREDENTIAL", re.IGNORECASE)
_SPEC_FILE_PREFIX = f"{CDI_VENDOR}-{CDI_CLASS}_claim-"


class CdiError(ValueError):
    """A CDI spec could not be built or stored (the message names the claim and field)."""


class _CdiModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class CdiMount(_CdiModel):
    host_path: str = Field(alias="hostPath", min_length=1)
    container_path: str = Field(alias="containerPath", min_length=1)
    options: tuple[str, ...] | None = None
    type: str | None = None


class CdiContainerEdits(_CdiModel):
    env: tuple[str, ...] | None = None
    mounts: tuple[CdiMount, ...] | None = None

    @field_validator("env")
    @classmethod
    def _env_is_safe(cls, env: tuple[str, ...] | None) -> tuple[str, ...] | None:
        for entry in env or ():
            name, sep, _ = entry.partition("=")
            if not sep or not _ENV_NAME.match(name):
                raise ValueError(f"env entry {name!r} is not KEY=VALUE")
            if _SECRET_ENV_NAME.search(name):
                raise ValueError(f"env {name} looks like a credential; CDI specs never hold one")
        return env


class CdiDevice(_CdiModel):
    name: str
    container_edits: CdiContainerEdits = Field(alias="containerEdits")

    @field_validator("name")
    @classmethod
    def _valid_name(cls, name: str) -> str:
        if not _DEVICE_NAME.match(name):
            raise ValueError(f"invalid CDI device name {name!r}")
        return name


class CdiSpec(_CdiModel):
    cdi_version: str = Field(alias="cdiVersion")
    kind: str
    devices: tuple[CdiDevice, ...] = Field(min_length=1)

    def to_json(self) -> bytes:
        """The file content: stable key order, no null fields, trailing newline."""
        data = self.model_dump(mode="json", by_alias=True, exclude_none=True)
        return (json.dumps(data, indent=2) + "\n").encode()


def minimum_cdi_version(spec: CdiSpec) -> str:
    """The lowest ``cdiVersion`` that supports every field ``spec`` uses."""
    for device in spec.devices:
        for mount in device.container_edits.mounts or ():
            if mount.type:
                return CDI_MOUNT_TYPE_VERSION
    return CDI_BASE_VERSION


def device_name(claim_uid: str) -> str:
    """The CDI device name of a claim, ``claim-<uid>``; fails on a UID CDI cannot name."""
    name = f"claim-{claim_uid}"
    if not claim_uid or not _DEVICE_NAME.match(name):
        raise CdiError(f"claim UID {claim_uid!r} cannot form a CDI device name")
    return name


def qualified_device_id(claim_uid: str) -> str:
    """The ID the kubelet passes to the runtime: ``thundercompute.com/gpu=claim-<uid>``."""
    return f"{CDI_KIND}={device_name(claim_uid)}"


def transient_spec_name(vendor: str, cdi_class: str, transient_id: str) -> str:
    """CDI's ``GenerateTransientSpecName``: ``<vendor>-<class>_<id>``, ``/`` as ``_``."""
    return f"{vendor}-{cdi_class}_{transient_id.replace('/', '_')}"


def spec_file_name(claim_uid: str) -> str:
    """``thundercompute.com-gpu_claim-<uid>.json``."""
    return transient_spec_name(CDI_VENDOR, CDI_CLASS, device_name(claim_uid)) + ".json"


@dataclass(frozen=True)
class NodeGpuFiles:
    """Host paths of the node's NVIDIA tools, each None when the node does not have it."""

    nvidia_smi: Path | None = None
    libcuda: Path | None = None
    libnvidia_ml: Path | None = None


def _bind(host: Path, container: str, claim_uid: str) -> CdiMount:
    if not host.is_absolute():
        raise CdiError(f"claim {claim_uid}: host path {host} for {container} is not absolute")
    return CdiMount(
        host_path=str(host),
        container_path=container,
        options=READ_ONLY_BIND_OPTIONS,
        type=MOUNT_TYPE,
    )


def _mounts(
    claim_uid: str,
    config_json: Path,
    libthunder: Path,
    files: NodeGpuFiles,
    ca_bundle: Path | None,
) -> list[CdiMount]:
    mounts = [
        _bind(config_json, CONFIG_CONTAINER_PATH, claim_uid),
        _bind(libthunder, LIBTHUNDER_CONTAINER_PATH, claim_uid),
    ]
    if files.nvidia_smi is not None:
        mounts.append(_bind(files.nvidia_smi, NVIDIA_SMI_CONTAINER_PATH, claim_uid))
    for library, soname in (
        (files.libcuda, "libcuda.so.1"),
        (files.libnvidia_ml, "libnvidia-ml.so.1"),
    ):
        if library is not None:
            mounts.extend(
                _bind(library, f"{d}/{soname}", claim_uid) for d in LIBRARY_CONTAINER_DIRS
            )
    if ca_bundle is not None:
        mounts.append(_bind(ca_bundle, CA_BUNDLE_CONTAINER_PATH, claim_uid))
    return mounts


def _env(claim: PreparedClaim, preload: bool) -> list[str]:
    env = [f"LD_PRELOAD={LIBTHUNDER_CONTAINER_PATH}"] if preload else []
    env += [
        f"THUNDER_GPU_TYPE={claim.gpu_type}",
        f"THUNDER_GPU_COUNT={claim.gpu_count}",
        f"THUNDER_RESOURCE_CLAIM_UID={claim.uid}",
        f"THUNDER_RESOURCE_CLAIM_NAMESPACE={claim.namespace}",
        f"THUNDER_RESOURCE_CLAIM_NAME={claim.name}",
        f"THUNDER_CDI_DEVICE={qualified_device_id(claim.uid)}",
    ]
    return env


def build_claim_spec(
    claim: PreparedClaim,
    *,
    config_json: Path,
    libthunder: Path,
    node_gpu_files: NodeGpuFiles | None = None,
    ca_bundle: Path | None = None,
    preload: bool = True,
) -> CdiSpec:
    """The CDI spec for one prepared claim, at the minimum ``cdiVersion`` it needs.

    ``config_json`` and ``libthunder`` are the claim's files (:mod:`.layout`), the node's
    GPU files and ``ca_bundle`` (opt-in: it hides the image's own bundle) are mounted when
    given, and ``preload`` is False when the claim sets ``LD_PRELOAD`` itself. Every path
    is an absolute host path."""
    mounts = _mounts(
        claim.uid, config_json, libthunder, node_gpu_files or NodeGpuFiles(), ca_bundle
    )
    device = CdiDevice(
        name=device_name(claim.uid),
        container_edits=CdiContainerEdits(env=tuple(_env(claim, preload)), mounts=tuple(mounts)),
    )
    draft = CdiSpec(cdi_version=CDI_BASE_VERSION, kind=CDI_KIND, devices=(device,))
    return draft.model_copy(update={"cdi_version": minimum_cdi_version(draft)})


def claim_uid_from_file_name(name: str) -> str | None:
    """The claim UID of one of our spec files, or None for any other file."""
    if not (name.startswith(_SPEC_FILE_PREFIX) and name.endswith(".json")):
        return None
    uid = name[len(_SPEC_FILE_PREFIX) : -len(".json")]
    return uid or None


class CdiSpecStore:
    """Our transient spec files in one CDI directory (``/var/run/cdi`` by default).

    ``node_gpu_files`` tells, at each write, which of the node's NVIDIA tools a spec mounts
    (only those present: a missing bind source fails the container); ``ca_bundle`` is the
    node's CA bundle to mount, if the deployment asks for it."""

    def __init__(
        self,
        cdi_dir: Path = DEFAULT_CDI_DIR,
        *,
        node_gpu_files: Callable[[], NodeGpuFiles] = NodeGpuFiles,
        ca_bundle: Path | None = None,
    ) -> None:
        self.cdi_dir = cdi_dir
        self._node_gpu_files = node_gpu_files
        self._ca_bundle = ca_bundle

    def path_for(self, claim_uid: str) -> Path:
        return self.cdi_dir / spec_file_name(claim_uid)

    async def write_claim(
        self, claim: PreparedClaim, *, config_json: Path, libthunder: Path, preload: bool = True
    ) -> Path:
        """Build and store a claim's spec; returns the spec file path."""
        spec = build_claim_spec(
            claim,
            config_json=config_json,
            libthunder=libthunder,
            node_gpu_files=self._node_gpu_files(),
            ca_bundle=self._ca_bundle,
            preload=preload,
        )
        return await self.write(claim.uid, spec)

    async def write(self, claim_uid: str, spec: CdiSpec) -> Path:
        """Store ``spec`` as the claim's spec file, atomically; a no-op if already current."""
        expected = device_name(claim_uid)
        if [d.name for d in spec.devices] != [expected]:
            raise CdiError(f"claim {claim_uid}: spec must hold exactly device {expected}")
        path = self.path_for(claim_uid)
        with step_span(_tracer, "thunder_dra.cdi_spec.write", attributes={"file.path": str(path)}):
            await asyncio.to_thread(self._write_sync, path, spec.to_json())
        return path

    def _write_sync(self, path: Path, content: bytes) -> None:
        if not self.cdi_dir.is_dir():
            # Shared with other vendors' specs: create it if missing, never re-mode it.
            fsutil.ensure_dir(self.cdi_dir, 0o755)
        try:
            if path.read_bytes() == content:
                return
        except FileNotFoundError:
            pass
        fsutil.write_atomic(path, content, mode=0o644)

    async def remove(self, claim_uid: str, *, durable: bool = True) -> bool:
        """Delete the claim's spec file; a missing file is done already. True if removed.

        ``durable=False``: one unlink, on the event loop (cheaper than a thread hand-off),
        without the directory fsync; the caller fsyncs :attr:`cdi_dir` before it relies
        on the removal surviving a power loss."""
        path = self.path_for(claim_uid)
        with step_span(_tracer, "thunder_dra.cdi_spec.remove", attributes={"file.path": str(path)}):
            if not durable:
                return fsutil.remove_if_exists(path, durable=False)
            return await fsutil.remove_if_exists_async(path)

    async def list_claim_uids(self) -> list[str]:
        """UIDs of the claims that have a spec file here, sorted (for rebuild and cleanup)."""
        return await asyncio.to_thread(self._list_sync)

    def _list_sync(self) -> list[str]:
        try:
            names = [entry.name for entry in self.cdi_dir.iterdir() if entry.is_file()]
        except FileNotFoundError:
            return []
        return sorted(uid for uid in map(claim_uid_from_file_name, names) if uid is not None)

    async def remove_temp_files(self) -> int:
        """Delete our temporary files left by a crash mid-write; returns how many."""
        return await asyncio.to_thread(self._remove_temp_sync)

    def _remove_temp_sync(self) -> int:
        removed = 0
        try:
            entries = list(self.cdi_dir.iterdir())
        except FileNotFoundError:
            return 0
        for entry in entries:
            if fsutil.is_temp_name(entry.name) and entry.name.startswith(f".{_SPEC_FILE_PREFIX}"):
                removed += fsutil.remove_if_exists(entry)
        return removed
