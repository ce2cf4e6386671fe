"""Bounded work per kubelet call: shared single-flight lookups, bounded claim slots, and the
journal sweep's backoff."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from tests.support.fakekube import FakeKube
from thunder_dra.kube.client import KubeClient
from thunder_dra.plugin.claims.allocation import PoolResolver, SingleFlight, ZoneIds
from thunder_dra.plugin.claims.recovery import SWEEP_MAX_BACKOFF_INTERVALS, sweep_delay
from thunder_dra.plugin.errors import ClaimError
from thunder_dra.plugin.kubelet.handler import ClaimSlots
from thunder_dra.thunder import ThunderClient

ZONES = [
    {"zoneId": "zone-b", "displayName": "us-east"},
    {"zoneId": "zone-a", "displayName": "us-east"},
    {"zoneId": "zone-c", "displayName": "eu-west"},
]


def _thunder(seen: list[str], status: int = 200) -> ThunderClient:
    async def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        await asyncio.sleep(0.01)  # long enough for every caller to arrive meanwhile
        if status != 200:
            return httpx.Response(status, json={"error": "nope", "message": "injected"})
        return httpx.Response(200, json={"zones": ZONES})

    return ThunderClient(
        api_token="t0k",
        component="daemon",
        base_url="http://thunder.test",
        transport=httpx.MockTransport(answer),
        registry=CollectorRegistry(),
    )


async def test_concurrent_zone_lookups_share_one_zone_list() -> None:
    seen: list[str] = []
    zones = ZoneIds(_thunder(seen))
    names = ["us-east", "eu-west"] * 150
    ids = await asyncio.gather(*(zones.resolve(n) for n in names))
    assert seen == ["/api/v1/zones"]
    assert set(zip(names, ids, strict=True)) == {("us-east", "zone-a"), ("eu-west", "zone-c")}
    # Cached afterwards: no further list.
    assert await zones.resolve("us-east") == "zone-a"
    assert seen == ["/api/v1/zones"]


async def test_a_failed_shared_zone_list_fails_every_waiter_once() -> None:
    seen: list[str] = []
    zones = ZoneIds(_thunder(seen, status=400))
    results = await asyncio.gather(
        *(zones.resolve("us-east") for _ in range(20)), return_exceptions=True
    )
    assert all(isinstance(r, ClaimError) for r in results)
    assert "Thunder zone lookup failed" in str(results[0])
    assert seen == ["/api/v1/zones"]


async def test_an_unknown_zone_is_a_claim_error() -> None:
    zones = ZoneIds(_thunder([]))
    with pytest.raises(ClaimError, match="no zone named 'nowhere'"):
        await zones.resolve("nowhere")


class _Slices(KubeClient):
    def __init__(self) -> None:
        super().__init__(FakeKube())
        self.calls = 0

    async def list_slices(self, *, driver: str, label_selector: str) -> list[dict[str, Any]]:
        self.calls += 1
        await asyncio.sleep(0.01)
        annotations = {
            "thundercompute.com/thunder-zone": "us-east",
            "thundercompute.com/thunder-gpu-type": "A6000",
        }
        return [
            {
                "metadata": {"annotations": annotations},
                "spec": {"pool": {"name": "us-east/a6000", "generation": 1}, "devices": []},
            }
        ]


async def test_concurrent_pool_lookups_share_one_slice_list() -> None:
    kube = _Slices()
    pools = PoolResolver(kube, "thundercompute.com")
    found = await asyncio.gather(*(pools.resolve("us-east/a6000") for _ in range(300)))
    assert kube.calls == 1
    assert {(f.zone_name, f.gpu_type) for f in found} == {("us-east", "A6000")}


async def test_a_cancelled_waiter_does_not_cancel_the_shared_call() -> None:
    flight: SingleFlight[str, str] = SingleFlight()
    release = asyncio.Event()

    async def slow() -> str:
        await release.wait()
        return json.dumps("done")

    first = asyncio.ensure_future(flight.run("k", slow))
    second = asyncio.ensure_future(flight.run("k", slow))
    await asyncio.sleep(0)
    first.cancel()
    release.set()
    assert await second == '"done"'
    assert flight.calls == 1


async def test_claim_slots_bound_the_work_in_flight() -> None:
    slots = ClaimSlots(5, CollectorRegistry())
    running = 0
    most = 0

    async def work() -> None:
        nonlocal running, most
        async with slots.held():
            running += 1
            most = max(most, running)
            await asyncio.sleep(0.001)
            running -= 1

    await asyncio.gather(*(work() for _ in range(300)))
    assert most == slots.peak == 5
    assert slots.in_flight == 0


def test_claim_slots_refuse_a_zero_bound() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        ClaimSlots(0, CollectorRegistry())


def test_the_sweep_backs_off_after_failures_and_returns_to_its_interval() -> None:
    assert sweep_delay(30.0, 0) == 30.0
    first = sweep_delay(30.0, 1)
    assert 30.0 <= first <= 60.0
    ceiling = 30.0 * SWEEP_MAX_BACKOFF_INTERVALS
    assert all(sweep_delay(30.0, n) <= ceiling for n in range(1, 40))
    assert max(sweep_delay(30.0, 20) for _ in range(50)) > 30.0 * 2
