"""mlx-vlm's own ``generate``, one request at a time: the reference for the families stock
vllm-mlx 0.6.0 cannot serve (its every image request fails for them).

A request is replayed from what the server recorded (`tests.support.vllm_mlx_server`: its
templated prompt and its image URLs): its inputs are ``mlx_vlm.utils.prepare_inputs``' for that
prompt and those images, as vllm-mlx's own preprocessing calls it, and its tokens come from
mlx-vlm's ``stream_generate`` on those inputs (greedy, the request's logit bias), each with its
top log-probs, as the server harness records them. LLaVA's inputs are its ``LlavaProcessor``'s,
called with images and text alone: mlx-vlm 0.7.10's ``prepare_inputs`` itself fails for LLaVA
under transformers 5 (it passes ``padding=`` on to the image processor), as stock vllm-mlx does.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from PIL import Image

from tests.support.vllm_mlx_server import TOP_LOGPROBS

__all__ = ["Oracle", "decode_image"]


def decode_image(url: str) -> Image.Image:
    """A ``data:image/...;base64,`` URL's image, as RGB."""
    return Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))).convert("RGB")


class Oracle:
    """A model directory loaded by mlx-vlm, generating one request at a time."""

    def __init__(self, model_dir: str | None = None, *, loaded: tuple[Any, Any] | None = None) -> None:
        """The model in ``model_dir``, or an already ``loaded`` (model, processor)."""
        if loaded is None:
            from mlx_vlm import load

            loaded = load(model_dir)
        self.model, self.processor = loaded

    def inputs(self, prompt: str, images: Sequence[Image.Image]) -> dict[str, Any]:
        from mlx_vlm.utils import prepare_inputs

        config = self.model.config
        if config.model_type == "llava":  # mlx-vlm's prepare_inputs fails for it (see the module)
            return dict(self.processor(images=list(images), text=[prompt]))
        token_index = getattr(config, "image_token_index", None)
        prepare: Any = prepare_inputs
        return dict(
            prepare(self.processor, images=list(images), prompts=prompt, image_token_index=token_index)
        )

    def tokens(
        self,
        prompt: str,
        image_urls: Sequence[str],
        max_tokens: int,
        logit_bias: Mapping[str, float] | None = None,
    ) -> list[dict[str, Any]]:
        """mlx-vlm's greedy tokens for the request, each with its top log-probs, as
        ``{"token": id, "top": [[id, logprob], ...]}``."""
        inputs = self.inputs(prompt, [decode_image(url) for url in image_urls])
        return self.generate(inputs, max_tokens, logit_bias)

    def generate(
        self, inputs: Mapping[str, Any], max_tokens: int, logit_bias: Mapping[str, float] | None = None
    ) -> list[dict[str, Any]]:
        """mlx-vlm's ``stream_generate`` on ``inputs`` (``input_ids``, ``pixel_values``,
        ``attention_mask`` and the model's other inputs): its tokens with their top log-probs."""
        import mlx.core as mx
        from mlx_vlm.generate import stream_generate

        inputs = dict(inputs)
        input_ids, pixel_values = inputs.pop("input_ids"), inputs.pop("pixel_values", None)
        mask = inputs.pop("attention_mask", None)
        bias = {int(token): float(value) for token, value in (logit_bias or {}).items()}
        results = stream_generate(
            self.model,
            self.processor,
            "",
            input_ids=input_ids,
            pixel_values=pixel_values,
            mask=mask,
            max_tokens=max_tokens,
            temperature=0.0,
            logit_bias=bias or None,
            **inputs,
        )
        tokens = []
        for result in results:
            # Every token once; the last result repeats the last token (finish_reason "length")
            # or is the stop token (finish_reason "stop"), which the server emits too.
            if result.token is None or getattr(result, "finish_reason", None) == "length":
                continue
            logprobs = np.array(result.logprobs.astype(mx.float32)).reshape(-1)
            top = np.argsort(-logprobs, kind="stable")[:TOP_LOGPROBS]
            tokens.append({"token": int(result.token), "top": [[int(i), float(logprobs[i])] for i in top]})
        return tokens
