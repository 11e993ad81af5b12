"""The connector's digest of an image, computed outside an engine: what ``visioncache purge --image
--vllm-model`` removes.

The connector keys an item by the inputs vLLM's multimodal processor makes of it
(`encoder_inputs`), not by the image's bytes. So an image is put through the same path an
offline ``LLM.chat`` request takes (vLLM's renderer for the model: the media loader, the chat
template, the processor with the request's ``mm_processor_kwargs``), without loading the model,
and its processed item is digested as the scheduler digests it. Needs vLLM (the versions of
`versions.SUPPORTED`).
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

from visioncache.errors import ConfigurationError
from visioncache.integrations.vllm.encoder_inputs import encoder_input_digest
from visioncache.integrations.vllm.installed import RELEASE  # the vLLM and transformers checked

__all__ = ["RELEASE", "encoder_input_digests"]


def _data_url(image: bytes) -> str:
    """The image as a ``data:image/...`` URL (how an OpenAI client sends it)."""
    import io

    from PIL import Image

    try:
        with Image.open(io.BytesIO(image)) as opened:
            kind = (opened.format or "png").lower()
    except Exception as error:
        raise ConfigurationError(f"not an image vLLM can read: {error}") from None
    return f"data:image/{kind};base64," + base64.b64encode(image).decode()


def encoder_input_digests(
    model: str, images: Sequence[bytes], *, mm_processor_kwargs: dict[str, Any] | None = None
) -> list[bytes]:
    """The encoder-input digest of each image (encoded bytes) for vLLM serving ``model``."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.renderers import renderer_from_config
    from vllm.renderers.params import ChatParams

    config = EngineArgs(model=model, limit_mm_per_prompt={"image": 1}).create_engine_config()
    renderer = renderer_from_config(config)
    extras = None if mm_processor_kwargs is None else {"mm_processor_kwargs": mm_processor_kwargs}
    params = ChatParams(
        chat_template_kwargs={"add_generation_prompt": True}, mm_processor_kwargs=mm_processor_kwargs
    )
    digests = []
    for index, image in enumerate(images):
        part = {"type": "image_url", "image_url": {"url": _data_url(image)}}
        conversation = [{"role": "user", "content": [part]}]
        _, inputs = renderer.render_chat(
            [conversation], params, renderer.default_chat_tok_params, prompt_extras=extras, skip_mm_cache=True
        )
        items = inputs[0].get("mm_kwargs", {}).get("image", []) if inputs else []
        digest = encoder_input_digest("image", items[0]) if items else None
        if digest is None:
            raise ConfigurationError(
                f"image {index}: vLLM's processor for {model!r} made no image input of it"
            )
        digests.append(digest)
    return digests
