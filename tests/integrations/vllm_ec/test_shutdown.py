"""Nothing queued is lost at shutdown: every save a server accepted is written or counted.

On SIGTERM vLLM gives its engine ``--shutdown-timeout`` seconds (0 by default: it kills every
process at once, and the connector warns at start that queued saves would then be lost uncounted),
and a worker a grace period inside that; the connector flushes its writer for a deadline within
the grace period, drops and counts the rest, and logs what became of every save. A disk tier
slower than the deadline (each write sleeps) makes some saves miss it.
"""

from __future__ import annotations

import contextlib
import re
import time
from pathlib import Path
from typing import Any

from tests.integrations.vllm_ec.conftest import ec_config
from tests.integrations.vllm_ec.servers import VllmServer, chat
from tests.integrations.vllm_ec.workload import TEN_IMAGES

SHUTDOWN_LINE = re.compile(
    r"VisionCacheECConnector shutdown: (\d+) encoder outputs queued for the tiers since start, "
    r"(\d+) written, (\d+) dropped unwritten at shutdown, (\d+) still being written"
)


def _shutdown_report(log: Path) -> tuple[int, int, int, int]:
    found = SHUTDOWN_LINE.findall(log.read_text())
    assert len(found) == 1, f"expected one shutdown line (one worker), found {found}"
    queued, written, dropped, unfinished = (int(value) for value in found[0])
    return queued, written, dropped, unfinished


def test_saves_queued_when_a_server_is_stopped_are_written_or_counted_as_dropped(
    tiny_model: Path, tmp_path: Path
) -> None:
    config = ec_config(disk_dir=str(tmp_path / "tier"))
    slow = {"VISIONCACHE_TEST_SLOW_WRITES": "2.5"}  # seconds each disk write takes
    grace = ("--shutdown-timeout", "20")  # vLLM's default, 0, kills every process at once
    first = VllmServer(tiny_model, tmp_path, config, name="first", env=slow, flags=grace)
    try:
        first.start().wait_ready()
        ran = chat(first, TEN_IMAGES, TEN_IMAGES.requests(), {})
    finally:
        first.stop()  # SIGTERM right after the last answer, as an orchestrator stops a server
    assert ran["failed"] == 0
    queued, written, dropped, unfinished = _shutdown_report(first.log)
    assert queued == TEN_IMAGES.distinct
    assert dropped > 0  # the scenario is real: the tier could not keep up with the deadline
    assert unfinished <= 1 and written + dropped + unfinished == queued

    second = VllmServer(tiny_model, tmp_path, config, name="second").start()
    try:
        second.wait_ready()
        before = second.encoded()
        again = chat(second, TEN_IMAGES, TEN_IMAGES.requests(), {})
        encoded = second.encoded() - before
    finally:
        second.stop()
    assert again["failed"] == 0
    # What was counted as dropped, and nothing else, is encoded again (the one write running at
    # the deadline may have landed or not).
    assert dropped <= encoded <= dropped + unfinished
    assert again["outputs"] == ran["outputs"]


def test_a_server_without_a_shutdown_timeout_is_warned_at_start(tiny_model: Path, tmp_path: Path) -> None:
    server = VllmServer(tiny_model, tmp_path, ec_config(disk_dir=str(tmp_path / "tier")), name="default")
    try:
        server.start().wait_ready()
    finally:
        server.stop()
    assert "--shutdown-timeout is 0" in server.log.read_text()


def test_regression_an_engine_core_outlives_a_server_stopped_during_start_up(
    tiny_model: Path, tmp_path: Path
) -> None:
    # Before, `VllmServer.stop` signalled the API server alone: stopped while it was starting (a
    # `wait_ready` timeout), its engine core was left behind, reparented and spinning.
    import psutil

    server = VllmServer(tiny_model, tmp_path, name="early").start()
    assert server.process is not None
    api = psutil.Process(server.process.pid)
    children: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 300
        while not any(_engine_core(p) for p in children) and time.monotonic() < deadline:
            assert api.is_running(), server.log.read_text()[-3000:]
            children = api.children(recursive=True)
            time.sleep(0.2)
        assert any(_engine_core(p) for p in children), "the server started no engine core"
        server.stop()
        _, alive = psutil.wait_procs(children, timeout=30)
        assert not alive, f"left running after stop: {[(p.pid, p.name()) for p in alive]}"
    finally:
        server.stop()
        for child in children:  # ended by PID whatever the assertions said
            with contextlib.suppress(psutil.Error):
                child.kill()


def _engine_core(process: Any) -> bool:
    with contextlib.suppress(Exception):  # psutil.Error: it may have exited meanwhile
        return "EngineCore" in " ".join([process.name(), *process.cmdline()])
    return False
