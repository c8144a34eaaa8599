"""Each program's configuration, as its stack writes it into the program's Deployment and as the program reads it
back: one frozen dataclass per program. The stack (infra/) builds it and puts `to_env()` in the Deployment; the
program (its __main__) reads `from_env(os.environ)`. The same code on both sides, so the names and the JSON shapes
are written once.

No value has a default here, nor in a program: a stack config key's default is in the settings table
(infra/settings/keys.py), the others (resync periods, worker counts, ports) are constants of the stack
(infra/failover.py, infra/fleet.py), and the stack always writes every variable. A variable that is missing or
malformed is a ConfigError that names it; the programs print it and exit with status 2.

    python -m failover.regional      RegionalConfig      FAILOVER_*
    python -m failover.watch         FleetWatchConfig    FLEET_MEMBERS, FLEET_ORIGIN, FLEET_SECRETS_NAMESPACE, ...
    python -m failover.ladder        LadderConfig        FLEET_LADDER, FLEET_NAMESPACE, ..., LADDER_*
    python -m failover.credentials   FleetRenewerConfig (FLEET_ACCESS set) or ScrapeRenewerConfig (SCRAPE_*)
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:  # at run time imported where parsed: the scrape token's renewer ships without failover/api/
    from failover.api.climbs import ClimbPolicy
    from failover.api.probes import Probes
    from failover.api.queues import Chain, Ladder
    from failover.maintenance import Policy

EnvVar = dict[str, str]  # one item of a container's `env`: {"name": ..., "value": ...}
T = TypeVar("T")
MAX_PORT = 65535


class ConfigError(ValueError):
    """An environment variable a program needs is missing or cannot be read."""

    def __init__(self, name: str, problem: str):
        super().__init__(f"{name}: {problem}")
        self.name, self.problem = name, problem


# ---- reading one variable ------------------------------------------------------------------------------------------
def _text(environ: Mapping[str, str], name: str) -> str:
    value = environ.get(name)
    if value is None or not value.strip():
        raise ConfigError(name, "missing (the program's Deployment sets it: infra/)")
    return value


def _int(environ: Mapping[str, str], name: str, low: int, high: int | None = None) -> int:
    text = _text(environ, name)
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(name, f"{text!r} is not a whole number") from None
    if value < low or (high is not None and value > high):
        raise ConfigError(name, f"{value} is out of range ({low} to {high})" if high is not None
                          else f"{value} is below {low}")
    return value


def _port(environ: Mapping[str, str], name: str) -> int:
    return _int(environ, name, 0, MAX_PORT)  # 0 turns the server off


def _seconds(environ: Mapping[str, str], name: str, positive: bool = True) -> datetime.timedelta:
    text = _text(environ, name)
    try:
        seconds = float(text)
    except ValueError:
        raise ConfigError(name, f"{text!r} is not a number of seconds") from None
    if seconds < 0 or (positive and seconds == 0) or seconds != seconds:  # NaN
        raise ConfigError(name, f"{text!r} must be {'more than' if positive else 'at least'} 0 seconds")
    return datetime.timedelta(seconds=seconds)


def _choice(environ: Mapping[str, str], name: str, choices: tuple[str, ...]) -> str:
    text = _text(environ, name)
    if text not in choices:
        raise ConfigError(name, f"{text!r} is not one of {', '.join(choices)}")
    return text


def _json(environ: Mapping[str, str], name: str, parse: Callable[[Any], T], shape: str) -> T:
    text = _text(environ, name)
    try:
        return parse(json.loads(text))
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise ConfigError(name, f"not {shape}: {type(error).__name__} {error}") from None


def _names(value: Any) -> dict[str, str]:
    """{member: its kubeconfig Secret}, in the stack's order."""
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) and v
                                              for k, v in value.items()):
        raise TypeError("expected an object of strings")
    return dict(value)


# ---- writing one variable ------------------------------------------------------------------------------------------
def _var(name: str, value: str) -> EnvVar:
    return {"name": name, "value": value}


def seconds_text(delta: datetime.timedelta) -> str:
    """Seconds as the programs read them: whole seconds without a fraction (300, not 300.0)."""
    seconds = delta.total_seconds()
    return str(int(seconds)) if seconds == int(seconds) else str(seconds)


# ---- python -m failover.regional -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class RegionalConfig:
    """The regional failover controller's (failover/regional/)."""

    chain: Chain  # FAILOVER_CHAIN: the rungs, rung 0 first, each with its check and its slice-recovery wait
    stockout_grace: datetime.timedelta  # FAILOVER_GRACE_SECONDS: fallback.stockoutGracePeriod (the early path)
    resync: datetime.timedelta  # FAILOVER_RESYNC_SECONDS: every Workload queued again, the safety net
    workers: int  # FAILOVER_WORKERS: Workloads reconciled at once (a move waits up to 10 s for Kueue)
    health_port: int  # FAILOVER_HEALTH_PORT: /healthz (0: none)
    metrics_port: int  # FAILOVER_METRICS_PORT: Prometheus /metrics (0: none)
    # fallback.maintenance (failover/maintenance.py): FAILOVER_MAINTENANCE_ACTION (move, checkpoint or none),
    # FAILOVER_MAINTENANCE_LEAD_SECONDS (the checkpoint request this long ahead), FAILOVER_SAVE_TIMEOUT_SECONDS (the
    # save taken as done this long after it)
    maintenance: Policy
    # FAILOVER_CLIMB_BACK: fallback.climbBack (failover/regional/climb.py), a JSON object {to, reserved (flavors),
    # settleSeconds, minIntervalSeconds, minRuntimeSeconds, runEndMarginSeconds, saveTimeoutSeconds}; `to` empty: off
    climb_back: ClimbPolicy
    # FAILOVER_PROBES: fallback.climbBack.probe (failover/api/probes.py), a JSON object {namespace, image, rungs:
    # [{flavor, nodeSelector, tolerations, tpuChips}]}; no rung: probing is off
    probes: Probes

    def to_env(self) -> list[EnvVar]:
        return [_var("FAILOVER_CHAIN", self.chain.to_json()),
                _var("FAILOVER_GRACE_SECONDS", seconds_text(self.stockout_grace)),
                _var("FAILOVER_RESYNC_SECONDS", seconds_text(self.resync)),
                _var("FAILOVER_WORKERS", str(self.workers)),
                _var("FAILOVER_HEALTH_PORT", str(self.health_port)),
                _var("FAILOVER_METRICS_PORT", str(self.metrics_port)),
                _var("FAILOVER_MAINTENANCE_ACTION", self.maintenance.action),
                _var("FAILOVER_MAINTENANCE_LEAD_SECONDS", seconds_text(self.maintenance.lead)),
                _var("FAILOVER_SAVE_TIMEOUT_SECONDS", seconds_text(self.maintenance.save_timeout)),
                _var("FAILOVER_CLIMB_BACK", json.dumps(self.climb_back.as_data(), sort_keys=True)),
                _var("FAILOVER_PROBES", json.dumps(self.probes.as_data(), sort_keys=True))]

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> RegionalConfig:
        from failover.api.ahead import ACTIONS
        from failover.api.climbs import ClimbPolicy
        from failover.api.probes import Probes
        from failover.api.queues import Chain
        from failover.maintenance import Policy

        chain = _json(environ, "FAILOVER_CHAIN", Chain.from_data, "a JSON list of rungs {flavor, clusterQueue, "
                      "localQueue, admissionCheck, recoverySeconds}")
        if not chain.rungs:
            raise ConfigError("FAILOVER_CHAIN", "has no rung")
        return cls(chain, _seconds(environ, "FAILOVER_GRACE_SECONDS", positive=False),
                   _seconds(environ, "FAILOVER_RESYNC_SECONDS"), _int(environ, "FAILOVER_WORKERS", 1),
                   _port(environ, "FAILOVER_HEALTH_PORT"), _port(environ, "FAILOVER_METRICS_PORT"),
                   Policy(_choice(environ, "FAILOVER_MAINTENANCE_ACTION", ACTIONS),
                          _seconds(environ, "FAILOVER_MAINTENANCE_LEAD_SECONDS"),
                          _seconds(environ, "FAILOVER_SAVE_TIMEOUT_SECONDS")),
                   _json(environ, "FAILOVER_CLIMB_BACK", ClimbPolicy.from_data, "a JSON object {to, reserved, "
                         "settleSeconds, minIntervalSeconds, minRuntimeSeconds, runEndMarginSeconds, "
                         "saveTimeoutSeconds}"),
                   _json(environ, "FAILOVER_PROBES", Probes.from_data, "a JSON object {namespace, image, rungs: "
                         "[{flavor, nodeSelector, tolerations, tpuChips}]}"))


# ---- python -m failover.watch --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FleetWatchConfig:
    """The fleet watch's (failover/watch/), on a fleet's manager."""

    members: Mapping[str, str]  # FLEET_MEMBERS: {member cluster: its kubeconfig Secret} (the Secrets MultiKueue uses)
    origin: str  # FLEET_ORIGIN: the multikueue-origin label value of the copies this manager makes
    secrets_namespace: str  # FLEET_SECRETS_NAMESPACE: where those Secrets are (Kueue's namespace)
    period: datetime.timedelta  # FLEET_WATCH_SECONDS: kubeconfigs read again, members asked for an answer
    resync: datetime.timedelta  # FLEET_RESYNC_SECONDS: every job queued again, the safety net
    health_port: int  # FLEET_HEALTH_PORT: /healthz (0: none)
    metrics_port: int  # FLEET_METRICS_PORT: Prometheus /metrics (0: none)

    def to_env(self) -> list[EnvVar]:
        return [_var("FLEET_MEMBERS", json.dumps(dict(self.members))),
                _var("FLEET_ORIGIN", self.origin),
                _var("FLEET_SECRETS_NAMESPACE", self.secrets_namespace),
                _var("FLEET_WATCH_SECONDS", seconds_text(self.period)),
                _var("FLEET_RESYNC_SECONDS", seconds_text(self.resync)),
                _var("FLEET_HEALTH_PORT", str(self.health_port)),
                _var("FLEET_METRICS_PORT", str(self.metrics_port))]

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> FleetWatchConfig:
        return cls(_json(environ, "FLEET_MEMBERS", _names, "a JSON object {member: kubeconfig Secret}"),
                   _text(environ, "FLEET_ORIGIN"), _text(environ, "FLEET_SECRETS_NAMESPACE"),
                   _seconds(environ, "FLEET_WATCH_SECONDS"), _seconds(environ, "FLEET_RESYNC_SECONDS"),
                   _port(environ, "FLEET_HEALTH_PORT"), _port(environ, "FLEET_METRICS_PORT"))


# ---- python -m failover.ladder -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LadderConfig:
    """The fleet's ladder controller's (failover/ladder/), on a fleet's manager."""

    ladder: Ladder  # FLEET_LADDER: the steps, first first; the last one DWS in every member
    namespace: str  # FLEET_NAMESPACE: the fleet's jobs' namespace
    step_wait: datetime.timedelta  # FLEET_STEP_WAIT_SECONDS: fleet.stepWait, at a step before the last
    max_wait: datetime.timedelta | None  # FLEET_MAX_WAIT_SECONDS: fleet.maxWait; None (the variable unset): never
    # FLEET_MEMBERS: {member cluster: its kubeconfig Secret}, the members it reads (a stockout, a lost slice) through
    # the Secrets MultiKueue uses; FLEET_SECRETS_NAMESPACE: where they are
    members: Mapping[str, str]
    secrets_namespace: str
    period: datetime.timedelta  # FLEET_WATCH_SECONDS: how often the members' kubeconfigs are read again
    resync: datetime.timedelta  # LADDER_RESYNC_SECONDS: every job queued again, the safety net
    workers: int  # LADDER_WORKERS: jobs handled at once
    health_port: int  # LADDER_HEALTH_PORT: /healthz (0: none)
    metrics_port: int  # LADDER_METRICS_PORT: Prometheus /metrics (0: none)
    # FLEET_CLIMB_BACK: fleet.climbBack (failover/ladder/climb.py), a JSON object {to, reserved (the members'
    # flavors), settleSeconds, minIntervalSeconds, minRuntimeSeconds, runEndMarginSeconds, saveTimeoutSeconds}
    climb_back: ClimbPolicy

    def to_env(self) -> list[EnvVar]:
        return [_var("FLEET_LADDER", self.ladder.to_json()),
                _var("FLEET_NAMESPACE", self.namespace),
                _var("FLEET_STEP_WAIT_SECONDS", seconds_text(self.step_wait)),
                *([_var("FLEET_MAX_WAIT_SECONDS", seconds_text(self.max_wait))] if self.max_wait is not None else []),
                _var("FLEET_MEMBERS", json.dumps(dict(self.members))),
                _var("FLEET_SECRETS_NAMESPACE", self.secrets_namespace),
                _var("FLEET_WATCH_SECONDS", seconds_text(self.period)),
                _var("LADDER_RESYNC_SECONDS", seconds_text(self.resync)),
                _var("LADDER_WORKERS", str(self.workers)),
                _var("LADDER_HEALTH_PORT", str(self.health_port)),
                _var("LADDER_METRICS_PORT", str(self.metrics_port)),
                _var("FLEET_CLIMB_BACK", json.dumps(self.climb_back.as_data(), sort_keys=True))]

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> LadderConfig:
        from failover.api.climbs import ClimbPolicy
        from failover.api.queues import Ladder

        ladder = _json(environ, "FLEET_LADDER", Ladder.from_data, "a JSON list of steps {localQueue, clusterQueue, "
                       "admissionCheck, rung, members}")
        if not ladder.steps:
            raise ConfigError("FLEET_LADDER", "has no step")
        max_wait = _seconds(environ, "FLEET_MAX_WAIT_SECONDS") if "FLEET_MAX_WAIT_SECONDS" in environ else None
        return cls(ladder, _text(environ, "FLEET_NAMESPACE"), _seconds(environ, "FLEET_STEP_WAIT_SECONDS"), max_wait,
                   _json(environ, "FLEET_MEMBERS", _names, "a JSON object {member: kubeconfig Secret}"),
                   _text(environ, "FLEET_SECRETS_NAMESPACE"), _seconds(environ, "FLEET_WATCH_SECONDS"),
                   _seconds(environ, "LADDER_RESYNC_SECONDS"), _int(environ, "LADDER_WORKERS", 1),
                   _port(environ, "LADDER_HEALTH_PORT"), _port(environ, "LADDER_METRICS_PORT"),
                   _json(environ, "FLEET_CLIMB_BACK", ClimbPolicy.from_data, "a JSON object {to, reserved, "
                         "settleSeconds, minIntervalSeconds, minRuntimeSeconds, runEndMarginSeconds, "
                         "saveTimeoutSeconds}"))


# ---- python -m failover.credentials --------------------------------------------------------------------------------
@dataclass(frozen=True)
class MemberAccess:
    """Where a member's API server is, and the Secret on the manager that MultiKueue reads for it."""

    secret: str
    server: str
    certificate_authority_data: str  # base64 PEM, as in a kubeconfig

    def as_data(self) -> dict[str, str]:
        return {"secret": self.secret, "server": self.server,
                "certificateAuthorityData": self.certificate_authority_data}

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> MemberAccess:
        values = [data[key] for key in ("secret", "server", "certificateAuthorityData")]
        if not all(isinstance(value, str) and value for value in values):
            raise TypeError(f"secret, server and certificateAuthorityData must be strings: {dict(data)!r}")
        return cls(*values)


def _accesses(value: Any) -> dict[str, MemberAccess]:
    if not isinstance(value, dict) or not value:
        raise TypeError("expected a non-empty object")
    return {str(member): MemberAccess.from_data(access) for member, access in value.items()}


@dataclass(frozen=True)
class FleetRenewerConfig:
    """The token renewer on a fleet's manager: the manager's tokens in each member's kubeconfig Secret."""

    members: Mapping[str, MemberAccess]  # FLEET_ACCESS: {member cluster: {secret, server, certificateAuthorityData}}
    secrets_namespace: str  # FLEET_SECRETS_NAMESPACE: where those Secrets are (Kueue's namespace)

    def to_env(self) -> list[EnvVar]:
        access = {member: access.as_data() for member, access in self.members.items()}
        return [_var("FLEET_ACCESS", json.dumps(access, sort_keys=True)),
                _var("FLEET_SECRETS_NAMESPACE", self.secrets_namespace)]

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> FleetRenewerConfig:
        return cls(_json(environ, "FLEET_ACCESS", _accesses,
                         "a JSON object {member: {secret, server, certificateAuthorityData}}"),
                   _text(environ, "FLEET_SECRETS_NAMESPACE"))


def _namespaced(environ: Mapping[str, str], name: str) -> tuple[str, str]:
    namespace, _, object_name = _text(environ, name).partition("/")
    if not namespace or not object_name:
        raise ConfigError(name, f"{environ[name]!r} is not namespace/name")
    return namespace, object_name


@dataclass(frozen=True)
class ScrapeRenewerConfig:
    """The token renewer of a cluster with monitoring: the token Managed Prometheus scrapes Kueue with."""

    service_account: tuple[str, str]  # SCRAPE_SERVICE_ACCOUNT: namespace/name of the scrape ServiceAccount
    secret: tuple[str, str]  # SCRAPE_SECRET: namespace/name of the Secret it writes the token into
    token_lifetime: datetime.timedelta  # SCRAPE_TOKEN_SECONDS: each token's lifetime (TokenRequest)

    def to_env(self) -> list[EnvVar]:
        return [_var("SCRAPE_SERVICE_ACCOUNT", "/".join(self.service_account)),
                _var("SCRAPE_SECRET", "/".join(self.secret)),
                _var("SCRAPE_TOKEN_SECONDS", seconds_text(self.token_lifetime))]

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> ScrapeRenewerConfig:
        return cls(_namespaced(environ, "SCRAPE_SERVICE_ACCOUNT"), _namespaced(environ, "SCRAPE_SECRET"),
                   datetime.timedelta(seconds=_int(environ, "SCRAPE_TOKEN_SECONDS", 1)))


def renewer_config(environ: Mapping[str, str]) -> FleetRenewerConfig | ScrapeRenewerConfig:
    """The renewer's job: a fleet's manager's tokens when FLEET_ACCESS is set, else a scrape token."""
    return (FleetRenewerConfig.from_env(environ) if "FLEET_ACCESS" in environ
            else ScrapeRenewerConfig.from_env(environ))
