"""Run workloads through one in-process vLLM engine and write what happened as JSON.

``python -m tests.integrations.vllm_ec.engine_run --model DIR --out result.json [--ec-config JSON]
[--budget N] [--max-model-len N] [--workload main|other ...]``. Started as a subprocess by the
tests and the benchmark: one engine per process (vLLM keeps per-process globals), in-process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``: 3-4 s to start instead of 20-40 s). Reports, per workload:
greedy token ids and top-5 logprobs per request, failed requests, items the vision encoder
encoded (counted by `encoder_counter`), and time to first token per request; plus the connector's counters.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from tests.integrations.vllm_ec.workload import (
    BENCH,
    BUDGET,
    CLIENT_ID_A,
    CLIENT_ID_A_RENAMED,
    CLIENT_ID_B,
    CLIENT_ID_KWARGS_A,
    CLIENT_ID_KWARGS_B,
    FAMILY,
    MAIN,
    OTHER,
    WARM_UP_SEED,
    Workload,
    image_data_url,
)

WORKLOADS = {
    "main": MAIN,
    "other": OTHER,
    "budget": BUDGET,
    "bench": BENCH,
    "client-id-a": CLIENT_ID_A,
    "client-id-b": CLIENT_ID_B,
    "client-id-kwargs-a": CLIENT_ID_KWARGS_A,
    "client-id-kwargs-b": CLIENT_ID_KWARGS_B,
    "client-id-a-renamed": CLIENT_ID_A_RENAMED,
    "family": FAMILY,
}
TOP_LOGPROBS = 5
MAX_TOKENS = 6
KV_CACHE_BYTES = 64 * 2**20
MAX_MODEL_LEN = 4096  # a family whose images are thousands of tokens each asks for more


def engine_arguments(
    model: str,
    ec_config: dict[str, Any] | None,
    budget: int | None,
    mm_embeds: bool = False,
    max_model_len: int = MAX_MODEL_LEN,
) -> dict[str, Any]:
    """Arguments shared by the in-process engine and (as flags) the OpenAI server."""
    arguments: dict[str, Any] = {
        "model": model,
        "dtype": "bfloat16",
        "max_model_len": max_model_len,
        "limit_mm_per_prompt": {
            "image": max(w.max_images_per_request() for w in WORKLOADS.values()),
            "video": 0,
        },
        "seed": 0,
        "enforce_eager": True,
        "gpu_memory_utilization": 0.1,
        # An explicit KV cache (the tiny models need a few MiB) instead of 10% of the host's
        # memory per engine: several engines run side by side on a shared machine.
        "kv_cache_memory_bytes": KV_CACHE_BYTES,
        "disable_log_stats": False,  # per-request time to first token; connector stats hooks
    }
    if budget is not None:
        arguments["max_num_batched_tokens"] = budget
    if mm_embeds:
        # What vLLM turns on by itself for an EC consumer; it sizes the encoder cache for videos.
        arguments["enable_mm_embeds"] = True
    if ec_config is not None:
        arguments["ec_transfer_config"] = ec_config
    return arguments


def answered(result: Any, started: float) -> tuple[float, dict[str, Any]]:
    """A finished request's time to first token (vLLM's own metric, else the time since
    ``started``) and its output as the runs report it: token ids and top-5 logprobs."""
    metrics = getattr(result, "metrics", None)
    first = getattr(metrics, "first_token_latency", None) if metrics is not None else None
    completion = result.outputs[0]
    output = {
        "token_ids": list(completion.token_ids),
        "logprobs": [
            sorted((token, entry.logprob) for token, entry in step.items()) for step in completion.logprobs
        ],
    }
    return (first if first else time.perf_counter() - started), output


def describe(error: BaseException) -> str:
    """An error in one line, as the reports carry it."""
    return f"{type(error).__name__}: {error}".splitlines()[0][:300]


def run_requests(llm: Any, workload: Workload, log: str) -> dict[str, Any]:
    """The workload's requests one at a time, in order (the one loop the tests and the benchmarks
    run): each request's output, None where it failed (its error in ``errors``, in order), items
    encoded meanwhile, and the time to first token of each answered request."""
    from vllm import SamplingParams

    from tests.integrations.vllm_ec.encoder_counter import encoded_items

    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, logprobs=TOP_LOGPROBS)
    before = encoded_items(log)
    replies: dict[tuple[int, int], str] = {}
    outputs: list[dict[str, Any] | None] = []
    errors: list[str] = []
    first_token_seconds: list[float] = []
    for user, turn in workload.requests():
        started = time.perf_counter()
        try:
            result = llm.chat(
                workload.messages(user, turn, replies),
                params,
                use_tqdm=False,
                mm_processor_kwargs=dict(workload.processor_kwargs) or None,
            )[0]
        except Exception as error:  # reported: the tests require none, the fault benchmarks count them
            print(f"request failed: {error!r}", file=sys.stderr)
            errors.append(describe(error))
            outputs.append(None)
            replies[(user, turn)] = ""
            continue
        seconds, output = answered(result, started)
        first_token_seconds.append(seconds)
        replies[(user, turn)] = result.outputs[0].text
        outputs.append(output)
    return {
        "encoded": encoded_items(log) - before,
        "errors": errors,
        "outputs": outputs,
        "first_token_seconds": first_token_seconds,
    }


def run_workload(llm: Any, workload: Workload, log: str) -> dict[str, Any]:
    """`run_requests` as the tests read it: the answered requests' outputs, and how many failed."""
    ran = run_requests(llm, workload, log)
    outputs = [output for output in ran["outputs"] if output is not None]
    return {
        "encoded": ran["encoded"],
        "failed": len(ran["errors"]),
        "outputs": outputs,
        "first_token_seconds": ran["first_token_seconds"],
    }


def warm_up(llm: Any) -> None:
    """One request with an image no workload uses: the first request pays one-off kernel set-up."""
    from vllm import SamplingParams

    image = {"type": "image_url", "image_url": {"url": image_data_url(WARM_UP_SEED)}}
    messages = [{"role": "user", "content": [image, {"type": "text", "text": "describe the image"}]}]
    llm.chat(messages, SamplingParams(max_tokens=1), use_tqdm=False)


def evict_after_load() -> None:
    """Delete every entry from its tiers right after the scheduler has read it: as if another
    process evicted it between ``has_cache_item`` and the worker's step."""
    from visioncache.integrations.vllm.item_store import ItemStore

    original = ItemStore.load

    def load_then_evict(self: ItemStore, key: str, **kwargs: Any) -> Any:
        entry = original(self, key, **kwargs)
        for tier in self.chain.tiers:
            for name in self.chain.tier_keys(key):
                tier.delete(name)
        return entry

    ItemStore.load = load_then_evict  # type: ignore[method-assign]


def scheduler_connector(llm: Any) -> Any:
    """The scheduler-side connector of an in-process engine (None without one)."""
    core = getattr(getattr(llm.llm_engine, "engine_core", None), "engine_core", None)
    return getattr(getattr(core, "scheduler", None), "ec_connector", None)


def exported_metrics(connector: Any) -> dict[str, float]:
    """What visioncache's Prometheus collector exports for the connector: ``name{labels}`` -> value."""
    from prometheus_client import CollectorRegistry, generate_latest

    from visioncache.metrics import register_metrics

    registry = CollectorRegistry()
    register_metrics(connector, registry)
    samples = {}
    for line in generate_latest(registry).decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--ec-config")
    parser.add_argument("--budget", type=int)
    parser.add_argument("--mm-embeds", action="store_true")
    parser.add_argument("--max-model-len", type=int, default=MAX_MODEL_LEN)
    parser.add_argument("--evict-after-load", action="store_true")
    parser.add_argument("--workload", action="append", choices=sorted(WORKLOADS))
    args = parser.parse_args()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    log = os.environ["VISIONCACHE_TEST_ENCODER_LOG"]

    from tests.integrations.vllm_ec.encoder_counter import install

    install()
    if args.evict_after_load:
        evict_after_load()
    from vllm import LLM

    ec_config = json.loads(args.ec_config) if args.ec_config else None
    started = time.perf_counter()
    llm = LLM(**engine_arguments(args.model, ec_config, args.budget, args.mm_embeds, args.max_model_len))
    result: dict[str, Any] = {"start_seconds": time.perf_counter() - started, "workloads": {}}
    warm_up(llm)
    for name in args.workload or ["main"]:
        result["workloads"][name] = run_workload(llm, WORKLOADS[name], log)
    connector = scheduler_connector(llm)
    result["connector"] = connector.totals() if connector is not None else {}
    result["metrics"] = exported_metrics(connector) if connector is not None else {}
    llm.llm_engine.engine_core.shutdown()
    Path(args.out).write_text(json.dumps(result))


if __name__ == "__main__":
    main()
