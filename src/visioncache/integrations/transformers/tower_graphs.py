"""CUDA graphs of the vision tower for the patch grids a video's missing patches repeat.

Why: a warm sliding-window turn encodes one temporal patch, and on a GPU that call is bound by its
~700 kernel launches and the host syncs between them, not by the GPU's work (a 2B-class Qwen2-VL
tower on an H100: 16.6 ms eager, 5.6 ms replayed from a graph; ``benchmarks/bench_tower_graph.py``).
A graph replays the launches as one.

How: a call whose patch shape (rows of the grid, dtype, device) was encoded before is captured
for its grid; so the first turn of a live window (8 patches) makes the second (1 patch) a
capture, and later turns replays, while a shape seen once costs no capture. The eager call records what
its blocks receive: the rotary position embeddings and the sequence bounds, which depend on the
grid alone. The bounds move to the host, where the SDPA and eager attention paths only read them
to split the sequence, so the blocks run without a host sync and can be captured:
``patch_embed -> blocks -> merger``. Later calls with that grid copy their pixels into the graph's
input and replay it.

A graph holds device addresses, not tensors: each is kept with the body it was captured from, so
the recorded arguments it reads are never freed and reused while it can replay (a defect found on
an H100, where later allocations overwrote the freed rotary embeddings and replays went wrong).

Exact by check, not by name: the first replay must equal the eager output bit for bit
(``torch.equal``), or graphs are refused for this model and the reason kept (``refused``), as
for a tower whose forward does more than that chain (Qwen2.5-VL's windows). At most ``limit``
graphs are kept (least recently used dropped, with their memory pools). Calls are serialised: a
graph's input and output buffers are shared.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import torch

from visioncache import forking

__all__ = ["Capture", "Replay", "TowerGraphs", "cuda_capture"]

Body = Callable[[torch.Tensor], torch.Tensor]  # the tower's chain, with the recorded arguments
Replay = Callable[[torch.Tensor], torch.Tensor]  # pixels -> pooled output (shared buffer)
# A capture's replay may hold only device addresses (a CUDA graph does): whoever keeps the replay
# keeps the body too, so the tensors the body closes over are never freed while it can replay.
Capture = Callable[[Body, torch.Tensor], Replay]
_Key = tuple[tuple[tuple[int, ...], ...], torch.dtype, torch.device, torch.Size]
_Shape = tuple[tuple[int, ...], torch.dtype, torch.device]


def cuda_capture(body: Body, example: torch.Tensor) -> Replay:
    """``body`` captured in a CUDA graph on ``example``'s shape; the replay reads its argument.
    The graph reads what ``body`` closes over by address: the caller keeps ``body`` alive."""
    static = example.clone()
    stream = torch.cuda.Stream(example.device)  # type: ignore[no-untyped-call]
    stream.wait_stream(torch.cuda.current_stream(example.device))
    with torch.cuda.stream(stream):  # warm up off the default stream, as capture requires
        body(static)
    torch.cuda.current_stream(example.device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        output = body(static)

    def replay(pixels: torch.Tensor) -> torch.Tensor:
        static.copy_(pixels)
        graph.replay()
        return output

    return replay


class TowerGraphs:
    """The tower's pooled output per call, replayed from a CUDA graph where one is kept."""

    def __init__(
        self, model: Any, limit: int = 4, capture: Capture = cuda_capture, device_type: str = "cuda"
    ) -> None:
        """``capture`` and ``device_type``: how and where graphs are made (tests pass a capture
        that runs the recorded chain eagerly, on "cpu")."""
        self.limit = limit
        self.device_type = device_type
        self.captures = 0
        self.replays = 0
        self.refused: str | None = None
        self._capture = capture
        # each graph with the body it was captured from: what the body reads must outlive the graph
        self._graphs: OrderedDict[_Key, tuple[Replay, Body]] = OrderedDict()
        self._seen: OrderedDict[_Shape, None] = OrderedDict()  # patch shapes encoded before
        self._lock = forking.lock()  # free in a forked child (see `visioncache.forking`)
        inner = getattr(model, "model", model)
        self._tower: Any = getattr(inner, "visual", None)
        if not all(hasattr(self._tower, name) for name in ("patch_embed", "blocks", "merger")):
            self.refused = "the vision tower is not patch_embed -> blocks -> merger"
        attention = str(getattr(getattr(self._tower, "config", None), "_attn_implementation", ""))
        if "flash" in attention:
            self.refused = f"{attention} reads the sequence bounds on the device"

    def encode(
        self, pixels: torch.Tensor, grids: torch.Tensor, eager: Callable[[], Sequence[torch.Tensor]]
    ) -> Sequence[torch.Tensor]:
        """Per grid row, the tower's pooled output: replayed for a captured grid, else ``eager()``
        (``model.get_video_features``'s ``pooler_output``), capturing a grid whose patch shapes it
        has encoded before."""
        if self.limit == 0 or self.refused is not None or pixels.device.type != self.device_type:
            return eager()
        rows = tuple(map(tuple, grids.tolist()))
        key: _Key = (rows, pixels.dtype, pixels.device, pixels.shape)
        shapes = [(row, pixels.dtype, pixels.device) for row in dict.fromkeys(rows)]
        sizes = (grids.prod(-1) // self._tower.spatial_merge_size**2).tolist()
        with self._lock:
            kept = self._graphs.get(key)
            if kept is not None:
                self._graphs.move_to_end(key)
                self.replays += 1
                return torch.split(kept[0](pixels).clone(), sizes)  # clone: the next replay overwrites it
            seen = all(shape in self._seen for shape in shapes)
            for shape in shapes:
                self._seen[shape] = None
                self._seen.move_to_end(shape)
            while len(self._seen) > 4 * self.limit:
                self._seen.popitem(last=False)
            if not seen:
                return eager()
            return self._capture_grid(key, pixels, sizes, eager)

    def _capture_grid(
        self,
        key: _Key,
        pixels: torch.Tensor,
        sizes: list[int],
        eager: Callable[[], Sequence[torch.Tensor]],
    ) -> Sequence[torch.Tensor]:
        kwargs, expected = self._record(eager)
        if kwargs is None:
            return expected
        body = self._body(kwargs)
        try:
            replay = self._capture(body, pixels.to(self._tower.dtype))
            parts = torch.split(replay(pixels), sizes)
            same = len(parts) == len(expected) and all(map(torch.equal, parts, expected))
        except Exception as error:  # what torch refuses to capture varies by release
            return self._refuse(f"capture failed: {error!r}", expected)
        if not same:
            return self._refuse("a replay differed from the eager call", expected)
        self.captures += 1
        self._graphs[key] = (replay, body)
        while len(self._graphs) > self.limit:
            self._graphs.popitem(last=False)
        return expected

    def _record(
        self, eager: Callable[[], Sequence[torch.Tensor]]
    ) -> tuple[dict[str, Any] | None, Sequence[torch.Tensor]]:
        """``eager()``'s output and the keyword arguments its first block received."""
        seen: dict[str, Any] = {}
        positional: list[int] = []

        def hook(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            positional.append(len(args))
            seen.update(kwargs)

        handle = self._tower.blocks[0].register_forward_pre_hook(hook, with_kwargs=True)
        try:
            expected = eager()
        finally:
            handle.remove()
        bounds = seen.get("cu_seqlens")
        if positional != [1] or not isinstance(bounds, torch.Tensor):
            self._refuse(f"the blocks' arguments are not (hidden_states, cu_seqlens=...): {sorted(seen)}")
            return None, expected
        return {**seen, "cu_seqlens": bounds.cpu()}, expected

    def _body(self, kwargs: dict[str, Any]) -> Body:
        tower = self._tower

        def body(pixels: torch.Tensor) -> torch.Tensor:
            hidden = tower.patch_embed(pixels)
            for block in tower.blocks:
                hidden = block(hidden, **kwargs)
            merged: torch.Tensor = tower.merger(hidden)
            return merged

        return body

    def _refuse(self, reason: str, result: Sequence[torch.Tensor] = ()) -> Sequence[torch.Tensor]:
        self.refused = reason
        self._graphs.clear()
        warnings.warn(f"visioncache: vision-tower CUDA graphs are off for this model: {reason}", stacklevel=3)
        return result
