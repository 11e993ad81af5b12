"""TowerGraphs: a patch grid encoded twice is captured, replayed after, and exact by check.

On a CPU a "capture" that runs the recorded chain (patch_embed -> blocks -> merger, with the
keyword arguments the eager call gave the blocks) stands in for a CUDA graph: it exercises the
recording, keys, splits, limits and the exactness check. The real CUDA capture is tested where a
GPU is present (benchmarks/bench_tower_graph.py measures it).
"""

from __future__ import annotations

import gc
import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import pytest

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from tests.integrations.video_reference import (
    VIDEO,
    chat,
    logits,
    max_difference,
    noise_frames,
    reference_inputs,
)
from visioncache.bench.models import build_offline_model
from visioncache.errors import ConfigurationError
from visioncache.integrations.transformers import CachedVisionModel, VideoFrames
from visioncache.integrations.transformers.tower_graphs import TowerGraphs, cuda_capture

pytestmark = pytest.mark.slow


def eager_chain(body: Callable[[Any], Any], example: Any) -> Callable[[Any], Any]:
    """A stand-in for a CUDA graph on CPU: the recorded chain, run when replayed."""
    return body


@pytest.fixture(scope="module")
def qwen2_vl() -> Any:
    model, _ = build_offline_model("qwen2_vl")
    return model


def patch(height: int, width: int, seed: int = 0, device: str = "cpu") -> tuple[Any, Any]:
    """Pixel rows and grid of one temporal patch of height x width patches (random values)."""
    generator = torch.Generator().manual_seed(seed)
    pixels = torch.randn(height * width, 3 * 2 * 14 * 14, generator=generator).to(device)
    return pixels, torch.tensor([[1, height, width]])


class Counted:
    """``model.get_video_features`` on fixed inputs, counting its calls."""

    def __init__(self, model: Any, pixels: Any, grid: Any) -> None:
        self.model, self.pixels, self.grid, self.calls = model, pixels, grid, 0

    def __call__(self) -> Sequence[Any]:
        self.calls += 1
        with torch.no_grad():
            pooled: Sequence[Any] = self.model.get_video_features(
                self.pixels, self.grid.to(self.pixels.device)
            ).pooler_output
        return pooled


def encode(graphs: TowerGraphs, eager: Counted) -> Sequence[Any]:
    with torch.no_grad():
        return graphs.encode(eager.pixels, eager.grid, eager)


def test_a_grid_seen_twice_is_captured_then_replayed_equal_to_the_eager_call(qwen2_vl: Any) -> None:
    graphs = TowerGraphs(qwen2_vl, capture=eager_chain, device_type="cpu")
    eager = Counted(qwen2_vl, *patch(4, 6))
    expected = eager()
    first, second = encode(graphs, eager), encode(graphs, eager)  # seen, then captured
    assert (eager.calls, graphs.captures, graphs.replays) == (3, 1, 0)
    replayed = encode(graphs, eager)
    assert (eager.calls, graphs.replays) == (3, 1)  # the tower's eager forward did not run
    for output in (first, second, replayed):
        assert len(output) == 1 and torch.equal(output[0], expected[0])
    other = Counted(qwen2_vl, *patch(4, 6, seed=1))  # same grid, other pixels: the graph reads them
    assert torch.equal(encode(graphs, other)[0], other()[0])
    assert graphs.refused is None


def addresses_only(body: Callable[[Any], Any], example: Any) -> Callable[[Any], Any]:
    """A stand-in that, like a CUDA graph, holds no reference to what it was captured from: its
    replay fails where the body (and the recorded tensors it reads) were freed."""
    held = weakref.ref(body)

    def replay(pixels: Any) -> Any:
        alive = held()
        assert alive is not None, "the graph replays memory that was freed after the capture"
        return alive(pixels)

    return replay


def test_a_kept_graph_keeps_what_it_reads_alive(qwen2_vl: Any) -> None:
    """Regression: on an H100 the rotary embeddings recorded for a graph were freed once the capture
    returned; later allocations reused their memory and replays gave wrong embeddings (a video bench's
    logits differed from the uncached path by 0.94). TowerGraphs now keeps each graph's body."""
    graphs = TowerGraphs(qwen2_vl, capture=addresses_only, device_type="cpu")
    eager = Counted(qwen2_vl, *patch(4, 6))
    encode(graphs, eager)
    encode(graphs, eager)  # captured
    gc.collect()
    assert torch.equal(encode(graphs, eager)[0], eager()[0])
    assert (graphs.captures, graphs.replays, graphs.refused) == (1, 1, None)


def test_a_patch_shape_seen_in_a_clip_makes_the_first_one_patch_call_a_capture(qwen2_vl: Any) -> None:
    graphs = TowerGraphs(qwen2_vl, capture=eager_chain, device_type="cpu")
    pixels, grid = patch(4, 6)
    clip = Counted(qwen2_vl, torch.cat([pixels, pixels + 1]), grid.repeat(2, 1))  # 2 patches
    encode(graphs, clip)
    assert graphs.captures == 0
    one = Counted(qwen2_vl, pixels, grid)  # a warm turn's one new patch, of the clip's shape
    encode(graphs, one)
    assert graphs.captures == 1
    assert torch.equal(encode(graphs, one)[0], one()[0]) and graphs.replays == 1


def test_a_replay_that_differs_from_the_eager_call_turns_graphs_off_with_the_reason(qwen2_vl: Any) -> None:
    def wrong(body: Callable[[Any], Any], example: Any) -> Callable[[Any], Any]:
        return lambda pixels: body(pixels) + 1

    graphs = TowerGraphs(qwen2_vl, capture=wrong, device_type="cpu")
    eager = Counted(qwen2_vl, *patch(4, 6))
    encode(graphs, eager)
    with pytest.warns(UserWarning, match="differed"):
        output = encode(graphs, eager)
    assert torch.equal(output[0], eager()[0])  # the eager output, never the replay's
    assert graphs.refused is not None and "differed" in graphs.refused
    encode(graphs, eager)
    assert (graphs.captures, graphs.replays) == (0, 0)


def test_a_capture_that_raises_turns_graphs_off_and_returns_the_eager_output(qwen2_vl: Any) -> None:
    def refuses(body: Callable[[Any], Any], example: Any) -> Callable[[Any], Any]:
        raise RuntimeError("operation not permitted when stream is capturing")

    graphs = TowerGraphs(qwen2_vl, capture=refuses, device_type="cpu")
    eager = Counted(qwen2_vl, *patch(4, 6))
    encode(graphs, eager)
    with pytest.warns(UserWarning, match="capture failed"):
        output = encode(graphs, eager)
    assert torch.equal(output[0], eager()[0])
    assert graphs.refused is not None and "not permitted" in graphs.refused


def test_qwen2_5_vl_window_attention_is_refused_by_the_check_not_by_name() -> None:
    model, _ = build_offline_model("qwen2_5_vl")
    graphs = TowerGraphs(model, capture=eager_chain, device_type="cpu")
    eager = Counted(model, *patch(16, 16))  # several 112-pixel windows: blocks differ per layer
    encode(graphs, eager)
    with pytest.warns(UserWarning, match="vision-tower CUDA graphs are off"):
        output = encode(graphs, eager)
    assert torch.equal(output[0], eager()[0])
    assert graphs.refused is not None and graphs.captures == 0


def test_at_most_limit_graphs_are_kept(qwen2_vl: Any) -> None:
    graphs = TowerGraphs(qwen2_vl, limit=1, capture=eager_chain, device_type="cpu")
    small, large = Counted(qwen2_vl, *patch(4, 6)), Counted(qwen2_vl, *patch(6, 8))
    for eager in (small, small, large, large):
        encode(graphs, eager)
    assert graphs.captures == 2 and len(graphs._graphs) == 1
    encode(graphs, small)  # dropped, so captured again (it was seen)
    assert (graphs.captures, graphs.replays) == (3, 0)
    encode(graphs, small)
    assert graphs.replays == 1


def test_no_graphs_off_their_device_or_with_limit_zero(qwen2_vl: Any) -> None:
    for graphs in (TowerGraphs(qwen2_vl), TowerGraphs(qwen2_vl, limit=0, device_type="cpu")):
        eager = Counted(qwen2_vl, *patch(4, 6))
        for _ in range(3):
            encode(graphs, eager)
        assert (eager.calls, graphs.captures, graphs.replays) == (3, 0, 0)


@pytest.mark.parametrize("value", [-1, 1.5, "4", True])
def test_a_bad_tower_graphs_setting_is_a_configuration_error(qwen2_vl: Any, value: Any) -> None:
    _, processor = build_offline_model("qwen2_vl")
    with pytest.raises(ConfigurationError, match="tower_graphs"):
        CachedVisionModel(qwen2_vl, processor, tower_graphs=value)


def test_a_sliding_window_with_replayed_patches_gives_the_uncached_logits() -> None:
    model, processor = build_offline_model("qwen2_vl")
    cached = CachedVisionModel(model, processor)
    stream = noise_frames(16, seed=3)
    for turn, start in enumerate(range(0, 9, 2)):
        window = VideoFrames(stream[start : start + 8], fps=4.0, frame_indices=range(start, start + 8))
        actual = logits(model, cached.prepare(chat(VIDEO), videos=[window]))
        expected = logits(model, reference_inputs(model, processor, chat(VIDEO), videos=[window]))
        assert max_difference(actual, expected) <= 1e-4
        if turn == 0:  # swap in the CPU stand-in once the encoder exists
            assert cached._video is not None
            cached._video.graphs = TowerGraphs(model, capture=eager_chain, device_type="cpu")
    graphs = cached._video.graphs  # type: ignore[union-attr]
    # turns 2-5 each encode one new patch of the same grid: seen, captured, then replayed twice
    assert (graphs.captures, graphs.replays, cached.times.patches_encoded) == (1, 2, 8)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_graph_replay_equals_the_eager_tower() -> None:
    model, _ = build_offline_model("qwen2_vl")
    model = model.cuda()
    graphs = TowerGraphs(model, capture=cuda_capture)
    eager = Counted(model, *patch(8, 8, device="cuda"))
    expected = eager()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a refusal would warn
        for _ in range(4):
            output = encode(graphs, eager)
            assert torch.equal(output[0], expected[0])
            gc.collect()
            # Regression: a graph read freed memory that these allocations overwrite (see above).
            scribbles = [torch.full((2**bits,), float("nan"), device="cuda") for bits in range(6, 22)]
            del scribbles
    assert (graphs.refused, graphs.captures, graphs.replays, eager.calls) == (None, 1, 2, 3)
