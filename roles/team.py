"""The team role: one team's training jobs on the shared cluster of a platform stack.

A team stack declares only the team's workloads (checkpoint bucket, Workload Identity, the script's ConfigMap,
the RayJobs) in the namespace the platform stack made for the team, queued on the team's LocalQueue. Everything
else (cluster, pools, Kueue, the failover controller) belongs to the platform stack, read through a
StackReference: its kubeconfig (still secret), its settings (`platform` output) and its teams (`teams` output).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from infra.settings import (DEFAULTS, FULLY_QUALIFIED_STACK, JOB_HEAD_CPU, JOB_HEAD_MEMORY_GIB, SUBMITTER_CPU, SUBMITTER_MEMORY_GIB,
                            ConfigReader, PlatformSettings)
from roles.contract import (KUBECONFIG_OUTPUT, PLATFORM_OUTPUT, TEAMS_OUTPUT, cluster_id, settings_from_output,
                            team_from_output)
from workloads.jobs import PlatformHandles, TeamNamespace, TrainingJobs
from workloads.settings import WORKLOAD_DEFAULTS, WorkloadSettings, cpu_cores, memory_gib, read_workload_settings

PLATFORM_STACK_KEY = "platformStack"
TEAM_KEY = "team"
WORKLOADS_KEY = "workloads"
_TEAM_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def is_team_stack(config: pulumi.Config) -> bool:
    """A stack that names its platform stack is a team stack; any other is a platform."""
    return config.get(PLATFORM_STACK_KEY) is not None


@dataclass(frozen=True)
class TeamStackSettings:
    platform_stack: str  # <organization>/<project>/<stack>
    team: str


def differs_from_default(raw: str, default: Any) -> bool:
    """Whether a config value (a string, JSON for objects and lists, as the CLI passes it) is not the default."""
    if isinstance(default, str):
        return raw != default
    if isinstance(default, bool):
        return raw.lower() != str(default).lower()
    try:
        given = json.loads(raw)
    except json.JSONDecodeError:
        return True
    if isinstance(default, dict) and isinstance(given, dict):  # a stack file may give some fields of an object
        return any(field not in default or value != default[field] for field, value in given.items())
    return given != default


def read_team_stack_settings(reader: ConfigReader) -> TeamStackSettings:
    """The team stack's own keys; a platform key set here is a problem (the platform stack owns it)."""
    platform_stack = reader.config.get(PLATFORM_STACK_KEY) or ""
    reader.check(PLATFORM_STACK_KEY, bool(FULLY_QUALIFIED_STACK.match(platform_stack)),
                 f"{platform_stack!r} is not a fully qualified stack name; use <organization>/<project>/<stack>, "
                 "e.g. my-org/tpu-fallback/platform-us-east5-b (organization/... on a self-managed backend)")
    reader.check(PLATFORM_STACK_KEY, platform_stack.split("/")[1:] != [pulumi.get_project(), pulumi.get_stack()],
                 "names this stack; name the platform stack whose cluster this team uses")
    team = reader.config.get(TEAM_KEY)
    if team is None:
        reader.fail(TEAM_KEY, "required: the team (of the platform stack's `teams`) this stack deploys for")
    else:
        reader.check(TEAM_KEY, bool(_TEAM_NAME.match(team)), f"{team!r} is not a team name (lowercase letters, "
                                                             "digits and hyphens, starting with a letter)")
    for key, default in DEFAULTS.items():
        raw = reader.config.get(key)
        if raw is not None and differs_from_default(raw, default):
            reader.fail(key, f"set on the platform stack; a team stack reads it from {platform_stack or 'it'}: "
                             "remove it here")
    reader.unknown_keys({*DEFAULTS, WORKLOADS_KEY, PLATFORM_STACK_KEY, TEAM_KEY})
    return TeamStackSettings(platform_stack, team or "")


async def read_published(reference: pulumi.StackReference, name: str) -> Any:
    """A plain, non-secret output of the platform stack, or None when it has none by that name."""
    details = await reference.get_output_details(name)
    return details.value


def read_platform(reader: ConfigReader, stack: TeamStackSettings, published: Any,
                  teams: Any) -> tuple[PlatformSettings | None, TeamNamespace | None]:
    """The platform's settings and the team's namespace, from the platform stack's outputs; problems name the key
    of this stack that led there."""
    where = f"{stack.platform_stack}'s `{PLATFORM_OUTPUT}` output"
    platform = None
    if not isinstance(published, Mapping):
        reader.fail(PLATFORM_STACK_KEY, f"{stack.platform_stack} has no `{PLATFORM_OUTPUT}` output: it is not a "
                                        "platform stack with teams, or was last deployed by an older version; "
                                        "set `teams` there and run `pulumi up` on it")
    else:
        try:
            platform = settings_from_output(published)
        except (KeyError, TypeError, ValueError) as err:
            reader.fail(PLATFORM_STACK_KEY, f"{where} is not readable ({type(err).__name__}: {err}); run "
                                            "`pulumi up` on the platform stack with this version of tpu-fallback")
    known = sorted(teams) if isinstance(teams, Mapping) else []
    if stack.team not in known:
        reader.fail(TEAM_KEY, f"{stack.team!r} is not a team of {stack.platform_stack}; its teams: "
                              f"{', '.join(known) or 'none (set `teams` on the platform stack)'}")
        return platform, None
    try:
        return platform, team_from_output(teams, stack.team)
    except (KeyError, TypeError) as err:
        reader.fail(TEAM_KEY, f"{stack.platform_stack}'s `{TEAMS_OUTPUT}` entry for {stack.team!r} is not "
                              f"readable ({type(err).__name__}: {err})")
        return platform, None


def check_head_within_share(reader: ConfigReader, workloads: WorkloadSettings) -> None:
    """A team's share holds each job's Ray head at the platform's per-job size (JOB_HEAD_CPU, infra/settings/).
    A bigger head borrows CPU for every job, and a job that borrows anything cannot reclaim the team's share
    (measured on real Kueue 0.19.2: tests/test_teams_controlplane.py, docs/teams.md): reclaim would silently never
    happen."""
    for field, given, amount, extra, limit, unit in (
            ("headCpu", workloads.head_cpu, cpu_cores(workloads.head_cpu), SUBMITTER_CPU, JOB_HEAD_CPU, "vCPU"),
            ("headMemory", workloads.head_memory, memory_gib(workloads.head_memory), SUBMITTER_MEMORY_GIB,
             JOB_HEAD_MEMORY_GIB, "GiB")):
        reader.check(f"{WORKLOADS_KEY}.{field}", amount is None or amount + extra <= limit,
                     f"{given} with the submitter is more than the {limit} {unit} per job the team's share holds: "
                     "every job would borrow, and a job that borrows cannot reclaim the team's share")


def deploy() -> None:
    """Declare the team's workloads on the platform stack's cluster."""
    reader = ConfigReader(pulumi.Config())
    stack = read_team_stack_settings(reader)
    reader.raise_if_failed()

    # A read of the platform stack's outputs; it creates nothing.
    reference = pulumi.StackReference(PLATFORM_OUTPUT, stack_name=stack.platform_stack)

    # The RayJobs need plain values at construction time: their resource names come from the slice shape (the
    # default job names), and their manifests and the workloads' checks (head fits the CPU pool, batch splits over
    # the chips) read the platform's settings. StackReference outputs are Outputs. Building the jobs inside an
    # apply would hide them from `pulumi preview` and check nothing before the first resource. Instead the program
    # awaits the platform's outputs (StackReference.get_output_details) in an async entrypoint, pulumi.run
    # (pulumi >= 3.254), which the runtime awaits on its own event loop after this module's code: every resource
    # is then declared the ordinary way, with plain inputs. Stack references are read during preview too.
    # Ref: https://github.com/pulumi/pulumi/pull/23945 (pulumi.run), https://github.com/pulumi/pulumi/issues/12172
    async def declare_workloads() -> pulumi.Inputs:
        published = await read_published(reference, PLATFORM_OUTPUT)
        teams = await read_published(reference, TEAMS_OUTPUT)
        platform, team = read_platform(reader, stack, published, teams)
        workloads = read_workload_settings(reader, platform)
        if workloads is not None and team is not None:
            # The platform made the team's namespace; workloads.namespace may only repeat it.
            reader.check(f"{WORKLOADS_KEY}.namespace",
                         workloads.namespace in (WORKLOAD_DEFAULTS["namespace"], team.namespace),
                         f"{workloads.namespace!r}: a team stack deploys into its team's namespace "
                         f"{team.namespace!r} (from {stack.platform_stack}); remove it")
            check_head_within_share(reader, workloads)
        reader.raise_if_failed()
        workloads = dataclasses.replace(workloads, namespace=team.namespace)

        # The kubeconfig stays a secret Output end to end: require_output keeps the secrecy the platform gave it.
        provider = k8s.Provider(f"{PLATFORM_OUTPUT}-k8s", kubeconfig=reference.require_output(KUBECONFIG_OUTPUT),
                                cluster_identifier=cluster_id(platform))
        jobs = None
        if workloads.enabled and workloads.jobs > 0:
            jobs = TrainingJobs("training", PlatformHandles(platform, provider, None, None, team), workloads)
        return {
            PLATFORM_STACK_KEY: stack.platform_stack,
            TEAM_KEY: stack.team,
            "namespace": team.namespace,
            "localQueue": team.local_queue,
            "queueChain": teams[stack.team].get("queueChain", []),
            "trainingJobs": jobs.job_names if jobs else [],
            "checkpointBucket": jobs.bucket.url if jobs else None,
        }

    pulumi.run(declare_workloads)
