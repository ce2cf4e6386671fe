"""The verified Thunder installer and ``libthunder.so``: installer pins, then the node cache.

The digest comes from the installer's ``libthunder_sha256`` line (thunder-api.md 3.1),
re-read at most every few minutes (:class:`PinnedDigest`); the library URL from its
``default_artifact_base_url``. The cache (:class:`LibthunderCache`) downloads a digest
once and stages it only if the SHA-256 matches. A mismatch forgets the pins, so the next
claim re-reads the installer rather than trusting a digest that may have moved on.

A deployment may pin both digests (ThunderCluster ``spec.thunder.installerSHA256`` and
``librarySHA256``, daemon flags ``--installer-sha256`` and ``--library-sha256``): an
installer with another SHA-256 is refused (no claim gets a library from it, no node
install runs it), and so is an installer whose library pin differs from
``librarySHA256``. Either refusal names the URL and both digests and stages nothing.
"""

from __future__ import annotations

from pathlib import Path

from thunder_dra.plugin.errors import ClaimError
from thunder_dra.plugin.files.libcache import (
    DigestMismatchError,
    LibraryCacheError,
    LibthunderCache,
    PinnedDigest,
)
from thunder_dra.plugin.metrics import ErrorReason
from thunder_dra.thunder import (
    ArtifactDigestMismatch,
    ArtifactFetcher,
    InstallerPins,
    ThunderError,
)


class LibraryPinMismatch(LibraryCacheError):
    """The installer pins another libthunder.so than the deployment's ``librarySHA256``."""

    def __init__(self, installer_url: str, installer_pin: str, deployment_pin: str) -> None:
        super().__init__(
            f"installer {installer_url} pins libthunder.so SHA-256 {installer_pin}, but the"
            f" pinned librarySHA256 is {deployment_pin}; refused, nothing was staged"
        )


class LibraryProvider:
    def __init__(
        self,
        fetcher: ArtifactFetcher,
        cache: LibthunderCache,
        installer_url: str,
        *,
        installer_sha256: str | None = None,
        library_sha256: str | None = None,
    ) -> None:
        self._fetcher = fetcher
        self.cache = cache
        self._installer_url = installer_url
        self._installer_sha256 = installer_sha256
        self._library_sha256 = library_sha256
        self._library_url: str | None = None
        self._pinned = PinnedDigest(self._resolve)

    async def fetch_installer(self) -> InstallerPins:
        """The installer, its text verified against the pins (raises ThunderError or
        :class:`LibraryPinMismatch`)."""
        pins = await self._fetcher.fetch_installer(self._installer_url, self._installer_sha256)
        if self._library_sha256 and pins.libthunder_sha256 != self._library_sha256:
            raise LibraryPinMismatch(
                self._installer_url, pins.libthunder_sha256, self._library_sha256
            )
        return pins

    async def _resolve(self) -> str:
        pins = await self.fetch_installer()
        self._library_url = pins.library_url
        return pins.libthunder_sha256

    async def current(self) -> Path:
        """The library new claims get; raises :class:`ClaimError` (reason libthunder)."""
        try:
            digest = await self._pinned.get()
        except (ArtifactDigestMismatch, LibraryPinMismatch) as err:
            raise ClaimError(f"libthunder.so refused: {err}", ErrorReason.LIBTHUNDER) from None
        except (ThunderError, LibraryCacheError) as err:
            raise ClaimError(
                f"reading the libthunder.so digest from {self._installer_url} failed: {err}",
                ErrorReason.LIBTHUNDER,
            ) from None
        return await self.by_digest(digest)

    async def by_digest(self, digest: str) -> Path:
        """The cached library with ``digest``, downloading it again if it went missing."""
        try:
            if self._library_url is None:
                await self._pinned.get()
            return await self.cache.ensure(digest, self._library_url or "")
        except (ArtifactDigestMismatch, DigestMismatchError) as err:
            self._pinned.invalidate()
            raise ClaimError(
                f"libthunder.so digest mismatch, refused: {err}", ErrorReason.LIBTHUNDER
            ) from None
        except (ThunderError, LibraryCacheError, OSError) as err:
            raise ClaimError(
                f"fetching libthunder.so failed: {err}", ErrorReason.LIBTHUNDER
            ) from None


def digest_of(library: Path) -> str | None:
    """The digest in a cache path ``.../sha256/<digest>/libthunder.so``."""
    if library.name != "libthunder.so" or library.parent.parent.name != "sha256":
        return None
    return library.parent.name
