"""The Kueue Helm chart rendered with the values the stack passes, and what of it the tier runs.

The release `infra/kueue.py` declares installs CRDs, webhook configurations, a manager ConfigMap and a Deployment.
The tier applies the same CRDs and webhooks (pointed at a Kueue process on 127.0.0.1) and runs the manager with
the rendered configuration, changed only where a process outside a Pod needs it.
"""

from __future__ import annotations

import base64
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

import yaml

from infra.kueue import MANAGER_CONFIG_KEY, NAMESPACE, RELEASE_NAME
from testbed import build

CONFIG_KEY = MANAGER_CONFIG_KEY  # the chart's ConfigMap key
# libyaml's loader: the chart's and KubeRay's CRDs are megabytes of YAML, and PyYAML's pure-Python scanner spent
# ~10 s of CPU per control plane start parsing them (profiled), a third of a plane's start.
YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml(text: str):
    return yaml.load(text, Loader=YAML_LOADER)
MANAGER_CONTAINER = "manager"
# The webhooks that judge our objects. The chart also registers webhooks on Pods, Jobs, Deployments…; no
# such objects are created here, and no kubelet exists to run them.
WEBHOOK_GROUPS = ("kueue.x-k8s.io", "ray.io")
# The visibility API server needs in-cluster serving (an APIService behind a Service).
TIER_FEATURE_GATES = {"VisibilityOnDemand": "false"}


@dataclass(frozen=True)
class RenderedChart:
    documents: list[dict]

    def of_kind(self, kind: str) -> list[dict]:
        return [doc for doc in self.documents if doc.get("kind") == kind]

    def manager_args(self) -> list[str]:
        (deployment,) = [d for d in self.of_kind("Deployment") if d["metadata"]["name"].endswith("controller-manager")]
        (container,) = [c for c in deployment["spec"]["template"]["spec"]["containers"]
                        if c["name"] == MANAGER_CONTAINER]
        return list(container.get("args", []))

    def feature_gate_args(self) -> list[str]:
        return [arg for arg in self.manager_args() if arg.startswith("--feature-gates")]

    def manager_config(self) -> dict:
        (config_map,) = [c for c in self.of_kind("ConfigMap") if CONFIG_KEY in (c.get("data") or {})]
        return yaml.safe_load(config_map["data"][CONFIG_KEY])

    def crds(self) -> list[dict]:
        return self.of_kind("CustomResourceDefinition")


def render(values: dict, workdir: Path) -> RenderedChart:
    """`helm template` of the Kueue chart shipped in the pinned Kueue module, as the stack's Release would."""
    chart = build.module_dir("kueue") / "charts" / "kueue"
    values_file = workdir / "kueue-values.json"
    values_file.write_text(json.dumps(values))
    rendered = subprocess.run(
        [str(build.build("helm")), "template", RELEASE_NAME, str(chart), "--namespace", NAMESPACE,
         "--values", str(values_file)],
        check=True, text=True, capture_output=True).stdout
    return RenderedChart([doc for doc in yaml.load_all(rendered, Loader=YAML_LOADER) if doc])


def with_feature_gates(args: list[str], extra: dict[str, str]) -> list[str]:
    """The chart's single --feature-gates argument with the tier's gates added (one argument, not two)."""
    gates = [arg for arg in args if arg.startswith("--feature-gates=")]
    rest = [arg for arg in args if not arg.startswith("--feature-gates=") and not arg.startswith("--config")]
    merged = [gates[0].split("=", 1)[1]] if gates else []
    merged += [f"{name}={value}" for name, value in extra.items()]
    return [*rest, f"--feature-gates={','.join(merged)}"]


def out_of_cluster_config(config: dict, health_port: int, webhook_port: int, cert_dir: Path) -> dict:
    """The chart's manager configuration, changed only where a process outside a Pod needs it."""
    config = json.loads(json.dumps(config))  # a deep copy
    config["health"] = {**config.get("health", {}), "healthProbeBindAddress": f"127.0.0.1:{health_port}"}
    config["metrics"] = {**config.get("metrics", {}), "bindAddress": "0"}
    config["webhook"] = {**config.get("webhook", {}), "host": "127.0.0.1", "port": webhook_port,
                         "certDir": str(cert_dir)}
    config["leaderElection"] = {**config.get("leaderElection", {}), "leaderElect": False}
    config["internalCertManagement"] = {"enable": False}
    config.pop("pprofBindAddress", None)
    return config


def _url_config(path: str, webhook_port: int, ca_pem: bytes) -> dict:
    return {"url": f"https://127.0.0.1:{webhook_port}{path}", "caBundle": base64.b64encode(ca_pem).decode()}


def local_crd(crd: dict, webhook_port: int, ca_pem: bytes) -> dict:
    """A chart CRD whose conversion webhook calls the local Kueue instead of the in-cluster Service."""
    crd = json.loads(json.dumps(crd))
    crd["metadata"].get("annotations", {}).pop("cert-manager.io/inject-ca-from", None)
    conversion = crd["spec"].get("conversion") or {}
    if conversion.get("strategy") == "Webhook":
        client = conversion["webhook"]["clientConfig"]
        conversion["webhook"]["clientConfig"] = _url_config(client["service"].get("path", "/convert"),
                                                            webhook_port, ca_pem)
    return crd


def local_webhook_configurations(chart: RenderedChart, webhook_port: int, ca_pem: bytes) -> list[dict]:
    """The chart's webhook configurations, keeping the webhooks for our groups, called by URL."""
    configurations = []
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        for configuration in chart.of_kind(kind):
            configuration = json.loads(json.dumps(configuration))
            configuration["metadata"].pop("annotations", None)
            kept = []
            for webhook in configuration.get("webhooks", []):
                groups = {group for rule in webhook.get("rules", []) for group in rule.get("apiGroups", [])}
                if not groups & set(WEBHOOK_GROUPS):
                    continue
                webhook["clientConfig"] = _url_config(webhook["clientConfig"]["service"]["path"],
                                                      webhook_port, ca_pem)
                kept.append(webhook)
            if kept:
                configuration["webhooks"] = kept
                configurations.append(configuration)
    return configurations
