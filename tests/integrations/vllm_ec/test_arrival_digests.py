"""Items are hashed as their request arrives (vLLM's input thread), not on the scheduler's thread,
and the scheduler keys them by that same digest of their inputs (`arrival_digests`; vLLM's own
field classes, no engine: `test_client_ids.py` runs it in a real engine)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
from vllm.multimodal.inputs import MultiModalBatchedField, MultiModalFieldElem, MultiModalKwargsItem

from visioncache.integrations.vllm import arrival_digests
from visioncache.integrations.vllm.arrival_digests import digest_on_arrival, hash_on_arrival, marked_digest
from visioncache.integrations.vllm.encoder_inputs import encoder_input_digest
from visioncache.integrations.vllm.scheduled_items import ScheduledItems

PIXELS = torch.arange(24, dtype=torch.float32).reshape(4, 6)


def _inputs(pixels: torch.Tensor) -> MultiModalKwargsItem:
    element = MultiModalFieldElem(data=pixels, field=MultiModalBatchedField())
    return MultiModalKwargsItem({"pixel_values": element})


def _request(*items: tuple[str, Any]) -> Any:
    position = SimpleNamespace(offset=0, length=4)
    features = [
        SimpleNamespace(identifier=f"id{index}", mm_position=position, modality=modality, data=data)
        for index, (modality, data) in enumerate(items)
    ]
    return SimpleNamespace(request_id="r", mm_features=features)


def _items() -> tuple[ScheduledItems, dict[str, float]]:
    counts: dict[str, float] = {}

    def count(name: str, value: float) -> None:
        counts[name] = counts.get(name, 0) + value

    return ScheduledItems(lambda request: None, lambda scope: "", count), counts


def test_an_item_hashed_on_arrival_is_keyed_by_that_digest_and_not_hashed_again() -> None:
    request = _request(("image", _inputs(PIXELS)), ("prompt_embeds", _inputs(PIXELS)), ("image", None))
    digest_on_arrival(request)
    image, embeds, absent = request.mm_features
    assert marked_digest(image) == encoder_input_digest("image", image.data)
    assert marked_digest(embeds) is None and marked_digest(absent) is None  # nothing to key: unmarked
    image.data = _inputs(PIXELS + 1)  # were the scheduler to hash it again, the digest would differ
    items, counts = _items()
    assert items.digest_of(request, 0) == encoder_input_digest("image", _inputs(PIXELS))
    assert items.digest_of(request, 1) is None
    assert counts == {}  # neither the image nor the pass-through item was hashed late


def test_an_item_not_hashed_on_arrival_is_hashed_by_the_scheduler_and_counted() -> None:
    request = _request(("image", _inputs(PIXELS)))
    items, counts = _items()
    assert items.digest_of(request, 0) == encoder_input_digest("image", _inputs(PIXELS))
    assert items.digest_of(request, 0) == encoder_input_digest("image", _inputs(PIXELS))
    assert counts == {"late_digests": 1}  # once per request item


def test_a_digest_that_fails_on_arrival_leaves_the_item_to_the_scheduler() -> None:
    request = _request(("image", {"pixel_values": 1, 2: 3}), ("image", _inputs(PIXELS)))
    digest_on_arrival(request)  # sorting the first item's field names raises TypeError: logged, not raised
    broken, fine = request.mm_features
    assert marked_digest(broken) is None and marked_digest(fine) is not None


def test_preprocess_add_request_is_wrapped_once_and_hashes_only_for_this_connector() -> None:
    from vllm.v1.engine.core import EngineCore

    hash_on_arrival()
    wrapped = EngineCore.preprocess_add_request
    hash_on_arrival()
    assert EngineCore.preprocess_add_request is wrapped  # once per process

    made: list[Any] = []

    def original(engine: Any, raw: Any) -> tuple[Any, int]:
        made.append(_request(("image", _inputs(PIXELS))))
        return made[-1], 0

    preprocess = arrival_digests._wrap(original)
    ours = SimpleNamespace(scheduler=SimpleNamespace(ec_connector=SimpleNamespace(hashes_on_arrival=True)))
    other = SimpleNamespace(scheduler=SimpleNamespace(ec_connector=object()))
    assert preprocess(ours, "raw")[1] == 0 and marked_digest(made[-1].mm_features[0]) is not None
    preprocess(other, "raw")
    assert marked_digest(made[-1].mm_features[0]) is None  # an engine without this connector: untouched
