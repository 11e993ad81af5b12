"""Chat traffic for the bench: users in multi-turn conversations that resend their images.

Why: a cache is only as good as the traffic it meets. OpenAI-style clients resend every image of
a conversation with each turn, users share popular images, and the same image comes back with
different questions; this workload has all three, with real photos shipped by installed packages
(matplotlib's and scikit-image's sample data) and generated ones, as ``data:`` URLs as clients
send them. It is engine-agnostic: an engine's runner renders ``chat_prompt`` with its own image
placeholder. Deterministic for a given seed.
"""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass

import numpy as np
from PIL import Image

from visioncache.bench.vocabulary import IMAGE_PLACEHOLDER

__all__ = [
    "MODES",
    "Request",
    "Turn",
    "Workload",
    "build_workload",
    "chat_prompt",
    "question_prompt",
    "sample_images",
]

# The bench's image modes, side by side: no cache, the reference's prompt-keyed pixel cache, and
# visioncache's per-image pixels and embeddings (every engine's runner runs these three).
MODES = ("off", "prompt_keyed", "visioncache")

QUESTIONS = (
    "describe the image",
    "what is in this picture",
    "what colour is the background",
    "how many people are there",
    "tell me more about the left of the photo",
    "what is on the right",
    "describe the foreground in detail",
    "which one is the cat",
)
ANSWER = "it is a photo of a person and a cup"  # canned assistant turn: later prompts grow


@dataclass(frozen=True)
class Turn:
    """One user message: the images it attaches (indexes into ``Workload.images``) and its question."""

    image_indexes: tuple[int, ...]
    question: str


@dataclass(frozen=True)
class Request:
    """One chat request: the user's conversation so far, ending with the new question."""

    user: int
    turns: tuple[Turn, ...]

    @property
    def image_indexes(self) -> tuple[int, ...]:
        """Every image of the conversation, in order: clients resend them all with each turn."""
        return tuple(index for turn in self.turns for index in turn.image_indexes)


@dataclass(frozen=True)
class Workload:
    """Images (as ``data:`` URLs) and the requests that send them, in arrival order."""

    image_names: tuple[str, ...]
    images: tuple[str, ...]
    requests: tuple[Request, ...]

    def repeated_only(self) -> list[bool]:
        """Per request: whether every image it sends was already sent by an earlier request."""
        seen: set[int] = set()
        flags = []
        for request in self.requests:
            flags.append(bool(request.image_indexes) and seen.issuperset(request.image_indexes))
            seen.update(request.image_indexes)
        return flags

    @property
    def images_sent(self) -> int:
        return sum(len(request.image_indexes) for request in self.requests)

    @property
    def distinct_images_sent(self) -> int:
        return len({index for request in self.requests for index in request.image_indexes})


def sample_photos() -> list[tuple[str, np.ndarray]]:
    """The real photos shipped by matplotlib and scikit-image, as (name, RGB array)."""
    import matplotlib.cbook
    import skimage.data

    hopper = Image.open(matplotlib.cbook.get_sample_data("grace_hopper.jpg", asfileobj=False))
    photos = [("grace_hopper", np.asarray(hopper.convert("RGB")))]
    for name in ("astronaut", "coffee", "chelsea"):
        photos.append((name, np.asarray(getattr(skimage.data, name)())))
    return photos


def _generated(index: int, rng: np.random.Generator) -> np.ndarray:
    """A 4:3 scene of a colour gradient, noise and a few rectangles: non-trivial to encode."""
    height, width = 384, 512
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x / width, y / height, np.full((height, width), (index * 0.37) % 1.0)], -1)
    image = base * 200 + rng.normal(0, 12, (height, width, 3))
    for _ in range(4):
        top, left = rng.integers(0, height - 64), rng.integers(0, width - 64)
        image[top : top + rng.integers(32, 128), left : left + rng.integers(32, 128)] = rng.integers(
            0, 256, 3
        )
    return np.clip(image, 0, 255).astype(np.uint8)


def _data_url(array: np.ndarray, max_side: int) -> str:
    image = Image.fromarray(array)
    image.thumbnail((max_side, max_side), Image.Resampling.BICUBIC)
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=90)
    return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def sample_images(image_size: int, generated_images: int, seed: int = 0) -> list[tuple[str, str]]:
    """(name, data URL) of the four shipped photos and ``generated_images`` generated ones,
    each resized so that its longest side is ``image_size`` pixels."""
    rng = np.random.default_rng(seed)
    arrays = sample_photos() + [(f"generated_{i}", _generated(i, rng)) for i in range(generated_images)]
    return [(name, _data_url(array, image_size)) for name, array in arrays]


def build_workload(
    users: int = 3, turns: int = 3, image_size: int = 224, generated_images: int = 2, seed: int = 0
) -> Workload:
    """``users`` conversations of ``turns`` turns, interleaved turn by turn as traffic arrives.

    User ``u`` opens with photo ``u`` (photos are shared once users outnumber them), asks its
    second question about the same image, and from the third turn on attaches one more image it
    has not sent yet, the generated ones first, then other users' photos, so users share those.
    """
    if users < 1 or turns < 1 or image_size < 28 or generated_images < 0:
        raise ValueError("users and turns must be >= 1, image_size >= 28, generated_images >= 0")
    named = sample_images(image_size, generated_images, seed)
    photos = 4
    conversations: list[list[Turn]] = [[] for _ in range(users)]
    requests: list[Request] = []
    for turn in range(turns):
        for user in range(users):
            if turn == 0:
                attached: tuple[int, ...] = (user % photos,)
            elif turn == 1:
                attached = ()
            else:
                attached = _next_new_image(conversations[user], photos + user + turn - 2, len(named))
            question = QUESTIONS[(user + 3 * turn) % len(QUESTIONS)]
            conversations[user].append(Turn(attached, question))
            requests.append(Request(user, tuple(conversations[user])))
    return Workload(tuple(name for name, _ in named), tuple(url for _, url in named), tuple(requests))


def _next_new_image(conversation: list[Turn], start: int, count: int) -> tuple[int, ...]:
    """The first image from ``start`` on (cyclically) not yet in the conversation, if any."""
    sent = {index for turn in conversation for index in turn.image_indexes}
    for offset in range(count):
        if (start + offset) % count not in sent:
            return ((start + offset) % count,)
    return ()


def chat_prompt(request: Request, image_placeholder: str = IMAGE_PLACEHOLDER) -> str:
    """The conversation in ChatML (Qwen's chat format), one placeholder per image, in order."""
    parts = []
    for index, turn in enumerate(request.turns):
        images = "".join(image_placeholder for _ in turn.image_indexes)
        parts.append(f"<|im_start|>user\n{images}{turn.question}<|im_end|>\n")
        if index < len(request.turns) - 1:
            parts.append(f"<|im_start|>assistant\n{ANSWER}<|im_end|>\n")
    return "".join(parts) + "<|im_start|>assistant\n"


def question_prompt(question: str, num_images: int = 1, image_placeholder: str = IMAGE_PLACEHOLDER) -> str:
    """`chat_prompt` of one user turn: ``num_images`` image placeholders, then ``question``."""
    return chat_prompt(Request(0, (Turn(tuple(range(num_images)), question),)), image_placeholder)
