"""Render the Helm chart in-process (helm-python-sdk: Helm's Go SDK through a bundled
shared library; no helm binary, no cluster, no network) and validate what comes out."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import yaml
from kubernetes_validate import utils as kv
from referencing import Registry, Resource

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "keyshard"
NAMESPACE = "streaming"
RELEASE = "ks"
# The chart's kubeVersion floor and the newest schemas kubernetes-validate ships.
KUBE_VERSIONS = ("1.25.0", kv.latest_version())

# The one value the chart cannot default: where Kafka is.
MINIMAL: dict[str, Any] = {"config": {"bootstrapServers": "kafka-0.kafka:9092"}}

# Everything non-default at once: every daemon setting changed, tokens on (the chart's
# own Secret), reads protected, ServiceMonitor, Grafana dashboard, PDB, more replicas,
# resources and the rest.
FULL: dict[str, Any] = {
    "replicaCount": 5,
    "image": {"repository": "registry.example/keyshard", "tag": "9.9.9", "pullPolicy": "Always"},
    "imagePullSecrets": [{"name": "regcred"}],
    "config": {
        "bootstrapServers": "kafka-0.kafka:9092,kafka-1.kafka:9092",
        "stateTopic": "__keyshard_state_prod",
        "statePartitions": 12,
        "replicaTimeoutMs": 3_000,
        "leaderFailoverMs": 25_000,
        "assignor": "balanced",
        "groupAssignors": {"orders": "sticky", "audit": "consistent-hash"},
        "autoOffsetReset": "latest",
        "groupAutoOffsetResets": {"orders": "earliest", "clicks": "latest"},
        "drainTimeoutMs": 12_345,
        "lostMemberMarginMs": 750,
        "stallTimeoutMs": 15_000,
        "rebalanceThreshold": 1.5,
        "rebalanceHoldMs": 45_000,
        "backlogHoldMs": 1_500,
        "backlogRecords": 300,
        "demandHorizonMs": 3_000,
        "balanceCheckMs": 2_500,
        "loadHalfLifeMs": 60_000,
        "maxCapacity": 64,
        "minSessionTimeoutMs": 2_000,
        "maxSessionTimeoutMs": 45_000,
        "maxMembersPerGroup": 2_500,
        "maxGroups": 300,
        "maxSpeedFactor": 2.5,
        "adminAuthReads": True,
        "logLevel": "DEBUG",
        "listenHost": "0.0.0.0",
        "registerTimeoutMs": 5_000,
        "maxConnections": 5_000,
        "maxConnectionsPerPeer": 200,
        "preAuthMaxFrameBytes": 131_072,
    },
    "kafka": {
        "config": {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": "keyshard",
            "ssl.ca.location": "/etc/keyshard/kafka-tls/ca.crt",
        },
        "secretRefs": {"sasl.password": {"name": "kafka-credentials", "key": "password"}},
        "tlsSecret": "kafka-tls",
    },
    "auth": {"consumerToken": "consumer-secret", "adminToken": "admin-secret"},
    "access": {
        "consumerTokenPrincipal": "User:legacy-consumers",
        "tokensSecret": "keyshard-tokens",
        "consumerTokensKey": "consumer-tokens",
        "adminTokensKey": "admin-tokens",
        "sslPrincipalMappingRules": "RULE:^CN=(.*?),OU=.*$/$1/L, DEFAULT",
        "jwtJwksUrl": "https://issuer.example/.well-known/jwks.json",
        "jwtIssuer": "https://issuer.example",
        "jwtAudience": "keyshard",
        "jwtPrincipalClaim": "client_id",
        "authorizer": "acl-file",
        "acls": "User:team-a allow Read Group prefixed team-a.\n",
        "aclCacheMs": 5_000,
        "adminRoles": "User:team-a operator team-a.*\n",
    },
    "tls": {"existingSecret": "keyshard-tls", "requireClientCert": True},
    "adminTls": {"existingSecret": "keyshard-admin-tls"},
    "ports": {"consumer": 9171, "admin": 9172},
    "service": {
        "consumer": {"type": "LoadBalancer", "port": 7171, "annotations": {"a/b": "c"}},
        "admin": {"type": "ClusterIP", "port": 8080},
    },
    "extraEnv": [{"name": "TZ", "value": "UTC"}],
    "extraArgs": [],
    "serviceAccount": {"create": True, "name": "keyshard-sa", "annotations": {"x/y": "z"}},
    "podAnnotations": {"team": "streaming"},
    "podLabels": {"tier": "control"},
    "resources": {
        "requests": {"cpu": "250m", "memory": "256Mi"},
        "limits": {"cpu": "1", "memory": "1Gi"},
    },
    "podDisruptionBudget": {"enabled": True, "maxUnavailable": 2},
    "serviceMonitor": {
        "enabled": True,
        "labels": {"release": "kube-prometheus-stack"},
        "interval": "15s",
        "scrapeTimeout": "5s",
    },
    "grafanaDashboard": {
        "enabled": True,
        "labels": {"grafana_dashboard": "1"},
        "annotations": {"grafana_folder": "Streaming"},
    },
    "nodeSelector": {"kubernetes.io/os": "linux"},
    "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
    "priorityClassName": "high",
}

# A parked release (no coordinator), tokens from a Secret the user manages.
PARKED: dict[str, Any] = {
    "replicaCount": 0,
    "config": {"bootstrapServers": "kafka:9092"},
    "auth": {"existingSecret": "keyshard-tokens", "consumerTokenKey": ""},
    "serviceAccount": {"create": False},
}

VALUE_SETS = {"minimal": MINIMAL, "full": FULL, "parked": PARKED}


def merged(*layers: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge value layers, later ones winning (as repeated `-f` files do)."""
    out: dict[str, Any] = {}
    for layer in layers:
        for key, value in layer.items():
            if isinstance(value, dict) and isinstance(out.get(key), dict):
                out[key] = merged(out[key], value)
            else:
                out[key] = copy.deepcopy(value)
    return out


def render(values: dict[str, Any], chart: Path = CHART) -> dict[str, str]:
    """Template path -> rendered text, as `helm template` would print them."""
    with helm.Chart.load(chart) as loaded:
        return loaded.render(values=values, name=RELEASE, namespace=NAMESPACE, is_install=True)


def manifests(values: dict[str, Any]) -> list[dict[str, Any]]:
    """Every Kubernetes object the chart renders (NOTES.txt is not one)."""
    objects: list[dict[str, Any]] = []
    for path, text in sorted(render(values).items()):
        if path.endswith("NOTES.txt"):
            continue
        objects.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return objects


def notes(values: dict[str, Any]) -> str:
    return next(text for path, text in render(values).items() if path.endswith("NOTES.txt"))


def find(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and name in (None, o["metadata"]["name"])]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


DASHBOARD = CHART / "dashboards" / "keyshard.json"


def settings_map(objects: list[dict[str, Any]]) -> dict[str, Any]:
    """The ConfigMap of the daemon's KEYSHARD_* settings (not the Kafka settings file's)."""
    return find(objects, "ConfigMap", f"{RELEASE}-keyshard")


def service(objects: list[dict[str, Any]], suffix: str) -> dict[str, Any]:
    """The Service whose name ends in -consumer, -replicas or -admin."""
    (found,) = [
        o
        for o in objects
        if o["kind"] == "Service" and o["metadata"]["name"].endswith(f"-{suffix}")
    ]
    return found


def container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    pod = find(objects, "Deployment")["spec"]["template"]["spec"]
    (coordinator,) = [c for c in pod["containers"] if c["name"] == "coordinator"]
    return dict(coordinator)


# ServiceMonitor is a CRD (prometheus-operator), so kubernetes-validate has no schema for
# it. servicemonitor.schema.json is ours: written from prometheus-operator's API reference
# for monitoring.coreos.com/v1 and limited to the fields this chart renders, each object
# closed (additionalProperties: false) like the strict Kubernetes schemas; metadata and
# the label selector are checked against the real Kubernetes definitions.
_SERVICE_MONITOR_SCHEMA = json.loads(
    (Path(__file__).with_name("servicemonitor.schema.json")).read_text(encoding="utf-8")
)


def _k8s_definitions(version: str) -> Resource[Any]:
    major_minor = ".".join(version.split(".")[:2])
    available = [v for v in kv.all_versions() if kv.major_minor(v) == major_minor]
    path = f"kubernetes-json-schema/v{available[0]}-local-strict/_definitions.json"
    return Resource.from_contents(kv.schema_contents(path, version))


def validate_custom(obj: dict[str, Any], version: str) -> None:
    """Validate a ServiceMonitor; raises jsonschema.ValidationError with the path."""
    registry: Registry[Any] = _k8s_definitions(version) @ Registry()
    jsonschema.Draft202012Validator(_SERVICE_MONITOR_SCHEMA, registry=registry).validate(obj)


def validate_object(obj: dict[str, Any], version: str) -> None:
    """Strict validation (unknown fields are errors) of one rendered object."""
    if obj["apiVersion"] == "monitoring.coreos.com/v1" and obj["kind"] == "ServiceMonitor":
        validate_custom(obj, version)
    else:
        kv.validate(obj, version, strict=True)
