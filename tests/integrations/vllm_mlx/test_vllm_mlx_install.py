"""`install` for people who embed vllm-mlx's engine: version pinning, what is patched and restored,
the launcher's refusals, the cache's identity, and the batch generator driven in process
(Qwen2.5-VL here; the server tests use Qwen2-VL)."""

from __future__ import annotations

import base64
import inspect
import io
import json
import tempfile
import uuid
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from tests.integrations.vllm_mlx.chat import SYSTEM, image_url
from tests.support.threads import run_threads
from visioncache import ConfigurationError
from visioncache.integrations import vllm_mlx
from visioncache.integrations.vllm_mlx import VisionCacheSettings, install
from visioncache.integrations.vllm_mlx.launcher import check_model_type, serve
from visioncache.integrations.vllm_mlx.patches import GENERATOR_METHODS
from visioncache.integrations.vllm_mlx.settings import weights_identity

generator_module = pytest.importorskip("vllm_mlx.mllm_batch_generator")
scheduler_module = pytest.importorskip("vllm_mlx.mllm_scheduler")
PATCHED = GENERATOR_METHODS  # from the seam table (compat.SEAMS)


def current_code() -> dict[str, Any]:
    code = {name: inspect.getattr_static(generator_module.MLLMBatchGenerator, name) for name in PATCHED}
    code["scheduler"] = inspect.getattr_static(scheduler_module.MLLMScheduler, "__init__")
    return {**code, "guard": generator_module.is_text_only_prefix_cache_request}


@pytest.fixture
def stock_code() -> Iterator[dict[str, Any]]:
    """vllm-mlx's own code; the test fails if anything is left patched after it."""
    before = current_code()
    yield before
    installation = vllm_mlx.installed()
    if installation is not None:
        installation.uninstall()
    assert current_code() == before


def test_another_vllm_mlx_version_is_refused_before_anything_is_patched(
    stock_code: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    real_version = metadata.version
    monkeypatch.setattr(
        metadata, "version", lambda name: "0.5.2" if name == "vllm-mlx" else real_version(name)
    )
    with pytest.raises(ConfigurationError, match=r"supports vllm-mlx ==0\.6\.0, but 0\.5\.2 is installed"):
        install(model_id="m")
    assert current_code() == stock_code and vllm_mlx.installed() is None


def test_a_changed_seam_is_refused_before_anything_is_patched(
    stock_code: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    with monkeypatch.context() as patch:
        patch.delattr(generator_module.MLLMBatchGenerator, "_language_model_kwargs")
        with pytest.raises(ConfigurationError, match="_language_model_kwargs"):
            install(model_id="m")
    assert vllm_mlx.installed() is None and current_code() == stock_code


def test_install_patches_the_listed_methods_and_uninstall_restores_them(stock_code: dict[str, Any]) -> None:
    installation = install(model_id="m")
    patched = current_code()
    assert all(patched[name] is not stock_code[name] for name in patched)
    with pytest.raises(ConfigurationError, match="already installed"):
        install(model_id="m")
    installation.uninstall()
    assert current_code() == stock_code


def test_launcher_refuses_what_it_cannot_serve_exactly(tmp_path: Path, stock_code: dict[str, Any]) -> None:
    for served in ("gemma3", "llava", "mistral3", "paligemma"):  # stock vllm-mlx fails their images
        check_model_type("m", served)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "florence2"}))
    with pytest.raises(ConfigurationError, match=r"'florence2' is not supported .*no family description"):
        serve([str(tmp_path), "--continuous-batching"])
    with pytest.raises(ConfigurationError, match="--continuous-batching"):
        serve([str(tmp_path)])
    with pytest.raises(ConfigurationError, match="--specprefill"):
        serve([str(tmp_path), "--continuous-batching", "--specprefill"])
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2_vl"}))
    with pytest.raises(ConfigurationError, match="cannot parse"):
        serve([str(tmp_path), "--continuous-batching", "--vision-cache-max-embedding-bytes", "2 parsecs"])
    assert vllm_mlx.installed() is None


def test_weights_identity_follows_the_weight_files(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"weights v1")
    first = weights_identity(VisionCacheSettings(model_path=str(tmp_path)))
    assert first == weights_identity(VisionCacheSettings(model_path=str(tmp_path)))
    (tmp_path / "model.safetensors").write_bytes(b"weights, version 2")
    assert weights_identity(VisionCacheSettings(model_path=str(tmp_path))) != first
    assert (
        weights_identity(VisionCacheSettings(model_path=str(tmp_path), model_id="org/m@abc")) == "org/m@abc"
    )
    with pytest.raises(ConfigurationError, match="--vision-cache-model-id"):
        weights_identity(VisionCacheSettings(model_path=str(tmp_path / "absent")))
    with pytest.raises(ConfigurationError, match="model_path"):
        VisionCacheSettings()


def test_regression_the_tenant_salt_could_only_be_given_on_the_command_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The salt keys every entry and seals every handle, but ``ps`` shows a command line to every
    user of the host: --vision-cache-salt-env names an environment variable instead."""
    from visioncache.integrations.vllm_mlx.launcher import build_parser

    base = ["--vision-cache-model-id", "org/m@1"]
    monkeypatch.setenv("VC_TENANT", "tenant-a")
    parsed = build_parser().parse_args([*base, "--vision-cache-salt-env", "VC_TENANT"])
    assert VisionCacheSettings.from_args(parsed, model_path=None).salt == "tenant-a"
    monkeypatch.delenv("VC_TENANT")
    with pytest.raises(ConfigurationError, match=r"'VC_TENANT'.* unset or empty"):
        VisionCacheSettings.from_args(parsed, model_path=None)
    both = build_parser().parse_args([*base, "--vision-cache-salt", "s", "--vision-cache-salt-env", "X"])
    with pytest.raises(ConfigurationError, match="not both"):
        VisionCacheSettings.from_args(both, model_path=None)


def test_flags_size_and_tier_the_engine_cache(tmp_path: Path) -> None:
    from visioncache.integrations.vllm_mlx.launcher import build_parser

    flags = ["--vision-cache-model-id", "org/m@1", "--vision-cache-max-embedding-entries", "1"]
    small = VisionCacheSettings.from_args(build_parser().parse_args(flags), model_path=None)
    tiered = VisionCacheSettings.from_args(
        build_parser().parse_args([*flags, "--vision-cache-disk-dir", str(tmp_path / "tier")]),
        model_path=None,
    )
    calls: list[int] = []

    def encode(images: list[Any]) -> list[np.ndarray]:
        calls.append(len(images))
        return [np.full(4, len(calls), np.float32) for _ in images]

    first, second = image_url(1), image_url(2)
    with small.build_cache("ns") as cache:
        for image in (first, second, first):
            cache.encode_images([image], encode)
    assert calls == [1, 1, 1]  # one entry: the second image evicted the first
    calls.clear()
    for _ in ("before a restart", "after"):
        with tiered.build_cache("ns") as cache:
            cache.encode_images([first], encode)
    assert calls == [1]  # the disk tier served the restarted cache


# ---- the batch generator, in process -------------------------------------------------------------


@pytest.fixture(scope="module")
def qwen25(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any, Any]:
    from mlx_vlm.utils import load

    from tests.support.mlx_model_dir import save_model_dir

    path = save_model_dir(tmp_path_factory.mktemp("qwen2.5-vl-tiny"), "qwen2_5_vl")
    model, processor = load(str(path))
    return path, model, processor


@pytest.fixture
def tower_calls(qwen25: tuple[Path, Any, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[int]:
    tower = type(qwen25[1].vision_tower)
    original = tower.__call__
    calls: list[int] = []

    def counted(self: Any, pixels: Any, grid_thw: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(int(grid_thw.shape[0]))
        return original(self, pixels, grid_thw, *args, **kwargs)

    monkeypatch.setattr(tower, "__call__", counted)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where vllm-mlx writes request images
    return calls


def new_generator(model: Any, processor: Any) -> Any:
    from vllm_mlx.memory_cache import MemoryCacheConfig

    stop = {processor.tokenizer.convert_tokens_to_ids("<|im_end|>")}
    config = MemoryCacheConfig(max_memory_mb=256)
    return generator_module.MLLMBatchGenerator(model, processor, stop_tokens=stop, prefix_cache_config=config)


def generate(generator: Any, prompt: str, images: list[str]) -> tuple[list[int], list[np.ndarray]]:
    request = generator_module.MLLMBatchRequest(
        uid=-1, request_id=str(uuid.uuid4()), prompt=prompt, images=images, max_tokens=5, temperature=0.0
    )
    generator.insert([request])
    tokens, logprobs = [], []
    while generator.has_pending():
        for response in generator.next():
            assert response.finish_reason != "error"
            tokens.append(response.token)
            logprobs.append(np.array(response.logprobs))
    return tokens, logprobs


def prompt_length(processor: Any, prompt: str, images: list[str]) -> int:
    """Tokens of ``prompt`` once its placeholders are expanded for ``images`` (mlx-vlm's own count)."""
    from mlx_vlm.utils import prepare_inputs

    decoded = [Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))) for url in images]
    return int(prepare_inputs(processor, images=decoded, prompts=[prompt])["input_ids"].shape[1])


def chat_prompts(processor: Any, first: str, second: str) -> tuple[list[str], list[list[str]]]:
    """Two turns: an image, then a second image with the first re-sent (the answer is fixed text)."""

    def user(text: str) -> dict[str, Any]:
        return {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}

    turn_1 = [{"role": "system", "content": SYSTEM}, user("describe the image")]
    turn_2 = [*turn_1, {"role": "assistant", "content": "a cat"}, user("compare")]
    prompts = [
        processor.apply_chat_template(m, tokenize=False, add_generation_prompt=True) for m in (turn_1, turn_2)
    ]
    return prompts, [[first], [first, second]]


@pytest.mark.slow
def test_embedded_generator_matches_stock_with_one_encode_per_image_and_kv_reuse(
    qwen25: tuple[Path, Any, Any], tower_calls: list[int], stock_code: dict[str, Any]
) -> None:
    path, model, processor = qwen25
    prompts, images = chat_prompts(processor, image_url(500), image_url(501))
    stock = new_generator(model, processor)
    expected = [generate(stock, prompt, turn) for prompt, turn in zip(prompts, images, strict=True)]
    assert tower_calls == [1, 2]
    tower_calls.clear()

    install(model_path=str(path))
    ours = new_generator(model, processor)
    tower_calls.clear()  # the family's self-check ran its probe images (once per model)
    results = [generate(ours, prompt, turn) for prompt, turn in zip(prompts, images, strict=True)]
    for (tokens, logprobs), (stock_tokens, stock_logprobs) in zip(results, expected, strict=True):
        assert tokens == stock_tokens
        assert all(np.array_equal(a, b) for a, b in zip(logprobs, stock_logprobs, strict=True))
    assert tower_calls == [1, 1]  # turn 2 encodes only the new image
    stats = ours.get_vision_cache_stats()
    assert stats["kv_prefix_hits"] == 1
    assert stats["kv_tokens_reused"] >= prompt_length(processor, prompts[0], images[0])  # all of turn 1
    # Turn 2's first image lies inside the reused KV prefix: neither looked up nor encoded (it was
    # an embedding-cache hit before the covered-image skip; this test still asserted that).
    assert stats["kv_covered_images_not_encoded"] == 1 and stats["kv_covered_images_encoded_late"] == 0
    assert stats["embedding_cache_hits"] == 0 and stats["vision_tower_calls"] == 2


@pytest.mark.slow
def test_tenants_with_different_salts_share_no_kv_even_through_one_prefix_store(
    qwen25: tuple[Path, Any, Any], tower_calls: list[int], stock_code: dict[str, Any]
) -> None:
    path, model, processor = qwen25
    prompts, images = chat_prompts(processor, image_url(510), image_url(511))
    runs = {}
    store = None
    for tenant in ("a", "b", "a"):
        installation = install(model_path=str(path), salt=f"tenant-{tenant}")
        generator = new_generator(model, processor)
        if store is not None:
            generator.prefix_cache._inner = store  # one store, as a shared or persisted cache would be
        store = generator.prefix_cache._inner
        result = generate(generator, prompts[0], images[0])
        runs.setdefault(tenant, []).append(
            (result[0], generator.get_vision_cache_stats()["kv_tokens_reused"])
        )
        installation.uninstall()
    (first_tokens, first_reused), (again_tokens, again_reused) = runs["a"]
    ((other_tokens, other_reused),) = runs["b"]
    assert first_reused == 0 and other_reused == 0  # tenant b reused nothing of a's identical prompt
    assert again_reused > 0  # ... while tenant a, back, reuses its own
    assert first_tokens == other_tokens == again_tokens


@pytest.mark.slow
def test_every_image_form_vllm_mlx_accepts_is_served_like_stock(
    qwen25: tuple[Path, Any, Any], tower_calls: list[int], stock_code: dict[str, Any]
) -> None:
    """Regression: an image vllm-mlx had already written to a file (raw base64, or base64 it
    decodes leniently) was handed to its URL loader again on a miss, and the request failed."""
    path, model, processor = qwen25
    urls = [image_url(seed) for seed in range(520, 524)]  # one image per form: each one a miss
    payloads = [url.split(",", 1)[1] for url in urls]
    wrapped = "\n".join(payloads[2][i : i + 76] for i in range(0, len(payloads[2]), 76))
    forms = {
        "data URL": urls[0],
        "raw base64": payloads[1],
        "base64 with line breaks": "data:image/png;base64," + wrapped,
        "OpenAI dict": {"url": urls[3]},
    }
    prompt = chat_prompts(processor, urls[0], urls[0])[0][0]
    stock = new_generator(model, processor)
    expected = {name: generate(stock, prompt, [image])[0] for name, image in forms.items()}
    install(model_path=str(path))
    ours = new_generator(model, processor)
    for name, image in forms.items():
        assert generate(ours, prompt, [image])[0] == expected[name], name
    stats = ours.get_vision_cache_stats()
    assert stats["image_request_errors"] == 0 and stats["images_encoded"] == len(forms)


# ---- what visioncache does not serve stays stock vllm-mlx's --------------------------------------


class _FakeTokenizer:
    eos_token_id = None

    def encode(self, text: str) -> list[int]:
        return [1, 2, 3]


class _FakeProcessor:
    tokenizer = _FakeTokenizer()


class _FakeModel:
    """As vllm-mlx's own scheduler tests build one: no configuration, so no family."""

    config = None


def test_regression_embedded_an_unrecognised_model_builds_as_stock_with_one_warning(
    stock_code: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    """Regression: with visioncache installed, building vllm-mlx's MLLMScheduler for a model of no
    described family raised ConfigurationError (mlx-vlm model type None is not supported), where
    stock builds it (5 of vllm-mlx 0.6.0's own tests failed). Embedded, such a model gets vllm-mlx's
    own code and one warning, however many schedulers are built for it."""
    model = _FakeModel()
    stock = scheduler_module.MLLMScheduler(model=model, processor=_FakeProcessor())
    install(model_id="m")
    schedulers: list[Any] = []

    def build() -> None:
        schedulers.append(scheduler_module.MLLMScheduler(model=model, processor=_FakeProcessor()))

    with caplog.at_level("WARNING", logger="visioncache.integrations.vllm_mlx.install"):
        run_threads(lambda _: build(), 8)  # built by 8 threads at once: still one warning
    assert len(schedulers) == 8
    warnings = [
        record for record in caplog.records if "vllm-mlx serves it with its own code" in record.message
    ]
    assert len(warnings) == 1 and "model type None is not supported" in warnings[0].message
    assert all(sorted(vars(scheduler)) == sorted(vars(stock)) for scheduler in schedulers)
    assert vllm_mlx.installed() is not None and not vllm_mlx.installed().engines  # type: ignore[union-attr]


def test_where_the_caller_asks_an_unrecognised_model_is_refused_when_its_engine_is_built(
    stock_code: dict[str, Any],
) -> None:
    """``refuse_unsupported`` (what visioncache serve-mlx sets: the user asked for the cache)."""
    install(model_id="m", refuse_unsupported=True)
    with pytest.raises(ConfigurationError, match="model type None is not supported"):
        scheduler_module.MLLMScheduler(model=_FakeModel(), processor=_FakeProcessor())


@pytest.mark.slow
def test_a_generator_of_a_model_visioncache_does_not_serve_runs_stock_code(
    qwen25: tuple[Path, Any, Any],
    tower_calls: list[int],
    stock_code: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the model's family unknown to visioncache, an installed vllm-mlx's batch generator is
    the stock one: same tokens and log-probs, the tower on every image, vllm-mlx's own vision
    cache and stats."""
    from visioncache.integrations.mlx_vlm.families import registry

    path, model, processor = qwen25
    prompts, images = chat_prompts(processor, image_url(530), image_url(531))
    stock = new_generator(model, processor)
    expected = [generate(stock, prompt, turn) for prompt, turn in zip(prompts, images, strict=True)]
    monkeypatch.delitem(registry._BY_MODEL_TYPE, "qwen2_5_vl")  # a family visioncache does not describe
    install(model_path=str(path))
    ours = new_generator(model, processor)
    tower_calls.clear()
    results = [generate(ours, prompt, turn) for prompt, turn in zip(prompts, images, strict=True)]
    for (tokens, logprobs), (stock_tokens, stock_logprobs) in zip(results, expected, strict=True):
        assert tokens == stock_tokens
        assert all(np.array_equal(a, b) for a, b in zip(logprobs, stock_logprobs, strict=True))
    assert tower_calls == [1, 2]  # stock's: every image of every request
    assert type(ours.vision_cache) is type(stock.vision_cache)
    assert sorted(ours.get_vision_cache_stats()) == sorted(stock.get_vision_cache_stats())
