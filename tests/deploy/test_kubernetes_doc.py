"""docs/operations/kubernetes.md's worker Deployment, validated strictly like the chart's manifests,
and the Grafana dashboard the chart ships: what the doc and the dashboard promise must
hold for the worker as it is."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from keyshard.cli.parser import build_parser
from tests.deploy.chart import (
    DASHBOARD,
    FULL,
    KUBE_VERSIONS,
    MINIMAL,
    ROOT,
    find,
    manifests,
    validate_object,
)

DOC = ROOT / "docs" / "operations" / "kubernetes.md"


def doc_manifests(path: Path = DOC) -> list[dict[str, Any]]:
    """Every object in the doc's ```yaml blocks."""
    blocks = re.findall(r"```yaml\n(.*?)```", path.read_text(encoding="utf-8"), re.S)
    return [doc for block in blocks for doc in yaml.safe_load_all(block) if doc]


def worker_container() -> tuple[dict[str, Any], dict[str, Any]]:
    deployment = find(doc_manifests(), "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    return pod, container


def worker_flag_variables() -> set[str]:
    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command")
    worker = commands.choices["worker"]  # type: ignore[index]
    return {
        "KEYSHARD_" + o.lstrip("-").replace("-", "_").upper()
        for a in worker._actions
        for o in a.option_strings
        if o.startswith("--") and o != "--help"
    }


@pytest.mark.parametrize("version", KUBE_VERSIONS)
def test_the_worker_deployment_validates_strictly(version: str) -> None:
    objects = doc_manifests()
    assert [o["kind"] for o in objects] == ["Deployment"]
    for obj in objects:
        validate_object(obj, version)


def test_the_worker_deployment_runs_keyshard_worker_with_known_variables() -> None:
    _, container = worker_container()
    assert container["args"][:2] == ["keyshard", "worker"]
    assert re.fullmatch(r"[\w.]+:\w+", container["args"][2])
    names = {e["name"] for e in container["env"]}
    unknown = names - worker_flag_variables()
    assert not unknown, f"variables no `keyshard worker` flag reads: {unknown}"


def test_probes_use_the_worker_endpoints_and_grace_outlasts_the_drain() -> None:
    pod, container = worker_container()
    env = {e["name"]: e.get("value") for e in container["env"]}
    port = int(env["KEYSHARD_METRICS_LISTEN"].rsplit(":", 1)[1])
    (named,) = [p for p in container["ports"] if p["name"] == "metrics"]
    assert named["containerPort"] == port
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    drain_s = int(env["KEYSHARD_DRAIN_TIMEOUT_MS"]) / 1000
    assert pod["terminationGracePeriodSeconds"] > drain_s
    assert container["resources"]["requests"] and container["resources"]["limits"]


def dashboard_metric_names(dashboard: dict[str, Any]) -> set[str]:
    """Every keyshard metric name a query of the dashboard (panels and variables) uses."""
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    exprs += [v["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    return {name for e in exprs for name in re.findall(r"\bkeyshard_[a-z0-9_]+", e)}


def test_the_dashboard_configmap_carries_the_dashboard_for_the_sidecar() -> None:
    assert not [o for o in manifests(MINIMAL) if o["metadata"]["name"].endswith("-dashboard")]
    config_map = find(manifests(FULL), "ConfigMap", "ks-keyshard-dashboard")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["annotations"] == {"grafana_folder": "Streaming"}
    shipped = json.loads(config_map["data"]["keyshard.json"])
    assert shipped == json.loads(DASHBOARD.read_text(encoding="utf-8"))
    assert {"keyshard_group_members", "keyshard_consumer_handler_seconds_bucket"} <= (
        dashboard_metric_names(shipped)
    )
