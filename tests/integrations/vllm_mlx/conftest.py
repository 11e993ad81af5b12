"""vllm-mlx servers for the tests: a tiny random-weight Qwen2-VL saved to a temporary model
directory, served by vllm-mlx's real OpenAI server twice (stock, and with visioncache), each in its
own process on loopback. Both are started once per test module and shared by its tests, which
compare their records by request; they stop when the module is done."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("mlx.core", reason="mlx cannot be imported here (pip install 'visioncache[mlx]')")
pytest.importorskip("vllm_mlx", reason="vllm-mlx is not installed (pip install 'visioncache[vllm-mlx]')")
pytest.importorskip("openai", reason="the openai client is not installed")

from tests.support.vllm_mlx_server import ServerProcess


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.support.mlx_model_dir import save_model_dir

    return save_model_dir(tmp_path_factory.mktemp("qwen2-vl-tiny"))


def _serve(engine: str, model_dir: Path, root: Path, *flags: str) -> Iterator[ServerProcess]:
    server = ServerProcess(engine, model_dir, root, *flags).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def stock_server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    yield from _serve("stock", model_dir, tmp_path_factory.mktemp("stock"))


@pytest.fixture(scope="module")
def visioncache_server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    yield from _serve("visioncache", model_dir, tmp_path_factory.mktemp("visioncache"), "--enable-metrics")
