"""vllm-mlx's real OpenAI server in a subprocess, stock or with visioncache, instrumented the same way.

Why: the engine tests and ``benchmarks/bench_vllm_mlx.py`` compare the stock server with the
visioncache one on the same requests. vllm-mlx 0.6.0's API returns no logprobs and counts no
vision-tower calls, so the server process records both itself: every call of the model's vision
tower (with its image count) and every token the batch generator emits (with its top log-probs,
keyed by the request's prompt and images). The recording wraps only methods the integration
leaves alone (the tower, ``MLLMBatchGenerator.insert`` / ``next``), so both servers are measured
by the same code; ``insert`` also records each request's templated prompt and images, which an
in-process reference (mlx-vlm's own ``generate``) can replay. The same ``next`` wrapper records
which requests each step took from the queue
(what the engine actually batched) and can hold the queue (`ServerProcess.hold`): while a hold
for n requests is armed, an idle generator starts nothing until n requests are queued, so a test
gets requests sent concurrently into ONE step by construction, not by the odds of their timing.
The visioncache server also records what its reads cost (`_count_reads`): every byte given to the
content hasher, every byte its tiers return, and every handle opened.

vllm-mlx refuses media URLs on loopback (its SSRF check); a test that serves images from a local
HTTP server starts both servers with ``allow_loopback_media=True``, which lets 127.0.0.1 through
that check (and nothing else) in both, the same way.

Run by `ServerProcess`: ``python -m tests.support.vllm_mlx_server RECORD stock|visioncache
MODEL [flags]``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from blake3 import blake3

from tests.support.mlx_towers import counted, towers

__all__ = ["ENGINES", "ServerProcess", "free_port", "request_key"]

ENGINES = ("stock", "visioncache")
TOP_LOGPROBS = 5
LOOPBACK_MEDIA_VARIABLE = "HARNESS_ALLOW_LOOPBACK_MEDIA"
HOLD_TIMEOUT_S = 120.0  # a hold whose requests never all arrive is released (and recorded) after this


def hold_path(record_path: str | Path) -> Path:
    """The file that arms a hold: it holds the number of requests to wait for."""
    return Path(record_path).with_suffix(".hold")


def request_key(prompt: str, images: Sequence[Any]) -> str:
    """Names a request by its templated prompt and image inputs (the same in both servers)."""
    return blake3(json.dumps([prompt, [str(image) for image in images or []]]).encode()).hexdigest()[:24]


def _count_towers(write: Callable[[dict[str, Any]], None]) -> None:
    def record(count: int) -> None:
        write({"kind": "tower", "images": count})

    for tower, images in towers():
        tower.__call__ = counted(tower.__call__, images, record)


def _count_forwards(write: Callable[[dict[str, Any]], None]) -> None:
    """Record every forward of Qwen2-VL's decoder stack with the positions it computes (its
    batch rows and tokens per row): prefill chunks are the calls of one row over more than one
    token, whoever makes them (vllm-mlx's vision forward, its prefix-hit path, visioncache's feed)."""
    from mlx_vlm.models.qwen2_vl import language

    forward = language.Qwen2Model.__call__

    def counted_forward(self: Any, inputs: Any, inputs_embeds: Any = None, *args: Any, **options: Any) -> Any:
        shape = (inputs_embeds if inputs_embeds is not None else inputs).shape
        write({"kind": "forward", "rows": int(shape[0]), "tokens": int(shape[1])})
        return forward(self, inputs, inputs_embeds, *args, **options)

    language.Qwen2Model.__call__ = counted_forward  # type: ignore[method-assign]


class _CountedHasher:
    """A blake3 hasher whose ``update`` input is recorded."""

    def __init__(self, inner: Any, write: Callable[[dict[str, Any]], None]) -> None:
        self._inner, self._write = inner, write

    def update(self, data: Any) -> _CountedHasher:
        self._write({"kind": "hashed", "bytes": memoryview(data).nbytes})
        self._inner.update(data)
        return self

    def digest(self, *args: Any, **options: Any) -> Any:
        return self._inner.digest(*args, **options)


def _count_reads(write: Callable[[dict[str, Any]], None]) -> None:
    """Record every byte visioncache's content hasher is given (``hashed``), every byte its tiers
    return (``tier_read``) and every handle it opens (``opened``)."""
    from visioncache.identity import files, hasher
    from visioncache.integrations.handles import handle_codec
    from visioncache.tiers import chain
    from visioncache.trees import tree_nbytes

    def counted_blake3(data: Any = b"", **options: Any) -> _CountedHasher:
        counted = _CountedHasher(blake3(**options), write)
        return counted.update(data) if memoryview(data).nbytes else counted

    hasher.blake3 = files.blake3 = counted_blake3  # type: ignore[assignment]
    load_many, open_handle = chain.TierChain.load_many, handle_codec.HandleCodec.open

    def counted_load_many(self: Any, keys: Any) -> list[Any]:
        trees: list[Any] = load_many(self, keys)
        write({"kind": "tier_read", "bytes": sum(tree_nbytes(tree) for tree in trees if tree is not None)})
        return trees

    def counted_open(self: Any, handle: str, *kind: Any) -> bytes:
        write({"kind": "opened"})
        digest: bytes = open_handle(self, handle, *kind)  # kind: "image" or "video"
        return digest

    chain.TierChain.load_many = counted_load_many  # type: ignore[method-assign]
    handle_codec.HandleCodec.open = counted_open  # type: ignore[method-assign]


def _instrument(record_path: str, engine: str) -> None:
    """Record tower calls and emitted tokens (with top log-probs) as JSON lines."""
    import mlx.core as mx
    from vllm_mlx import mllm_batch_generator as generator_module

    lock = threading.Lock()
    record = open(record_path, "a", buffering=1)  # noqa: SIM115 - open for the process's lifetime

    def write(entry: dict[str, Any]) -> None:
        with lock:
            record.write(json.dumps(entry) + "\n")

    _count_towers(write)
    _count_forwards(write)
    if engine == "visioncache":
        _count_reads(write)

    generator = generator_module.MLLMBatchGenerator
    original_insert, original_next = generator.insert, generator.next
    keys: dict[int, str] = {}
    hold_file, held_since = hold_path(record_path), [0.0]

    def held(self: Any) -> bool:
        """True while an armed hold waits for more queued requests (an idle generator only)."""
        if self.active_batch and len(self.active_batch) > 0:
            return False
        try:
            wanted = int(hold_file.read_text())  # written atomically by `ServerProcess.hold`
        except FileNotFoundError:
            held_since[0] = 0.0
            return False
        held_since[0] = held_since[0] or time.monotonic()
        timed_out = time.monotonic() - held_since[0] > HOLD_TIMEOUT_S
        if len(self.unprocessed_requests) < wanted and not timed_out:
            time.sleep(0.002)  # the event loop still serves requests between steps
            return True
        hold_file.unlink(missing_ok=True)
        held_since[0] = 0.0
        write({"kind": "hold", "queued": len(self.unprocessed_requests), "timed_out": timed_out})
        return False

    def insert(self: Any, requests: list[Any]) -> list[int]:
        uids: list[int] = original_insert(self, requests)
        for request in requests:
            key = keys[request.uid] = request_key(request.prompt, request.images or [])
            images = [str(image) for image in request.images or []]
            write({"kind": "request", "key": key, "prompt": request.prompt, "images": images})
        return uids

    def next_tokens(self: Any) -> list[Any]:
        if held(self):
            return []
        queued = [request.uid for request in self.unprocessed_requests]
        responses: list[Any] = original_next(self)
        left = {request.uid for request in self.unprocessed_requests}
        taken = [keys.get(uid) for uid in queued if uid not in left]
        if taken:
            write({"kind": "step", "requests": taken})
        for response in responses:
            entry: dict[str, Any] = {"kind": "token", "key": keys.get(response.uid), "token": response.token}
            entry["finish_reason"] = response.finish_reason
            if response.finish_reason != "error" and response.logprobs.size > 1:
                logprobs = np.array(response.logprobs.astype(mx.float32))
                top = np.argsort(-logprobs, kind="stable")[:TOP_LOGPROBS]
                entry["top"] = [[int(index), float(logprobs[index])] for index in top]
            write(entry)
        return responses

    generator.insert, generator.next = insert, next_tokens


def _allow_loopback_media() -> None:
    """vllm-mlx's URL safety check, except that 127.0.0.1 passes (where the tests serve images)."""
    from urllib.parse import urlparse

    from vllm_mlx import server
    from vllm_mlx.models import mllm

    check = mllm._validate_url_safety

    def validate(url: str) -> None:
        if urlparse(url).hostname != "127.0.0.1":
            check(url)

    mllm._validate_url_safety = server._validate_url_safety = validate


def main(argv: Sequence[str]) -> int:
    record_path, engine, *serve_args = argv
    if engine not in ENGINES:
        raise SystemExit(f"engine must be one of {ENGINES}, got {engine!r}")
    _instrument(record_path, engine)
    if os.environ.get(LOOPBACK_MEDIA_VARIABLE) == "1":
        _allow_loopback_media()
    if engine == "visioncache":
        from visioncache.integrations.vllm_mlx import serve

        return serve(serve_args)
    from vllm_mlx import cli

    cli.serve_command(cli.create_parser().parse_args(["serve", *serve_args]))
    return 0


REPOSITORY = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class ServerProcess:
    """One server (stock or visioncache) on loopback; its HOME and TMPDIR live under ``root``.

    vllm-mlx writes data-URL images to temporary files and keeps its prefix cache under
    ``~/.cache``: both stay inside ``root``, and a restart with the same ``root`` finds them.
    """

    def __init__(
        self,
        engine: str,
        model_dir: str | Path,
        root: str | Path,
        *flags: str,
        allow_loopback_media: bool = False,
        environment: dict[str, str] | None = None,
    ) -> None:
        self.engine, self.root = engine, Path(root)
        self.environment = dict(environment or {})  # e.g. a variable a --vision-cache-*-env flag names
        self.allow_loopback_media = allow_loopback_media
        self.port = free_port()
        self.record_path = self.root / f"record-{self.port}.jsonl"
        self.log_path = self.root / f"server-{self.port}.log"
        self.command = [
            sys.executable,
            "-m",
            "tests.support.vllm_mlx_server",
            str(self.record_path),
            engine,
        ]
        self.command += [str(model_dir), "--served-model-name", "model", "--continuous-batching", "--mllm"]
        self.command += ["--offline", "--host", "127.0.0.1", "--port", str(self.port), *flags]
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 180.0) -> ServerProcess:
        for name in ("home", "tmp"):
            (self.root / name).mkdir(parents=True, exist_ok=True)
        env = dict(
            os.environ, HOME=str(self.root / "home"), TMPDIR=str(self.root / "tmp"), HF_HUB_OFFLINE="1"
        )
        env = {name: value for name, value in env.items() if not name.startswith("VISIONCACHE_")}
        env[LOOPBACK_MEDIA_VARIABLE] = "1" if self.allow_loopback_media else "0"
        env.update(self.environment)
        # ``-m tests.support.vllm_mlx_server`` resolves from the repository root.
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPOSITORY), env.get("PYTHONPATH")]))
        with open(self.log_path, "ab") as log:
            self._process = subprocess.Popen(self.command, env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(
                    f"{self.engine} server exited ({self._process.returncode}): {self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(self.base_url + "/health", timeout=2):
                    return self
            except OSError:
                time.sleep(0.25)
        self.stop()
        raise RuntimeError(f"{self.engine} server did not start in {timeout:.0f} s: {self.log_tail()}")

    def stop(self, timeout: float = 60.0) -> int | None:
        """Stop gracefully (SIGINT: vllm-mlx saves its prefix cache, tiers flush), then kill."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return None if process is None else process.returncode
        process.send_signal(signal.SIGINT)
        try:
            return process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            return process.wait()

    @contextmanager
    def hold(self, count: int) -> Iterator[None]:
        """Within the block, the idle engine starts nothing until ``count`` requests are queued;
        they are then taken together (if the engine batches them: see the ``step`` records)."""
        path = hold_path(self.record_path)
        partial = path.with_suffix(".hold-partial")
        partial.write_text(str(count))
        partial.replace(path)  # atomic: the server never reads half a number
        try:
            yield
        finally:
            path.unlink(missing_ok=True)

    def get_json(self, path: str) -> Any:
        return json.loads(self.get_text(path))

    def get_text(self, path: str) -> str:
        with urllib.request.urlopen(self.base_url + path, timeout=30) as response:
            text: str = response.read().decode()
            return text

    def records(self, kind: str) -> list[dict[str, Any]]:
        if not self.record_path.exists():
            return []
        lines = self.record_path.read_text().splitlines()
        return [entry for entry in map(json.loads, lines) if entry["kind"] == kind]

    def log_tail(self, characters: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-characters:] if self.log_path.exists() else ""

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
