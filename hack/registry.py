"""A local OCI registry on loopback, for ``make push`` and the install-from-registry test.

Debian's ``docker-registry`` (the CNCF distribution registry) runs as a plain process
like the control plane's etcd (``hack.cluster``): tied to the thread that starts it,
its blobs under the caller's work directory, plain http on ``127.0.0.1`` and a free
port, never another address. containerd and helm reach plain http on a loopback
address without configuration; skopeo is told so (``--dest-tls-verify=false``).
``hack/ensure-registry.sh`` installs ``docker-registry`` and ``skopeo``.

    with Registry(workdir) as registry:
        registry.host                     # "127.0.0.1:41234"
        registry.tags("thunder-compute/thunder-device-plugin")

    python -m hack.registry run [--workdir DIR]    # until Ctrl-C, printing its address
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from hack import supervise
from hack.cluster.launcher import free_port
from hack.tied import tied

REPO = Path(__file__).resolve().parents[1]
ENSURE_SCRIPT = REPO / "hack" / "ensure-registry.sh"
BINARY = "docker-registry"


class RegistryError(RuntimeError):
    """The registry could not start, or answered a request with an error."""


def unavailable() -> str | None:
    """Why no registry can run here (after ``hack/ensure-registry.sh``), or None."""
    done = subprocess.run([str(ENSURE_SCRIPT)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return done.stderr.strip() or f"{ENSURE_SCRIPT} failed ({done.returncode})"
    return None


class Registry(supervise.Served):
    """One registry process: ``start`` (or ``with``) runs it, ``stop`` ends it."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = 0

    @property
    def host(self) -> str:
        """``127.0.0.1:PORT``: what image references and ``oci://`` URLs start with."""
        return f"127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.workdir / "registry.log"

    def start(self) -> Registry:
        binary = shutil.which(BINARY)
        if binary is None:
            raise RegistryError(f"{BINARY} is not on PATH (run {ENSURE_SCRIPT})")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        config = {
            "version": 0.1,
            "log": {"level": "info", "accesslog": {"disabled": False}},
            "storage": {
                "filesystem": {"rootdirectory": str(self.workdir / "data")},
                "delete": {"enabled": True},
            },
            "http": {"addr": self.host},
        }
        path = self.workdir / "config.yml"
        path.write_text(yaml.safe_dump(config))
        with self.log.open("ab") as out:
            self._popen = subprocess.Popen(
                tied([binary, "serve", str(path)]),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            code = self._popen.poll()
            if code is not None:
                tail = supervise.log_tail(self.log, 20)
                raise RegistryError(f"{BINARY} exited with code {code}:\n{tail}")
            try:
                self.get("/v2/")
                return self
            except (OSError, RegistryError):
                time.sleep(0.1)
        self.stop()
        raise RegistryError(f"{BINARY} did not answer on {self.host} within 30s")

    def get(self, path: str, accept: str | None = None) -> Any:
        """GET ``path`` from the registry's API; its JSON body (None when 404)."""
        request = urllib.request.Request(f"http://{self.host}{path}")
        if accept:
            request.add_header("Accept", accept)
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                body = answer.read()
        except urllib.error.HTTPError as err:
            if err.code == 404:
                return None
            raise RegistryError(f"GET {path}: HTTP {err.code}") from err
        return json.loads(body) if body else {}

    def tags(self, repository: str) -> list[str]:
        """The tags of ``repository`` (e.g. ``thunder-compute/thunder-device-plugin``)."""
        found = self.get(f"/v2/{repository}/tags/list")
        return sorted((found or {}).get("tags") or [])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hack.registry", description=__doc__.split("\n")[0]
    )
    parser.add_argument("action", choices=("run",))
    parser.add_argument("--workdir", type=Path, help="where its blobs go (default: a temp dir)")
    args = parser.parse_args(argv)
    why = unavailable()
    if why:
        print(f"registry: {why}", file=sys.stderr)
        return 2
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="thunder-registry-"))
    try:
        with Registry(workdir) as registry:
            print(f"registry on {registry.host} (data in {workdir}); Ctrl-C stops it", flush=True)
            print(f"  make push REGISTRY={registry.host}/thunder-compute", flush=True)
            signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
            while True:
                time.sleep(3600)
    except KeyboardInterrupt:
        return 0
    except RegistryError as err:
        print(f"registry: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
