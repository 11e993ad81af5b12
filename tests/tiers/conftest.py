"""Fixtures for tier tests: a real redis-server on a free loopback port, started and stopped here."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator

import pytest

REDIS_SERVER = shutil.which("redis-server")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class RedisProcess:
    """One redis-server subprocess on 127.0.0.1:``port``, without persistence."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.url = f"redis://127.0.0.1:{port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        assert REDIS_SERVER is not None
        self.process = subprocess.Popen(
            [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
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
