"""Strict validation of the GCP half against Google's own request schemas, the APIs' discovery documents.

The pulumi-gcp provider cannot run here, so nothing else sees what GKE would reject only at `pulumi up`: a
misspelled nested field, an enum value GKE does not know, a field GKE dropped. Google publishes each API's
request schema as a discovery document, and google-api-python-client ships them as static files (pinned in
requirements.txt; read offline, no credentials).

Each recorded GCP resource is mapped to the request the Terraform provider under pulumi-gcp sends to create it,
by one mechanical rule plus the explicit deviations in REQUESTS:

- Mechanical rule: a recorded input's name is already the API's JSON name. pulumi-gcp camelCases Terraform's
  snake_case argument (node_config -> nodeConfig), and Google's JSON names are the same camelCase of the proto
  field (NodePool.initial_node_count -> initialNodeCount); nested blocks nest the same way.
  Ref: https://github.com/pulumi/pulumi-terraform-bridge/blob/master/pkg/tfbridge/names.go (TerraformToPulumiNameV2)
- Deviations: an argument the provider renames or moves, a list-of-one block, one item of an API list, an input
  that goes into the request URL, an argument only the provider reads. Each says why. Anything else is a problem:
  nothing is skipped silently.
  Ref: https://github.com/hashicorp/terraform-provider-google (google/services/*/resource_*_meta.yaml give each
  argument's api_field, or provider_only)

The body is then checked like `kubectl --validate=strict`: every field exists, nested objects recursively,
enum values allowed (not deprecated, not the *_UNSPECIFIED default), types right, int32 in range, no output-only
field, no deprecated field unless a deviation says why, method-required fields present, URL parameters matching
their pattern, plus the few rules Google states only in prose (PROSE_RULES), each pinned to its sentence.
Cross-field rules (flex-start needs auto-repair off, topologies per machine type) stay in infra/settings/.

Ref: https://developers.google.com/discovery/v1/reference/apis (the document format)
"""

from __future__ import annotations

import difflib
import functools
import importlib.metadata
import importlib.resources
import json
import re
import string
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

CLIENT_PACKAGE = "google-api-python-client"
# What google-api-python-client==2.202.0 ships. A client bump changes these: review the schema changes, then
# update this table and the README's pinned versions together.
PINNED_REVISIONS: Mapping[str, str] = MappingProxyType({
    "cloudresourcemanager.v1": "20261107",
    "compute.v1": "20261106",
    "container.v1": "20261027",
    "iam.v1": "20261023",
    "monitoring.v1": "20260903",
    "monitoring.v3": "20260129",
    "serviceusage.v1": "20260921",
    "storage.v1": "20261009",
})
INT32 = (-(2 ** 31), 2 ** 31 - 1)
# A google.protobuf.Duration in JSON: seconds, up to nine fractional digits, and the suffix "s" ("15m" is not one).
# Ref: https://protobuf.dev/programming-guides/json/ (Duration)
GOOGLE_DURATION = re.compile(r"-?[0-9]+(\.[0-9]{1,9})?s")
UINT32 = (0, 2 ** 32 - 1)


# ---- how a recorded input deviates from the mechanical rule ----------------------------------------------------
# Input paths are dotted recorded names from the resource's inputs (list items unmarked); API paths are dotted
# JSON names from the object the request body describes (ApiRequest.body).

@dataclass(frozen=True)
class Renamed:
    """The input is the API field at `api`, not at its own name (renamed by the provider, or moved)."""

    api: str
    why: str


@dataclass(frozen=True)
class ListOfOne:
    """pulumi-gcp takes a list holding one object; the API takes that one object at `api`."""

    api: str
    why: str


@dataclass(frozen=True)
class OneItemOf:
    """The input is one item of the API's list at `api`: the provider wraps or merges it."""

    api: str
    why: str


@dataclass(frozen=True)
class ProviderOnly:
    """Read by the provider itself (Terraform-level); no API field carries it."""

    why: str


@dataclass(frozen=True)
class DeprecatedOnPurpose:
    """Maps mechanically, to a field the schema marks deprecated, which we still set for `why`."""

    why: str


@dataclass(frozen=True)
class JsonBody:
    """A JSON document in a string: the provider parses it and sends the object at `api` ("" = the whole body),
    which is then checked like any other input."""

    api: str
    why: str


Deviation = Renamed | ListOfOne | OneItemOf | ProviderOnly | DeprecatedOnPurpose | JsonBody


@dataclass(frozen=True)
class ApiRequest:
    """The API call that creates one resource type, and how its recorded inputs map onto that call."""

    document: str  # discovery document, e.g. container.v1
    method: str  # resource path of the method in the document, e.g. projects.locations.clusters.create
    body: str  # dotted path from the request schema to the object the inputs describe ("" = the whole body)
    url: Mapping[str, str]  # URL parameter -> template over inputs; the inputs it names go nowhere else
    deviations: Mapping[str, Deviation] = field(default_factory=dict)
    # Method-required body fields a resource leaves to Pulumi, which fills them before the request -> why.
    filled_by_pulumi: Mapping[str, str] = field(default_factory=dict)
    ref: str = ""

    def __post_init__(self):
        for name in ("url", "deviations", "filled_by_pulumi"):  # frozen all the way down
            object.__setattr__(self, name, MappingProxyType(dict(getattr(self, name))))


_META = "https://github.com/hashicorp/terraform-provider-google/blob/main/google/services"
_IAM_MEMBER = ("IAM members are non-authoritative: the provider reads the policy, adds this one member to the "
               "role's Binding and writes the policy back (getIamPolicy, then setIamPolicy)")
_DEFAULT_POOL = ("the cluster's own pool keeps GKE's name `default-pool`, which the seed's Kueue flavor and the "
                 "Ray head select (infra/cluster.py); node_pool.* would create a pool of another name. The "
                 "provider sends it as the deprecated Cluster field, which GKE still accepts")

REQUESTS: Mapping[str, ApiRequest] = MappingProxyType({
    "gcp:container/cluster:Cluster": ApiRequest(
        "container.v1", "projects.locations.clusters.create", "cluster",
        url={"parent": "projects/{project}/locations/{location}"},
        deviations={
            "minMasterVersion": Renamed("initialClusterVersion", "sent on create as Cluster.initialClusterVersion "
                                        "(`InitialClusterVersion: d.Get(\"min_master_version\")`)"),
            # The bridge pluralises a Terraform list block without MaxItems 1 (ray_operator_config).
            "addonsConfig.rayOperatorConfigs": ListOfOne(
                "addonsConfig.rayOperatorConfig", "the provider sends element 0 as AddonsConfig.rayOperatorConfig"),
            "deletionProtection": ProviderOnly("the provider refuses to delete the cluster while it is true "
                                               "(meta.yaml: provider_only)"),
            "initialNodeCount": DeprecatedOnPurpose(_DEFAULT_POOL),
            # expandMonitoringConfig builds both API objects from the flat Terraform block.
            "monitoringConfig.enableComponents": Renamed(
                "monitoringConfig.componentConfig.enableComponents",
                "sent as MonitoringConfig.componentConfig (a MonitoringComponentConfig)"),
            "monitoringConfig.managedPrometheus": Renamed(
                "monitoringConfig.managedPrometheusConfig", "sent as MonitoringConfig.managedPrometheusConfig"),
            "nodeConfig": DeprecatedOnPurpose(_DEFAULT_POOL),
        },
        ref=f"{_META}/container/resource_container_cluster_meta.yaml"),
    "gcp:container/nodePool:NodePool": ApiRequest(
        "container.v1", "projects.locations.clusters.nodePools.create", "nodePool",
        url={"parent": "projects/{project}/locations/{location}/clusters/{cluster}"},
        deviations={"nodeConfig": Renamed("config", "a pool's node_config is NodePool.config (meta.yaml)")},
        ref=f"{_META}/container/resource_container_node_pool_meta.yaml"),
    # TPU7x's workload policy (infra/tpu_pool.py). The region is only the URL's: ResourcePolicy.region is output-only.
    "gcp:compute/resourcePolicy:ResourcePolicy": ApiRequest(
        "compute.v1", "resourcePolicies.insert", "",
        url={"project": "{project}", "region": "{region}"},
        ref=f"{_META}/compute/resource_compute_resource_policy_meta.yaml"),
    "gcp:projects/service:Service": ApiRequest(
        "serviceusage.v1", "services.batchEnable", "",
        url={"parent": "projects/{project}"},
        deviations={
            "service": OneItemOf("serviceIds", "the provider batches enables: each Service is one id of "
                                 "BatchEnableServicesRequest.serviceIds (serviceusage_batching.go)"),
            "disableOnDestroy": ProviderOnly("decides whether `pulumi destroy` calls services.disable; "
                                             "enabling has no such field"),
        },
        ref=f"{_META}/resourcemanager/resource_google_project_service_meta.yaml"),
    "gcp:serviceaccount/account:Account": ApiRequest(
        "iam.v1", "projects.serviceAccounts.create", "",
        url={"name": "projects/{project}"},
        deviations={"displayName": Renamed("serviceAccount.displayName", "the request carries accountId beside "
                                           "the ServiceAccount, whose user-set fields are displayName and "
                                           "description")},
        ref=f"{_META}/resourcemanager/resource_google_service_account_meta.yaml"),
    "gcp:projects/iAMMember:IAMMember": ApiRequest(
        "cloudresourcemanager.v1", "projects.setIamPolicy", "policy.bindings[]",
        url={"resource": "{project}"},
        deviations={"member": OneItemOf("members", _IAM_MEMBER)},
        ref=f"{_META}/resourcemanager/iam_project.go"),
    "gcp:serviceaccount/iAMMember:IAMMember": ApiRequest(
        "iam.v1", "projects.serviceAccounts.setIamPolicy", "policy.bindings[]",
        url={"resource": "{serviceAccountId}"},
        deviations={"member": OneItemOf("members", _IAM_MEMBER)},
        ref=f"{_META}/resourcemanager/iam_service_account.go"),
    "gcp:storage/bucket:Bucket": ApiRequest(
        "storage.v1", "buckets.insert", "",
        url={"project": "{project}"},
        deviations={
            "uniformBucketLevelAccess": Renamed("iamConfiguration.uniformBucketLevelAccess.enabled",
                                                "a flat boolean in Terraform (expandIamConfiguration)"),
            "publicAccessPrevention": Renamed("iamConfiguration.publicAccessPrevention",
                                              "flat in Terraform (expandIamConfiguration)"),
            "forceDestroy": ProviderOnly("on destroy the provider deletes every object, then the bucket "
                                         "(meta.yaml: provider_only)"),
        },
        ref=f"{_META}/storage/resource_storage_bucket_meta.yaml"),
    "gcp:storage/bucketIAMMember:BucketIAMMember": ApiRequest(
        "storage.v1", "buckets.setIamPolicy", "bindings[]",
        url={"bucket": "{bucket}"},
        deviations={"member": OneItemOf("members", _IAM_MEMBER)},
        ref=f"{_META}/storage/iam_storage_bucket.go"),
    "gcp:monitoring/dashboard:Dashboard": ApiRequest(
        "monitoring.v1", "projects.dashboards.create", "",
        url={"parent": "projects/{project}"},
        deviations={"dashboardJson": JsonBody("", "the provider POSTs structure.ExpandJsonFromString(dashboard_json) "
                                                  "as the Dashboard (resourceMonitoringDashboardCreate)")},
        ref=f"{_META}/monitoring/resource_monitoring_dashboard.go"),
    "gcp:monitoring/alertPolicy:AlertPolicy": ApiRequest(
        "monitoring.v3", "projects.alertPolicies.create", "",
        url={"name": "projects/{project}"},
        ref=f"{_META}/monitoring/resource_monitoring_alert_policy.go"),
})


# ---- rules Google states only in a field's description ------------------------------------------------------

@dataclass(frozen=True)
class ProseRule:
    """A rule from a field's description; `quote` must still be in it, word for word, or the rule is stale."""

    quote: str
    allows: str  # what the failure message says is allowed
    accepts: Callable[[Any], bool]


def _fullmatch(pattern: str, max_len: int, min_len: int = 1) -> Callable[[Any], bool]:
    compiled = re.compile(pattern)
    return lambda value: (isinstance(value, str) and min_len <= len(value) <= max_len
                          and compiled.fullmatch(value) is not None)


def _one_of(*values: str) -> Callable[[Any], bool]:
    return lambda value: value in values


# Keyed by (document, Schema.field); an inline object schema is named by its path, e.g. Bucket.iamConfiguration.
PROSE_RULES: Mapping[tuple[str, str], ProseRule] = MappingProxyType({
    ("container.v1", "Cluster.name"): ProseRule(
        "can be up to 40 characters with the following restrictions: * Lowercase letters, numbers, and hyphens "
        "only. * Must start with a letter. * Must end with a number or a letter.",
        "1-40 lowercase letters, digits or hyphens, starting with a letter, ending alphanumeric",
        _fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", 40)),
    ("container.v1", "Cluster.initialClusterVersion"): ProseRule(
        '- "latest": picks the highest valid Kubernetes version - "1.X": picks the highest valid patch+gke.N '
        'patch in the 1.X version - "1.X.Y": picks the highest valid gke.N patch in the 1.X.Y version - '
        '"1.X.Y-gke.N": picks an explicit Kubernetes version - "","-": picks the default Kubernetes version',
        'latest, 1.X, 1.X.Y, 1.X.Y-gke.N, "" or -',
        _fullmatch(r"latest|-|1\.\d+(\.\d+(-gke\.\d+)?)?", 64, min_len=0)),
    ("container.v1", "NodeKubeletConfig.shutdownGracePeriodSeconds"): ProseRule(
        "This field is only valid for Spot VMs. Allowed values: 0, 30, 120.", "0, 30 or 120 (seconds)",
        lambda value: value in (0, 30, 120)),
    ("container.v1", "MonitoringComponentConfig.enableComponents"): ProseRule(
        "An empty set would disable all monitoring.", "at least one component (SYSTEM_COMPONENTS keeps GKE's "
        "system metrics)", lambda value: isinstance(value, list) and len(value) > 0),
    ("compute.v1", "ResourcePolicy.name"): ProseRule(
        "the name must be 1-63 characters long and match the regular\nexpression `[a-z]([-a-z0-9]*[a-z0-9])?`",
        "1-63 characters matching [a-z]([-a-z0-9]*[a-z0-9])?", _fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", 63)),
    ("iam.v1", "CreateServiceAccountRequest.accountId"): ProseRule(
        "must be 6-30 characters long, and match the regular expression `[a-z]([-a-z0-9]*[a-z0-9])`",
        "6-30 characters matching [a-z]([-a-z0-9]*[a-z0-9])",
        _fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])", 30, min_len=6)),
    ("iam.v1", "ServiceAccount.displayName"): ProseRule(
        "The maximum length is 100 UTF-8 bytes.", "at most 100 UTF-8 bytes",
        lambda value: isinstance(value, str) and len(value.encode()) <= 100),
    ("monitoring.v3", "AlertPolicy.notificationChannels"): ProseRule(
        "The format of the entries in this field is: projects/[PROJECT_ID_OR_NUMBER]/notificationChannels/[CHANNEL_ID]",
        "projects/[PROJECT_ID_OR_NUMBER]/notificationChannels/[CHANNEL_ID]",
        lambda value: isinstance(value, list) and all(
            _fullmatch(r"projects/[^/]+/notificationChannels/[^/]+", 1024)(item) for item in value)),
    ("monitoring.v3", "AlertPolicy.conditions"): ProseRule(
        "A policy can have from one to six conditions.", "1 to 6 conditions",
        lambda value: isinstance(value, list) and 1 <= len(value) <= 6),
    ("monitoring.v3", "Documentation.mimeType"): ProseRule(
        'Presently, only the value "text/markdown" is supported.', "text/markdown", _one_of("text/markdown")),
    ("storage.v1", "Bucket.iamConfiguration.publicAccessPrevention"): ProseRule(
        "Currently, 'inherited' and 'enforced' are supported.", "inherited, enforced",
        _one_of("inherited", "enforced")),
})


# ---- the discovery documents -------------------------------------------------------------------------------

@functools.cache
def document(name: str) -> dict:
    """A discovery document shipped by google-api-python-client, e.g. container.v1."""
    try:
        folder = importlib.resources.files("googleapiclient") / "discovery_cache" / "documents"
    except ModuleNotFoundError as err:
        raise LookupError(f"{CLIENT_PACKAGE} is not installed; pip install -r requirements.txt") from err
    return json.loads((folder / f"{name}.json").read_text())


def documents_used() -> tuple[str, ...]:
    return tuple(sorted({request.document for request in REQUESTS.values()}))


def discovery_revisions() -> dict[str, str]:
    """The revision of every discovery document the mapping uses, e.g. {"container.v1": "20261027", ...}."""
    return {name: document(name)["revision"] for name in documents_used()}


def discovery_header() -> str:
    """One line for the test run's header: the client version and the revisions checked against."""
    try:
        version = importlib.metadata.version(CLIENT_PACKAGE)
        revisions = ", ".join(f"{name} {revision}" for name, revision in discovery_revisions().items())
    except (importlib.metadata.PackageNotFoundError, LookupError):
        return f"Google API schemas: {CLIENT_PACKAGE} not installed (pip install -r requirements.txt)"
    return f"Google API schemas ({CLIENT_PACKAGE} {version}): {revisions}"


def api_method(request: ApiRequest) -> dict:
    node = document(request.document)
    *resources, name = request.method.split(".")
    for resource in resources:
        node = node["resources"][resource]
    return node["methods"][name]


def resolve(document_name: str, prop: dict) -> tuple[str | None, dict]:
    """A property's schema with its $ref followed: (the referenced schema's name or None, the schema)."""
    ref = prop.get("$ref")
    if ref is None:
        return None, prop
    return ref, document(document_name)["schemas"][ref]


def body_schema(request: ApiRequest) -> tuple[str, dict]:
    """(name, schema) of the object the inputs describe: the request schema, followed along `body`."""
    name, schema = resolve(request.document, api_method(request)["request"])
    for step in filter(None, request.body.split(".")):
        prop = schema["properties"][step.removesuffix("[]")]
        if step.endswith("[]"):
            prop = prop["items"]
        ref, schema = resolve(request.document, prop)
        name = ref or f"{name}.{step}"
    return name, schema


def api_field(request: ApiRequest, api_path: str) -> dict | None:
    """The property at a dotted API path from the body object (list items stepped through), or None."""
    _, schema = body_schema(request)
    prop: dict | None = None
    for step in api_path.split("."):
        if prop is not None:
            schema = _element_schema(request.document, prop)
        prop = schema.get("properties", {}).get(step)
        if prop is None:
            return None
    return prop


def _element_schema(document_name: str, prop: dict) -> dict:
    while prop.get("type") == "array":
        prop = prop["items"]
    return resolve(document_name, prop)[1]


def described_field(document_name: str, label: str) -> dict:
    """The property a PROSE_RULES label names, e.g. Bucket.iamConfiguration.publicAccessPrevention."""
    schema_name, *steps = label.split(".")
    prop = {"$ref": schema_name}
    for step in steps:
        prop = _element_schema(document_name, prop)["properties"][step]
    return prop


def is_output_only(prop: dict) -> bool:
    # Most documents mark these readOnly; a few say so only in the description.
    return bool(prop.get("readOnly")) or prop.get("description", "").startswith("Output only")


def allowed_enum_values(prop: dict) -> list[str]:
    """An enum's values less the deprecated ones and the proto default *_UNSPECIFIED, which means "not set"."""
    deprecated = prop.get("enumDeprecated") or [False] * len(prop["enum"])
    return [value for value, old in zip(prop["enum"], deprecated)
            if not old and value != "UNSPECIFIED" and not value.endswith("_UNSPECIFIED")]


# ---- checking one resource --------------------------------------------------------------------------------

@dataclass
class Findings:
    """Problems found, one readable line each; the deviations the inputs needed, as (type, input path); and
    the enum values set, per Schema.field."""

    problems: list[str] = field(default_factory=list)
    deviations_used: set[tuple[str, str]] = field(default_factory=set)
    enum_values: dict[str, set[str]] = field(default_factory=dict)

    def add(self, other: Findings) -> None:
        self.problems.extend(other.problems)
        self.deviations_used |= other.deviations_used
        for label, values in other.enum_values.items():
            self.enum_values.setdefault(label, set()).update(values)


def _template_inputs(template: str) -> list[str]:
    return [name for _, name, _, _ in string.Formatter().parse(template) if name]


def _dotted(path: tuple) -> str:
    text = ""
    for step in path:
        text += f"[{step}]" if isinstance(step, int) else (f".{step}" if text else step)
    return text


def _key(path: tuple) -> str:
    """A path without its list indices, as the deviation tables spell it."""
    return ".".join(step for step in path if not isinstance(step, int))


class _Check:
    """One resource: its inputs translated into the request body, then the body checked against the schema."""

    def __init__(self, typ: str, name: str, request: ApiRequest):
        self.typ, self.name, self.request = typ, name, request
        self.method_id = api_method(request)["id"]
        self.root_name, self.root = body_schema(request)
        self.body: dict = {}
        self.origin: dict[tuple, str] = {(): ""}  # API path -> the input it came from, for messages
        self.deprecated_ok: set[str] = set()
        self.findings = Findings()

    # -- reporting --
    def problem(self, api_path: tuple, message: str, input_path: str | None = None,
                target: str | None = None) -> None:
        source = input_path if input_path is not None else self._input_path(api_path)
        where = _dotted(api_path)
        target = target or f"{self.request.document} {self.root_name}" + (f".{where}" if where else "")
        self.findings.problems.append(f"{self.typ} {self.name}: {source or '<inputs>'} -> {target}: {message}")

    def _input_path(self, api_path: tuple) -> str:
        for cut in range(len(api_path), -1, -1):
            if api_path[:cut] in self.origin:
                base = self.origin[api_path[:cut]]
                rest = _dotted(api_path[cut:])
                return f"{base}.{rest}" if base and rest and not rest.startswith("[") else base + rest
        return ""

    # -- URL parameters --
    def check_url(self, inputs: Mapping[str, Any]) -> None:
        parameters = api_method(self.request)["parameters"]
        url = f"{self.request.document} {self.method_id} URL"
        for parameter in api_method(self.request).get("parameterOrder", []):
            if parameter not in self.request.url:
                self.problem((), f"the mapping gives no value for the required parameter {parameter!r}",
                             input_path="", target=url)
        for parameter, template in self.request.url.items():
            names = _template_inputs(template)
            missing = [n for n in names if not isinstance(inputs.get(n), str)]
            if missing:
                self.problem((), f"parameter {parameter!r} ({template}) needs string input(s) {', '.join(missing)}",
                             input_path=", ".join(missing), target=url)
                continue
            value = template.format(**{n: inputs[n] for n in names})
            pattern = parameters[parameter].get("pattern")
            if pattern and not re.match(pattern, value):
                self.problem((), f"parameter {parameter!r} = {value!r} does not match {pattern}",
                             input_path=", ".join(names), target=url)

    def url_inputs(self) -> set[str]:
        return {name for template in self.request.url.values() for name in _template_inputs(template)}

    # -- translation: inputs -> request body --
    def translate(self, inputs: Mapping[str, Any]) -> None:
        body_inputs = {k: v for k, v in inputs.items() if k not in self.url_inputs()}
        self._translate_object(body_inputs, (), "", ())

    def _translate_object(self, value: Mapping[str, Any], input_keys: tuple, shown: str, api_path: tuple) -> None:
        for name, item in value.items():
            keys, here = (*input_keys, name), f"{shown}.{name}" if shown else name
            deviation = self.request.deviations.get(".".join(keys))
            if deviation is not None:
                self.findings.deviations_used.add((self.typ, ".".join(keys)))
            self._translate_field(item, keys, here, api_path + (name,), deviation)

    def _translate_field(self, value: Any, keys: tuple, shown: str, api_path: tuple,
                         deviation: Deviation | None) -> None:
        if isinstance(deviation, ProviderOnly):
            return
        if isinstance(deviation, JsonBody):
            self._translate_json(value, keys, shown, tuple(filter(None, deviation.api.split("."))))
            return
        if isinstance(deviation, DeprecatedOnPurpose):
            self.deprecated_ok.add(_key(api_path))
        if isinstance(deviation, (Renamed, ListOfOne, OneItemOf)):
            api_path = tuple(deviation.api.split("."))
        if isinstance(deviation, OneItemOf):
            value = [value]
        if isinstance(deviation, ListOfOne):
            if not (isinstance(value, list) and len(value) == 1):
                count = len(value) if isinstance(value, list) else "no list but one"
                self.problem(api_path, f"pulumi-gcp's list must hold exactly one object, which the API takes as "
                                       f"one object; it holds {count}", input_path=shown)
                return
            value = value[0]
        self._place(value, keys, shown, api_path)

    def _translate_json(self, text: Any, keys: tuple, shown: str, api_path: tuple) -> None:
        try:
            value = json.loads(text) if isinstance(text, str) else None
        except json.JSONDecodeError as err:
            self.problem(api_path, f"not JSON: {err}", input_path=shown)
            return
        if not isinstance(value, dict):
            self.problem(api_path, f"must be a JSON object in a string; got {_kind_of(text)}", input_path=shown)
            return
        if api_path:
            self._place(value, keys, shown, api_path)
        else:
            self._translate_object(value, keys, shown, ())

    def _place(self, value: Any, keys: tuple, shown: str, api_path: tuple) -> None:
        """Put an input's value at its API path, creating the objects on the way (a move may need several)."""
        parent = self._parent_of(api_path, shown)
        last = api_path[-1]
        taken = isinstance(parent, dict) and last in parent
        if taken and not (isinstance(value, dict) and isinstance(parent[last], dict)):
            self.problem(api_path, f"two inputs map to this one API field ({self.origin[api_path]} and {shown})",
                         input_path=shown)
            return
        self.origin.setdefault(api_path, shown)
        if isinstance(value, dict):
            if not taken:
                parent[last] = {}
            self._translate_object(value, keys, shown, api_path)
        elif isinstance(value, list):
            parent[last] = [None] * len(value)
            for index, item in enumerate(value):
                self._place(item, keys, f"{shown}[{index}]", api_path + (index,))
        else:
            parent[last] = value

    def _parent_of(self, api_path: tuple, shown: str) -> dict | list:
        node: Any = self.body
        for depth, step in enumerate(api_path[:-1]):
            self.origin.setdefault(api_path[:depth + 1], shown)
            node = node.setdefault(step, {}) if isinstance(node, dict) else node[step]
        return node

    # -- validation: request body -> schema --
    def validate(self) -> None:
        self._check_object(self.body, self.root, self.root_name, ())

    def _check_object(self, value: dict, schema: dict, owner: str, api_path: tuple) -> None:
        properties = schema.get("properties", {})
        for name, item in value.items():
            if name in properties:
                self._check_field(item, properties[name], owner, name, api_path + (name,))
            else:
                self.problem(api_path + (name,), f"{owner} has no field {name!r}{_suggestion(name, properties)}; "
                                                 f"its fields: {', '.join(sorted(properties)) or '(none)'}")
        for name, prop in properties.items():
            required_by = prop.get("annotations", {}).get("required", [])
            filled = not api_path and name in self.request.filled_by_pulumi
            if self.method_id in required_by and name not in value and not filled:
                self.problem(api_path + (name,), f"{owner}.{name} is required by {self.method_id} and not set")

    def _check_field(self, value: Any, prop: dict, owner: str, name: str, api_path: tuple) -> None:
        label = f"{owner}.{name}"
        if is_output_only(prop):
            self.problem(api_path, f"{label} is output only: set by Google, not by a request")
            return
        if prop.get("deprecated") and _key(api_path) not in self.deprecated_ok:
            revision = document(self.request.document)["revision"]
            self.problem(api_path, f"{label} is deprecated in {self.request.document} revision {revision} "
                                   f"({_deprecation_note(prop)}); set its replacement, or add a "
                                   "DeprecatedOnPurpose deviation saying why")
        self._check_prose(value, prop, label, api_path)
        self._check_value(value, prop, label, api_path)

    def _check_prose(self, value: Any, prop: dict, label: str, api_path: tuple) -> None:
        rule = PROSE_RULES.get((self.request.document, label))
        if rule is None:
            return
        if rule.quote not in prop.get("description", ""):
            self.problem(api_path, f"the description of {label} no longer says {rule.quote!r}; re-read it and "
                                   "update PROSE_RULES")
        elif not rule.accepts(value):
            self.problem(api_path, f"{value!r} breaks the rule {label}'s description states; allowed: {rule.allows}")

    def _check_value(self, value: Any, prop: dict, label: str, api_path: tuple) -> None:
        ref, schema = resolve(self.request.document, prop)
        kind = schema.get("type")
        if kind == "any":
            return
        if kind == "array":
            if self._type_ok(value, list, "a list", label, api_path):
                for index, item in enumerate(value):
                    self._check_value(item, schema["items"], f"{label}[]", api_path + (index,))
        elif kind == "object" and "additionalProperties" in schema and "properties" not in schema:
            if self._type_ok(value, dict, "an object (a map)", label, api_path):
                for key, item in value.items():
                    self._check_value(item, schema["additionalProperties"], f"{label}{{}}", api_path + (key,))
        elif kind == "object":
            if self._type_ok(value, dict, "an object", label, api_path):
                self._check_object(value, schema, ref or label, api_path)
        else:
            self._check_scalar(value, schema, label, api_path)

    def _type_ok(self, value: Any, python_type: type, wanted: str, label: str, api_path: tuple) -> bool:
        if isinstance(value, python_type):
            return True
        self.problem(api_path, f"{value!r} is {_kind_of(value)}; {label} takes {wanted}")
        return False

    def _check_scalar(self, value: Any, schema: dict, label: str, api_path: tuple) -> None:
        kind, fmt = schema.get("type"), schema.get("format")
        wanted = kind + (f" ({fmt})" if fmt else "")
        if not _scalar_type_ok(value, kind, fmt):
            self.problem(api_path, f"{value!r} is {_kind_of(value)}; {label} takes {wanted}")
        elif kind == "integer" and fmt in ("int32", "uint32"):
            low, high = INT32 if fmt == "int32" else UINT32
            if not low <= value <= high:
                self.problem(api_path, f"{value} is out of {label}'s {fmt} range {low}..{high}")
        elif fmt == "google-duration" and not GOOGLE_DURATION.fullmatch(value):
            self.problem(api_path, f"{value!r} is not a {fmt}; {label} takes seconds with the suffix s, such as "
                                   "3600s or 1.5s")
        elif "enum" in schema:
            self.findings.enum_values.setdefault(label, set()).add(value)
            if value not in allowed_enum_values(schema):
                self.problem(api_path, f"{value!r} is not a value of {label}; allowed: "
                                       f"{', '.join(allowed_enum_values(schema))}")


def _scalar_type_ok(value: Any, kind: str | None, fmt: str | None) -> bool:
    if isinstance(value, bool):
        return kind == "boolean"
    if kind == "string":
        # int64 travels as a JSON string; the provider formats an integer argument as one.
        return isinstance(value, str) or (fmt in ("int64", "uint64") and isinstance(value, int))
    if kind == "integer":
        return isinstance(value, int)
    if kind == "number":
        return isinstance(value, (int, float))
    return False


def _deprecation_note(prop: dict) -> str:
    sentences = re.findall(r"[^.]*deprecated[^.]*\.", prop.get("description", ""), flags=re.IGNORECASE)
    return sentences[0].strip() if sentences else "its description says no more"


def _kind_of(value: Any) -> str:
    names = {bool: "a boolean", str: "a string", int: "an integer", float: "a number", list: "a list",
             dict: "an object", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _suggestion(name: str, properties: Mapping[str, Any]) -> str:
    close = difflib.get_close_matches(name, list(properties), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def check_resource(typ: str, name: str, inputs: Mapping[str, Any]) -> Findings:
    """Every way a GCP resource's recorded inputs miss the API schema of the request that creates it."""
    request = REQUESTS.get(typ)
    if request is None:
        return Findings([f"{typ} {name}: no API request is mapped for this type; add it to "
                         "tests/gcp_schema.py REQUESTS"])
    check = _Check(typ, name, request)
    check.check_url(inputs)
    check.translate(inputs)
    check.validate()
    return check.findings


def gcp_resources(plan) -> list:
    return [r for r in plan.resources if r.type.startswith("gcp:") and r.custom]


def check_plan(plan) -> Findings:
    """Findings for every GCP resource of a recorded plan (tests/conftest.py plan_for)."""
    findings = Findings()
    for resource in gcp_resources(plan):
        findings.add(check_resource(resource.type, resource.name, resource.inputs))
    return findings
