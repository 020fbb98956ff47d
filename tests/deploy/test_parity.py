"""The chart, the Dockerfile and the docs agree with what `keyshard coordinator`
accepts. Everything is read from the code (build_parser(), the admin app's routes,
known_assignors()), never from a copy of it."""

from __future__ import annotations

import argparse
import base64
import json
import re
from typing import Any

import pytest
from fastapi.testclient import TestClient

from keyshard.api.app import create_app
from keyshard.cli.parser import build_parser
from keyshard.coordinator.group.state import OffsetReset
from keyshard.coordinator.strategies.registry import known_assignors
from keyshard.core.kafka.settings import from_environment, parse_properties
from tests.api.fake_runtime import fake_runtime
from tests.deploy.chart import (
    CHART,
    FULL,
    MINIMAL,
    ROOT,
    container,
    find,
    manifests,
    service,
    settings_map,
)

# values.yaml key (under config/auth) -> argparse dest of `keyshard coordinator`. A new
# flag without a chart value fails test_every_flag_is_reachable_from_values.
VALUE_FOR_DEST = {
    "bootstrap_servers": ("config", "bootstrapServers"),
    "listen": ("ports", "consumer"),
    "admin_listen": ("ports", "admin"),
    "state_topic": ("config", "stateTopic"),
    "state_partitions": ("config", "statePartitions"),
    "replica_timeout_ms": ("config", "replicaTimeoutMs"),
    "leader_failover_ms": ("config", "leaderFailoverMs"),
    "auth_token": ("auth", "consumerToken"),
    "admin_token": ("auth", "adminToken"),
    "admin_auth_reads": ("config", "adminAuthReads"),
    "drain_timeout_ms": ("config", "drainTimeoutMs"),
    "lost_member_margin_ms": ("config", "lostMemberMarginMs"),
    "stall_timeout_ms": ("config", "stallTimeoutMs"),
    "assignor": ("config", "assignor"),
    "group_assignor": ("config", "groupAssignors"),
    "auto_offset_reset": ("config", "autoOffsetReset"),
    "group_auto_offset_reset": ("config", "groupAutoOffsetResets"),
    "rebalance_threshold": ("config", "rebalanceThreshold"),
    "rebalance_hold_ms": ("config", "rebalanceHoldMs"),
    "backlog_hold_ms": ("config", "backlogHoldMs"),
    "backlog_records": ("config", "backlogRecords"),
    "demand_horizon_ms": ("config", "demandHorizonMs"),
    "balance_check_ms": ("config", "balanceCheckMs"),
    "load_half_life_ms": ("config", "loadHalfLifeMs"),
    "max_capacity": ("config", "maxCapacity"),
    "min_session_timeout_ms": ("config", "minSessionTimeoutMs"),
    "max_session_timeout_ms": ("config", "maxSessionTimeoutMs"),
    "max_members_per_group": ("config", "maxMembersPerGroup"),
    "max_groups": ("config", "maxGroups"),
    "max_speed_factor": ("config", "maxSpeedFactor"),
    "metadata_refresh_ms": ("config", "metadataRefreshMs"),
    "flush_interval_ms": ("config", "flushIntervalMs"),
    "partition_growth_window_ms": ("config", "partitionGrowthWindowMs"),
    "log_level": ("config", "logLevel"),
    "kafka_config": ("kafka", "config"),
    "register_timeout_ms": ("config", "registerTimeoutMs"),
    "max_connections": ("config", "maxConnections"),
    "max_connections_per_peer": ("config", "maxConnectionsPerPeer"),
    "pre_auth_max_frame_bytes": ("config", "preAuthMaxFrameBytes"),
    # Files mounted from the Secret the value names (the replica secret's is the chart's
    # own unless one is named).
    "replica_secret_file": ("replicaSecret", "existingSecret"),
    "tls_cert_file": ("tls", "existingSecret"),
    "tls_key_file": ("tls", "existingSecret"),
    "tls_client_ca_file": ("tls", "requireClientCert"),
    "admin_tls_cert_file": ("adminTls", "existingSecret"),
    "admin_tls_key_file": ("adminTls", "existingSecret"),
    "auth_token_principal": ("access", "consumerTokenPrincipal"),
    "auth_tokens_file": ("access", "consumerTokensKey"),
    "admin_tokens_file": ("access", "adminTokensKey"),
    "ssl_principal_mapping_rules": ("access", "sslPrincipalMappingRules"),
    "jwt_jwks_url": ("access", "jwtJwksUrl"),
    "jwt_issuer": ("access", "jwtIssuer"),
    "jwt_audience": ("access", "jwtAudience"),
    "jwt_principal_claim": ("access", "jwtPrincipalClaim"),
    "authorizer": ("access", "authorizer"),
    "acl_file": ("access", "acls"),
    "acl_cache_ms": ("access", "aclCacheMs"),
    "admin_roles_file": ("access", "adminRoles"),
}
# argparse dest -> the pod field it comes from (the downward API): what differs per pod
# has no value. The daemon sees a stand-in, "<field>" (see pod_environment).
FROM_THE_POD = {
    "replica_id": "metadata.name",
    "advertise": "status.podIP",
}
# argparse dests that deliberately have no value: the chart requires bootstrapServers, so
# the embedded broker these configure never runs in a pod; the tokens come from the
# chart's Secret through their variables, so their -file flags are not needed.
NOT_IN_THE_CHART = {"embedded_broker_listen", "auth_token_file", "admin_token_file"}
KAFKA_CONFIG_PATH = "/etc/keyshard/kafka/kafka.properties"


def _coordinator_parser() -> argparse.ArgumentParser:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    coordinator = sub.choices["coordinator"]
    assert isinstance(coordinator, argparse.ArgumentParser)
    return coordinator


def daemon_flags() -> dict[str, str]:
    """Every flag that configures the running daemon -> its argparse dest: the options of
    the `coordinator` subcommand plus the top-level --log-level."""
    flags: dict[str, str] = {}
    for parser in (build_parser(), _coordinator_parser()):
        for action in parser._actions:
            long = [s for s in action.option_strings if s.startswith("--")]
            if long and action.dest != "help" and not isinstance(action, argparse._HelpAction):
                flags[long[0]] = action.dest
    return flags


def env_name(flag: str) -> str:
    """The documented rule (keyshard/cli/parser.py): KEYSHARD_ + flag, dashes to underscores."""
    return "KEYSHARD_" + flag.removeprefix("--").replace("-", "_").upper()


_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' expansion of an env value: $(VAR) is the value of a variable defined
    before it (envFrom, then the earlier env entries), $$ is a literal $, and a reference
    to an undefined variable stays as written."""

    def replace(match: re.Match[str]) -> str:
        if match[0] == "$$":
            return "$"
        return env.get(match[1], match[0])

    return _REFERENCE.sub(replace, text)


def pod_environment(values: dict[str, Any]) -> dict[str, str]:
    """The environment the coordinator container gets: the ConfigMap (envFrom) plus the
    env entries in order, with $(VAR) references expanded, secretKeyRefs resolved through
    the rendered Secret, and fieldRefs (the downward API) as marked stand-ins such as
    "<metadata.name>"."""
    objects = manifests(values)
    env = dict(settings_map(objects)["data"])
    secrets = {
        o["metadata"]["name"]: {k: base64.b64decode(v).decode() for k, v in o["data"].items()}
        for o in objects
        if o["kind"] == "Secret"
    }
    for entry in container(objects).get("env", []):
        if "value" in entry:
            env[entry["name"]] = expand(entry["value"], env)
        elif "fieldRef" in entry["valueFrom"]:
            env[entry["name"]] = f"<{entry['valueFrom']['fieldRef']['fieldPath']}>"
        else:
            ref = entry["valueFrom"]["secretKeyRef"]
            # A Secret the user manages is not rendered: stand in a marked value.
            env[entry["name"]] = secrets.get(ref["name"], {}).get(
                ref["key"], f"<{ref['name']}/{ref['key']}>"
            )
    return env


def is_kafka_setting(variable: str) -> bool:
    """KEYSHARD_KAFKA_<SETTING> variables carry Kafka settings, not daemon flags."""
    return variable.startswith("KEYSHARD_KAFKA_") and variable != "KEYSHARD_KAFKA_CONFIG"


def parse_with_env(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> argparse.Namespace:
    """What the daemon would run with: `keyshard coordinator` and this environment."""
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return build_parser().parse_args(["coordinator"])


def test_every_flag_has_its_env_variable_in_the_help() -> None:
    """The help text (what operators read) names the same variable the rule gives."""
    coordinator = _coordinator_parser()
    for action in coordinator._actions:
        long = [s for s in action.option_strings if s.startswith("--")]
        if not long or isinstance(action, argparse._HelpAction):
            continue
        assert f"[env {env_name(long[0])}]" in str(action.help), long[0]


def test_every_flag_is_reachable_from_values() -> None:
    assert (
        set(daemon_flags().values()) == set(VALUE_FOR_DEST) | set(FROM_THE_POD) | NOT_IN_THE_CHART
    )
    assert not set(VALUE_FOR_DEST) & set(FROM_THE_POD)
    assert not (set(VALUE_FOR_DEST) | set(FROM_THE_POD)) & NOT_IN_THE_CHART


def test_env_expansion_is_kubernetes_own() -> None:
    env = {"POD_IP": "10.0.0.7"}
    assert expand("$(POD_IP):7171", env) == "10.0.0.7:7171"
    assert expand("$$(POD_IP) $(NOPE) $$$(POD_IP)", env) == "$(POD_IP) $(NOPE) $10.0.0.7"


def test_full_values_set_every_variable_and_the_daemon_reads_them(
    clean_env: pytest.MonkeyPatch,
) -> None:
    env = pod_environment(FULL)
    keyshard_env = {k for k in env if k.startswith("KEYSHARD_") and not is_kafka_setting(k)}
    assert keyshard_env == {
        env_name(flag) for flag, dest in daemon_flags().items() if dest not in NOT_IN_THE_CHART
    }

    clean = build_parser().parse_args(["coordinator"])  # before the pod's environment
    args = parse_with_env(clean_env, env)
    config, auth, access = FULL["config"], FULL["auth"], FULL["access"]
    expected = {
        "bootstrap_servers": config["bootstrapServers"],
        "listen": (config["listenHost"], FULL["ports"]["consumer"]),
        "admin_listen": (config["listenHost"], FULL["ports"]["admin"]),
        "state_topic": config["stateTopic"],
        "state_partitions": config["statePartitions"],
        "replica_timeout_ms": config["replicaTimeoutMs"],
        "leader_failover_ms": config["leaderFailoverMs"],
        "replica_id": "<metadata.name>",
        "advertise": ("<status.podIP>", FULL["ports"]["consumer"]),
        "auth_token": auth["consumerToken"],
        "admin_token": auth["adminToken"],
        "admin_auth_reads": config["adminAuthReads"],
        "drain_timeout_ms": config["drainTimeoutMs"],
        "lost_member_margin_ms": config["lostMemberMarginMs"],
        "stall_timeout_ms": config["stallTimeoutMs"],
        "assignor": config["assignor"],
        "group_assignor": sorted(config["groupAssignors"].items()),
        "auto_offset_reset": config["autoOffsetReset"],
        "group_auto_offset_reset": sorted(config["groupAutoOffsetResets"].items()),
        "rebalance_threshold": config["rebalanceThreshold"],
        "rebalance_hold_ms": config["rebalanceHoldMs"],
        "backlog_hold_ms": config["backlogHoldMs"],
        "backlog_records": config["backlogRecords"],
        "demand_horizon_ms": config["demandHorizonMs"],
        "balance_check_ms": config["balanceCheckMs"],
        "load_half_life_ms": config["loadHalfLifeMs"],
        "max_capacity": config["maxCapacity"],
        "min_session_timeout_ms": config["minSessionTimeoutMs"],
        "max_session_timeout_ms": config["maxSessionTimeoutMs"],
        "max_members_per_group": config["maxMembersPerGroup"],
        "max_groups": config["maxGroups"],
        "max_speed_factor": config["maxSpeedFactor"],
        "log_level": config["logLevel"],
        "kafka_config": KAFKA_CONFIG_PATH,
        "register_timeout_ms": config["registerTimeoutMs"],
        "max_connections": config["maxConnections"],
        "max_connections_per_peer": config["maxConnectionsPerPeer"],
        "pre_auth_max_frame_bytes": config["preAuthMaxFrameBytes"],
        "replica_secret_file": "/etc/keyshard/replica-secret/replica-secret",
        "tls_cert_file": "/etc/keyshard/tls/tls.crt",
        "tls_key_file": "/etc/keyshard/tls/tls.key",
        "tls_client_ca_file": "/etc/keyshard/tls/ca.crt",
        "admin_tls_cert_file": "/etc/keyshard/admin-tls/tls.crt",
        "admin_tls_key_file": "/etc/keyshard/admin-tls/tls.key",
        "auth_token_principal": access["consumerTokenPrincipal"],
        "auth_tokens_file": f"/etc/keyshard/access-tokens/{access['consumerTokensKey']}",
        "admin_tokens_file": f"/etc/keyshard/access-tokens/{access['adminTokensKey']}",
        "ssl_principal_mapping_rules": access["sslPrincipalMappingRules"],
        "jwt_jwks_url": access["jwtJwksUrl"],
        "jwt_issuer": access["jwtIssuer"],
        "jwt_audience": access["jwtAudience"],
        "jwt_principal_claim": access["jwtPrincipalClaim"],
        "authorizer": access["authorizer"],
        "acl_file": "/etc/keyshard/access/acls",
        "acl_cache_ms": access["aclCacheMs"],
        "admin_roles_file": "/etc/keyshard/access/admin-roles",
    }
    actual = {dest: getattr(args, dest) for dest in expected}
    actual["group_assignor"] = sorted(actual["group_assignor"])
    actual["group_auto_offset_reset"] = sorted(actual["group_auto_offset_reset"])
    assert actual == expected
    # Every value differs from the daemon's default, so none passed by accident.
    for dest in expected:
        assert getattr(clean, dest) != getattr(args, dest), dest


def test_the_pods_kafka_settings_are_the_values_with_secrets_from_their_secret(
    clean_env: pytest.MonkeyPatch,
) -> None:
    """kafka.config becomes the file --kafka-config reads, kafka.secretRefs the variables
    that win over it: together, what the daemon parses (keyshard.cli.main)."""
    objects = manifests(FULL)
    (kafka_map,) = [o for o in objects if o["kind"] == "ConfigMap" and "kafka.properties"
                    in o.get("data", {})]  # fmt: skip
    from_file = parse_properties(kafka_map["data"]["kafka.properties"].splitlines())
    env = pod_environment(FULL)
    settings = {**from_file, **from_environment(env)}
    assert settings == {**FULL["kafka"]["config"], "sasl.password": "<kafka-credentials/password>"}
    mounts = {m["mountPath"]: m["name"] for m in container(objects)["volumeMounts"]}
    assert mounts["/etc/keyshard/kafka"] == "kafka-config"
    assert mounts["/etc/keyshard/kafka-tls"] == "kafka-tls"
    assert env["KEYSHARD_KAFKA_CONFIG"] == KAFKA_CONFIG_PATH


def test_chart_defaults_are_the_daemons_defaults(clean_env: pytest.MonkeyPatch) -> None:
    """Only where the chart must differ: Kafka is required, in a pod the listeners bind
    every interface instead of loopback, each pod names itself and its address, and the
    replicas always share a replica secret (the chart's own unless one is named)."""
    daemon = build_parser().parse_args(["coordinator"])
    chart = parse_with_env(clean_env, pod_environment(MINIMAL))
    dests = set(VALUE_FOR_DEST) | set(FROM_THE_POD)
    differ = {d for d in dests if getattr(daemon, d) != getattr(chart, d)}
    assert differ == {
        "bootstrap_servers", "listen", "admin_listen", "replica_secret_file", *FROM_THE_POD
    }  # fmt: skip
    assert chart.listen == ("0.0.0.0", daemon.listen[1])
    assert chart.admin_listen == ("0.0.0.0", daemon.admin_listen[1])


def test_container_ports_are_the_ports_the_daemon_listens_on(
    clean_env: pytest.MonkeyPatch,
) -> None:
    for values in (MINIMAL, FULL):
        objects = manifests(values)
        args = parse_with_env(clean_env, pod_environment(values))
        ports = {p["name"]: p["containerPort"] for p in container(objects)["ports"]}
        assert ports == {"consumer": args.listen[1], "admin": args.admin_listen[1]}
        # Each replica is its pod, reached at the pod's IP on the port it listens on.
        assert args.replica_id == f"<{FROM_THE_POD['replica_id']}>"
        assert args.advertise == (f"<{FROM_THE_POD['advertise']}>", args.listen[1])
        for name in ("consumer", "admin"):
            (svc_port,) = service(objects, name)["spec"]["ports"]
            assert svc_port["targetPort"] == name  # resolves to the container port above


def test_probe_paths_exist_and_never_need_the_token() -> None:
    """The probes GET the admin app's real routes; even with reads protected they answer
    without a token (a 401 would make the kubelet restart a healthy coordinator)."""
    app = create_app(fake_runtime(), admin_token="t0ken", auth_reads=True)
    routes = {getattr(r, "path", None) for r in app.routes}
    objects = manifests(FULL)
    coordinator = container(objects)
    client = TestClient(app)
    expected = {
        "startupProbe": ("/healthz", {200}),
        "livenessProbe": ("/healthz", {200}),
        "readinessProbe": ("/readyz", {200, 503}),
    }
    for probe, (path, statuses) in expected.items():
        get = coordinator[probe]["httpGet"]
        assert get["path"] == path and path in routes
        assert get["port"] == "admin"
        assert client.get(path).status_code in statuses, probe
    # The ServiceMonitor scrapes a real route, which does need the token here.
    (endpoint,) = find(objects, "ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["path"] in routes
    assert client.get(endpoint["path"]).status_code == 401
    authorized = client.get(endpoint["path"], headers={"Authorization": "Bearer t0ken"})
    assert authorized.status_code == 200


def test_schema_knows_exactly_the_daemons_assignors() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    config = schema["properties"]["config"]["properties"]
    assert sorted(config["assignor"]["enum"]) == sorted(known_assignors())
    assert sorted(config["groupAssignors"]["additionalProperties"]["enum"]) == sorted(
        known_assignors()
    )


def test_schema_knows_exactly_the_daemons_offset_resets() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    config = schema["properties"]["config"]["properties"]
    resets = sorted(r.value for r in OffsetReset)
    assert sorted(config["autoOffsetReset"]["enum"]) == resets
    assert sorted(config["groupAutoOffsetResets"]["additionalProperties"]["enum"]) == resets


def _doc_table(page: str) -> dict[str, tuple[str, str]]:
    """flag -> (env variable, default) from the "## Flags" table of a docs page."""
    text = (ROOT / "docs" / page).read_text(encoding="utf-8")
    section = "## Flags"
    text = text[text.index(section) :]
    end = text.find("\n## ", len(section))
    text = text if end < 0 else text[:end]
    rows: dict[str, tuple[str, str]] = {}
    row = re.compile(r"^\| `(--[a-z-]+)[^`]*` \| `(KEYSHARD_[A-Z_]+)[^|]*\| ([^|]+)\|", re.M)
    for match in row.finditer(text):
        rows[match[1]] = (match[2], match[3].strip().strip("`"))
    return rows


def test_docs_table_lists_every_flag_with_its_variable_and_default(
    clean_env: pytest.MonkeyPatch,
) -> None:
    """docs/operations/coordinator.md: every `keyshard coordinator` flag, its variable and
    its default."""
    rows = _doc_table("operations/coordinator.md")
    flags = daemon_flags()
    assert set(rows) == set(flags)
    defaults = build_parser().parse_args(["coordinator"])
    for flag, (env, default) in rows.items():
        assert env == env_name(flag), flag
        value = getattr(defaults, flags[flag])
        if isinstance(value, tuple):
            value = ":".join(map(str, value))
        if value in (None, False, []):
            assert default in ("none", "off", "embedded broker"), flag
        else:
            assert default == str(value), flag


def test_docs_worker_table_lists_every_worker_flag(clean_env: pytest.MonkeyPatch) -> None:
    """docs/user-guide/worker.md: the `keyshard worker` flags, variables and defaults."""
    rows = _doc_table("user-guide/worker.md")
    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command")
    worker = commands.choices["worker"]  # type: ignore[index]
    flags = {
        o: a.dest for a in worker._actions for o in a.option_strings
        if o.startswith("--") and o != "--help"
    }  # fmt: skip
    assert set(rows) == set(flags)
    defaults = parser.parse_args(["worker", "m:f"])
    for flag, (env, default) in rows.items():
        assert env == env_name(flag), flag
        value = getattr(defaults, flags[flag])
        if isinstance(value, tuple):
            value = ":".join(map(str, value))
        if value is None:
            assert default.startswith("none"), flag
        else:
            assert default == str(value), flag


def test_dockerfile_environment_and_ports_match_the_daemon(
    clean_env: pytest.MonkeyPatch,
) -> None:
    from tests.deploy.dockerfile import parse_dockerfile

    image = parse_dockerfile(ROOT / "Dockerfile")
    keyshard_env = {k: v for k, v in image.env.items() if k.startswith("KEYSHARD_")}
    assert set(keyshard_env) <= {env_name(flag) for flag in daemon_flags()}
    args = parse_with_env(clean_env, keyshard_env)
    assert image.exposed == {args.listen[1], args.admin_listen[1]}
    assert image.entrypoint + image.cmd == ["keyshard", "coordinator"]
    values = (CHART / "values.yaml").read_text(encoding="utf-8")
    assert f"runAsUser: {image.user.split(':')[0]}" in values
