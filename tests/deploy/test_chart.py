"""The Helm chart renders, lints clean, validates strictly, and refuses bad values."""

from __future__ import annotations

import base64
import shutil
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import pytest
import yaml
from kubernetes_validate import utils as kv

from tests.deploy.chart import (
    CHART,
    FULL,
    KUBE_VERSIONS,
    MINIMAL,
    PARKED,
    VALUE_SETS,
    container,
    find,
    manifests,
    merged,
    notes,
    render,
    service,
    settings_map,
    validate_custom,
    validate_object,
)


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_lint_has_no_findings(name: str) -> None:
    report = helm.lint(CHART, VALUE_SETS[name], strict=True, namespace="streaming")
    findings = {(m["severity"], m["path"], m["error"]) for m in report["messages"]}
    assert report["total_charts_linted"] == 1
    assert report["errors"] == []
    assert findings == set()


@pytest.mark.parametrize("version", KUBE_VERSIONS)
@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_every_manifest_validates_strictly(name: str, version: str) -> None:
    objects = manifests(VALUE_SETS[name])
    assert objects
    for obj in objects:
        validate_object(obj, version)


def test_strict_validation_catches_an_unknown_field() -> None:
    """The validation above can fail: a misspelt field in a rendered object is an error,
    for the built-in kinds and for the ServiceMonitor schema alike."""
    objects = manifests(FULL)
    deployment = find(objects, "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}
    with pytest.raises(kv.ValidationError, match="livenesProbe"):
        validate_object(deployment, KUBE_VERSIONS[-1])
    monitor = find(objects, "ServiceMonitor")
    monitor["spec"]["endpoints"][0]["intervall"] = "15s"
    with pytest.raises(jsonschema.ValidationError, match="intervall"):
        validate_custom(monitor, KUBE_VERSIONS[-1])
    monitor = find(manifests(FULL), "ServiceMonitor")
    monitor["metadata"]["labelz"] = {}
    with pytest.raises(jsonschema.ValidationError, match="labelz"):
        validate_custom(monitor, KUBE_VERSIONS[-1])


def test_minimal_values_render_the_expected_objects() -> None:
    kinds = sorted(o["kind"] for o in manifests(MINIMAL))
    assert kinds == [
        "ConfigMap",
        "Deployment",
        "PodDisruptionBudget",
        "Secret",  # the replica secret, generated
        "Service",
        "Service",
        "Service",
        "ServiceAccount",
    ]


def test_full_values_render_the_optional_objects() -> None:
    kinds = sorted(o["kind"] for o in manifests(FULL))
    assert kinds == [
        "ConfigMap",
        "ConfigMap",  # the Kafka client settings file
        "ConfigMap",  # the Grafana dashboard
        "ConfigMap",  # the ACL file and the admin roles
        "Deployment",
        "PodDisruptionBudget",
        "Secret",  # the tokens
        "Secret",  # the replica secret, generated
        "Service",
        "Service",
        "Service",
        "ServiceAccount",
        "ServiceMonitor",
    ]


def test_every_object_carries_the_standard_labels() -> None:
    for values in VALUE_SETS.values():
        for obj in manifests(values):
            labels = obj["metadata"]["labels"]
            for key in (
                "app.kubernetes.io/name",
                "app.kubernetes.io/instance",
                "app.kubernetes.io/version",
                "app.kubernetes.io/managed-by",
                "app.kubernetes.io/component",
                "helm.sh/chart",
            ):
                assert labels.get(key), f"{obj['kind']} {obj['metadata']['name']} lacks {key}"
            assert obj["metadata"]["namespace"] == "streaming"


def pod_labels(objects: list[dict[str, Any]]) -> dict[str, str]:
    labels = find(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    return dict(labels)


def test_three_replicas_rolled_one_at_a_time() -> None:
    """Replicas fence each other through coordinator epochs, so an old and a new one may
    run side by side: one new pod at a time, and no old one goes before it is ready."""
    deployment = find(manifests(MINIMAL), "Deployment")
    assert deployment["spec"]["replicas"] == 3
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    assert find(manifests(FULL), "Deployment")["spec"]["replicas"] == FULL["replicaCount"]
    assert find(manifests(PARKED), "Deployment")["spec"]["replicas"] == 0
    assert "PARKED" in notes(PARKED)
    assert "standbys only" not in notes(MINIMAL)
    assert "standbys only" in notes(merged(MINIMAL, {"replicaCount": 7}))


def test_disruption_budget_lets_one_replica_go_at_a_time() -> None:
    objects = manifests(MINIMAL)
    budget = find(objects, "PodDisruptionBudget")["spec"]
    assert budget["maxUnavailable"] == 1
    assert "minAvailable" not in budget
    assert budget["selector"]["matchLabels"].items() <= pod_labels(objects).items()
    full = find(manifests(FULL), "PodDisruptionBudget")["spec"]
    assert full["maxUnavailable"] == FULL["podDisruptionBudget"]["maxUnavailable"]
    # One replica (or none): a budget could only allow a drain or block it for good.
    for values in (merged(MINIMAL, {"replicaCount": 1}), PARKED):
        assert not [o for o in manifests(values) if o["kind"] == "PodDisruptionBudget"]
    off = merged(MINIMAL, {"podDisruptionBudget": {"enabled": False}})
    assert not [o for o in manifests(off) if o["kind"] == "PodDisruptionBudget"]


def test_headless_service_lists_the_ready_replicas_for_consumers() -> None:
    """Consumers are given the headless Service's name: it resolves to every ready pod,
    which they reach directly, so its port is the container's consumer port."""
    for values in (MINIMAL, FULL):
        objects = manifests(values)
        replicas = service(objects, "replicas")["spec"]
        assert replicas["clusterIP"] == "None"
        assert replicas["publishNotReadyAddresses"] is False
        assert replicas["selector"].items() <= pod_labels(objects).items()
        ports = {p["name"]: p["containerPort"] for p in container(objects)["ports"]}
        (port,) = replicas["ports"]
        assert (port["name"], port["targetPort"]) == ("consumer", "consumer")
        assert port["port"] == ports["consumer"]
        name = service(objects, "replicas")["metadata"]["name"]
        assert f'coordinator="{name}.streaming.svc:{ports["consumer"]}"' in notes(values)
    # The consumer Service is still there, for first contact.
    assert service(manifests(MINIMAL), "consumer")["spec"]["type"] == "ClusterIP"


def test_each_replica_names_itself_and_its_address_from_the_downward_api() -> None:
    for values in (MINIMAL, FULL, PARKED):
        env = container(manifests(values))["env"]
        names = [e["name"] for e in env]
        by_name = {e["name"]: e for e in env}
        assert by_name["POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
        assert by_name["KEYSHARD_REPLICA_ID"]["valueFrom"] == {
            "fieldRef": {"fieldPath": "metadata.name"}
        }
        port = merged({"ports": {"consumer": 7171}}, values)["ports"]["consumer"]
        assert by_name["KEYSHARD_ADVERTISE"]["value"] == f"$(POD_IP):{port}"
        # Kubernetes expands $(POD_IP) only from entries defined before it.
        assert names.index("POD_IP") < names.index("KEYSHARD_ADVERTISE")


def test_security_context_is_locked_down() -> None:
    objects = manifests(MINIMAL)
    pod = find(objects, "Deployment")["spec"]["template"]["spec"]
    ctx = container(objects)["securityContext"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert ctx["readOnlyRootFilesystem"] is True
    assert ctx["allowPrivilegeEscalation"] is False
    assert ctx["capabilities"] == {"drop": ["ALL"]}
    assert ctx["runAsUser"] != 0
    assert pod["automountServiceAccountToken"] is False
    assert pod["enableServiceLinks"] is False
    mounts = container(objects)["volumeMounts"]
    assert {m["mountPath"] for m in mounts if not m.get("readOnly")} == {
        "/tmp"
    }  # the only writable path


def test_resources_come_from_values() -> None:
    assert container(manifests(FULL))["resources"] == FULL["resources"]


TOKENS = "ks-keyshard"  # the chart's Secret of the tokens in FULL
REPLICA_SECRET = "ks-keyshard-replica-secret"


def test_tokens_go_to_a_secret_never_the_configmap() -> None:
    objects = manifests(FULL)
    secret = find(objects, "Secret", TOKENS)
    decoded = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert decoded == {"consumer-token": "consumer-secret", "admin-token": "admin-secret"}
    settings = yaml.safe_dump(settings_map(objects)["data"])
    assert not [token for token in decoded.values() if token in settings]
    env = {e["name"]: e for e in container(objects)["env"]}
    tokens = {"KEYSHARD_AUTH_TOKEN": "consumer-token", "KEYSHARD_ADMIN_TOKEN": "admin-token"}
    for var, key in tokens.items():
        ref = env[var]["valueFrom"]["secretKeyRef"]
        assert ref == {"name": secret["metadata"]["name"], "key": key}


def test_existing_secret_is_referenced_not_created() -> None:
    objects = manifests(PARKED)
    assert [o["metadata"]["name"] for o in objects if o["kind"] == "Secret"] == [REPLICA_SECRET]
    env = {e["name"]: e for e in container(objects)["env"]}
    downward = {"POD_IP", "KEYSHARD_REPLICA_ID", "KEYSHARD_ADVERTISE"}
    assert set(env) - downward == {"KEYSHARD_ADMIN_TOKEN"}  # consumerTokenKey "": none
    assert env["KEYSHARD_ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": "keyshard-tokens",
        "key": "admin-token",
    }


def test_service_monitor_scrapes_metrics_with_the_admin_token() -> None:
    objects = manifests(FULL)
    monitor = find(objects, "ServiceMonitor")
    admin, consumer = service(objects, "admin"), service(objects, "consumer")
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= admin["metadata"]["labels"].items()
    assert not selector.items() <= consumer["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in admin["spec"]["ports"]}
    assert endpoint["authorization"]["credentials"] == {
        "name": find(objects, "Secret", TOKENS)["metadata"]["name"],
        "key": "admin-token",
    }
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_service_monitor_scrapes_with_a_viewers_token_when_given_one() -> None:
    viewer = {"serviceMonitor": {"tokenSecret": {"name": "monitoring", "key": "viewer-token"}}}
    (endpoint,) = find(manifests(merged(FULL, viewer)), "ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["authorization"]["credentials"] == {
        "name": "monitoring",
        "key": "viewer-token",
    }


def test_tls_files_are_mounted_where_the_daemon_reads_them() -> None:
    """Each TLS variable names a file inside the volume of its Secret; the probes and
    the ServiceMonitor speak HTTPS to an HTTPS admin API."""
    objects = manifests(FULL)
    env = settings_map(objects)["data"]
    pod = find(objects, "Deployment")["spec"]["template"]["spec"]
    mounts = {m["mountPath"]: m["name"] for m in container(objects)["volumeMounts"]}
    secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    expected = {
        "KEYSHARD_TLS_CERT_FILE": ("keyshard-tls", "tls.crt"),
        "KEYSHARD_TLS_KEY_FILE": ("keyshard-tls", "tls.key"),
        "KEYSHARD_TLS_CLIENT_CA_FILE": ("keyshard-tls", "ca.crt"),
        "KEYSHARD_ADMIN_TLS_CERT_FILE": ("keyshard-admin-tls", "tls.crt"),
        "KEYSHARD_ADMIN_TLS_KEY_FILE": ("keyshard-admin-tls", "tls.key"),
    }
    for variable, (secret, key) in expected.items():
        folder, _, file = env[variable].rpartition("/")
        assert (secrets[mounts[folder]], file) == (secret, key), variable
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container(objects)[probe]["httpGet"]["scheme"] == "HTTPS"
    (endpoint,) = find(objects, "ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"] == {
        "ca": {"secret": {"name": "keyshard-admin-tls", "key": "ca.crt"}},
        "serverName": f"{service(objects, 'admin')['metadata']['name']}.streaming.svc",
    }
    # Without TLS: no volume, no variable, plain HTTP.
    plain = manifests(MINIMAL)
    assert not any(k.startswith(("KEYSHARD_TLS", "KEYSHARD_ADMIN_TLS")) for k in
                   find(plain, "ConfigMap")["data"])  # fmt: skip
    assert container(plain)["livenessProbe"]["httpGet"]["scheme"] == "HTTP"
    assert [
        v["name"] for v in find(plain, "Deployment")["spec"]["template"]["spec"]["volumes"]
    ] == ["tmp", "replica-secret"]


def test_replicas_share_a_replica_secret_the_chart_generates_or_takes() -> None:
    """Every pod reads the replica secret from the file its Secret is mounted as: the
    chart's own (a random one, no token of the values in it), or the user's."""
    for values, secret_name in (
        (MINIMAL, REPLICA_SECRET),
        (merged(MINIMAL, {"replicaSecret": {"existingSecret": "mine", "key": "s"}}), "mine"),
    ):
        objects = manifests(values)
        path = settings_map(objects)["data"]["KEYSHARD_REPLICA_SECRET_FILE"]
        pod = find(objects, "Deployment")["spec"]["template"]["spec"]
        mounts = {m["mountPath"]: m["name"] for m in container(objects)["volumeMounts"]}
        folder, _, key = path.rpartition("/")
        (volume,) = [v for v in pod["volumes"] if v["name"] == mounts[folder]]
        assert volume["secret"]["secretName"] == secret_name
        assert key == values.get("replicaSecret", {}).get("key", "replica-secret")
    generated = find(manifests(MINIMAL), "Secret", REPLICA_SECRET)
    (value,) = generated["data"].values()
    assert len(base64.b64decode(value)) >= 32
    taken = manifests(merged(MINIMAL, {"replicaSecret": {"existingSecret": "mine"}}))
    assert not [o for o in taken if o["kind"] == "Secret"]
    # Not in the pod's checksums: keeping it over an upgrade restarts nothing.
    annotations = find(manifests(MINIMAL), "Deployment")["spec"]["template"]["metadata"]
    assert not [a for a in annotations["annotations"] if "replica" in a]


def test_config_change_restarts_the_pod() -> None:
    def checksum(values: dict[str, Any]) -> str:
        annotations = find(manifests(values), "Deployment")["spec"]["template"]["metadata"]
        return str(annotations["annotations"]["checksum/config"])

    assert checksum(MINIMAL) != checksum(merged(MINIMAL, {"config": {"drainTimeoutMs": 5000}}))


# --- values the schema refuses, each with the message a user sees --------------------

BAD_VALUES = [
    pytest.param({}, r"/config/bootstrapServers': minLength: got 0, want 1", id="no-bootstrap"),
    pytest.param(
        {"config": {"bootstrapServers": None}},
        r"at '/config': missing property 'bootstrapServers'",
        id="null-bootstrap",
    ),
    pytest.param(
        {"config": {"bootstrapServers": "kafka"}},
        r"/config/bootstrapServers': 'kafka' does not match pattern",
        id="bootstrap-without-port",
    ),
    pytest.param(
        merged(MINIMAL, {"config": {"drainTimeoutMs": "10s"}}),
        r"/config/drainTimeoutMs': got string, want integer",
        id="wrong-type",
    ),
    pytest.param(
        merged(MINIMAL, {"config": {"rebalanceThreshold": 1}}),
        r"/config/rebalanceThreshold': exclusiveMinimum",
        id="threshold-not-above-1",
    ),
    pytest.param(
        merged(MINIMAL, {"config": {"assignor": "round-robin"}}),
        r"/config/assignor': value must be one of",
        id="unknown-assignor",
    ),
    pytest.param(
        merged(MINIMAL, {"config": {"groupAssignors": {"orders": "nope"}}}),
        r"/config/groupAssignors/orders': value must be one of",
        id="unknown-group-assignor",
    ),
    pytest.param(
        merged(MINIMAL, {"config": {"autoOffsetReset": "smallest"}}),
        r"/config/autoOffsetReset': value must be one of",
        id="unknown-offset-reset",
    ),
    pytest.param(
        merged(MINIMAL, {"config": {"groupAutoOffsetResets": {"orders": "none"}}}),
        r"/config/groupAutoOffsetResets/orders': value must be one of",
        id="unknown-group-offset-reset",
    ),
    pytest.param(
        merged(MINIMAL, {"replicaCount": -1}),
        r"/replicaCount': minimum: got -1, want 0",
        id="negative-replicas",
    ),
    pytest.param(
        merged(MINIMAL, {"config": {"statePartitions": 0}}),
        r"/config/statePartitions': minimum: got 0, want 1",
        id="no-state-partitions",
    ),
    pytest.param(
        merged(MINIMAL, {"config": {"replicaTimeoutMs": 400}}),
        r"/config/replicaTimeoutMs': minimum: got 400, want 1,000",
        id="replica-timeout-below-two-beats",
    ),
    pytest.param(
        merged(MINIMAL, {"config": {"startupGraceMs": 10_500}}),
        r"additional properties 'startupGraceMs' not allowed",
        id="startup-grace-is-gone",
    ),
    pytest.param(
        merged(MINIMAL, {"podDisruptionBudget": {"minAvailable": 2}}),
        r"additional properties 'minAvailable' not allowed",
        id="pdb-min-available",
    ),
    pytest.param(
        merged(MINIMAL, {"ports": {"admin": 70000}}),
        r"/ports/admin': maximum: got 70,000, want 65,535",
        id="port-range",
    ),
    pytest.param(
        merged(MINIMAL, {"auth": {"existingSecret": "mine", "adminToken": "x"}}),
        r"/auth/adminToken': maxLength: got 1, want 0",
        id="token-and-existing-secret",
    ),
    pytest.param(
        merged(MINIMAL, {"config": {"drainTimeoutMS": 5}}),
        r"additional properties 'drainTimeoutMS' not allowed",
        id="misspelt-key",
    ),
    pytest.param(
        merged(MINIMAL, {"tls": {"requireClientCert": True}}),
        r"/tls/existingSecret': minLength: got 0, want 1",
        id="client-certs-without-tls",
    ),
    pytest.param(
        merged(MINIMAL, {"serviceMonitor": {"interval": "15 seconds"}}),
        r"/serviceMonitor/interval': '15 seconds' does not match pattern",
        id="bad-duration",
    ),
    pytest.param(
        merged(MINIMAL, {"kafka": {"config": {"sasl.password": "in-a-configmap"}}}),
        r"/kafka/config': 'not' failed",
        id="kafka-secret-in-config",
    ),
    pytest.param(
        merged(MINIMAL, {"kafka": {"secretRefs": {"sasl.password": {"name": "s"}}}}),
        r"/kafka/secretRefs/sasl.password': missing property 'key'",
        id="kafka-secret-ref-without-key",
    ),
    pytest.param(
        merged(
            MINIMAL, {"grafanaDashboard": {"enabled": True, "labels": {"grafana_dashboard": 1}}}
        ),
        r"/grafanaDashboard/labels/grafana_dashboard': got number, want string",
        id="dashboard-label-not-a-string",
    ),
]


@pytest.mark.parametrize(("values", "message"), BAD_VALUES)
def test_schema_refuses_bad_values(values: dict[str, Any], message: str) -> None:
    with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmValuesError, match=message):
        chart.validate_schema(values)
    with pytest.raises(helm.HelmValuesError, match="don't meet the specifications"):
        render(values)


def test_a_bad_values_file_is_refused(tmp_path: Path) -> None:
    """The same through a YAML file, as `helm install -f bad.yaml` reads it."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("config:\n  bootstrapServers: kafka:9092\n  replicaTimeoutMs: soon\n")
    values = helm.values_from_yaml(bad.read_text())
    message = r"/config/replicaTimeoutMs': got string, want integer"
    with pytest.raises(helm.HelmValuesError, match=message):
        render(values)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({}, "config.bootstrapServers is required"),
        (
            merged(MINIMAL, {"config": {"adminAuthReads": True}}),
            "config.adminAuthReads needs an admin token",
        ),
        (
            merged(MINIMAL, {"tls": {"requireClientCert": True}}),
            "tls.requireClientCert needs tls.existingSecret",
        ),
        (
            merged(MINIMAL, {"serviceMonitor": {"tokenSecret": {"name": "monitoring"}}}),
            "serviceMonitor.tokenSecret.name needs serviceMonitor.tokenSecret.key",
        ),
    ],
)
def test_template_guards_hold_without_the_schema(
    tmp_path: Path, values: dict[str, Any], message: str
) -> None:
    """`helm install --skip-schema-validation` still gets the reason, from the templates."""
    chart = tmp_path / "keyshard"
    shutil.copytree(CHART, chart)
    (chart / "values.schema.json").unlink()
    with pytest.raises(helm.HelmRenderError, match=message):
        render(values, chart)


def undocumented_keys(text: str) -> list[str]:
    """Keys of a values.yaml without a comment block right above them. A block starting
    with `# --` documents a whole value: a mapping under it (a securityContext, say) is
    that value's content and needs no comments of its own; a plain `#` block documents a
    group whose keys each need one."""
    lines = text.splitlines()
    missing: list[str] = []
    path: list[tuple[int, str]] = []
    opaque_below: int | None = None
    for number, line in enumerate(lines):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        indent = len(line) - len(line.lstrip())
        if opaque_below is not None:
            if indent > opaque_below:
                continue
            opaque_below = None
        key = stripped.split(":", 1)[0]
        path = [(i, k) for i, k in path if i < indent] + [(indent, key)]
        block: list[str] = []
        back = number - 1
        while back >= 0 and lines[back].strip().startswith("#"):
            block.insert(0, lines[back].strip())
            back -= 1
        if not block:
            missing.append(".".join(k for _, k in path))
        elif block[0].startswith("# --"):
            opaque_below = indent
    return missing


def test_every_values_key_has_a_comment() -> None:
    assert undocumented_keys((CHART / "values.yaml").read_text(encoding="utf-8")) == []


def test_the_comment_check_can_fail() -> None:
    text = "# group\ngroup:\n  # -- fine\n  a: 1\n  b: 2\n# -- whole value\nctx:\n  x: 1\n"
    assert undocumented_keys(text) == ["group.b"]
