"""Apache Kafka 4.x for tests and benchmarks, assembled from Maven Central.

No tarball and no Docker: `pom.xml` beside this file names Kafka's broker and tools jars;
`mvn dependency:copy-dependencies` collects them (and everything they pull in) once into
a cache directory keyed by the pom's content, and every broker runs from there with the
machine's Java 17. A broker is a single KRaft node (broker and controller in one process)
on free loopback ports, formatted fresh in its own directory, stopped by pid.

Readiness is a metadata answer listing the broker, not an open port: Kafka binds its
listeners before it can serve, and a client that arrives then sees no brokers.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import fcntl
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

from keyshard.local.processes import free_port

POM = Path(__file__).with_name("pom.xml")
KAFKA_INTERNAL_TOPICS = frozenset(
    {"__consumer_offsets", "__transaction_state", "__share_group_state", "__cluster_metadata"}
)


def internal_topics(replicas: int, min_isr: int) -> dict[str, str]:
    """Broker settings every node of a test cluster shares: the internal topics at
    `replicas` replicas and `min_isr` in sync, few partitions, no topic made by a client."""
    return {
        "offsets.topic.replication.factor": str(replicas),
        "offsets.topic.num.partitions": "4",
        "transaction.state.log.replication.factor": str(replicas),
        "transaction.state.log.min.isr": str(min_isr),
        "transaction.state.log.num.partitions": "4",
        "share.coordinator.state.topic.replication.factor": str(replicas),
        "share.coordinator.state.topic.min.isr": str(min_isr),
        "share.coordinator.state.topic.num.partitions": "4",
        # A test's first consumer group would otherwise wait 3 s for more members.
        "group.initial.rebalance.delay.ms": "0",
        "auto.create.topics.enable": "false",
        "num.partitions": "1",
    }


_LOG4J = """\
status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = {level}
rootLogger.appenderRef.file.ref = file
"""


class KafkaUnavailable(RuntimeError):
    """Java or Maven is missing, or the jars could not be collected."""


class KafkaBrokerError(RuntimeError):
    """The broker could not be formatted, started or made ready."""


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(os.environ.get("KEYSHARD_CACHE", Path(base) / "keyshard"))


def missing_tools() -> str | None:
    """Why a Kafka broker cannot run here (None: it can). Maven is needed only until the
    jars are cached."""
    if shutil.which("java") is None:
        return "no `java` on the PATH (Apache Kafka needs Java 17)"
    if not (jar_dir(POM, "kafka-jars") / ".complete").exists() and shutil.which("mvn") is None:
        return "no `mvn` on the PATH to collect Apache Kafka's jars from Maven Central"
    return None


def jar_dir(pom: Path, name: str) -> Path:
    """Where `pom`'s jars are cached: `name` and a digest of the pom's content, so an
    edited pom collects afresh."""
    digest = hashlib.sha256(pom.read_bytes()).hexdigest()[:12]
    return cache_root() / f"{name}-{digest}"


def ensure_jars(timeout: float = 600.0) -> Path:
    """The directory holding Kafka's jars, collected on first use."""
    reason = missing_tools()
    if reason is not None:
        raise KafkaUnavailable(reason)
    return collect_jars(POM, "kafka-jars", "kafka_2.13-*.jar", timeout)


def collect_jars(pom: Path, name: str, expect: str, timeout: float = 600.0) -> Path:
    """The directory holding the jars `pom` names and everything they pull in, collected by
    `mvn dependency:copy-dependencies` on first use into the cache (`jar_dir`); `expect` is
    a glob that must match a collected jar. A file lock keeps two runs from collecting into
    one directory at once."""
    target = jar_dir(pom, name)
    if (target / ".complete").exists():
        return target
    if shutil.which("mvn") is None:
        raise KafkaUnavailable(f"no `mvn` on the PATH to collect {name} from Maven Central")
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / ".complete").exists():
            return target
        staging = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=target.parent))
        cmd = ["mvn", "-q", "-B", "-f", str(pom), "dependency:copy-dependencies"]
        cmd.append(f"-DoutputDirectory={staging}")
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as err:
            shutil.rmtree(staging, ignore_errors=True)
            raise KafkaUnavailable(f"mvn did not collect {name} in {timeout:g} s") from err
        if done.returncode != 0 or not any(staging.glob(expect)):
            shutil.rmtree(staging, ignore_errors=True)
            tail = "\n".join((done.stdout + done.stderr).splitlines()[-20:])
            raise KafkaUnavailable(f"mvn could not collect {name}:\n{tail}")
        (staging / ".complete").touch()
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
    return target


def java_command(jars: Path, main: str, *args: str, heap: str = "256m") -> list[str]:
    return ["java", f"-Xmx{heap}", "-cp", f"{jars}/*", main, *args]


def run_tool(main: str, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run one of Kafka's command-line classes (e.g. ConsumerGroupCommand) to completion."""
    jars = ensure_jars()
    return subprocess.run(
        java_command(jars, main, *args), capture_output=True, text=True, timeout=timeout
    )


def new_cluster_id() -> str:
    """A random cluster id (base64url of a UUID). One that starts with "-" (1 in 64) would
    be read by the format tool's argument parser as an option, and formatting fails."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def _properties(values: Mapping[str, str]) -> str:
    return "".join(f"{k}={v}\n" for k, v in values.items())


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "<no log>"


class KafkaBroker:
    """One KRaft node (`process.roles=broker,controller`) in its own directory.

    `extra_config` adds or overrides `server.properties` entries; `extra_listeners` adds
    named listeners (name -> security protocol) on free ports, e.g. a SASL_SSL one, whose
    addresses `listener(name)` gives; `scram_users` (name -> password) are SCRAM-SHA-512
    credentials written at format time; `secured_broker` puts these together. The process
    runs in its own session and is stopped by pid (SIGTERM, then SIGKILL); a directory we
    created is removed on stop.
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        workdir: Path | None = None,
        heap: str = "768m",
        log_level: str = "WARN",
        extra_config: Mapping[str, str] | None = None,
        extra_listeners: Mapping[str, str] | None = None,
        scram_users: Mapping[str, str] | None = None,
        jvm_options: Sequence[str] = (),
    ) -> None:
        self.host = host
        self.heap = heap
        self.log_level = log_level
        self.extra_config = dict(extra_config or {})
        self.extra_listeners = dict(extra_listeners or {})
        self.scram_users = dict(scram_users or {})
        self.jvm_options = list(jvm_options)
        self._workdir = workdir
        self._owns_workdir = workdir is None
        self._ports: dict[str, int] = {}
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def workdir(self) -> Path:
        if self._workdir is None:
            raise KafkaBrokerError("the broker's directory is made on start(); start it first")
        return self._workdir

    @property
    def bootstrap_servers(self) -> str:
        return self.listener("PLAINTEXT")

    def listener(self, name: str) -> str:
        if name not in self._ports:
            raise KafkaBrokerError(f"no listener {name!r} (started? one of {sorted(self._ports)})")
        return f"{self.host}:{self._ports[name]}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def log_path(self) -> Path:
        return self.workdir / "broker.log"

    def config(self) -> dict[str, str]:
        names = ["PLAINTEXT", "CONTROLLER", *self.extra_listeners]
        for name in names:
            self._ports.setdefault(name, free_port(self.host))
        protocols = {"PLAINTEXT": "PLAINTEXT", "CONTROLLER": "PLAINTEXT", **self.extra_listeners}
        served = [n for n in names if n != "CONTROLLER"]
        return {
            "process.roles": "broker,controller",
            "node.id": "1",
            "listeners": ",".join(f"{n}://{self.host}:{self._ports[n]}" for n in names),
            "advertised.listeners": ",".join(f"{n}://{self.host}:{self._ports[n]}" for n in served),
            "listener.security.protocol.map": ",".join(f"{n}:{p}" for n, p in protocols.items()),
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "controller.quorum.bootstrap.servers": f"{self.host}:{self._ports['CONTROLLER']}",
            "log.dirs": str(self.workdir / "data"),
            **internal_topics(replicas=1, min_isr=1),
            **self.extra_config,
        }

    def start(self, timeout: float = 90.0) -> None:
        if self.running:
            raise KafkaBrokerError(f"broker already running (pid {self.pid})")
        jars = ensure_jars()
        if self._workdir is None:
            self._workdir = Path(tempfile.mkdtemp(prefix="keyshard-kafka-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        # A start after a stop formats afresh: a restarted test broker is an empty one.
        shutil.rmtree(self.workdir / "data", ignore_errors=True)
        write_node_files(self.workdir, self.config(), self.log_level)
        extra = ["--standalone"]
        for user, password in self.scram_users.items():  # SCRAM users live in the metadata log
            extra += ["--add-scram", f"SCRAM-SHA-512=[name={user},password={password}]"]
        format_node(jars, self.workdir, new_cluster_id(), extra, self.jvm_options, timeout)
        self._proc = launch_node(jars, self.workdir, self.heap, self.jvm_options)
        try:
            wait_serving(self._proc, self.workdir, self.bootstrap_servers, timeout)
        except BaseException:
            self.stop()
            raise

    def reset(self, timeout: float = 30.0) -> None:
        """Delete every topic a test made, so the next test sees an empty cluster without
        paying for a new JVM (~5 s). Internal topics stay; so do consumer groups (aiokafka
        cannot delete them), but Kafka drops their committed offsets with the topics."""
        empty_cluster(self.bootstrap_servers, timeout)

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM (a controlled shutdown), SIGKILL after `timeout`; reap; remove our dir."""
        if self._proc is not None:
            terminate_node(self._proc, timeout)
        if self._owns_workdir and self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None

    def kill(self) -> None:
        if self._proc is not None:
            kill_node(self._proc)

    def __enter__(self) -> KafkaBroker:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def write_node_files(workdir: Path, config: Mapping[str, str], log_level: str) -> Path:
    """A node's server.properties and log4j2.properties in `workdir`; the former's path."""
    props = workdir / "server.properties"
    props.write_text(_properties(config))
    (workdir / "log4j2.properties").write_text(
        _LOG4J.format(log=workdir / "broker.log", level=log_level)
    )
    return props


def _jvm_options(workdir: Path, extra: Sequence[str]) -> list[str]:
    return [f"-Dlog4j2.configurationFile={workdir / 'log4j2.properties'}", *extra]


def format_node(
    jars: Path,
    workdir: Path,
    cluster_id: str,
    extra: Sequence[str],
    jvm_options: Sequence[str],
    timeout: float,
) -> None:
    """Format the node of `workdir` as a member of cluster `cluster_id` (`extra`: e.g.
    `--standalone`, SCRAM users)."""
    fmt = java_command(jars, "kafka.tools.StorageTool", heap="256m")
    fmt[1:1] = _jvm_options(workdir, jvm_options)
    fmt += ["format", "-t", cluster_id, "-c", str(workdir / "server.properties"), *extra]
    done = subprocess.run(fmt, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise KafkaBrokerError(f"formatting failed: {(done.stdout + done.stderr)[-2000:]}")


def launch_node(
    jars: Path, workdir: Path, heap: str, jvm_options: Sequence[str]
) -> subprocess.Popen[bytes]:
    """`kafka.Kafka` on the node of `workdir`, in a session of its own (stopped by pid)."""
    cmd = java_command(jars, "kafka.Kafka", str(workdir / "server.properties"), heap=heap)
    cmd[1:1] = [*_jvm_options(workdir, jvm_options), "-XX:+UseSerialGC", "-Djava.awt.headless=true"]
    with open(workdir / "stdout.log", "ab") as out:
        return subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True
        )


def wait_serving(
    proc: subprocess.Popen[bytes], workdir: Path, bootstrap: str, timeout: float, brokers: int = 1
) -> None:
    """Until the node at `bootstrap` answers a metadata request listing `brokers` brokers;
    raises with its log's tail if it exits or does not in `timeout`."""
    host, _, port = bootstrap.rpartition(":")
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        while time.monotonic() < deadline:
            code = proc.poll()
            if code is not None:
                raise KafkaBrokerError(
                    f"Kafka exited with code {code} while starting; log:\n"
                    f"{_tail(workdir / 'broker.log')}\n{_tail(workdir / 'stdout.log')}"
                )
            try:
                # A bare connect first: aiokafka logs every refused connection.
                with socket.create_connection((host, int(port)), 1):
                    pass
                if pool.submit(asyncio.run, _serves_metadata(bootstrap, brokers)).result():
                    return
            except Exception as err:  # not up yet: refused, timed out, no brokers
                last = err
            time.sleep(0.1)
    raise KafkaBrokerError(
        f"Kafka not serving metadata on {bootstrap} within {timeout:g} s "
        f"(last error: {last!r}); log:\n{_tail(workdir / 'broker.log')}"
    )


def terminate_node(proc: subprocess.Popen[bytes], timeout: float) -> None:
    """SIGTERM to the node's process group (a controlled shutdown: Kafka moves its
    partitions' leaders away first), SIGKILL after `timeout`; reaped."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            kill_node(proc)


def kill_node(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL to the node's process group (a crash: nothing is handed over); reaped."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def empty_cluster(bootstrap: str, timeout: float = 30.0) -> None:
    """Delete every topic but Kafka's internal ones (see `KafkaBroker.reset`)."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, _empty_cluster(bootstrap, timeout)).result()


SASL_SSL = "SASL_SSL"


def secured_broker(
    *,
    ca: Path,
    cert: Path,
    key: Path,
    users: Mapping[str, str],
    authorizer: bool = False,
    workdir: Path | None = None,
) -> KafkaBroker:
    """A broker with a SASL_SSL listener (SCRAM-SHA-512 over TLS, certificate `cert`/`key`
    signed by `ca`) beside the PLAINTEXT one the tests set topics up through.

    With `authorizer`, Kafka's StandardAuthorizer is on: the PLAINTEXT principal (ANONYMOUS)
    and `admin` are super users, everyone else needs ACLs (`run_tool` + AclCommand).
    """
    keystore = (workdir or Path(tempfile.mkdtemp(prefix="keyshard-kafka-tls-"))) / "broker.pem"
    keystore.parent.mkdir(parents=True, exist_ok=True)
    keystore.write_bytes(_pkcs8(key.read_bytes()) + cert.read_bytes())
    prefix = "listener.name.sasl_ssl."
    config = {
        "sasl.enabled.mechanisms": "SCRAM-SHA-512",
        f"{prefix}scram-sha-512.sasl.jaas.config": (
            "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        ),
        f"{prefix}ssl.keystore.type": "PEM",
        f"{prefix}ssl.keystore.location": str(keystore),
        f"{prefix}ssl.truststore.type": "PEM",
        f"{prefix}ssl.truststore.location": str(ca),
    }
    if authorizer:
        config["authorizer.class.name"] = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
        config["super.users"] = "User:ANONYMOUS;User:admin"
    return KafkaBroker(
        workdir=workdir,
        extra_config=config,
        extra_listeners={SASL_SSL: SASL_SSL},
        scram_users=users,
    )


def _pkcs8(key_pem: bytes) -> bytes:
    """Kafka's PEM key stores take PKCS#8 keys only (`BEGIN PRIVATE KEY`)."""
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(key_pem, None)
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


async def _serves_metadata(bootstrap: str, brokers: int = 1) -> bool:
    from aiokafka import AIOKafkaClient

    client = AIOKafkaClient(bootstrap_servers=bootstrap, request_timeout_ms=3000)
    try:
        await asyncio.wait_for(client.bootstrap(), 5)
        cluster = await asyncio.wait_for(client.fetch_all_metadata(), 5)
        return len(cluster.brokers()) >= brokers
    finally:
        await client.close()


async def _empty_cluster(bootstrap: str, timeout: float) -> None:
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.errors import KafkaError

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    await asyncio.wait_for(admin.start(), timeout)
    try:
        deadline = time.monotonic() + timeout
        while True:
            topics = [t for t in await admin.list_topics() if t not in KAFKA_INTERNAL_TOPICS]
            if not topics:
                return
            if time.monotonic() > deadline:
                raise KafkaBrokerError(f"topics {topics} still there {timeout:g} s after delete")
            with contextlib.suppress(KafkaError):
                await asyncio.wait_for(admin.delete_topics(topics), timeout)
            await asyncio.sleep(0.05)
    finally:
        await admin.close()


def main() -> int:
    """`python -m harness.brokers.kafka`: collect the jars now (scripts/test.sh does, so a
    first test run does not pay for it inside a test), or say in one line why not."""
    try:
        print(f"Apache Kafka jars: {ensure_jars()}")
    except KafkaUnavailable as err:
        print(f"Apache Kafka tests will be skipped: {err}")
        return 0 if not os.environ.get("CI") else 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
