"""The chat workload the vllm-mlx tests send through the real ``openai`` client.

Three users, four turns each, history re-sent every turn (as OpenAI-style clients do): turn 1 is
a shared image, turn 2 the user's own image, turn 3 a text-only follow-up, turn 4 the next user's
image. The system prompt is long enough (128+ tokens with the images) for vllm-mlx's prefix cache,
which stores nothing shorter. Each user words the questions their own way (`question`), so no two
requests are the same: stock vllm-mlx answers a repeated request from its pixel cache without the
model inputs it cleared after the first (Gemma 4's image token types; docs/vllm-mlx.md), which
test_vllm_mlx_families.py checks on its own.
"""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from PIL import Image

SYSTEM = " ".join(["you are a helpful assistant look at the photo and describe it"] * 10)
QUESTIONS = ("describe the image", "compare the image and the picture", "what is in this picture", "and this")
_WORDING = ("", " please", " now")  # user n's words after each question


def question(turn: int, user: int) -> str:
    """What ``user`` asks at ``turn`` (0-based)."""
    return QUESTIONS[turn] + _WORDING[user % len(_WORDING)]


SIZES = ((112, 112), (84, 112), (112, 84), (140, 112), (112, 140), (84, 84), (140, 140))  # (w, h)


def image_png(seed: int, size: tuple[int, int] | None = None) -> bytes:
    """A distinct random PNG; sizes vary with the seed, so grids differ."""
    width, height = size or SIZES[seed % len(SIZES)]
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "PNG")
    return buffer.getvalue()


def image_url(seed: int, size: tuple[int, int] | None = None) -> str:
    """`image_png` as a data URL."""
    return "data:image/png;base64," + base64.b64encode(image_png(seed, size)).decode()


def user_message(text: str, *images: str) -> dict[str, Any]:
    parts: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": url}} for url in images]
    return {"role": "user", "content": [*parts, {"type": "text", "text": text}]}


@dataclass
class Reply:
    text: str
    prompt_tokens: int
    finish_reason: str


@dataclass
class Conversation:
    """One user's chat; `send` adds the user turn, asks the server, and keeps the answer."""

    messages: list[dict[str, Any]] = field(default_factory=lambda: [{"role": "system", "content": SYSTEM}])
    logit_bias: dict[str, float] | None = None  # e.g. keep a random model from writing image markers

    def send(self, client: Any, text: str, *images: str, max_tokens: int = 6) -> Reply:
        self.messages.append(user_message(text, *images))
        reply = complete(client, self.messages, max_tokens, self.logit_bias)
        self.messages.append({"role": "assistant", "content": reply.text})
        return reply


def complete(
    client: Any,
    messages: list[dict[str, Any]],
    max_tokens: int = 6,
    logit_bias: dict[str, float] | None = None,
) -> Reply:
    options = {} if logit_bias is None else {"logit_bias": logit_bias}
    response = client.chat.completions.create(
        model="model", messages=messages, max_tokens=max_tokens, temperature=0.0, **options
    )
    choice = response.choices[0]
    return Reply(choice.message.content or "", response.usage.prompt_tokens, choice.finish_reason)


def turn_images(user: int, turn: int, shared: str, own: list[str]) -> tuple[str, ...]:
    """The images user ``user`` sends at ``turn`` (0-based) of the three-user workload."""
    return ((shared,), (own[user],), (), (own[(user + 1) % len(own)],))[turn]


def client_for(base_url: str) -> Any:
    from openai import OpenAI

    return OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=120)
