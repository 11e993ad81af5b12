"""Fixtures for tier tests: real redis-servers (standalone or a cluster) on free loopback ports."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

REDIS_SERVER = shutil.which("redis-server")
# A value and keys for the Redis tests.
VALUE = np.arange(1000, dtype=np.float16)


class FakeClock:
    """A clock the breaker tests move by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def key(index: int) -> str:
    return f"0123456789abcdef/embedding/{index:064x}"


REDIS_CLI = shutil.which("redis-cli")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def free_cluster_ports(count: int) -> list[int]:
    """``count`` distinct free ports P whose cluster bus port P + 10000 is free (and valid) too."""
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port + 10000 > 65535 or port in ports:
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        ports.append(port)
    return ports


class RedisProcess:
    """One redis-server subprocess on 127.0.0.1:``port``, without persistence."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.url = f"redis://127.0.0.1:{port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        assert REDIS_SERVER is not None
        self.process = subprocess.Popen(
            [
                REDIS_SERVER,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        import redis

        client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=0.5)
        deadline = time.monotonic() + 10
        while True:
            try:
                if client.ping():
                    break
            except redis.ConnectionError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    self.stop()
                    raise RuntimeError(f"redis-server did not answer PING on port {self.port}") from None
                time.sleep(0.02)
        client.close()

    def stop(self) -> None:
        """Kill the server (as a crash would) and wait for it to exit."""
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=10)
            self.process = None


@pytest.fixture(scope="session")
def redis_process_factory() -> Iterator[Callable[[], RedisProcess]]:
    """Starts servers on free ports; each is killed at the end of the session."""
    pytest.importorskip("redis", reason="needs redis-py: pip install 'visioncache[redis]'")
    if REDIS_SERVER is None:
        pytest.skip("redis-server is not on PATH (the project's `make test` installs it)")
    started: list[RedisProcess] = []

    def start() -> RedisProcess:
        server = RedisProcess(free_port())
        server.start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture(scope="session")
def redis_server(redis_process_factory: Callable[[], RedisProcess]) -> RedisProcess:
    """One server shared by the session's tests (each uses its own key prefix)."""
    return redis_process_factory()


@pytest.fixture
def redis_prefix(request: pytest.FixtureRequest) -> str:
    """A key prefix unique to the test, so tests sharing the server never see each other's keys."""
    return f"test:{request.node.nodeid}:"


@dataclass
class RedisClusterProcesses:
    """A 3-master Redis Cluster on 127.0.0.1 (no replicas); ``url`` names its first node."""

    ports: list[int]
    directory: Path
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    created: bool = False

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.ports[0]}/0"

    def start(self, timeout: float = 20.0) -> None:
        """Start the nodes; the first time, join them into a cluster (later, nodes-P.conf rejoins them)."""
        assert REDIS_SERVER is not None and REDIS_CLI is not None
        for port in self.ports:
            config = str(self.directory / f"nodes-{port}.conf")
            command = [
                REDIS_SERVER,
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                config,
                "--cluster-node-timeout",
                "2000",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.directory),
            ]
            process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            self.processes.append(process)
        deadline = time.monotonic() + timeout
        for port in self.ports:
            self._wait(deadline, f"PING on port {port}", lambda port=port: self._cli(port, "PING") == "PONG")
        if not self.created:
            nodes = [f"127.0.0.1:{port}" for port in self.ports]
            create = [REDIS_CLI, "--cluster", "create", *nodes, "--cluster-replicas", "0", "--cluster-yes"]
            done = subprocess.run(create, capture_output=True, text=True, timeout=deadline - time.monotonic())
            if done.returncode != 0:
                self.stop()
                raise RuntimeError(f"redis-cli --cluster create failed:\n{done.stdout}\n{done.stderr}")
            self.created = True
        for port in self.ports:
            info = lambda port=port: "cluster_state:ok" in self._cli(port, "CLUSTER", "INFO")  # noqa: E731
            self._wait(deadline, f"cluster_state:ok on port {port}", info)

    def _cli(self, port: int, *command: str) -> str:
        assert REDIS_CLI is not None
        try:
            command_line = [REDIS_CLI, "-h", "127.0.0.1", "-p", str(port), *command]
            done = subprocess.run(command_line, capture_output=True, text=True, timeout=2)
        except subprocess.TimeoutExpired:
            return ""
        return done.stdout.strip() if done.returncode == 0 else ""

    def _wait(self, deadline: float, what: str, ready: Callable[[], bool]) -> None:
        while not ready():
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.processes):
                self.stop()
                raise RuntimeError(f"Redis Cluster did not reach {what}")
            time.sleep(0.05)

    def stop(self) -> None:
        """Kill every node (as a crash would) and wait for them to exit."""
        for process in self.processes:
            process.kill()
        for process in self.processes:
            process.wait(timeout=10)
        self.processes.clear()


@pytest.fixture(scope="session")
def redis_cluster_factory() -> Iterator[Callable[[], RedisClusterProcesses]]:
    """Starts 3-master clusters on free loopback ports; each is killed at the end of the session."""
    pytest.importorskip("redis", reason="needs redis-py: pip install 'visioncache[redis]'")
    if REDIS_SERVER is None or REDIS_CLI is None:
        pytest.skip("redis-server or redis-cli is not on PATH (the project's `make test` installs them)")
    started: list[RedisClusterProcesses] = []
    with tempfile.TemporaryDirectory(prefix="visioncache-cluster-") as root:

        def start() -> RedisClusterProcesses:
            directory = Path(root) / str(len(started))
            directory.mkdir()
            cluster = RedisClusterProcesses(ports=free_cluster_ports(3), directory=directory)
            started.append(cluster)
            cluster.start()
            return cluster

        try:
            yield start
        finally:
            for cluster in started:
                cluster.stop()


@pytest.fixture(scope="session")
def redis_cluster(redis_cluster_factory: Callable[[], RedisClusterProcesses]) -> RedisClusterProcesses:
    """One cluster shared by the session's tests (each uses its own key prefix)."""
    return redis_cluster_factory()
