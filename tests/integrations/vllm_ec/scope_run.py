"""Run a script of steps through one in-process vLLM engine and write what each step did as JSON.

``python -m tests.integrations.vllm_ec.scope_run --model DIR --out result.json --steps JSON [--ec-config JSON]
[--lora]``, started as a subprocess by `tests/integrations/vllm_ec/test_scopes.py` (one engine per process, as
`engine_run`). A step is one of:

- ``{"request": IMAGE_SEED, "salt": SALT or null, "lora": [NAME, ID, PATH, INPLACE] or null}``: one
  greedy request with that image, ``cache_salt`` and LoRA adapter; reports its tokens and top-5
  logprobs and the items the vision encoder encoded for it (counted on the model);
- ``{"add_lora": [NAME, ID, PATH, INPLACE]}``: the engine's ``add_lora`` (what vLLM's server runs
  for ``/v1/load_lora_adapter``; ``INPLACE`` reloads an id it already has);
- ``{"update_weights": "collective_rpc", "seed": N}``: new vision-connector weights through
  ``collective_rpc`` and the model's ``load_weights`` (how RL frameworks refit a running engine),
  nothing reset after it;
- ``{"update_weights": "direct", "seed": N}``: new weights written into the model object in this
  process, then ``reset_encoder_cache`` (vLLM's documented call after a weight update);
- ``{"reset_encoder_cache": true}``.

Engine options: the other vLLM tests' (`engine_run.engine_arguments`), prefix caching off, and with
``--lora`` the tiny tower/connector LoRA settings (`tiny_lora`).

vLLM 0.32 (and 0.33, the same file) cannot start an EC producer with tower/connector LoRA: at
start-up it measures the encoder's output width by encoding a dummy item
(``encoder_output_width._measure_on_worker``) before any LoRA mapping is set, and the LoRA layers
index an uninitialised buffer (``IndexError`` on this CPU). Only vLLM's Mooncake and CPU connectors
read that width; so with ``--lora`` and a connector, this run records the tiny model's width
(`tiny_lora.ENCODER_OUTPUT_WIDTH`) instead of measuring it, and changes nothing else in vLLM.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from tests.integrations.vllm_ec.engine_run import (
    MAX_TOKENS,
    TOP_LOGPROBS,
    answered,
    engine_arguments,
    scheduler_connector,
)
from tests.integrations.vllm_ec.tiny_lora import ENCODER_OUTPUT_WIDTH
from tests.integrations.vllm_ec.tiny_lora import ENGINE_ARGUMENTS as LORA_ARGUMENTS

# The tiny model's chat template, rendered for one image and one question.
PROMPT = (
    "<|im_start|> user <|vision_start|> <|image_pad|> <|vision_end|> describe the image <|im_end|> "
    "<|im_start|> assistant "
)
# The checkpoint tensor an in-place update replaces: the connector's layer norm (a parameter no
# LoRA layer wraps, so its name is the same with LoRA enabled).
UPDATED = "model.visual.merger.ln_q.weight"
UPDATED_PARAMETER = "visual.merger.ln_q.weight"  # its name in vLLM's model


def _image(seed: int) -> Any:
    import io

    import pybase64
    from PIL import Image

    from tests.integrations.vllm_ec.workload import image_data_url

    data = pybase64.b64decode(image_data_url(seed).split(",", 1)[1])
    return Image.open(io.BytesIO(data)).convert("RGB")


def new_weights(seed: int, shape: tuple[int, ...]) -> Any:
    """The updated tensor of step ``seed`` (the same in every engine)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    return (1 + torch.randn(shape, generator=generator) * 0.5).to(torch.bfloat16)


def load_new_weights(worker: Any, seed: int) -> None:
    """Run on each worker by ``collective_rpc``: the model's own ``load_weights``, as a refit does."""
    model = worker.model_runner.model
    parameter = dict(model.named_parameters())[UPDATED_PARAMETER]
    model.load_weights([(UPDATED, new_weights(seed, tuple(parameter.shape)))])


def _lora(spec: list[Any] | None) -> Any:
    if spec is None:
        return None
    from vllm.lora.request import LoRARequest

    name, lora_id, path, inplace = spec
    return LoRARequest(name, int(lora_id), str(path), load_inplace=bool(inplace))


def run_step(llm: Any, step: dict[str, Any], log: str) -> dict[str, Any]:
    from vllm import SamplingParams

    from tests.integrations.vllm_ec.encoder_counter import encoded_items

    if "request" in step:
        prompt: dict[str, Any] = {"prompt": PROMPT, "multi_modal_data": {"image": _image(step["request"])}}
        if step.get("salt"):
            prompt["cache_salt"] = step["salt"]
        params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, logprobs=TOP_LOGPROBS)
        before = encoded_items(log)
        result = llm.generate(prompt, params, use_tqdm=False, lora_request=_lora(step.get("lora")))[0]
        _, output = answered(result, 0.0)
        return {"encoded": encoded_items(log) - before, "output": output}
    if "add_lora" in step:
        return {"added": bool(llm.llm_engine.add_lora(_lora(step["add_lora"])))}
    if step.get("update_weights") == "collective_rpc":
        llm.collective_rpc(load_new_weights, args=(int(step["seed"]),))
        return {}
    if step.get("update_weights") == "direct":
        model = llm.llm_engine.model_executor.driver_worker.worker.model_runner.model
        parameter = dict(model.named_parameters())[UPDATED_PARAMETER]
        parameter.data.copy_(new_weights(int(step["seed"]), tuple(parameter.shape)))
        llm.llm_engine.reset_encoder_cache()
        return {}
    if step.get("reset_encoder_cache"):
        llm.llm_engine.reset_encoder_cache()
        return {}
    raise ValueError(f"unknown step {step!r}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", required=True)
    parser.add_argument("--ec-config")
    parser.add_argument("--lora", action="store_true")
    args = parser.parse_args()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    log = os.environ["VISIONCACHE_TEST_ENCODER_LOG"]

    from tests.integrations.vllm_ec.encoder_counter import install

    install()
    from vllm import LLM

    if args.lora and args.ec_config:
        from vllm.distributed.ec_transfer.ec_connector import encoder_output_width

        encoder_output_width._measure_on_worker = lambda worker: {"image": ENCODER_OUTPUT_WIDTH}
    arguments = engine_arguments(args.model, json.loads(args.ec_config) if args.ec_config else None, None)
    arguments["enable_prefix_caching"] = False
    if args.lora:
        arguments.update(LORA_ARGUMENTS)
    llm = LLM(**arguments)
    results = [run_step(llm, step, log) for step in json.loads(args.steps)]
    connector = scheduler_connector(llm)
    report = {"steps": results, "connector": connector.totals() if connector is not None else {}}
    llm.llm_engine.engine_core.shutdown()
    Path(args.out).write_text(json.dumps(report))


if __name__ == "__main__":
    main()
