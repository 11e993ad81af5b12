"""Fixtures for the vLLM connector tests: a tiny Qwen2-VL checkpoint, engine runs in subprocesses.

These tests need vLLM (`make test-vllm` builds .venv-vllm and runs them); the main `make test`
environment has no vLLM, so there they are not collected at all.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.tiers.conftest import REDIS_SERVER, RedisProcess, free_port


def _vllm_installed() -> bool:
    spec = importlib.util.find_spec("vllm")
    return spec is not None and spec.origin is not None  # a namespace package is not vLLM


if not _vllm_installed():
    collect_ignore_glob = ["test_*.py"]

ROOT = Path(__file__).resolve().parents[3]
__all__ = ["ROOT", "EngineRunner", "copy_tier", "ec_config", "engine_env", "engine_runner", "free_port"]

CONNECTOR = {
    "ec_connector": "VisionCacheECConnector",
    "ec_connector_module_path": "visioncache.integrations.vllm",
}
RUN_TIMEOUT = 300
ENCODER_MODEL_ENV = "VISIONCACHE_TEST_ENCODER_MODEL"  # `encoder_counter`: which class to count


def ec_config(role: str = "ec_both", **extra: object) -> dict[str, Any]:
    """An ``--ec-transfer-config`` for the connector with ``ec_connector_extra_config=extra``."""
    return {**CONNECTOR, "ec_role": role, "ec_connector_extra_config": extra}


def engine_env(encoder_log: Path, *, server: bool = False, **extra: str) -> dict[str, str]:
    """Environment of a vLLM process: offline, visioncache importable, encoder calls counted (a
    server's processes through ``site/sitecustomize.py``; `engine_run` wraps the model itself)."""
    # This tree's own src first: a run of a copy of the tree tests that copy, not the editable install.
    paths = [str(ROOT / "src"), str(ROOT)]
    if server:
        paths.append(str(ROOT / "tests" / "integrations" / "vllm_ec" / "site"))
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": os.pathsep.join(paths),
        "VISIONCACHE_TEST_ENCODER_LOG": str(encoder_log),
        **extra,
    }


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.integrations.vllm_ec.tiny_model import save_tiny_qwen2_vl

    return save_tiny_qwen2_vl(tmp_path_factory.mktemp("tiny-qwen2-vl"))


EngineRunner = Callable[..., dict[str, Any]]


def engine_runner(
    model: Path, runs: Path, encoder_model: str | None = None, max_model_len: int | None = None
) -> EngineRunner:
    """``run(*workloads, ec=None, budget=None, mm_embeds=False, evict_after_load=False, env={})``:
    one in-process engine of ``model`` in a subprocess (`tests.integrations.vllm_ec.engine_run`), its encoder
    calls counted on ``encoder_model`` (``module:Class``; Qwen2-VL's by default), its context
    ``max_model_len`` tokens (`engine_run`'s default if None); returns its JSON report."""

    def run(
        *workloads: str,
        ec: dict[str, Any] | None = None,
        budget: int | None = None,
        mm_embeds: bool = False,
        evict_after_load: bool = False,
        env: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        index = len(list(runs.iterdir()))
        directory = runs / f"run{index}"
        directory.mkdir()
        command = [
            sys.executable,
            "-m",
            "tests.integrations.vllm_ec.engine_run",
            "--model",
            str(model),
            "--out",
            str(directory / "result.json"),
        ]
        for name in workloads or ("main",):
            command += ["--workload", name]
        if ec is not None:
            command += ["--ec-config", json.dumps(ec)]
        if budget is not None:
            command += ["--budget", str(budget)]
        if max_model_len is not None:
            command += ["--max-model-len", str(max_model_len)]
        if mm_embeds:
            command.append("--mm-embeds")
        if evict_after_load:
            command.append("--evict-after-load")
        extra = dict(env or {})
        if encoder_model is not None:
            extra[ENCODER_MODEL_ENV] = encoder_model
        log = directory / "engine.log"
        with log.open("w") as output:
            done = subprocess.run(
                command,
                cwd=ROOT,
                env=engine_env(directory / "encoder.log", **extra),
                stdout=output,
                stderr=subprocess.STDOUT,
                timeout=RUN_TIMEOUT,
            )
        if done.returncode != 0:
            tail = log.read_text()[-6000:]
            raise AssertionError(f"engine run failed ({done.returncode}):\n{tail}")
        result: dict[str, Any] = json.loads((directory / "result.json").read_text())
        result["log"] = str(log)
        return result

    return run


@pytest.fixture(scope="session")
def run_engine(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> EngineRunner:
    """`engine_runner` for the tiny Qwen2-VL model."""
    return engine_runner(tiny_model, tmp_path_factory.mktemp("engine-runs"))


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisProcess]:
    """A redis-server of the test module's own (a module may kill it)."""
    if REDIS_SERVER is None:
        pytest.skip("redis-server is not on PATH (`make redis-server` installs it)")
    server = RedisProcess(free_port())
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def stock(run_engine: EngineRunner) -> dict[str, Any]:
    """vLLM alone (no connector) on the main and the other workload: the reference outputs."""
    return run_engine("main", "other")


@pytest.fixture(scope="session")
def populated_disk(run_engine: EngineRunner, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A cold run with a disk tier (the main workload): its report and the directory it filled."""
    directory = tmp_path_factory.mktemp("disk-populated") / "tier"
    report = run_engine("main", ec=ec_config(disk_dir=str(directory)))
    return {"report": report, "directory": directory}


def copy_tier(source: Path, tmp_path: Path) -> Path:
    """A private copy of a disk tier (tests change entries without touching the shared one)."""
    target = tmp_path / "tier"
    shutil.copytree(source, target)
    return target
