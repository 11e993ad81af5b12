"""The multi-user, multi-turn, multi-image chat workload the vLLM tests and benchmark send.

Each user's conversation resends its history every turn (as OpenAI-style clients do), and users
share images, so one image appears in many requests. Requests are sent one at a time, so every run
batches identically and greedy outputs can be compared exactly.
"""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image

QUESTIONS = ["describe the image", "what is in this picture", "compare these two images", "tell me about it"]
SIZES = [(112, 140), (140, 112), (168, 168), (112, 112), (196, 140), (140, 196), (126, 154), (154, 126)]


def image_data_url(seed: int, size: tuple[int, int] | None = None) -> str:
    """A random PNG (deterministic per seed) as a ``data:`` URL."""
    width, height = size or SIZES[seed % len(SIZES)]
    pixels = (np.random.default_rng(seed).random((height, width, 3)) * 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


@dataclass(frozen=True)
class Workload:
    """``users`` conversations of ``turns`` turns over images ``first_seed .. first_seed+distinct-1``."""

    users: int = 3
    turns: int = 4
    distinct: int = 5
    first_seed: int = 0
    image_size: tuple[int, int] | None = None  # None: sizes vary by seed
    spread: bool = False  # two images every turn, spread over the pool (many distinct prefixes)
    uuid: str | None = None  # a client-chosen ID on every image part (vLLM's "uuid")
    processor_kwargs: tuple[tuple[str, int], ...] = ()  # the request's mm_processor_kwargs

    def turn_images(self, user: int, turn: int) -> list[int]:
        """Seeds of the images the user adds at this turn (one or two, shared between users)."""
        if self.spread:
            base = 2 * turn + user
            return [self.first_seed + base % self.distinct, self.first_seed + (base + 5) % self.distinct]
        first = self.first_seed + (user + turn) % self.distinct
        if turn % 2 == 1:
            return [first, self.first_seed + (user + turn + 2) % self.distinct]
        return [first]

    def requests(self) -> list[tuple[int, int]]:
        """(user, turn) in sending order: turn by turn, user by user."""
        return [(user, turn) for turn in range(self.turns) for user in range(self.users)]

    def messages(self, user: int, turn: int, replies: dict[tuple[int, int], str]) -> list[dict[str, Any]]:
        """The conversation up to this turn; earlier turns carry the assistant's earlier replies."""
        messages: list[dict[str, Any]] = []
        for earlier in range(turn + 1):
            content: list[dict[str, Any]] = [
                self._image_part(seed) for seed in self.turn_images(user, earlier)
            ]
            content.append({"type": "text", "text": QUESTIONS[(user + earlier) % len(QUESTIONS)]})
            messages.append({"role": "user", "content": content})
            if earlier < turn:
                messages.append({"role": "assistant", "content": replies[(user, earlier)]})
        return messages

    def _image_part(self, seed: int) -> dict[str, Any]:
        url = image_data_url(seed, self.image_size)
        part: dict[str, Any] = {"type": "image_url", "image_url": {"url": url}}
        if self.uuid is not None:
            part["uuid"] = self.uuid
        return part

    @property
    def images_sent(self) -> int:
        return sum(
            len(self.turn_images(user, earlier))
            for user, turn in self.requests()
            for earlier in range(turn + 1)
        )

    def max_images_per_request(self) -> int:
        return max(
            sum(len(self.turn_images(user, earlier)) for earlier in range(turn + 1))
            for user, turn in self.requests()
        )


MAIN = Workload()
WARM_UP_SEED = 999
# The same shape over other images: what a second phase (or a fault test) sends.
OTHER = Workload(first_seed=100)
# More and larger images (64 embeddings each) than vLLM's encoder cache holds when its budget is
# small: with an EC connector configured, vLLM sizes that cache for the largest video (448
# embeddings here, about 7 of these images), so the comparison runs set the same option.
# The benchmark's images: 448x448, 256 embeddings each (its model allows that many pixels).
BENCH = Workload(first_seed=300, image_size=(448, 448))
BUDGET = Workload(distinct=12, first_seed=200, image_size=(224, 224), spread=True)
# One image named by a client's ID, then another image under the same ID: vLLM takes a 64-hex ID
# as the item identifier itself, and hashes any ID together with the request's processor options
# into an identifier that looks like a content hash.
CLIENT_HEX_ID = "ab" * 32
CLIENT_ID_A = Workload(users=1, turns=1, distinct=1, first_seed=400, uuid=CLIENT_HEX_ID)
CLIENT_ID_B = Workload(users=1, turns=1, distinct=1, first_seed=401, uuid=CLIENT_HEX_ID)
CLIENT_KWARGS = (("max_pixels", 224 * 224),)  # the tiny model's own setting: only the hash changes
CLIENT_ID_KWARGS_A = Workload(
    users=1, turns=1, distinct=1, first_seed=400, uuid="client-chosen", processor_kwargs=CLIENT_KWARGS
)
CLIENT_ID_KWARGS_B = Workload(
    users=1, turns=1, distinct=1, first_seed=401, uuid="client-chosen", processor_kwargs=CLIENT_KWARGS
)
# The first image again under another ID: the same content.
CLIENT_ID_A_RENAMED = Workload(users=1, turns=1, distinct=1, first_seed=400, uuid="cd" * 32)
# Every family's workload: two users, two turns, three images (a second turn resends the first).
FAMILY = Workload(users=2, turns=2, distinct=3, first_seed=500)
# Ten requests, each with an image of its own: ten saves queued one after the other.
TEN_IMAGES = Workload(users=10, turns=1, distinct=10, first_seed=600)
