"""Where a pod's claim keeps its files on the node, decided in one place.

A pod's claim has a root-only directory ``<state dir>/claims/<claim uid>`` holding its
``config.json``, a transient CDI spec ``<cdi dir>/thundercompute.com-gpu_claim-<uid>.json``,
and mounts the node's cached ``libthunder.so``. Prepare, repair, rollback and the rebuild
of a lost checkpoint entry all take these paths from :class:`ClaimLayout`, and the
checkpoint records them as the claim's ``paths`` (:attr:`ClaimFiles.paths`). A KubeVirt
VM's claim has no files on the node.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from thunder_dra.plugin.files.cdi import spec_file_name
from thunder_dra.plugin.files.clientconfig import CONFIG_FILE_NAME, claim_dir


@dataclass(frozen=True)
class ClaimFiles:
    """One pod claim's files, as absolute host paths."""

    directory: Path
    config_json: Path
    cdi_spec: Path
    library: Path

    @property
    def paths(self) -> tuple[str, ...]:
        """As the checkpoint records them (``PreparedClaim.paths``), in this order."""
        return (str(self.directory), str(self.config_json), str(self.cdi_spec), str(self.library))


@dataclass(frozen=True)
class ClaimLayout:
    """The node's directories for claims' files: ``claims_dir`` (the claim directories)
    and ``cdi_dir`` (the CDI specs)."""

    claims_dir: Path
    cdi_dir: Path

    def directory(self, claim_uid: str) -> Path:
        """The claim's directory; raises ``ClientConfigError`` on a UID that is not a safe
        directory name."""
        return claim_dir(self.claims_dir, claim_uid)

    def config_json(self, claim_uid: str) -> Path:
        return self.directory(claim_uid) / CONFIG_FILE_NAME

    def files(self, claim_uid: str, library: Path) -> ClaimFiles:
        """Every file of the claim, which mounts the cached ``library``."""
        return ClaimFiles(
            directory=self.directory(claim_uid),
            config_json=self.config_json(claim_uid),
            cdi_spec=self.cdi_dir / spec_file_name(claim_uid),
            library=library,
        )
