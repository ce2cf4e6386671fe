"""Benchmark of what the kubelet waits on: its DRA manager's prepare and unprepare calls to
the node daemon, side by side with the same calls to a minimal Go plugin (the floor).

    python -m bench.kubelet_calls [--claims 100] [--in-flight 20] [--rounds 3]
                                  [--baseline REF] [--variant NAME]
                                  [--thunder-latency-ms N] [--run-ms N]
                                  [--write-docs] [--note TEXT]

Set-up (all local, nothing timed) is the daemon benchmark's (bench.daemon_prepare): a local
control plane, the fake Thunder service, one simulated client-only node with its pool's
ResourceSlice, claims created up front with ``status.allocation`` and ``reservedFor`` (a
bare pod each), and the real daemon process. Beside the daemon runs ``floorplugin``, a DRA
kubelet plugin on the upstream helper (``k8s.io/dynamic-resource-allocation/kubeletplugin``)
that answers every claim with a CDI device ID and writes nothing.

Both are driven by ``drabench``: the kubelet's own DRA manager (``pkg/kubelet/cm/dra`` of
the pinned Kubernetes, with ``pkg/kubelet/pluginmanager`` registering the plugin from its
``plugins_registry`` directory), timing ``PrepareResources`` and ``UnprepareResources`` for
each pod, one pod at a time and then ``--in-flight`` at once. The two Go programs are built
from hack/tools/kubeletbench by hack/build-kubeletbench.sh. The cases alternate between the
two plugins in one run, in ``--rounds`` rounds per number in flight: every plugin runs
every claim once a round, the plugins' order turning by one from round to round, so a
drift of the shared machine's speed over the run weighs on every plugin alike. Each case
pools its rounds and reports latency percentiles (and each round's p50), claims per
second, the kubelet's own gRPC metric and the CPU time per claim of the plugin, the API
server and the kubelet's DRA code (/proc/<pid>/stat). ``--write-docs`` replaces the
"Kubelet calls" section of docs/benchmarks.md.

``--thunder-latency-ms N`` makes the fake Thunder service answer every API request N ms
late (one latency fault on ``/api/v1/*``), as a Thunder service across a network would;
the run then writes its own section, after the loopback one.

``--run-ms N`` lets each pod run N ms between its prepare and its unprepare (drabench
``--run-for``, untimed), as a pod's containers run between the kubelet's two calls;
without it a pod is unprepared the moment its prepare answers. Its own section too.

``--baseline REF`` adds "before", the daemon of an earlier commit, to the same run: the
commit's tree is exported (``git archive``) into the run's temporary directory and started
as ours is (same flags, environment and interpreter, its own directories and
``plugins_registry``), so a before/after comparison comes from one run on the same
claims; the cases then alternate before, ours and floor.

``--variant NAME`` makes "before" a variant of the daemon instead: the tree of
``--baseline`` (default ``HEAD``) with ``bench/variants/NAME.patch`` applied, a patch that
takes some of the daemon's work out of the kubelet's wait (or all of it) to measure what
that work costs there. The patches are measurements, never the product; each begins with
what it changes, which the section quotes, and the run writes its own section. A variant
has no enrolled-before-binding cases.

Last comes "ours, enrolled before binding" (docs/daemon.md, "Enrolling before binding"):
claims of its own (as many, and two for drabench's warm-up) whose allocation names the
node in ``nodeSelector`` and asks for ``thundercompute.com/Enrolled`` on each device, as
the scheduler writes it when the operator publishes devices for enrollment before
binding; their pods are kept unbound by a scheduling gate, as the scheduler keeps a pod
while it waits for the claim (the daemon leaves alone a claim whose pod is bound). For
it ours is stopped and started again, same directories, with
``--enroll-before-binding``, rather than started as another daemon beside it: the mode
is the same daemon's, its state (the library cache) carries over, only one daemon of
this checkout is registered at a time, and its checkpoint is empty by then (every
earlier case unprepared what it prepared). The daemon enrolls every claim by itself; the
bench waits (bounded) until each claim's ``status.devices`` entry says ``Enrolled``, then
drabench times the kubelet's prepare (which finds the claim checkpointed and only checks
its files) and unprepare. drabench removes each pod from its claim's ``reservedFor``
between the two calls, untimed, as the claim controller does when a pod ends; otherwise
the daemon would enroll the unprepared claim again at once, in the middle of the timed
calls. Before each later run (another round, another number in flight) the claims are
reserved again and the bench waits for their enrollment again. The bench stops with an
error when the API server did not keep the binding fields (read back after the claims are
created) and when the fake Thunder service saw an enrollment during the case's drabench
run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from kubernetes import client, config
from prometheus_client.parser import text_string_to_metric_families

from bench.daemon_prepare import DRIVER, GROUP_RESOURCE, Claim, Environment, cpu_ticks
from bench.docsection import command_line
from bench.kubelet_report import (
    BEFORE,
    BEFORE_BINDING,
    FLOOR,
    OURS,
    OURS_BINDING,
    Baseline,
    Case,
    Machine,
    parse_rounds,
    render,
    write_docs,
)
from hack import supervise
from hack.tied import start_tied
from thunder_dra.kube.binding import ENROLLED, ENROLLMENT_FAILED
from thunder_dra.kube.resources import CLIENTS

_T = TypeVar("_T")

REPO = Path(__file__).resolve().parents[1]
BUILD_SCRIPT = REPO / "hack" / "build-kubeletbench.sh"
VARIANT_DIR = REPO / "bench" / "variants"
"""Patches that make variants of the daemon for ``--variant``: a description, then a diff."""
MINT_PATH = "/api/v1/enrollment-tokens"
"""The Thunder call that starts every enrollment (thunder-api.md), in the fake's writes."""
WARMUP = 2
"""drabench's untimed warm-up cycles (its --warmup default)."""
WAITING_POD = {"schedulingGates": [{"name": "thundercompute.com/bench"}]}
"""Kept unbound, as the scheduler keeps a pod whose claim waits for ``Enrolled`` (the
daemon leaves alone a claim whose pod is bound already)."""
BINDING_RESULT = {"bindingConditions": [ENROLLED], "bindingFailureConditions": [ENROLLMENT_FAILED]}
"""What each device result of a claim enrolled before binding carries."""


def _git(*args: str) -> str:
    done = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"git {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


def resolve_baseline(ref: str) -> Baseline:
    """The commit ``ref`` names: its short hash and subject line."""
    _git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    commit, subject = _git("show", "-s", "--format=%h%n%s", ref).splitlines()[:2]
    return Baseline(commit=commit, subject=subject)


def variant_names() -> list[str]:
    """The variants ``--variant`` can name: the patches in bench/variants."""
    return sorted(path.stem for path in VARIANT_DIR.glob("*.patch"))


def variant_summary(name: str) -> str:
    """What variant ``name`` changes: its patch's description (the paragraphs before the
    diff, the first line, which names the file's purpose, left out), as one paragraph."""
    text = (VARIANT_DIR / f"{name}.patch").read_text()
    description = text.split("\ndiff --git ", 1)[0].splitlines()[1:]
    return " ".join(line.strip() for line in description if line.strip())


def apply_variant(name: str, tree: Path, commit: str) -> None:
    """Apply variant ``name``'s patch to ``tree``, the exported tree of ``commit``."""
    patch = VARIANT_DIR / f"{name}.patch"
    done = subprocess.run(
        ["git", "apply", str(patch)],
        cwd=tree,
        capture_output=True,
        text=True,
        # The exported tree is no repository: keep git from finding one above it.
        env={**os.environ, "GIT_CEILING_DIRECTORIES": str(tree.parent)},
    )
    if done.returncode != 0:
        raise SystemExit(
            f"bench/variants/{name}.patch does not apply to {commit}; make it again "
            f"against that tree:\n{done.stderr.strip()}"
        )


def enrolls_before_binding(source: Path) -> bool:
    """Whether the daemon of the source tree ``source`` has ``--enroll-before-binding``."""
    config = source / "thunder_dra" / "plugin" / "config.py"
    return config.is_file() and "--enroll-before-binding" in config.read_text()


def export_tree(commit: str, directory: Path) -> Path:
    """The tree of ``commit`` written to ``directory`` (``git archive | tar -x``)."""
    directory.mkdir(parents=True)
    archive = subprocess.Popen(["git", "-C", str(REPO), "archive", commit], stdout=subprocess.PIPE)
    assert archive.stdout is not None
    untar = subprocess.run(["tar", "-x", "-C", str(directory)], stdin=archive.stdout)
    archive.stdout.close()
    if archive.wait() != 0 or untar.returncode != 0:
        raise SystemExit(f"exporting {commit} into {directory} failed")
    return directory


def build() -> Path:
    """Build (once, cached) drabench and floorplugin; their directory."""
    done = subprocess.run([str(BUILD_SCRIPT)], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{BUILD_SCRIPT.name} failed:\n{done.stderr}")
    return Path(done.stdout.strip().splitlines()[-1])


def pods_file(claims: Sequence[Claim], path: Path) -> Path:
    """The claims as drabench reads them: each with the pod it is reserved for."""
    path.write_text(
        json.dumps(
            [
                {"namespace": c.namespace, "claim": c.name, "pod": c.pod, "pod_uid": c.pod_uid}
                for c in claims
            ]
        )
    )
    return path


class Floor:
    """The floor plugin's process and directories."""

    def __init__(self, binary: Path, root: Path, kubeconfig: Path, node: str) -> None:
        self.registry = root / "plugins_registry"
        self.log = root / "floorplugin.log"
        root.mkdir(parents=True, exist_ok=True)
        self._log_file = self.log.open("ab")
        command = [
            str(binary),
            "--kubeconfig", str(kubeconfig),
            "--driver-name", DRIVER,
            "--node", node,
            "--registry-dir", str(self.registry),
            "--plugin-dir", str(root / "plugin"),
        ]  # fmt: skip
        self.process = start_tied(
            command,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        socket = self.registry / f"{DRIVER}-reg.sock"
        deadline = time.monotonic() + 30
        while not socket.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise SystemExit(f"floorplugin did not start: {supervise.read_log(self.log)}")
            time.sleep(0.05)

    def stop(self) -> None:
        supervise.stop(self.process, 10)
        self._log_file.close()


def binding_allocation(node: str) -> dict[str, Any]:
    """The fields the scheduler adds to an allocation for enrollment before binding:
    ``nodeSelector`` naming ``node`` (``bindsToNode``)."""
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    return {"nodeSelector": {"nodeSelectorTerms": [term]}}


def dropped_binding_fields(claim: Mapping[str, Any], node: str) -> list[str]:
    """The enrollment-before-binding fields of a claim's allocation that the API server
    did not keep as written (it drops them without DRADeviceBindingConditions)."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    dropped = []
    if allocation.get("nodeSelector") != binding_allocation(node)["nodeSelector"]:
        dropped.append("status.allocation.nodeSelector")
    results = (allocation.get("devices") or {}).get("results") or []
    for index, result in enumerate(results):
        for field, value in BINDING_RESULT.items():
            if result.get(field) != value:
                dropped.append(f"status.allocation.devices.results[{index}].{field}")
    return dropped if results else [*dropped, "status.allocation.devices.results"]


def _driver_entries(claim: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    devices = (claim.get("status") or {}).get("devices") or []
    return [entry for entry in devices if entry.get("driver") == DRIVER]


def enrollment(claim: Mapping[str, Any]) -> str | None:
    """Whether the daemon has enrolled a claim before binding: "" when every entry of our
    driver in ``status.devices`` says ``Enrolled`` True, the message of an
    ``EnrollmentFailed`` True, None while it has not answered."""
    entries = _driver_entries(claim)
    for entry in entries:
        for condition in entry.get("conditions") or []:
            if condition.get("type") == ENROLLMENT_FAILED and condition.get("status") == "True":
                return f"{condition.get('reason')}: {condition.get('message')}"
    enrolled = [
        any(
            c.get("type") == ENROLLED and c.get("status") == "True"
            for c in e.get("conditions") or []
        )
        for e in entries
    ]
    return "" if enrolled and all(enrolled) else None


class ClaimsReader:
    """Some claims of the run, read through the API server."""

    def __init__(self, env: Environment, claims: Sequence[Claim]) -> None:
        assert env.cluster is not None
        self.env = env
        self.claims = list(claims)
        self._api = config.new_client_from_config(config_file=str(env.cluster.kubeconfig))  # type: ignore[no-untyped-call]
        self._custom = client.CustomObjectsApi(self._api)

    def close(self) -> None:
        self._api.close()

    def read(self) -> dict[str, dict[str, Any]]:
        """Each claim as stored, by name."""
        names = {c.name for c in self.claims}
        listed: Any = self._custom.list_namespaced_custom_object(
            *GROUP_RESOURCE, self.env.namespace, "resourceclaims"
        )
        return {
            item["metadata"]["name"]: item
            for item in listed["items"]
            if item["metadata"]["name"] in names
        }


COUNTED_RESOURCES = frozenset({"resourceclaims", CLIENTS.plural})
"""The objects whose requests a case counts: the claims and the daemon's records."""
WRITE_VERBS = frozenset({"POST", "PUT", "PATCH", "APPLY", "DELETE"})


def api_request_counts(metrics: str) -> dict[str, int]:
    """Reads (GET) and writes of :data:`COUNTED_RESOURCES` so far, from the API server's
    ``/metrics`` text (``apiserver_request_total``); lists and watches are not counted."""
    counts = {"reads": 0, "writes": 0}
    for family in text_string_to_metric_families(metrics):
        if family.name != "apiserver_request":
            continue
        for sample in family.samples:
            if sample.name != "apiserver_request_total":
                continue
            if sample.labels.get("resource") not in COUNTED_RESOURCES:
                continue
            verb = sample.labels.get("verb", "")
            if verb == "GET":
                counts["reads"] += int(sample.value)
            elif verb in WRITE_VERBS:
                counts["writes"] += int(sample.value)
    return counts


class Leftovers(ClaimsReader):
    """What a daemon still does for the claims after drabench has its answers: the claim
    status writes and the `Client` records' removal. A case starts once the one before
    has none left, so that work is measured with its own daemon's case, not the next."""

    def count(self) -> int:
        """Claims with entries of our driver in ``status.devices``, and `Client` records."""
        records: Any = self._custom.list_namespaced_custom_object(
            CLIENTS.group, CLIENTS.version, self.env.namespace, CLIENTS.plural
        )
        entries = [item for item in self.read().values() if _driver_entries(item)]
        return len(entries) + len(records["items"])

    def api_requests(self) -> dict[str, int]:
        """The API server's count of requests of claims and records so far."""
        request: Any = self._api.param_serialize("GET", "/metrics", auth_settings=["BearerToken"])
        answer: Any = self._api.call_api(*request)
        answer.read()
        if answer.status != 200:
            raise SystemExit(f"reading the API server's /metrics: HTTP {answer.status}")
        return api_request_counts(answer.data.decode())

    def wait_none(self, after: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while (left := self.count()) and time.monotonic() < deadline:
            time.sleep(0.2)
        if left:
            raise SystemExit(
                f"{left} claim status entries and Client records left {timeout:g} s after {after}"
            )


class BindingClaims(ClaimsReader):
    """The claims of the enrollment-before-binding cases, read and reserved through the
    API server."""

    def check_kept(self) -> None:
        """Fail unless the API server kept every claim's binding fields."""
        stored = self.read()
        for claim in self.claims:
            dropped = dropped_binding_fields(stored.get(claim.name, {}), self.env.node)
            if dropped:
                raise SystemExit(
                    f"the API server dropped {', '.join(dropped)} of ResourceClaim "
                    f"{claim.namespace}/{claim.name}: enrollment before binding needs "
                    "the DRADeviceBindingConditions feature (on by default from 1.36)"
                )

    def reserve_again(self) -> None:
        """Reserve every claim for its pod again, as the scheduler does."""
        for claim in self.claims:
            body = {
                "status": {
                    "reservedFor": [{"resource": "pods", "name": claim.pod, "uid": claim.pod_uid}]
                }
            }
            self._custom.patch_namespaced_custom_object_status(
                *GROUP_RESOURCE, claim.namespace, "resourceclaims", claim.name, body
            )

    def wait_enrolled(self, log: Path) -> None:
        """Wait (bounded) until the daemon has enrolled every claim."""
        timeout = 60 + len(self.claims)
        deadline = time.monotonic() + timeout
        waiting: list[str] = []
        while time.monotonic() < deadline:
            stored = self.read()
            waiting = []
            for claim in self.claims:
                state = enrollment(stored.get(claim.name, {}))
                if state:
                    raise SystemExit(
                        f"the daemon failed to enroll ResourceClaim {claim.namespace}/"
                        f"{claim.name} before binding ({state}); its log:\n"
                        + supervise.log_tail(log, 30)
                    )
                if state is None:
                    waiting.append(claim.name)
            if not waiting:
                return
            time.sleep(0.5)
        raise SystemExit(
            f"after {timeout} s, {len(waiting)} of {len(self.claims)} claims have no "
            f"{ENROLLED} True in status.devices (first: {', '.join(waiting[:5])}); the "
            f"daemon's log:\n{supervise.log_tail(log, 30)}"
        )

    def wait_unprepared(self) -> None:
        """Wait (bounded) until the daemon's status writer has removed every claim's
        entries after its unprepare, so a claim reserved again is seen to wait."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            stored = self.read()
            if not any(_driver_entries(stored.get(c.name, {})) for c in self.claims):
                return
            time.sleep(0.5)
        raise SystemExit(
            "after 60 s the daemon still has status.devices entries on unprepared claims"
        )


def drive(
    drabench: Path,
    env: Environment,
    registry: Path,
    plugin_pid: int,
    pods: Path,
    in_flight: int,
    name: str,
    *,
    warmup: Path | None = None,
    end_reservations: bool = False,
    run_ms: int = 0,
) -> dict[str, Any]:
    """One drabench run against the plugin registered in ``registry``; its JSON result.
    ``warmup``: the pods of the untimed warm-up cycles (else the first of ``pods``);
    ``end_reservations``: each pod's reservation removed between its two calls;
    ``run_ms``: each pod runs that long between them."""
    assert env.cluster is not None
    state = env.root / f"kubelet-{name}"
    state.mkdir()
    log = env.root / f"drabench-{name}.log"
    command = [
        str(drabench),
        "--kubeconfig", str(env.cluster.kubeconfig),
        "--node", env.node,
        "--registry-dir", str(registry),
        "--state-dir", str(state),
        "--claims", str(pods),
        "--in-flight", str(in_flight),
        "--warmup", str(WARMUP),
        "--cpu", f"plugin={plugin_pid}",
        "--cpu", f"kube-apiserver={env.cluster.pids['kube-apiserver']}",
    ]  # fmt: skip
    if warmup is not None:
        command += ["--warmup-claims", str(warmup)]
    if end_reservations:
        command.append("--end-reservations")
    if run_ms:
        command += ["--run-for", f"{run_ms}ms"]
    with log.open("wb") as stderr:
        done = subprocess.run(
            command,
            stdout=subprocess.PIPE,
            stderr=stderr,
            timeout=900,
        )
    if done.returncode != 0:
        raise SystemExit(f"drabench ({name}) failed: {supervise.log_tail(log, 30)}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


@contextmanager
def load_sampler(every: float = 5.0) -> Iterator[list[float]]:
    """The 1-minute load average every ``every`` seconds while the block runs."""
    samples = [os.getloadavg()[0]]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(every):
            samples.append(os.getloadavg()[0])

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        stop.set()
        thread.join()
        samples.append(os.getloadavg()[0])


def turned(items: Sequence[_T], turn: int) -> list[_T]:
    """``items`` in the order of round ``turn`` (from 0): turned left by one a round."""
    if not items:
        return []
    shift = turn % len(items)
    return [*items[shift:], *items[:shift]]


def in_turns(items: Sequence[_T], rounds: int) -> list[tuple[int, _T]]:
    """Each of ``items`` once a round for ``rounds`` rounds, with its round (from 0), the
    order of each round :func:`turned` by one."""
    return [(turn, item) for turn in range(rounds) for item in turned(items, turn)]


def run_cases(
    env: Environment,
    bin_dir: Path,
    workdir: Path,
    in_flights: Sequence[int],
    baseline: Baseline | None,
    run_ms: int = 0,
    rounds: int = 1,
) -> list[Case]:
    """Every case: before (with a baseline), ours and floor for each number in flight,
    then, for each, before (when its daemon has ``--enroll-before-binding``) and ours
    enrolled before binding. Each number in flight runs in ``rounds`` rounds, every plugin
    once a round over every claim, the plugins' order turning by one from round to round;
    a case pools its rounds."""
    assert env.cluster is not None
    assert env.fake is not None
    clock_ticks = os.sysconf("SC_CLK_TCK")
    drabench = bin_dir / "drabench"
    binding = BindingClaims(
        env,
        env.add_claims(
            WARMUP + env.count,
            "bind-",
            allocation=binding_allocation(env.node),
            result=BINDING_RESULT,
            pod_spec=WAITING_POD,
        ),
    )
    cases: list[Case] = []
    floor: Floor | None = None
    leftovers = Leftovers(env, env.claims)
    try:
        binding.check_kept()
        plugins: dict[str, tuple[Path, int]] = {}
        # The daemons enrolled before binding, in order: (case, directory, source tree).
        binders: list[tuple[str, Path, Path]] = []
        if baseline is not None:
            source = export_tree(baseline.commit, workdir / "before-source")
            if baseline.variant:
                apply_variant(baseline.variant, source, baseline.commit)
            before = env.spawn_daemon(env.root / BEFORE, source=source)
            plugins[BEFORE] = (env.root / BEFORE / "plugins_registry", before.pid)
            # A variant answers without the work enrolling before binding waits for.
            if enrolls_before_binding(source) and not baseline.variant:
                binders.append((BEFORE_BINDING, env.root / BEFORE, source))
        binders.append((OURS_BINDING, env.root, REPO))
        plugins[OURS] = (env.root / "plugins_registry", env.start_daemon())
        floor = Floor(bin_dir / "floorplugin", env.root / "floor", env.cluster.kubeconfig, env.node)
        plugins[FLOOR] = (floor.registry, floor.process.pid)
        pods = pods_file(env.claims, env.root / "pods.json")
        for in_flight in in_flights:
            runs: dict[str, list[dict[str, Any]]] = {plugin: [] for plugin in plugins}
            for turn, plugin in in_turns(list(plugins), rounds):
                registry, pid = plugins[plugin]
                name = f"{plugin}-{in_flight}-{turn + 1}"
                requests = leftovers.api_requests()
                raw = drive(drabench, env, registry, pid, pods, in_flight, name, run_ms=run_ms)
                watched = {"plugin": pid, "kube-apiserver": env.cluster.pids["kube-apiserver"]}
                ticks = {label: cpu_ticks(p) for label, p in watched.items()}
                leftovers.wait_none(name)
                for label, p in watched.items():
                    raw["cpu_ticks"][label] += cpu_ticks(p) - ticks[label]
                counted = leftovers.api_requests()
                raw["api_requests"] = {
                    "claims": len(raw["prepare_s"]) + WARMUP,
                    **{kind: counted[kind] - requests[kind] for kind in requests},
                }
                runs[plugin].append(raw)
                print(f"{plugin}, {in_flight} in flight, round {turn + 1}: done", file=sys.stderr)
            cases += [parse_rounds(plugin, runs[plugin], clock_ticks) for plugin in plugins]

        for daemon in list(env.daemons):
            env.stop_daemon(daemon)
        warmup = pods_file(binding.claims[:WARMUP], env.root / "bind-warmup.json")
        timed = pods_file(binding.claims[WARMUP:], env.root / "bind-pods.json")
        first = True
        for in_flight in in_flights:
            bound: dict[str, list[dict[str, Any]]] = {plugin: [] for plugin, _, _ in binders}
            for turn, (plugin, root, source) in in_turns(binders, rounds):
                if not first:
                    binding.reserve_again()
                first = False
                # One daemon at a time: each enrolls every claim reserved for its node.
                daemon = env.spawn_daemon(
                    root, source=source, extra_args=["--enroll-before-binding"]
                )
                binding.wait_enrolled(root / "daemon.log")
                writes_before = len(env.fake.admin.writes())
                who = "before" if plugin == BEFORE_BINDING else "ours"
                name = f"{who}-binding-{in_flight}-{turn + 1}"
                raw = drive(
                    drabench,
                    env,
                    root / "plugins_registry",
                    daemon.pid,
                    timed,
                    in_flight,
                    name,
                    warmup=warmup,
                    end_reservations=True,
                    run_ms=run_ms,
                )
                minted = [
                    w
                    for w in env.fake.admin.writes()[writes_before:]
                    if w["method"] == "POST" and w["path"] == MINT_PATH
                ]
                if minted:
                    raise SystemExit(
                        f"the fake Thunder service saw {len(minted)} enrollments during "
                        f"drabench's run of {plugin} with {in_flight} in flight: its figures "
                        "would include enrollments, not only the checks of claims enrolled "
                        "before binding"
                    )
                bound[plugin].append(raw)
                # Before the daemon stops: its status writer removes the entries.
                binding.wait_unprepared()
                env.stop_daemon(daemon)
                print(f"{plugin}, {in_flight} in flight, round {turn + 1}: done", file=sys.stderr)
            cases += [parse_rounds(plugin, bound[plugin], clock_ticks) for plugin, _, _ in binders]
    finally:
        binding.close()
        leftovers.close()
        if floor is not None:
            floor.stop()
    return cases


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.kubelet_calls", description=__doc__)
    parser.add_argument("--claims", type=int, default=100, help="calls per case")
    parser.add_argument("--in-flight", type=int, default=20)
    parser.add_argument(
        "--baseline",
        metavar="REF",
        help='a git ref whose daemon runs beside ours as "before", in the same run',
    )
    parser.add_argument(
        "--variant",
        choices=variant_names(),
        help='run as "before" the tree of --baseline (default HEAD) with '
        "bench/variants/VARIANT.patch applied (own section)",
    )
    parser.add_argument(
        "--thunder-latency-ms",
        type=int,
        default=0,
        help="answer every Thunder API request this late, as across a network (own section)",
    )
    parser.add_argument(
        "--run-ms",
        type=int,
        default=0,
        help="each pod runs this long between its prepare and its unprepare (own section)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="rounds per number in flight, every plugin once a round, the order turning",
    )
    parser.add_argument("--write-docs", action="store_true")
    parser.add_argument(
        "--note", default="", help="a paragraph for the section, e.g. what else ran meanwhile"
    )
    args = parser.parse_args(argv)
    if not 0 <= args.thunder_latency_ms <= 10_000:
        parser.error("--thunder-latency-ms must be within 0-10000")
    if not 0 <= args.run_ms <= 60_000:
        parser.error("--run-ms must be within 0-60000")
    if not 1 <= args.rounds <= 20:
        parser.error("--rounds must be within 1-20")
    baseline = None
    if args.variant:
        baseline = dataclasses.replace(
            resolve_baseline(args.baseline or "HEAD"),
            variant=args.variant,
            variant_summary=variant_summary(args.variant),
        )
    elif args.baseline:
        baseline = resolve_baseline(args.baseline)
    bin_dir = build()
    started = datetime.now(UTC)
    with (
        load_sampler() as load,
        tempfile.TemporaryDirectory(prefix="bench-kubelet-") as workdir,
        Environment(args.claims, Path(workdir)) as env,
    ):
        env.prepare_cluster()
        if args.thunder_latency_ms:
            assert env.fake is not None
            env.fake.admin.add_fault("/api/v1/*", method="*", latency_ms=args.thunder_latency_ms)
        in_flights = sorted({1, args.in_flight})
        cases = run_cases(
            env, bin_dir, Path(workdir), in_flights, baseline, args.run_ms, args.rounds
        )
    machine = Machine.describe(started, sum(load) / len(load))
    command = command_line("bench.kubelet_calls", args, ["claims", "in_flight", "rounds"])
    if baseline is not None:
        command += f" --baseline {baseline.commit}"
    if args.variant:
        command += f" --variant {args.variant}"
    if args.thunder_latency_ms:
        command += f" --thunder-latency-ms {args.thunder_latency_ms}"
    if args.run_ms:
        command += f" --run-ms {args.run_ms}"
    section = render(
        cases,
        machine,
        command + " --write-docs",
        args.note,
        baseline,
        args.thunder_latency_ms,
        args.run_ms,
    )
    print(section)
    if args.write_docs:
        write_docs(
            section,
            thunder_latency_ms=args.thunder_latency_ms,
            run_ms=args.run_ms,
            variant=args.variant or "",
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
