"""The formats a config value must have: names, versions, URLs, durations (patterns and their parsers)."""

from __future__ import annotations

import re

# GKE name rules. Ref: https://cloud.google.com/kubernetes-engine/docs/how-to/creating-a-zonal-cluster
CLUSTER_NAME = re.compile(r"^[a-z](?:[-a-z0-9]{0,38}[a-z0-9])?$")
NODE_POOL_NAME = re.compile(r"^[a-z](?:[-a-z0-9]{0,38}[a-z0-9])?$")
# Ref: https://cloud.google.com/resource-manager/docs/creating-managing-projects (project IDs)
PROJECT_ID = re.compile(r"^[a-z][-a-z0-9]{4,28}[a-z0-9]$")
ZONE = re.compile(r"^[a-z]+-[a-z]+[0-9]+-[a-z]$")
GKE_VERSION = re.compile(r"^1\.(\d+)(?:\.(\d+)(?:-gke\.(\d+))?)?$")
# A Helm repository: an OCI registry path or an HTTPS chart repository (no trailing slash).
CHART_REPOSITORY = re.compile(r"^(oci|https)://[a-z0-9]([-a-z0-9.]*[a-z0-9])?(:[0-9]+)?(/[-a-zA-Z0-9._~]+)*$")
SEMVER = re.compile(r"^(\d+)\.(\d+)\.(\d+)$")
# A reservation in this project by name, or a shared one in another project by its path.
# Ref: https://cloud.google.com/compute/docs/instances/reservations-shared#consuming_shared_reservations
RESERVATION = re.compile(r"^(?:projects/[a-z][-a-z0-9]{4,28}[a-z0-9]/reservations/)?[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?$")
# An image reference pinned by tag or digest: registry/path:tag or registry/path@sha256:<64 hex>, never :latest.
# Ref: https://github.com/distribution/reference/blob/main/reference.go (the grammar, simplified to what is pinned)
PINNED_IMAGE = re.compile(r"^[a-z0-9]([-a-z0-9._]*[a-z0-9])?(:[0-9]+)?(/[a-z0-9]([-a-z0-9._]*[a-z0-9])?)*"
                          r"(:(?!latest$)[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}|@sha256:[0-9a-f]{64})$")
HTTPS_URL = re.compile(r"^https://[a-z0-9]([-a-z0-9.]*[a-z0-9])?(:[0-9]+)?(/[-a-zA-Z0-9._~%+]*)*$")
DURATION = re.compile(r"^([0-9]+)(s|m|h)$")
# The format AlertPolicy.notificationChannels documents: projects/[PROJECT_ID_OR_NUMBER]/notificationChannels/[CHANNEL_ID]
# Ref: https://cloud.google.com/monitoring/api/ref_v3/rest/v3/projects.alertPolicies#AlertPolicy
NOTIFICATION_CHANNEL = re.compile(r"^projects/(?:[a-z][-a-z0-9]{4,28}[a-z0-9]|[0-9]+)/notificationChannels/[0-9]+$")
# Another stack, fully qualified as the docs advise for a StackReference: <organization>/<project>/<stack>, each
# part letters, digits, hyphens, underscores or periods (`organization` on a self-managed backend).
# Ref: https://www.pulumi.com/docs/iac/concepts/stacks/#stackreferences
_STACK_PART = r"[A-Za-z0-9][A-Za-z0-9_.-]*"
FULLY_QUALIFIED_STACK = re.compile(rf"^{_STACK_PART}/{_STACK_PART}/{_STACK_PART}$")
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
TEAM_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,28}[a-z0-9])?$")  # prefixes cluster-scoped names: kept short
EMAIL = re.compile(r"^[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+$")
DOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)+$")

_SECONDS_PER_UNIT = {"s": 1, "m": 60, "h": 3600}


def duration_seconds(value: str) -> int | None:
    """Seconds of a duration such as 90s, 15m or 1h; None when it is not one."""
    match = DURATION.match(value)
    return None if match is None else int(match[1]) * _SECONDS_PER_UNIT[match[2]]


def short_duration(seconds: int) -> str:
    """A bound as a duration a user types: 30s, 5m, 24h."""
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def gke_version_tuple(version: str) -> tuple[int, ...]:
    """(minor, patch, gke-build) of a GKE version such as 1.34 or 1.33.0-gke.1712000; the major is always 1."""
    match = GKE_VERSION.match(version)
    if match is None:
        raise ValueError(version)
    return tuple(int(part) for part in match.groups() if part is not None)


def gke_version_at_least(version: str, minimum: str) -> bool:
    """True when `version` can only mean a release at or after `minimum`.

    A prefix such as 1.34 lets GKE pick a patch; it is compared on the parts it gives, since GKE only
    offers a minor's recent patches, which are newer than any minimum named here for an older patch.
    """
    given, needed = gke_version_tuple(version), gke_version_tuple(minimum)
    return given >= needed[: len(given)]
