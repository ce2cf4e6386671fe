"""A rolling update: two daemon instances on one node share its state directory; the newer
serves, the older leaves cleanly, and one killed mid-prepare is cleaned up by the other."""

from __future__ import annotations

import pytest

from hack.fake_thunder import FakeThunderProcess
from hack.testbed.daemon import (
    CLIENT_API,
    NodeHarness,
    Workloads,
    ZonePool,
    mints,
)
from hack.testbed.kube import Kube, wait_for


@pytest.mark.timeout(300)
def test_instances_hand_over_and_a_killed_one_is_rolled_back_by_the_survivor(
    kube: Kube, fake: FakeThunderProcess, pool: ZonePool, namespace: str
) -> None:
    pods = Workloads(kube, namespace, pool)
    with NodeHarness(kube, fake, zone=pool.zone) as node:
        old = node.daemon.start()
        old.wait_serving()
        first, _ = pods.create(node)
        running = pods.wait_running(node, first)
        answer = old.prepare(namespace, running.claim_name, running.claim_uid)

        new = node.another_instance(fake, "b").start()
        try:
            new.wait_serving()
            wait_for(
                lambda: (
                    (p := node.kubelet.endpoint_for("thundercompute.com")) is not None
                    and p.endpoint == str(new.dra_socket)
                ),
                "the new instance registered",
            )
            # Same claim through the new instance: the shared checkpoint answers it.
            writes_before = len(fake.admin.writes())
            assert new.prepare(namespace, running.claim_name, running.claim_uid) == answer
            assert mints(fake, writes_before) == []

            # The old instance leaves: its sockets go, the node keeps a plugin.
            assert old.stop() == 0
            assert not old.dra_socket.exists()

            # A third instance registers last and dies mid-prepare; the kubelet falls back
            # to the live one, and the survivor rolls the dead instance's journal back.
            doomed = node.another_instance(fake, "c").start(crash_at="prepare:client-recorded")
            doomed.wait_serving()
            wait_for(
                lambda: (
                    (p := node.kubelet.endpoint_for("thundercompute.com")) is not None
                    and p.endpoint == str(doomed.dra_socket)
                ),
                "the third instance registered",
            )
            second, _ = pods.create(node)
            assert doomed.wait_exit(timeout=90) == 137
            crashed = pods.wait_running(node, second)
            wait_for(
                lambda: not (node.root / "state" / "journal" / doomed.instance_id).exists(),
                "the dead instance's journal rolled back",
            )
            assert fake.admin.leaks() == []
            live = [
                c
                for c in fake.admin.state()["clients"]
                if c["displayName"] == second and not c["decommissionedAt"]
            ]
            assert len(live) == 1
            client = kube.get(CLIENT_API, "Client", f"claim-{crashed.claim_uid}", namespace)
            assert client is not None
            assert client["spec"]["clientId"] == live[0]["clientId"]

            for name in (first, second):
                pods.delete(name)
                pods.wait_gone(node, name)
            assert fake.admin.leaks() == []
            wait_for(
                lambda: kube.list_objects(CLIENT_API, "Client", namespace) == [],
                "the Client records removed after the unprepares",
            )
        finally:
            new.stop()
