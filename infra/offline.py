"""Run the real program with no cloud and no Pulumi CLI, and record every resource it declares.

The recording engine of the tests and of the offline plan: Pulumi's mock monitor, extended to keep what the
engine would see (type, inputs, parent, dependencies, provider, options), with a stack's config loaded the
way the CLI loads it (stack file over Pulumi.yaml defaults).

    python -m infra.offline dev            # print the resource tree, write build/plan/dev/manifests.yaml
    python -m infra.offline team-a         # a team stack: its StackReference is answered by the offline plan of
                                           # its platform stack (Pulumi.<stack>.yaml here) or --platform-outputs
    python -m infra.offline fleet          # a fleet stack: each member's reference likewise, or --stack-outputs

A stack the program refuses (a settings error, a pulumi.RunError) prints `error: ` and its message, with no
traceback, and exits 1, as the Pulumi CLI shows a RunError; any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import hashlib
import json
import runpy
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
import yaml
from pulumi.runtime import mocks as pulumi_mocks

ROOT = Path(__file__).resolve().parent.parent
PROJECT = "tpu-fallback"
SECRET_MARK = "[secret]"
PLACEHOLDER_PROJECT = "example-project"
STACK_REFERENCE = "pulumi:pulumi:StackReference"
PLATFORM_STACK_KEY = f"{PROJECT}:platformStack"  # roles/team.py: set on team stacks
FLEET_KEY = f"{PROJECT}:fleet"  # roles/fleet.py: set on fleet stacks


@dataclass
class Recorded:
    """One resource as the engine saw it."""

    urn: str
    type: str
    name: str
    custom: bool
    inputs: dict[str, Any]
    parent: str
    provider: str
    dependencies: list[str]
    property_dependencies: dict[str, list[str]]
    options: dict[str, Any]
    outputs: dict[str, Any] = field(default_factory=dict)

    @property
    def provider_urn(self) -> str:
        return self.provider.rsplit("::", 1)[0] if self.provider else ""


@dataclass
class Plan:
    resources: list[Recorded]
    outputs: dict[str, Any]
    secret_outputs: set[str]

    def by_urn(self) -> dict[str, Recorded]:
        return {r.urn: r for r in self.resources}

    def of_type(self, typ: str) -> list[Recorded]:
        return [r for r in self.resources if r.type == typ]

    def only(self, typ: str) -> Recorded:
        """The one resource of a type; an error when there are none or several (registration order is random)."""
        matches = self.of_type(typ)
        if len(matches) != 1:
            raise KeyError(f"{len(matches)} resources of type {typ!r}")
        return matches[0]

    def named(self, name: str) -> Recorded:
        matches = [r for r in self.resources if r.name == name]
        if len(matches) != 1:
            raise KeyError(f"{len(matches)} resources named {name!r}")
        return matches[0]

    def ancestors_and_dependencies(self, resource: Recorded) -> set[str]:
        """Every URN this resource waits for, directly or through what it waits for (parents included)."""
        index, seen, todo = self.by_urn(), set(), [resource.urn]
        while todo:
            current = index.get(todo.pop())
            if current is None:
                continue
            for urn in (*current.dependencies, *(u for us in current.property_dependencies.values() for u in us),
                        current.parent, current.provider_urn):
                if urn and urn not in seen:
                    seen.add(urn)
                    todo.append(urn)
        return seen

    def kubernetes_manifests(self) -> list[dict]:
        """Every Kubernetes object the program declares, as it would be applied."""
        manifests = []
        for r in self.resources:
            if not r.type.startswith("kubernetes:") or r.type.startswith("kubernetes:helm.sh"):
                continue
            # Copies: callers edit manifests (tests break them on purpose), and plans are cached between tests.
            body = copy.deepcopy({k: v for k, v in r.outputs.items() if k not in ("id", "urn", "status")})
            head = {k: body.pop(k) for k in ("apiVersion", "kind", "metadata") if k in body}
            manifests.append({**head, **body})
        # Registration order varies run to run; review and golden files need one order.
        return sorted(manifests, key=lambda m: (m["kind"], m["metadata"].get("namespace", ""), m["metadata"]["name"]))

    def helm_releases(self) -> list[Recorded]:
        return self.of_type("kubernetes:helm.sh/v3:Release")


@dataclass(frozen=True)
class StackOutputs:
    """Another stack's outputs as a StackReference reads them: what answers a team stack's reference to its
    platform stack. Secret values are kept as a mark (the offline plan never holds credentials)."""

    outputs: dict[str, Any]
    secret_output_names: tuple[str, ...] = ()

    @classmethod
    def of_plan(cls, plan: Plan) -> StackOutputs:
        return cls({key: SECRET_MARK if key in plan.secret_outputs else copy.deepcopy(value)
                    for key, value in plan.outputs.items()}, tuple(sorted(plan.secret_outputs)))

    def to_json(self) -> str:
        return json.dumps({"outputs": self.outputs, "secretOutputNames": list(self.secret_output_names)},
                          indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> StackOutputs:
        data = json.loads(text)
        return cls(data["outputs"], tuple(data.get("secretOutputNames", ())))


def _stable_suffix(name: str) -> str:
    # Pulumi auto-names with a random 7-character suffix; a hash keeps the offline plan reproducible.
    return hashlib.sha256(name.encode()).hexdigest()[:7]


class RecordingMocks(pulumi.runtime.Mocks):
    """Echo inputs and invent what the cloud would compute, as plausible fixed values; answer a StackReference
    with the outputs given for that stack."""

    stack_references: Mapping[str, StackOutputs] = {}  # by stack name; set per run by OfflineEngine

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        outputs = dict(args.inputs)
        typ = args.typ
        if typ == STACK_REFERENCE:
            # As pulumi's own mock tests answer one. Ref: pulumi/pulumi sdk/python/lib/test_with_mocks
            name = outputs.get("name") or args.resource_id
            if name not in self.stack_references:
                raise LookupError(f"unknown stack {name!r}: no outputs were given for it "
                                  f"(known: {', '.join(sorted(self.stack_references)) or 'none'})")
            referenced = self.stack_references[name]
            return name, {"name": name, "outputs": copy.deepcopy(referenced.outputs),
                          "secretOutputNames": list(referenced.secret_output_names)}
        if typ == "gcp:container/cluster:Cluster":
            outputs.update(
                endpoint="203.0.113.10",
                masterAuth={"clusterCaCertificate": "LS0tLS1CRUdJTi1FWEFNUExFLUNBLS0tLS0="},
            )
            resource_id = f"projects/{outputs.get('project')}/locations/{outputs['location']}/clusters/{outputs['name']}"
            return resource_id, outputs
        if typ == "gcp:serviceaccount/account:Account":
            outputs["email"] = f"{outputs['accountId']}@{outputs.get('project')}.iam.gserviceaccount.com"
            outputs["name"] = f"projects/{outputs.get('project')}/serviceAccounts/{outputs['email']}"
        elif typ == "gcp:storage/bucket:Bucket":
            outputs.setdefault("name", f"{args.name}-{_stable_suffix(args.name)}")
            outputs["url"] = f"gs://{outputs['name']}"
        elif typ.startswith("kubernetes:") and not typ.startswith("kubernetes:helm.sh"):
            metadata = dict(outputs.get("metadata") or {})
            metadata.setdefault("name", f"{args.name}-{_stable_suffix(args.name)}")
            outputs["metadata"] = metadata
        elif typ == "kubernetes:helm.sh/v3:Release":
            outputs["status"] = {"name": outputs.get("name"), "namespace": outputs.get("namespace"),
                                 "status": "deployed", "version": outputs.get("version")}
        return f"{args.name}-id", outputs

    def call(self, args: pulumi.runtime.MockCallArgs):
        return {}  # the program makes no provider calls


class RecordingMonitor(pulumi_mocks.MockMonitor):
    """The mock monitor, keeping each registration's graph fields, which MockResourceArgs drops."""

    def __init__(self, mocks: RecordingMocks):
        super().__init__(mocks)
        self.recorded: list[Recorded] = []

    def RegisterResource(self, request):
        response = super().RegisterResource(request)
        if request.type == "pulumi:pulumi:Stack":
            return response
        registration = self.resources[response.urn]
        self.recorded.append(Recorded(
            urn=response.urn,
            type=request.type,
            name=request.name,
            custom=request.custom,
            inputs=_plain(pulumi.runtime.rpc.deserialize_properties(request.object, keep_unknowns=True)),
            parent=request.parent,
            provider=request.provider,
            dependencies=list(request.dependencies),
            property_dependencies={k: list(v.urns) for k, v in request.propertyDependencies.items()},
            options={
                "deleteBeforeReplace": request.deleteBeforeReplace,
                "ignoreChanges": list(request.ignoreChanges),
                "protect": request.protect,
                "customTimeouts": {"create": request.customTimeouts.create,
                                   "update": request.customTimeouts.update,
                                   "delete": request.customTimeouts.delete},
            },
            outputs=_plain(registration.state),
        ))
        return response


    def ReadResource(self, request):
        # A read (a StackReference) creates nothing; kept so the plan says what the program reads.
        response = super().ReadResource(request)
        self.recorded.append(Recorded(
            urn=response.urn, type=request.type, name=request.name, custom=True, inputs={"id": request.id},
            parent=request.parent, provider=request.provider, dependencies=list(request.dependencies),
            property_dependencies={}, options={"read": True}, outputs=_plain(self.resources[response.urn].state),
        ))
        return response


def _plain(value: Any) -> Any:
    """Inputs as plain data, with secrets shown as a mark (the plan is for review, not for credentials)."""
    if isinstance(value, dict):
        if value.get(pulumi.runtime.rpc._special_sig_key) == pulumi.runtime.rpc._special_secret_sig:
            return SECRET_MARK
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)  # the wire format carries every number as a double
    return value


def config_value(value: Any) -> str:
    """Config values reach the program as strings; objects and arrays as JSON, as the CLI passes them."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return str(value)


def namespaced(key: str) -> str:
    return key if ":" in key else f"{PROJECT}:{key}"


class StackFileError(pulumi.RunError):
    """A stack file that is not a YAML mapping: the CLI refuses it before the program runs, with no traceback."""


def stack_config(stack: str, root: Path = ROOT, stack_file: Path | None = None) -> dict[str, str]:
    """A stack's config as the CLI hands it to the program: the stack file (Pulumi.<stack>.yaml in `root`, or
    `stack_file` as the CLI's --config-file names it) over Pulumi.yaml's defaults."""
    project = yaml.safe_load((root / "Pulumi.yaml").read_text())
    config = {
        namespaced(key): config_value(decl["default"])
        for key, decl in (project.get("config") or {}).items()
        if isinstance(decl, dict) and "default" in decl
    }
    stack_file = stack_file or root / f"Pulumi.{stack}.yaml"
    if not stack_file.exists():
        raise FileNotFoundError(f"no stack file {stack_file.name}")
    try:
        loaded = yaml.safe_load(stack_file.read_text()) or {}
    except yaml.YAMLError as err:
        raise StackFileError(f"{stack_file.name}: not YAML: {err}") from None
    if not isinstance(loaded, dict) or not isinstance(loaded.get("config") or {}, dict):
        raise StackFileError(f"{stack_file.name}: expected a mapping with a `config` mapping")
    for key, value in (loaded.get("config") or {}).items():
        config[namespaced(key)] = config_value(value)
    return config


def _ensure_event_loop() -> None:
    """Pulumi's mocks need a current, open event loop; code run before (Ray, asyncio.run) may leave none."""
    try:
        loop = asyncio.get_event_loop()
    except RuntimeError:
        loop = None
    if loop is None or loop.is_closed():
        asyncio.set_event_loop(asyncio.new_event_loop())


class OfflineEngine:
    """Runs __main__.py under the recording engine. `recorded` keeps what was registered, even when the
    program fails, so tests can check that a bad config registers nothing."""

    def __init__(self, stack: str = "dev", preview: bool = False,
                 stack_references: dict[str, StackOutputs] | None = None):
        self.stack, self.preview = stack, preview
        self.stack_references = stack_references
        self.recorded: list[Recorded] = []

    def run(self, config: dict[str, str]) -> Plan:
        _ensure_event_loop()
        pulumi.runtime.set_all_config(config)
        mocks = RecordingMocks()
        mocks.stack_references = self.stack_references or {}
        monitor = RecordingMonitor(mocks)
        self.recorded = monitor.recorded
        # A fresh stack resource per run: set_mocks keeps an existing one, and with it the exports (and an async
        # entrypoint) of the program run before, e.g. a platform stack's outputs in its team stack's plan.
        pulumi.runtime.settings.set_root_resource(None)
        pulumi.runtime.set_mocks(mocks, project=PROJECT, stack=self.stack, preview=self.preview, monitor=monitor)
        root = pulumi.runtime.settings.get_root_resource()
        # set_mocks closes its stack at once; the CLI's run_in_stack keeps it open for an async entrypoint
        # (pulumi.run, which team stacks use) and awaits that after the module's code. Do the same.
        # Ref: https://github.com/pulumi/pulumi/pull/23945 (runtime/stack.py: run_in_stack)
        root._async_program_registration_closed = False
        collected: dict[str, Any] = {}
        secret: set[str] = set()

        @pulumi.runtime.test
        def _run():
            runpy.run_path(str(ROOT / "__main__.py"), run_name="__main__")
            program = root._take_async_program()

            async def exports_after_program():
                if program is not None:
                    root._add_program_outputs(await program())
                exports = root.outputs
                for key, value in exports.items():
                    if await pulumi.Output.from_input(value).is_secret():
                        secret.add(key)
                await pulumi.Output.all(**exports).apply(collected.update).future()

            return asyncio.ensure_future(exports_after_program())

        _run()
        return Plan(monitor.recorded, collected, secret)


def run_program(config: dict[str, str], stack: str = "dev", preview: bool = False,
                stack_references: dict[str, StackOutputs] | None = None) -> Plan:
    """Run __main__.py under the recording engine; exceptions from the program propagate."""
    return OfflineEngine(stack, preview, stack_references).run(config)


class _ReviewDumper(yaml.SafeDumper):
    """YAML for people: multi-line strings (scripts, runtime envs) as literal blocks."""


def _represent_str(dumper: yaml.SafeDumper, text: str):
    style = "|" if "\n" in text else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_ReviewDumper.add_representer(str, _represent_str)


def _digest_long_text(value: Any) -> Any:
    """In the tree, a file carried as data (the training script) shows as its size and digest."""
    if isinstance(value, dict):
        return {k: _digest_long_text(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_digest_long_text(v) for v in value]
    if isinstance(value, str) and value.count("\n") > 20:
        return f"<{value.count(chr(10))} lines, sha256 {hashlib.sha256(value.encode()).hexdigest()[:12]}>"
    return value


def _block(value: Any, indent: str) -> list[str]:
    """A value as indented YAML lines: scalars inline, structures on the lines below."""
    value = _digest_long_text(value)
    text = yaml.dump(value, Dumper=_ReviewDumper, sort_keys=True, default_flow_style=False, width=200).rstrip("\n")
    if not isinstance(value, (dict, list)) or not value:
        return [" " + text.removesuffix("\n...")]
    return [""] + [f"{indent}  {line}" for line in text.splitlines()]


def render_tree(plan: Plan) -> str:
    """The resource tree with each resource's inputs, one line per top-level input."""
    children: dict[str, list[Recorded]] = {}
    for r in sorted(plan.resources, key=lambda r: (r.type, r.name)):
        children.setdefault(r.parent, []).append(r)
    index = plan.by_urn()
    lines: list[str] = []

    def walk(parent: str, depth: int) -> None:
        for r in children.get(parent, []):
            indent = "  " * depth
            deps = sorted(index[d].name for d in r.dependencies if d in index and d != r.parent)
            mark = "> read" if r.options.get("read") else "+"  # a read creates nothing
            lines.append(f"{indent}{mark} {r.type} {r.name}" + (f"  (after: {', '.join(deps)})" if deps else ""))
            if r.custom:
                for key in sorted(r.inputs):
                    block = _block(r.inputs[key], indent + "    ")
                    lines.append(f"{indent}    {key}:{block[0]}")
                    lines.extend(block[1:])
            walk(r.urn, depth + 1)

    roots = {r.parent for r in plan.resources if r.parent not in index}
    for root in sorted(roots):
        walk(root, 0)
    lines.append("")
    lines.append("Outputs:")
    for key in sorted(plan.outputs):
        block = [" " + SECRET_MARK] if key in plan.secret_outputs else _block(plan.outputs[key], "    ")
        lines.append(f"    {key}:{block[0]}")
        lines.extend(block[1:])
    return "\n".join(lines) + "\n"


def render_manifests(plan: Plan) -> str:
    """Every Kubernetes object as YAML, the Helm releases as their chart and values (like `helm template`)."""
    docs = []
    for release in plan.helm_releases():
        docs.append({"# helm release": {key: release.inputs.get(key)
                                        for key in ("name", "chart", "version", "namespace", "values")}})
    docs.extend(plan.kubernetes_manifests())
    # Sorted keys: the order of a struct's keys on the wire is random.
    return yaml.dump_all(docs, Dumper=_ReviewDumper, sort_keys=True, default_flow_style=False, width=200)


def write_plan(stack: str, config: dict[str, str], out_dir: Path,
               stack_references: dict[str, StackOutputs] | None = None) -> Plan:
    plan = run_program(config, stack=stack, stack_references=stack_references)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "plan.txt").write_text(render_tree(plan))
    (out_dir / "manifests.yaml").write_text(render_manifests(plan))
    # What a team stack's StackReference to this stack would read (--platform-outputs).
    (out_dir / "outputs.json").write_text(StackOutputs.of_plan(plan).to_json())
    return plan


def platform_config(stack: str, root: Path = ROOT) -> dict[str, str]:
    """A stack's config, with a placeholder project when its file leaves gcp:project to `pulumi config set`."""
    config = stack_config(stack, root)
    config.setdefault("gcp:project", PLACEHOLDER_PROJECT)
    return config


def platform_outputs_for(platform_stack: str, root: Path = ROOT) -> StackOutputs:
    """A platform stack's outputs from its offline plan, when its stack file is here (the stack part of
    <organization>/<project>/<stack>)."""
    short = platform_stack.rsplit("/", 1)[-1]
    if not (root / f"Pulumi.{short}.yaml").exists():
        raise FileNotFoundError(f"the stack {platform_stack} has no Pulumi.{short}.yaml here; pass its outputs "
                                "with --stack-outputs (or, for a team stack, --platform-outputs): the outputs.json "
                                "of its offline plan")
    return StackOutputs.of_plan(run_program(platform_config(short, root), stack=short))


def referenced_stacks(config: Mapping[str, str]) -> list[str]:
    """The stacks a stack's program reads through a StackReference: a team stack's platform, a fleet's members."""
    if PLATFORM_STACK_KEY in config:
        return [config[PLATFORM_STACK_KEY]]
    if FLEET_KEY in config:
        try:
            members = json.loads(config[FLEET_KEY]).get("members") or []
        except (ValueError, AttributeError):
            return []  # the program reports the bad key
        return [member for member in members if isinstance(member, str)]
    return []


def _stack_outputs_argument(text: str) -> tuple[str, Path]:
    stack, sep, path = text.partition("=")
    if not sep or not stack or not path:
        raise argparse.ArgumentTypeError(f"{text!r}: use <organization>/<project>/<stack>=<outputs.json>")
    return stack, Path(path)


def main(argv: list[str] | None = None) -> int:
    """The command: a stack the program refuses is one `error:` message and exit status 1, no traceback, as the
    Pulumi CLI prints a pulumi.RunError (SettingsError is one). Anything else is a bug: its traceback stays.
    Ref: https://github.com/pulumi/pulumi/blob/master/sdk/python/lib/pulumi/errors.py (RunError)"""
    try:
        return plan_command(argv)
    except pulumi.RunError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


def plan_command(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.offline", description=__doc__.split("\n\n")[0])
    parser.add_argument("stack", nargs="?", default="dev", help="stack name: reads Pulumi.<stack>.yaml")
    parser.add_argument("--config-file", type=Path, default=None, metavar="FILE",
                        help="the stack's config from FILE instead of Pulumi.<stack>.yaml, as the Pulumi CLI's "
                             "--config-file (referenced stacks are still read from this folder)")
    parser.add_argument("--out", type=Path, default=None, help="folder for plan.txt, manifests.yaml and outputs.json "
                                                                "(default build/plan/<stack>)")
    parser.add_argument("--platform-outputs", type=Path, default=None, metavar="JSON",
                        help="team stacks (tpu-fallback:platformStack set): the platform stack's outputs that answer "
                             "its StackReference, as the outputs.json an offline plan of the platform stack writes; "
                             "default: the offline plan of Pulumi.<stack>.yaml here, <stack> being the last part of "
                             "platformStack")
    parser.add_argument("--stack-outputs", type=_stack_outputs_argument, action="append", default=[],
                        metavar="STACK=JSON",
                        help="a referenced stack's outputs (<organization>/<project>/<stack>=outputs.json of its "
                             "offline plan), for a fleet's members or a team's platform; repeatable; default: the "
                             "offline plan of Pulumi.<stack>.yaml here")
    args = parser.parse_args(argv)
    config = stack_config(args.stack) if args.config_file is None else stack_config(args.stack,
                                                                                    stack_file=args.config_file)
    given = {stack: path for stack, path in args.stack_outputs}
    platform_stack = config.get(PLATFORM_STACK_KEY)
    if platform_stack is not None and args.platform_outputs is not None:
        given[platform_stack] = args.platform_outputs
    references = {}
    for referenced in referenced_stacks(config):
        if referenced in given:
            outputs, source = StackOutputs.from_json(given[referenced].read_text()), str(given[referenced])
        else:
            try:
                outputs = platform_outputs_for(referenced)
            except FileNotFoundError as err:
                parser.error(str(err))
            except pulumi.RunError as err:  # which stack it is: the message names keys of that stack's file
                raise pulumi.RunError(f"{referenced}, which this stack reads: {err}") from None
            source = f"the offline plan of Pulumi.{referenced.rsplit('/', 1)[-1]}.yaml"
        print(f"(the StackReference to {referenced} is answered by {source})")
        references[referenced] = outputs
    if platform_stack is None and "gcp:project" not in config:
        # Stack files leave the project to `pulumi config set gcp:project`; the offline plan needs one.
        print(f"(gcp:project is not set in Pulumi.{args.stack}.yaml; planning with {PLACEHOLDER_PROJECT})")
        config["gcp:project"] = PLACEHOLDER_PROJECT
    out_dir = args.out or ROOT / "build" / "plan" / args.stack
    plan = write_plan(args.stack, config, out_dir, references)
    sys.stdout.write((out_dir / "plan.txt").read_text())
    print(f"\n{len(plan.resources)} resources; Kubernetes objects written to {out_dir / 'manifests.yaml'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
