"""One in-process vLLM engine for `compare_ec_example.py`: a workload, a connector, maybe a fault.

    python benchmarks/_ec_engine.py --model DIR --out result.json --workload JSON
        [--ec-config JSON] [--delete-mid-run DIR] [--report-errors]

One engine per process (vLLM keeps per-process globals), in-process (scheduler and worker in one
process: ``VLLM_ENABLE_V1_MULTIPROCESSING=0``, as `tests/integrations/vllm_ec/engine_run.py`). The
workload is a `tests.integrations.vllm_ec.workload.Workload` given by its fields; its requests go
one at a time through the tests' loop (`engine_run.run_requests`), and each request's tokens and
top-5 logprobs are reported, or its error.

After the workload, one more request with a new image (the probe) tells whether the engine still
serves at all after a fault.

``--delete-mid-run DIR``: every time the scheduler has chosen to load an item from the connector
(right after ``update_state_after_alloc``), every entry file under DIR is deleted, as another
process evicting or cleaning the directory would between that decision and the worker's step.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.integrations.vllm_ec.engine_run import describe  # noqa: E402
from tests.integrations.vllm_ec.workload import Workload  # noqa: E402

# What holds an entry's bytes: vLLM's ECExampleConnector writes <dir>/<mm_hash>/encoder_cache.safetensors,
# visioncache's disk tier value files (diskcache's *.val; its index is cache.db).
ENTRY_FILES = ("encoder_cache.safetensors", "*.val")
CONNECTOR_CLASSES = {
    "ECExampleConnector": "vllm.distributed.ec_transfer.ec_connector.example_connector",
    "VisionCacheECConnector": "visioncache.integrations.vllm.connector",
}


def entry_files(directory: Path) -> list[Path]:
    return sorted(path for pattern in ENTRY_FILES for path in directory.rglob(pattern))


def delete_after_alloc(connector_name: str, directory: Path) -> None:
    """Patch the connector class: once the scheduler has chosen to load an item (its
    ``has_cache_item`` said yes) and ``update_state_after_alloc`` has run for it, delete every
    entry file under ``directory``."""
    import importlib

    cls = getattr(importlib.import_module(CONNECTOR_CLASSES[connector_name]), connector_name)
    has_cache_item, update_state_after_alloc = cls.has_cache_item, cls.update_state_after_alloc
    chosen: set[str] = set()

    def has(self: Any, identifier: str) -> bool:
        found = bool(has_cache_item(self, identifier))
        if found:
            chosen.add(identifier)
        return found

    def then_delete(self: Any, request: Any, index: int) -> None:
        update_state_after_alloc(self, request, index)
        identifier = request.mm_features[index].identifier
        if identifier in chosen:
            chosen.discard(identifier)
            for path in entry_files(directory):
                path.unlink(missing_ok=True)

    cls.has_cache_item, cls.update_state_after_alloc = has, then_delete


def fresh_image_request(llm: Any, seed: int) -> str | None:
    """One request with an image no run has sent; its error, if any. Before the workload it is
    the warm-up (one-off kernel set-up); after it, the probe: does the engine still serve?"""
    from vllm import SamplingParams

    from tests.integrations.vllm_ec.workload import image_data_url

    image = {"type": "image_url", "image_url": {"url": image_data_url(seed)}}
    messages = [{"role": "user", "content": [image, {"type": "text", "text": "describe the image"}]}]
    try:
        llm.chat(messages, SamplingParams(max_tokens=1), use_tqdm=False)
    except Exception as error:
        traceback.print_exc()
        return describe(error)
    return None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--workload", required=True, help="a Workload's fields as JSON")
    parser.add_argument("--ec-config")
    parser.add_argument("--delete-mid-run", type=Path)
    args = parser.parse_args()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    log = os.environ["VISIONCACHE_TEST_ENCODER_LOG"]
    fields = json.loads(args.workload)
    workload = Workload(**{**fields, "image_size": tuple(fields["image_size"])})
    ec = json.loads(args.ec_config) if args.ec_config else None

    from tests.integrations.vllm_ec.encoder_counter import install
    from tests.integrations.vllm_ec.engine_run import engine_arguments, run_requests, scheduler_connector

    install()
    if args.delete_mid_run is not None:
        assert ec is not None, "--delete-mid-run needs a connector"
        delete_after_alloc(ec["ec_connector"], args.delete_mid_run)
    from vllm import LLM

    report: dict[str, Any] = {"start_error": None}
    try:
        llm = LLM(**engine_arguments(args.model, ec, None))
    except Exception as error:  # a connector that cannot start is an outcome too
        traceback.print_exc()
        report["start_error"] = describe(error)
        args.out.write_text(json.dumps(report))
        return
    report["warm_up_error"] = fresh_image_request(llm, 10_000 + os.getpid())
    report.update(run_requests(llm, workload, log))  # a failed request keeps its place: None
    report["probe_error"] = fresh_image_request(llm, 20_000 + os.getpid())
    connector = scheduler_connector(llm)
    report["connector"] = connector.totals() if hasattr(connector, "totals") else {}
    try:
        llm.llm_engine.engine_core.shutdown()
    except Exception as error:  # an engine a fault broke may not shut down cleanly
        report["shutdown_error"] = describe(error)
    args.out.write_text(json.dumps(report))


if __name__ == "__main__":
    main()
