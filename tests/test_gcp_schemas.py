"""The GCP half against Google's own API schemas: every input of every tested config maps to a field of the
discovery document of the request that creates its resource, or to a documented deviation (tests/gcp_schema.py).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable

import pytest

from infra.settings import (
    _CLUSTER_NAME, _GKE_VERSION, DEFAULTS, MIN_GKE_FOR_QUEUED_TPU, MIN_GKE_FOR_RAY_OPERATOR,
)
from infra.tpu import MACHINE_TYPES
from tests.conftest import SHIPPED_STACKS, plan_for
from tests.gcp_schema import (
    PINNED_REVISIONS, PROSE_RULES, REQUESTS, DeprecatedOnPurpose, JsonBody, ListOfOne, OneItemOf, ProviderOnly,
    Renamed,
    api_field, api_method, check_plan, check_resource, described_field, discovery_revisions,
    gcp_resources,
)

# Every shipped stack, and the other shapes the tests plan: multi-slice plans, single-host slices, one plan only,
# a 3D topology, the name limits, the optional keys that reach a GCP resource.
CONFIGS: dict[str, tuple[str, dict | None]] = {
    **{stack: (stack, None) for stack in SHIPPED_STACKS},
    "multi-slice": ("dev", {"onDemand": {"maxSlices": 3}, "flexStart": {"maxSlices": 2}}),
    "single-host-1x1": ("dev", {"tpu": {"machineType": "ct6e-standard-1t", "topology": "1x1"},
                                "onDemand": {"maxSlices": 4}}),
    "plan-a-only-gke-1.33": ("dev", {"gkeVersion": "1.33", "flexStart": {"maxSlices": 0}}),
    "v5p-3d-slice": ("dev", {"zone": "us-east5-a", "tpu": {"machineType": "ct5p-hightpu-4t", "topology": "2x2x2"}}),
    "unlisted-zone": ("dev", {"zone": "europe-west1-b", "tpu": {"machineType": "ct6e-standard-4t", "topology": "4x4",
                                                                "allowUnlistedZone": True}}),
    "gke-patch-version": ("dev", {"gkeVersion": "1.34.1-gke.1829001"}),
    "longest-cluster-name": ("dev", {"clusterName": "a" * 39 + "b"}),
    "shortest-cluster-name": ("dev", {"clusterName": "a"}),
    "deletion-protection": ("dev", {"deletionProtection": True}),
    "own-workload-namespace": ("dev", {"workloads": {"namespace": "team-a"}}),
    # TPU7x: the workload policy's longest name (the longest cluster name and topology), and a single host (no policy).
    "tpu7x-longest-policy-name": ("ironwood-us-central1-c", {
        "clusterName": "a" * 39 + "b", "tpu": {"machineType": "tpu7x-standard-4t", "topology": "8x16x16"},
        "workloads": {"trainingArgs": ["--batch-size", "4096"]}}),  # 2048 chips: 4096 JAX devices
    "tpu7x-single-host": ("ironwood-us-central1-c", {"tpu": {"machineType": "tpu7x-standard-4t", "topology": "2x2x1"}}),
    "spot-graceful-termination-120s": ("dev", {"gkeVersion": "1.35.0-gke.1171000",
                                               "spot": {"maxSlices": 1, "gracefulTermination": "120s"}}),
}


@functools.cache
def planned(config: str):
    stack, overrides = CONFIGS[config]
    return plan_for(stack, overrides)


@functools.cache
def findings_of(config: str):
    return check_plan(planned(config))


def all_findings():
    findings = [findings_of(config) for config in CONFIGS]
    used = set().union(*(f.deviations_used for f in findings))
    enums: dict[str, set[str]] = {}
    for f in findings:
        for label, values in f.enum_values.items():
            enums.setdefault(label, set()).update(values)
    return used, enums


def test_discovery_revisions_are_the_pinned_ones():
    # The README names these next to the other pins; a client bump must show up here first.
    assert discovery_revisions() == dict(PINNED_REVISIONS)


@pytest.mark.parametrize("config", CONFIGS)
def test_every_gcp_input_maps_to_googles_schema(config):
    assert gcp_resources(planned(config)), "no GCP resource recorded"
    problems = findings_of(config).problems
    assert not problems, f"{len(problems)} input(s) Google's schema rejects:\n" + "\n".join(problems)


def test_every_mapped_type_is_declared_by_some_config():
    declared = {r.type for config in CONFIGS for r in gcp_resources(planned(config))}
    assert declared == set(REQUESTS), "REQUESTS maps a type no config declares, or misses one"


def test_every_deviation_is_needed_by_some_config():
    used, _ = all_findings()
    listed = {(typ, path) for typ, request in REQUESTS.items() for path in request.deviations}
    assert listed - used == set(), "deviations no tested input needs: remove them"


def test_fields_left_to_pulumi_are_absent_from_inputs_and_required():
    for typ, request in REQUESTS.items():
        for name in request.filled_by_pulumi:
            method_id = api_method(request)["id"]
            assert method_id in api_field(request, name).get("annotations", {}).get("required", [])
            assert all(name not in r.inputs for config in CONFIGS for r in planned(config).of_type(typ))


@pytest.mark.parametrize("typ", REQUESTS)
def test_deviations_agree_with_the_schema(typ):
    request = REQUESTS[typ]
    assert "request" in api_method(request)
    for path, deviation in request.deviations.items():
        mechanical = api_field(request, path)
        if isinstance(deviation, ProviderOnly):
            assert mechanical is None, f"{path} is an API field after all: map it instead"
        elif isinstance(deviation, DeprecatedOnPurpose):
            assert mechanical and mechanical.get("deprecated"), f"{path} is not deprecated (any more): drop it"
        elif isinstance(deviation, JsonBody):
            assert mechanical is None, f"{path} is an API field after all: map it instead"
            assert not deviation.api or api_field(request, deviation.api), f"{path} -> {deviation.api}: no field"
        elif isinstance(deviation, (Renamed, ListOfOne, OneItemOf)):
            target = api_field(request, deviation.api)
            assert target is not None, f"{path} -> {deviation.api}: no such API field"
            if not isinstance(deviation, Renamed):  # a rename keeps the value's shape, a list or not
                assert (target.get("type") == "array") == isinstance(deviation, OneItemOf), f"{path}: list or not"
            assert mechanical is None or isinstance(deviation, OneItemOf), f"{path} maps as it is named"


@pytest.mark.parametrize("key", PROSE_RULES, ids=lambda key: f"{key[0]}:{key[1]}")
def test_prose_rules_still_quote_googles_descriptions(key):
    document_name, label = key
    assert PROSE_RULES[key].quote in described_field(document_name, label)["description"]


# ---- the layer catches each kind of mistake, made by changing a built resource's inputs ---------------------

def _walk(inputs: dict, path: str) -> tuple[dict, str]:
    *parents, last = path.split(".")
    for name in parents:
        inputs = inputs[name]
    return inputs, last


def setting(path: str, value) -> Callable[[dict], None]:
    def change(inputs: dict) -> None:
        parent, last = _walk(inputs, path)
        parent[last] = value
    return change


def renaming(path: str, new_name: str) -> Callable[[dict], None]:
    def change(inputs: dict) -> None:
        parent, last = _walk(inputs, path)
        parent[new_name] = parent.pop(last)
    return change


def removing(path: str) -> Callable[[dict], None]:
    def change(inputs: dict) -> None:
        parent, last = _walk(inputs, path)
        del parent[last]
    return change


POOL, CLUSTER, BUCKET = "dws-tpu-dws-pool", "platform-gke", "training-checkpoints"
MISTAKES = {
    "unknown-nested-field": (
        POOL, renaming("nodeConfig.reservationAffinity.consumeReservationType", "consumeReservation"),
        ["nodeConfig.reservationAffinity.consumeReservation -> container.v1 NodePool.config.reservationAffinity."
         "consumeReservation", "ReservationAffinity has no field 'consumeReservation' (did you mean "
         "'consumeReservationType'?); its fields: consumeReservationType, key, values"]),
    "terraform-only-argument-not-listed": (
        CLUSTER, setting("removeDefaultNodePool", True), ["Cluster has no field 'removeDefaultNodePool'"]),
    "enum-location-policy": (
        POOL, setting("autoscaling.locationPolicy", "ANYWHERE"),
        ["autoscaling.locationPolicy", "'ANYWHERE' is not a value of NodePoolAutoscaling.locationPolicy; "
         "allowed: BALANCED, ANY"]),
    "enum-consume-reservation-type": (
        POOL, setting("nodeConfig.reservationAffinity.consumeReservationType", "NO_RESERVATIONS"),
        ["allowed: NO_RESERVATION, ANY_RESERVATION, SPECIFIC_RESERVATION, ANY_RESERVATION_THEN_FAIL"]),
    "enum-placement-type": (
        POOL, setting("placementPolicy.type", "SPREAD"), ["PlacementPolicy.type; allowed: COMPACT"]),
    "enum-unspecified-default": (
        POOL, setting("placementPolicy.type", "TYPE_UNSPECIFIED"), ["PlacementPolicy.type; allowed: COMPACT"]),
    "enum-workload-metadata-mode": (
        CLUSTER, setting("nodeConfig.workloadMetadataConfig.mode", "GKE"),
        ["nodeConfig.workloadMetadataConfig.mode -> container.v1 Cluster.nodeConfig.workloadMetadataConfig.mode",
         "allowed: GCE_METADATA, GKE_METADATA"]),
    "type-string-for-integer": (
        POOL, setting("initialNodeCount", "0"),
        ["'0' is a string; NodePool.initialNodeCount takes integer (int32)"]),
    "type-string-for-boolean": (
        POOL, setting("nodeConfig.flexStart", "true"), ["'true' is a string; NodeConfig.flexStart takes boolean"]),
    "type-string-for-list": (
        POOL, setting("nodeConfig.oauthScopes", "https://www.googleapis.com/auth/cloud-platform"),
        ["NodeConfig.oauthScopes takes a list"]),
    "type-boolean-for-object": (
        POOL, setting("management", False), ["False is a boolean; NodePool.management takes an object"]),
    "type-integer-label-value": (
        POOL, setting("nodeConfig.labels.tpu-fallback/capacity", 1), ["1 is an integer; NodeConfig.labels{}"]),
    "int32-overflow": (
        POOL, setting("autoscaling.maxNodeCount", 2 ** 31), ["out of NodePoolAutoscaling.maxNodeCount's int32"]),
    "output-only-field": (POOL, setting("status", "RUNNING"), ["NodePool.status is output only"]),
    "deprecated-field": (
        CLUSTER, setting("enableTpu", True), ["Cluster.enableTpu is deprecated in container.v1 revision 20261027"]),
    "list-of-one-holding-two": (
        CLUSTER, setting("addonsConfig.rayOperatorConfigs", [{"enabled": True}, {"enabled": False}]),
        ["addonsConfig.rayOperatorConfigs -> container.v1 Cluster.addonsConfig.rayOperatorConfig", "holds 2"]),
    "url-parameter-pattern": (
        "training-workload-identity",
        setting("serviceAccountId", "tpu-cluster-train@example-project.iam.gserviceaccount.com"),
        ["serviceAccountId -> iam.v1 iam.projects.serviceAccounts.setIamPolicy URL",
         "does not match ^projects/[^/]+/serviceAccounts/[^/]+$"]),
    "prose-account-id-too-short": (
        "platform-nodes", setting("accountId", "tpu"),
        ["accountId -> iam.v1 CreateServiceAccountRequest.accountId",
         "allowed: 6-30 characters matching [a-z]([-a-z0-9]*[a-z0-9])"]),
    "prose-public-access-prevention": (
        BUCKET, setting("publicAccessPrevention", "enforce"),
        ["publicAccessPrevention -> storage.v1 Bucket.iamConfiguration.publicAccessPrevention",
         "allowed: inherited, enforced"]),
    "required-by-the-method": (
        "training-bucket-objectUser", removing("role"),
        ["Policy.bindings[].role is required by storage.buckets.setIamPolicy"]),
}


@pytest.mark.parametrize("mistake", MISTAKES)
def test_each_kind_of_mistake_fails_naming_resource_field_and_what_is_allowed(mistake):
    name, change, expected = MISTAKES[mistake]
    built = planned("dev").named(name)
    inputs = copy.deepcopy(built.inputs)  # plans are cached: never edit them in place
    change(inputs)
    problems = check_resource(built.type, built.name, inputs).problems
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"{built.type} {built.name}: "), problems[0]
    for fragment in expected:
        assert fragment in problems[0]


def test_an_unmapped_resource_type_fails():
    problems = check_resource("gcp:compute/reservation:Reservation", "capacity", {"zone": "us-east5-b"}).problems
    assert problems == ["gcp:compute/reservation:Reservation capacity: no API request is mapped for this type; "
                        "add it to tests/gcp_schema.py REQUESTS"]


# ---- our GKE rules cross-checked with the schema --------------------------------------------------------------

def test_enum_values_the_program_sets_are_the_ones_gke_allows():
    _, enums = all_findings()
    assert enums == {
        "AlertPolicy.combiner": {"OR"},  # the alert policies (infra/monitoring.py): one condition each
        "AlertPolicy.severity": {"WARNING", "ERROR"},
        "Axis.scale": {"LINEAR"},  # the dashboard (infra/monitoring.py)
        "DataSet.plotType": {"LINE", "STACKED_AREA", "STACKED_BAR"},  # STACKED_AREA: where goodput went
        "DataSet.targetAxis": {"Y1", "Y2"},
        # GKE's defaults for a new 1.34 Standard cluster stay on (infra/cluster.py MONITORING_COMPONENTS)
        "MonitoringComponentConfig.enableComponents[]": {"SYSTEM_COMPONENTS", "STORAGE", "POD", "DEPLOYMENT",
                                                         "STATEFULSET", "DAEMONSET", "HPA", "JOBSET", "CADVISOR",
                                                         "KUBELET"},
        "NodePoolAutoscaling.locationPolicy": {"ANY"},  # plan B; plan A leaves GKE's default
        "PlacementPolicy.type": {"COMPACT"},  # every multi-host slice
        # The shipped platform stack has a reservation rung and a Spot rung (Pulumi.platform-us-east5-b.yaml).
        "NodeTaint.effect": {"NO_SCHEDULE"},
        "ReservationAffinity.consumeReservationType": {"NO_RESERVATION", "SPECIFIC_RESERVATION"},
        "ResourcePolicyWorkloadPolicy.type": {"HIGH_THROUGHPUT"},  # TPU7x's workload policy (infra/tpu_pool.py)
        "WorkloadMetadataConfig.mode": {"GKE_METADATA"},
    }


def test_workload_policy_names_fit_compute_s_rule():
    """The longest cluster name and TPU7x topology still make a valid resource policy name (RFC 1035, 63)."""
    policy = planned("tpu7x-longest-policy-name").only("gcp:compute/resourcePolicy:ResourcePolicy")
    assert policy.inputs["name"] == "a" * 39 + "b-tpu7x-8x16x16-c"
    assert PROSE_RULES["compute.v1", "ResourcePolicy.name"].accepts(policy.inputs["name"])


def test_cluster_name_rule_agrees_with_gkes():
    gke = PROSE_RULES["container.v1", "Cluster.name"].accepts
    samples = ["a", "tpu-cluster", "a" * 40, "a" * 41, "Tpu", "1tpu", "tpu-", "-tpu", "tpu_c", "t-1", ""]
    assert [bool(_CLUSTER_NAME.match(s)) for s in samples] == [gke(s) for s in samples]


def test_gke_versions_the_settings_accept_are_forms_gke_documents():
    gke = PROSE_RULES["container.v1", "Cluster.initialClusterVersion"].accepts
    versions = {DEFAULTS["gkeVersion"], MIN_GKE_FOR_QUEUED_TPU, MIN_GKE_FOR_RAY_OPERATOR, "1.34.1",
                *(m.generation.min_gke_version for m in MACHINE_TYPES.values())}
    for version in sorted(versions):
        assert _GKE_VERSION.match(version) and gke(version), version
    # Stricter than GKE on purpose: the version checks need numbers, so GKE's aliases are not settings.
    assert not any(_GKE_VERSION.match(alias) for alias in ("latest", "-", ""))

