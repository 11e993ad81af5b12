"""What the integration did inside one engine: tower calls, images encoded, KV reused."""

from __future__ import annotations

from dataclasses import asdict, dataclass

__all__ = ["EngineStats"]


@dataclass
class EngineStats:
    """Counters of one batch generator (updated on its scheduler thread only).

    Reported next to the cache's own counters by vllm-mlx's ``/v1/cache/stats`` (under
    ``engine_cache.vision_embedding_cache``) and by the Prometheus collector.
    """

    image_requests: int = 0  # requests whose images were served through visioncache
    image_request_errors: int = 0  # of those, failed (bad image, placeholder mismatch, ...)
    scheduler_steps: int = 0  # steps that prepared at least one image request
    vision_tower_calls: int = 0  # one per step with missing images (more only after a failure)
    images_encoded: int = 0  # images that went through the tower
    kv_prefix_hits: int = 0  # image requests that reused cached KV
    kv_prefix_misses: int = 0
    kv_prefix_refused: int = 0  # hits not used: the family cannot prefill their tail exactly
    kv_tokens_reused: int = 0  # prompt tokens whose KV was reused instead of computed
    kv_covered_images_not_encoded: int = 0  # images whose reused KV covered them: no lookup, no tower
    kv_covered_images_encoded_late: int = 0  # of those, encoded after all (the engine reused less)

    def as_dict(self) -> dict[str, int]:
        return asdict(self)
