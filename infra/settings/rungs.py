"""The ladder's rungs as a stack sets them: each rung's pools and size, the reservations, and `rungOrder`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from infra.rungs import RUNG_KINDS, RungKind
from infra.settings.constants import (MAX_SLICES_PER_PLAN, SPOT_CRITICAL_PODS_SECONDS, SPOT_GRACE_CHOICES,
                                      SPOT_GRACE_SECONDS, SYSTEM_POOL_NAME)
from infra.settings.formats import NODE_POOL_NAME, RESERVATION, duration_seconds
from infra.settings.keys import DEFAULTS
from infra.settings.reader import ConfigReader
from infra.tpu import TpuSlice

if TYPE_CHECKING:
    from infra.settings.regional import PlatformSettings


@dataclass(frozen=True)
class ReservedSlices:
    """A reservation the reservation rung consumes, and its size in slices (the program cannot read it)."""

    name: str  # a name in this project, or projects/<project>/reservations/<name> for a shared one
    slices: int


@dataclass(frozen=True)
class PoolSpec:
    name: str
    max_nodes: int
    reservation: str | None = None


@dataclass(frozen=True)
class NodeShutdown:
    """GKE's graceful shutdown of a Spot VM from its preemption notice (`spot.gracefulTermination`): the kubelet
    terminates the pods first, then the system pods (system-node-critical, system-cluster-critical) in their part.
    Ref: https://kubernetes.io/docs/concepts/cluster-administration/node-shutdown/#graceful-node-shutdown"""

    seconds: int = SPOT_GRACE_SECONDS
    critical_pods_seconds: int = SPOT_CRITICAL_PODS_SECONDS

    @property
    def pods_seconds(self) -> int:
        """The pods' part: the kubelet gives a pod the lesser of this and its terminationGracePeriodSeconds."""
        return self.seconds - self.critical_pods_seconds

    @property
    def gke_default(self) -> bool:
        """GKE's own setting: nothing to send, no version to require."""
        return self.seconds == SPOT_GRACE_SECONDS


@dataclass(frozen=True)
class PlanSettings:
    """One rung of the ladder: a kind of capacity (infra/rungs.py) with its pools' name and size."""

    kind: RungKind
    node_pool: str
    max_slices: int
    reservations: tuple[ReservedSlices, ...] = ()
    shutdown: NodeShutdown | None = None  # the Spot rung's extended graceful shutdown; None: GKE's default

    @property
    def config_key(self) -> str:
        return self.kind.key

    @property
    def flavor(self) -> str:
        return self.kind.flavor

    @property
    def flex_start(self) -> bool:
        return self.kind.flex_start

    @property
    def enabled(self) -> bool:
        return self.max_slices > 0

    def pools(self, tpu: TpuSlice) -> tuple[PoolSpec, ...]:
        """A multi-host slice is a whole node pool, so N slices need N pools; single-host slices share one.
        A reservation rung keeps each reservation's slices in pools of their own."""
        groups = [(r.name, r.slices) for r in self.reservations] if self.reservations else [(None, self.max_slices)]
        specs, index, several = [], 0, self.max_slices > 1 and (tpu.is_multi_host or len(groups) > 1)
        for reservation, slices in groups:
            for _ in range(slices if tpu.is_multi_host else 1):
                index += 1
                name = f"{self.node_pool}-{index}" if several else self.node_pool
                specs.append(PoolSpec(name, tpu.hosts if tpu.is_multi_host else slices, reservation))
        return tuple(specs)

    def pool_names(self, tpu: TpuSlice) -> tuple[str, ...]:
        return tuple(pool.name for pool in self.pools(tpu))

    def chips(self, tpu: TpuSlice) -> int:
        return self.max_slices * tpu.chips

    def hosts(self, tpu: TpuSlice) -> int:
        return self.max_slices * tpu.hosts


def read_plan(reader: ConfigReader, kind: RungKind) -> PlanSettings:
    key = kind.key
    raw = reader.obj(key, DEFAULTS[key])
    reader.check(f"{key}.nodePool", bool(NODE_POOL_NAME.match(raw["nodePool"])),
                 f"{raw['nodePool']!r} is not a GKE node pool name (lowercase letters, digits and hyphens, "
                 "starting with a letter, at most 40 characters)")
    if kind.reservation:
        reservations = _read_reservations(reader, key, raw["reservations"])
        return PlanSettings(kind, raw["nodePool"], sum(r.slices for r in reservations), reservations)
    reader.check(f"{key}.maxSlices", 0 <= raw["maxSlices"] <= MAX_SLICES_PER_PLAN,
                 f"{raw['maxSlices']} is out of range; use 0 (rung off) to {MAX_SLICES_PER_PLAN}")
    shutdown = _read_spot_shutdown(reader, key, raw["gracefulTermination"]) if kind.spot else None
    return PlanSettings(kind, raw["nodePool"], raw["maxSlices"], shutdown=shutdown)


def _read_spot_shutdown(reader: ConfigReader, key: str, value: str) -> NodeShutdown | None:
    """`spot.gracefulTermination`: one of the totals GKE allows a Spot VM; None for GKE's default. GKE also allows 0,
    which turns the graceful shutdown off, and with it the notice the training saves on. The version 120 s needs is
    checked with gkeVersion (cluster.py)."""
    seconds = duration_seconds(value)
    allowed = ", ".join(f"{choice}s" for choice in SPOT_GRACE_CHOICES)
    if not reader.check(f"{key}.gracefulTermination", seconds in SPOT_GRACE_CHOICES,
                        f"{value!r} is not one of {allowed}: the totals GKE allows a Spot VM's graceful shutdown "
                        f"({SPOT_GRACE_SECONDS}s is GKE's default)"):
        return None
    shutdown = NodeShutdown(seconds)
    return None if shutdown.gke_default else shutdown


def _read_reservations(reader: ConfigReader, key: str, items: list) -> tuple[ReservedSlices, ...]:
    """`reservations: [{name, slices}]`: each reservation and how many slices it holds (its Kueue quota)."""
    found: list[ReservedSlices] = []
    for index, item in enumerate(items):
        where = f"{key}.reservations[{index}]"
        if not isinstance(item, dict) or set(item) != {"name", "slices"}:
            reader.fail(where, f"must be an object with fields name, slices; got {item!r}")
            continue
        name, slices = item["name"], item["slices"]
        ok = reader.check(f"{where}.name", isinstance(name, str) and bool(RESERVATION.match(name)),
                          f"{name!r} is not a reservation name, nor projects/<project>/reservations/<name> for "
                          "a shared reservation")
        ok &= reader.check(f"{where}.slices", type(slices) is int and 1 <= slices <= MAX_SLICES_PER_PLAN,
                           f"{slices!r} is out of range; a reservation holds 1 to {MAX_SLICES_PER_PLAN} slices")
        if ok:
            found.append(ReservedSlices(name, slices))
    names = [r.name for r in found]
    reader.check(f"{key}.reservations", len(set(names)) == len(names), "a reservation is listed twice")
    reader.check(f"{key}.reservations", sum(r.slices for r in found) <= MAX_SLICES_PER_PLAN,
                 f"more than {MAX_SLICES_PER_PLAN} slices in all")
    return tuple(found)


def read_rung_order(reader: ConfigReader, plans: dict[str, PlanSettings]) -> tuple[PlanSettings, ...]:
    """The enabled rungs in `rungOrder` (default: the catalogue's order), each exactly once."""
    enabled = [key for key, plan in plans.items() if plan.enabled]
    order = reader.array("rungOrder", DEFAULTS["rungOrder"]) or enabled
    unknown = [key for key in order if key not in RUNG_KINDS]
    if not reader.check("rungOrder", not unknown, f"unknown rung(s) {', '.join(map(str, unknown))}; rungs: "
                                                  f"{', '.join(RUNG_KINDS)}"):
        return tuple(plans[key] for key in enabled)
    reader.check("rungOrder", len(set(order)) == len(order), "a rung is listed twice")
    reader.check("rungOrder", set(order) == set(enabled),
                 f"must list exactly the enabled rungs ({', '.join(enabled) or 'none'}); got {', '.join(order)}")
    return tuple(plans[key] for key in dict.fromkeys(order) if key in enabled)


def check_plans(reader: ConfigReader, settings: PlatformSettings) -> None:
    """At least one rung on; every pool name of every rung unique, not the CPU pool's, within GKE's length."""
    reader.check("onDemand.maxSlices", bool(settings.plans),
                 "every rung is off (onDemand.maxSlices and flexStart.maxSlices are 0, no reservation or spot); "
                 "turn one on")
    taken: dict[str, str] = {}
    for plan in settings.plans:
        clash = sorted(name for name in plan.pool_names(settings.tpu) if name in taken)
        reader.check(f"{plan.config_key}.nodePool", not clash,
                     f"node pool name(s) {', '.join(clash)} also used by "
                     f"{', '.join(sorted({taken[name] for name in clash}))}.nodePool")
        taken.update({name: plan.config_key for name in plan.pool_names(settings.tpu)})
    for plan in settings.plans:
        names = plan.pool_names(settings.tpu)
        reader.check(f"{plan.config_key}.nodePool", SYSTEM_POOL_NAME not in names,
                     f"{SYSTEM_POOL_NAME!r} is the CPU pool's name")
        longest = max(names, key=len)
        reader.check(f"{plan.config_key}.nodePool", len(longest) <= 40,
                     f"derived pool name {longest!r} is longer than GKE's 40 characters; shorten nodePool")


def tpu_quota(settings: PlatformSettings) -> dict[str, int]:
    """Chips per TPU quota kind (onDemand, preemptible, reserved) the enabled rungs draw on."""
    quota: dict[str, int] = {}
    for plan in settings.plans:
        quota[plan.kind.tpu_quota] = quota.get(plan.kind.tpu_quota, 0) + plan.chips(settings.tpu)
    return quota
