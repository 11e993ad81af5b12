"""The reference module's behaviour, and one regression test per defect (docs/reference-api.md)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from tests.conftest import data_url
from visioncache import (
    EncodingCacheEntry,
    InvalidImageError,
    PixelCacheEntry,
    PixelOnlyCacheEntry,
    UnsupportedImageTypeError,
    UnsupportedInputTypeError,
    VisionCacheStats,
    VisionEmbeddingCache,
    compute_image_hash,
)


def pixels(value: float, nbytes: int = 64) -> np.ndarray:
    return np.full(nbytes // 4, value, dtype=np.float32)


def store_pixels(cache: VisionEmbeddingCache, images, prompt="p", value=1.0, **kwargs) -> None:
    cache.set_pixel_cache(images, prompt, pixels(value), np.arange(3), **kwargs)


# ---- behaviour ---------------------------------------------------------------------------------
def test_defaults_and_repr():
    cache = VisionEmbeddingCache()
    assert (cache.max_pixel_entries, cache.max_encoding_entries, cache.enabled) == (100, 50, True)
    assert repr(cache) == "<VisionEmbeddingCache pixel=0/100 pixel_only=0/100 encoding=0/50>"


def test_pixel_hit_returns_entry_counts_and_adds_time_saved(make_png):
    cache = VisionEmbeddingCache()
    image = make_png(1)
    assert cache.get_pixel_cache([image], "p") is None
    store_pixels(cache, [image], image_grid_thw=np.array([[1, 2, 2]]), processing_time=0.5)
    entry = cache.get_pixel_cache([image], "p")
    assert isinstance(entry, PixelCacheEntry) and entry.processing_time == 0.5
    stats = cache.get_stats()
    assert (stats["pixel_cache_hits"], stats["pixel_cache_misses"]) == (1, 1)
    assert stats["pixel_hit_rate"] == 0.5 and stats["total_time_saved"] == pytest.approx(0.5)


def test_prompt_is_part_of_the_pixel_and_encoding_keys(make_png):
    cache = VisionEmbeddingCache()
    image = make_png(1)
    store_pixels(cache, [image], "first")
    cache.set_encoding_cache([image], "first", np.zeros(2), 7, np.zeros(2), encoding_time=1.0)
    assert cache.get_pixel_cache([image], "second") is None
    assert cache.get_encoding_cache([image], "second") is None
    encoding = cache.get_encoding_cache([image], "first")
    assert isinstance(encoding, EncodingCacheEntry) and encoding.first_token == 7
    assert cache.stats.encoding_hit_rate == 0.5


def test_pixel_only_level_is_prompt_independent(make_png):
    cache = VisionEmbeddingCache()
    image = make_png(1)
    cache.set_pixel_values([image], pixels(2.0), image_grid_thw=(1, 2, 2), processing_time=0.1)
    entry = cache.get_pixel_values([image])
    assert isinstance(entry, PixelOnlyCacheEntry) and entry.image_grid_thw == (1, 2, 2)


def test_lru_eviction_when_full(make_png):
    cache = VisionEmbeddingCache(max_pixel_entries=2)
    a, b, c = make_png(1), make_png(2), make_png(3)
    store_pixels(cache, [a])
    store_pixels(cache, [b])
    cache.get_pixel_cache([a], "p")
    store_pixels(cache, [c])
    assert cache.get_pixel_cache([b], "p") is None and cache.get_pixel_cache([a], "p") is not None


def test_disabled_cache_and_empty_images_do_nothing(make_png):
    cache = VisionEmbeddingCache(enabled=False)
    store_pixels(cache, [make_png(1)])
    assert cache.get_pixel_cache([make_png(1)], "p") is None
    assert cache.get_stats()["pixel_cache_size"] == 0
    cache = VisionEmbeddingCache()
    store_pixels(cache, [])
    assert cache.get_pixel_cache([], "p") is None and cache.get_stats()["pixel_cache_misses"] == 0


def test_clear_empties_levels_and_resets_stats(make_png):
    cache = VisionEmbeddingCache()
    store_pixels(cache, [make_png(1)])
    cache.get_pixel_cache([make_png(1)], "p")
    cache.clear()
    stats = cache.get_stats()
    assert stats["pixel_cache_size"] == 0 and stats["pixel_cache_hits"] == 0
    assert stats["total_images_processed"] == 0


def test_stats_dict_has_every_reference_key():
    stats = VisionEmbeddingCache().get_stats()
    reference_keys = {
        "pixel_cache_hits",
        "pixel_cache_misses",
        "pixel_hit_rate",
        "encoding_cache_hits",
        "encoding_cache_misses",
        "encoding_hit_rate",
        "total_time_saved",
        "total_images_processed",
        "pixel_cache_size",
        "pixel_only_cache_size",
        "encoding_cache_size",
    }
    assert reference_keys <= stats.keys()
    assert set(VisionCacheStats().to_dict()) == reference_keys - {
        "pixel_cache_size",
        "pixel_only_cache_size",
        "encoding_cache_size",
    }


def test_mlx_and_torch_arrays_come_back_as_the_same_objects(make_png):
    torch = pytest.importorskip("torch")
    mx = pytest.importorskip("mlx.core", reason="mlx cannot be installed on this platform")
    cache = VisionEmbeddingCache()
    values, grid = mx.ones((4, 3)), torch.tensor([[1, 2, 2]])
    cache.set_pixel_cache([make_png(1)], "p", values, torch.arange(3), image_grid_thw=grid)
    entry = cache.get_pixel_cache([make_png(1)], "p")
    assert entry.pixel_values is values and entry.image_grid_thw is grid


# ---- one regression test per defect of the reference -------------------------------------------
def test_defect_1_image_order_is_part_of_the_key(make_png):
    cache = VisionEmbeddingCache()
    a, b = make_png(1), make_png(2)
    store_pixels(cache, [a, b], value=1.0)
    assert cache.get_pixel_cache([b, a], "p") is None
    assert cache.get_pixel_values([b, a]) is None


def test_defect_2_data_url_and_file_share_a_key_and_deleted_files_raise(make_png, settled_file):
    cache = VisionEmbeddingCache()
    image = make_png(1)
    path = settled_file(image)
    store_pixels(cache, [str(path)])
    assert cache.get_pixel_cache([data_url(image)], "p") is not None
    path.unlink()
    with pytest.raises(InvalidImageError, match=str(path)):
        cache.get_pixel_cache([str(path)], "p")


def test_defect_3_digests_are_not_truncated_to_64_bits(make_png):
    assert len(compute_image_hash(make_png(1))) * 4 >= 128


def test_defect_4_concurrent_set_and_get_under_eviction_are_safe(make_png):
    cache = VisionEmbeddingCache(max_pixel_entries=4, max_pixel_bytes=400)
    images = [make_png(seed) for seed in range(12)]
    errors: list[BaseException] = []
    gets = [0] * 8
    barrier = threading.Barrier(8)

    def churn(worker: int) -> None:
        barrier.wait()
        try:
            for step in range(300):
                image = images[(worker * 7 + step) % len(images)]
                if step % 3:
                    cache.get_pixel_cache([image], "p")
                    gets[worker] += 1
                else:
                    store_pixels(cache, [image], value=step)
                stats = cache.get_stats()
                assert stats["pixel_cache_size"] <= 4 and stats["pixel_cache_bytes"] <= 400
        except BaseException as error:  # pragma: no cover - reported below
            errors.append(error)

    threads = [threading.Thread(target=churn, args=(worker,)) for worker in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    stats = cache.get_stats()
    assert stats["pixel_cache_hits"] + stats["pixel_cache_misses"] == sum(gets)
    assert stats["pixel_cache_size"] <= 4 and stats["pixel_cache_bytes"] <= 400


def test_defect_5_zero_entries_disables_the_level_without_raising(make_png):
    cache = VisionEmbeddingCache(max_pixel_entries=0, max_encoding_entries=0)
    store_pixels(cache, [make_png(1)])
    cache.set_encoding_cache([make_png(1)], "p", 1, 1, 1)
    assert cache.get_pixel_cache([make_png(1)], "p") is None
    assert cache.get_encoding_cache([make_png(1)], "p") is None


def test_defect_6_resetting_a_key_refreshes_it_and_evicts_nothing(make_png):
    cache = VisionEmbeddingCache(max_pixel_entries=2)
    a, b, c = make_png(1), make_png(2), make_png(3)
    store_pixels(cache, [a])
    store_pixels(cache, [b])
    store_pixels(cache, [a], value=5.0)  # replace a: b must stay, a becomes most recent
    assert cache.get_stats()["pixel_cache_size"] == 2
    store_pixels(cache, [c])  # evicts b, not a
    assert cache.get_pixel_cache([a], "p").pixel_values[0] == 5.0
    assert cache.get_pixel_cache([b], "p") is None


def test_defect_7_extra_kwargs_are_copied_on_store_and_on_hit(make_png):
    cache = VisionEmbeddingCache()
    extra = {"video": None, "sizes": [1, 2]}
    store_pixels(cache, [make_png(1)], extra_kwargs=extra)
    extra.clear()
    first = cache.get_pixel_cache([make_png(1)], "p")
    first.extra_kwargs["sizes"].append(3)
    first.extra_kwargs.clear()
    assert cache.get_pixel_cache([make_png(1)], "p").extra_kwargs == {"video": None, "sizes": [1, 2]}


def test_defect_8_pixel_only_lookups_have_their_own_counters(make_png):
    cache = VisionEmbeddingCache()
    cache.get_pixel_values([make_png(1)])
    cache.set_pixel_values([make_png(1)], pixels(1.0))
    cache.get_pixel_values([make_png(1)])
    stats = cache.get_stats()
    assert (stats["pixel_cache_hits"], stats["pixel_cache_misses"]) == (0, 0)
    assert (stats["pixel_only_cache_hits"], stats["pixel_only_cache_misses"]) == (1, 1)


def test_defect_9_repeated_stores_of_one_key_count_its_images_once(make_png):
    cache = VisionEmbeddingCache()
    for _ in range(3):
        store_pixels(cache, [make_png(1), make_png(2)])
    assert cache.stats.total_images_processed == 2


def test_defect_10_levels_are_bounded_in_bytes(make_png):
    cache = VisionEmbeddingCache(max_pixel_bytes="1KiB")
    for seed in range(4):
        cache.set_pixel_cache([make_png(seed)], "p", pixels(1.0, nbytes=400), np.arange(4, dtype=np.int32))
    stats = cache.get_stats()
    assert stats["pixel_cache_bytes"] <= 1024 and stats["pixel_cache_size"] == 2
    assert stats["pixel_cache_evictions"] == 2


def test_defect_11_a_later_chat_turn_reuses_each_images_encoder_output(make_png):
    """The reference caches only prompt-keyed pixels: a longer prompt (the next chat turn) misses,
    and even a hit runs the vision encoder again. The embedding level is per image, whatever the
    prompt or the other images of the request."""
    cache = VisionEmbeddingCache()
    a, b, c = make_png(1), make_png(2), make_png(3)
    encoded: list[int] = []

    def encode(images):
        encoded.append(len(images))
        return [pixels(float(len(encoded))) for _ in images]

    turn_1 = "user: <image><image> compare"
    store_pixels(cache, [a, b], prompt=turn_1)
    first = cache.encode_images([a, b], encode)
    turn_2 = turn_1 + " assistant: ... user: <image> and this one?"
    assert cache.get_pixel_cache([a, b, c], turn_2) is None  # the prompt-keyed level cannot help
    second = cache.encode_images([b, a, c], encode)  # another order, one new image
    assert encoded == [2, 1]  # only c reached the encoder on turn 2
    assert second[0] is first[1] and second[1] is first[0]
    assert cache.get_stats()["embedding_cache_hits"] == 2


@pytest.mark.parametrize("framework", ["numpy", "torch", "mlx"])
def test_byte_budget_counts_nbytes_of_every_framework(make_png, framework):
    if framework == "numpy":
        value = np.zeros((10, 10), dtype=np.float32)
    elif framework == "torch":
        value = pytest.importorskip("torch").zeros((10, 10), dtype=pytest.importorskip("torch").bfloat16)
    else:
        mx = pytest.importorskip("mlx.core", reason="mlx cannot be installed on this platform")
        value = mx.zeros((10, 10), dtype=mx.float16)
    cache = VisionEmbeddingCache(max_pixel_bytes=value.nbytes + 12)
    cache.set_pixel_cache([make_png(1)], "p", value, np.arange(3, dtype=np.int32))
    assert cache.get_stats()["pixel_cache_bytes"] == value.nbytes + 12
    cache.set_pixel_cache([make_png(2)], "p", value, np.arange(4, dtype=np.int32))  # 4 bytes too many
    stats = cache.get_stats()
    assert stats["pixel_cache_size"] == 1 and stats["pixel_cache_rejections"] == 1


def test_oversize_value_is_not_stored_and_the_call_succeeds(make_png):
    cache = VisionEmbeddingCache(max_pixel_bytes=100)
    store_pixels(cache, [make_png(1)])
    cache.set_pixel_cache([make_png(2)], "p", pixels(1.0, nbytes=400), np.arange(3))
    assert cache.get_pixel_cache([make_png(1)], "p") is not None
    assert cache.get_stats()["pixel_cache_rejections"] == 1


# ---- bad input: typed error, message names the input, state unchanged -----------------------------
@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda c, ok: c.get_pixel_cache([ok, "/missing.png"], "p"), InvalidImageError),
        (lambda c, ok: c.set_pixel_cache([ok, "/missing.png"], "p", 1, 1), InvalidImageError),
        (lambda c, ok: c.get_pixel_values("just-a-string"), UnsupportedImageTypeError),
        (lambda c, ok: c.set_pixel_values([ok, 3.5], 1), UnsupportedImageTypeError),
        (lambda c, ok: c.get_encoding_cache([ok], b"bytes prompt"), UnsupportedInputTypeError),
        (lambda c, ok: c.set_encoding_cache(["data:image/png;base64,!!"], "p", 1, 1, 1), InvalidImageError),
        (lambda c, ok: c.get_image_embeddings([ok, b""]), InvalidImageError),
        (lambda c, ok: c.encode_images([ok, None], lambda xs: xs), UnsupportedImageTypeError),
    ],
)
def test_bad_input_leaves_the_cache_unchanged(make_png, call, error):
    cache = VisionEmbeddingCache()
    ok = make_png(1)
    store_pixels(cache, [ok])
    before = cache.get_stats()
    with pytest.raises(error):
        call(cache, ok)
    assert cache.get_stats() == before


def test_invalid_configuration_is_rejected():
    from visioncache import ConfigurationError

    with pytest.raises(ConfigurationError, match="parsecs"):
        VisionEmbeddingCache(max_pixel_bytes="2 parsecs")
    with pytest.raises(ConfigurationError, match="max_pixel_entries"):
        VisionEmbeddingCache(max_pixel_entries=-1)
    with pytest.raises(ConfigurationError, match="namespace"):
        VisionEmbeddingCache(namespace="")


def test_namespace_and_salt_separate_entries(make_png):
    image = make_png(1)
    caches = [
        VisionEmbeddingCache(namespace="m1"),
        VisionEmbeddingCache(namespace="m2"),
        VisionEmbeddingCache(namespace="m1", salt="tenant-a"),
    ]
    keys = {cache.key("pixel", [image], "p") for cache in caches}
    assert len(keys) == 3


def test_path_hits_do_not_reread_the_file(make_png, settled_file, monkeypatch):
    cache = VisionEmbeddingCache()
    path = str(settled_file(make_png(1)))
    store_pixels(cache, [path])
    real_open = open
    monkeypatch.setattr("builtins.open", lambda *a, **k: pytest.fail("file re-read") or real_open(*a, **k))
    assert cache.get_pixel_cache([path], "p") is not None


def test_reference_private_key_helpers_exist_and_keep_order(make_png, settled_file):
    """Peers' tests call the reference's `_make_key(images, prompt)` and `_make_image_only_key(images)`;
    they must exist, with the order fix (defect 1 in docs/reference-api.md)."""
    cache = VisionEmbeddingCache()
    a, b = make_png(1), make_png(2)
    path = str(settled_file(a))
    assert cache._make_key([a, b], "p") != cache._make_key([b, a], "p")
    assert cache._make_key([a, b], "p") != cache._make_key([a, b], "q")
    assert cache._make_key([path, b], "p") == cache._make_key([a, b], "p")  # content, not the name
    assert cache._make_image_only_key([a, b]) != cache._make_image_only_key([b, a])
    assert cache._make_image_only_key([a]) != cache._make_key([a], "p")
    assert cache._make_image_only_key([a]) == cache.key("pixel_only", [a])
