"""Nothing queued is lost at shutdown: every save a server accepted is written or counted.

On SIGTERM vLLM gives its engine ``--shutdown-timeout`` seconds (0 by default: it kills every
process at once, and the connector warns at start that queued saves would then be lost uncounted),
and a worker a grace period inside that; the connector flushes its writer for a deadline within
the grace period, drops and counts the rest, and logs what became of every save. A disk tier
slower than the deadline (each write sleeps) makes some saves miss it.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.vllm_ec.conftest import ec_config
from tests.vllm_ec.servers import VllmServer, chat
from tests.vllm_ec.workload import TEN_IMAGES

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
