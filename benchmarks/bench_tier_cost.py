"""Cost per encoder output of a shared tier: save and load, visioncache's tiers next to vLLM's
`ECExampleConnector`, on the same machine in the same run.

An item is one image's encoder output as vLLM's Qwen2-VL-2B tower makes it (hidden 1536, bf16): 256
tokens (a 448x448 image), 999 (1024x768) and 5,329 (2048x2048). Per item and store:

- **save**: the encoder output handed over until it is stored (visioncache: `TierChain.save`, a
  synchronous write: serialise into the verified blob format, write; `ECExampleConnector`:
  ``save_caches``, a ``safetensors.torch.save_file`` of the tensor copied to the CPU);
- **load**: until the tensor is back and read once (visioncache: `TierChain.load_many` of one key:
  read, verify the digest or HMAC, deserialise; `ECExampleConnector`: ``start_load_caches``, a
  ``safetensors.torch.load_file`` onto the device, which on the CPU maps the file and reads
  nothing until the tensor is used). Every store's load includes one comparison with the tensor
  saved (numpy, as int16), which reads every byte (on a GPU, ``load_file`` reads them to copy).

Stores: visioncache's disk tier (unsigned and HMAC-signed), its Redis tier (a redis-server started
here on loopback, when one is installed), and `ECExampleConnector` (vLLM's reference connector:
one safetensors file per item on disk, no integrity check), driven through its own methods. The
stores take turns item by item, so load on the machine falls on all of them alike; reads come
from the page cache for both disk stores. Printed: median ms per item and MB/s per store, and
each visioncache store / `ECExampleConnector` (below 1: visioncache is faster).

usage: python benchmarks/bench_tier_cost.py [--items N] [--quick]   (vLLM for the connector column:
.venv-vllm/bin/python; without vLLM that column is left out)
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).parent))
from visioncache.tiers import DiskTier, TierChain  # noqa: E402

from _timing import print_table  # noqa: E402

HIDDEN = 1536
SIZES = {"448x448 (256 tokens)": 256, "1024x768 (999 tokens)": 999, "2048x2048 (5,329 tokens)": 5329}


class Store:
    """One store under test: ``save(name, tensor)`` and ``load(name) -> tensor``."""

    def __init__(self, label: str, save: Callable[[str, torch.Tensor], None], load: Callable[[str], Any]):
        self.label, self.save, self.load = label, save, load


def visioncache_store(label: str, chain: TierChain) -> Store:
    def key(name: str) -> str:
        return f"{'0' * 16}/embedding/{name}"

    def save(name: str, tensor: torch.Tensor) -> None:
        assert chain.save(key(name), tensor), f"{label}: not stored"

    def load(name: str) -> Any:
        value = chain.load_many([key(name)])[0]
        assert value is not None, f"{label}: missing"
        return value

    return Store(label, save, load)


def example_connector_store(directory: str) -> Store | None:
    """vLLM's `ECExampleConnector`, its methods run as the worker runs them (no engine needed)."""
    try:
        from vllm.distributed.ec_transfer.ec_connector.example_connector import (
            ECExampleConnector,
            ECExampleConnectorMetadata,
            MMMeta,
        )
    except ImportError:
        return None
    connector = object.__new__(ECExampleConnector)  # its __init__ wants a whole VllmConfig
    connector._is_producer = connector._is_consumer = True
    connector._storage_path = directory
    connector._mm_datas_need_loads = {}

    def save(name: str, tensor: torch.Tensor) -> None:
        connector.save_caches({name: tensor}, name)

    def load(name: str) -> Any:
        metadata = ECExampleConnectorMetadata()
        metadata.add_mm_data(MMMeta.make_meta(name, 1))
        connector.bind_connector_metadata(metadata)
        loaded: dict[str, torch.Tensor] = {}
        connector.start_load_caches(loaded)
        connector.clear_connector_metadata()
        return loaded[name]

    return Store("ECExampleConnector (disk)", save, load)


@contextmanager
def redis_url() -> Iterator[str | None]:
    """A redis-server on a free loopback port, or None where redis-server or redis-py is missing."""
    if shutil.which("redis-server") is None:
        yield None
        return
    try:
        from tests.tiers.conftest import RedisProcess, free_port
    except ImportError:
        yield None
        return
    server = RedisProcess(free_port())
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


def measure(stores: list[Store], tokens: int, items: int) -> dict[str, tuple[float, float]]:
    """Median save and load seconds per item of each store, the stores taking turns."""
    saves: dict[str, list[float]] = {store.label: [] for store in stores}
    loads: dict[str, list[float]] = {store.label: [] for store in stores}
    generator = torch.Generator().manual_seed(tokens)
    for item in range(items):
        tensor = torch.randn(tokens, HIDDEN, generator=generator).to(torch.bfloat16)
        name = f"{tokens:08d}{item:056x}"
        expected = tensor.view(torch.int16).numpy()
        for store in stores:
            started = time.perf_counter()
            store.save(name, tensor)
            saves[store.label].append(time.perf_counter() - started)
        for store in stores:
            started = time.perf_counter()
            value = store.load(name)
            same = bool((value.view(torch.int16).numpy() == expected).all())  # reads every byte
            loads[store.label].append(time.perf_counter() - started)
            assert same, f"{store.label} gave back another tensor"
    return {label: (statistics.median(saves[label]), statistics.median(loads[label])) for label in saves}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=24, help="items per size (default 24)")
    parser.add_argument("--quick", action="store_true", help="4 items per size")
    args = parser.parse_args(argv)
    items = 4 if args.quick else args.items
    with ExitStack() as stack:
        root = stack.enter_context(tempfile.TemporaryDirectory(prefix="tier-cost-"))
        url = stack.enter_context(redis_url())
        stores = [
            visioncache_store(
                "visioncache disk", TierChain([DiskTier(f"{root}/disk")], max_pending_write_bytes=0)
            ),
            visioncache_store(
                "visioncache disk, HMAC",
                TierChain([DiskTier(f"{root}/signed")], secrets=[b"bench-secret"], max_pending_write_bytes=0),
            ),
        ]
        if url is not None:
            from visioncache.tiers.redis import RedisTier

            redis_chain = TierChain([RedisTier(url)], secrets=[b"bench-secret"], max_pending_write_bytes=0)
            stores.append(visioncache_store("visioncache Redis, HMAC", redis_chain))
        example = example_connector_store(f"{root}/example")
        if example is not None:
            stores.append(example)
        rows = []
        for size, tokens in SIZES.items():
            megabytes = tokens * HIDDEN * 2 / 1e6
            medians = measure(stores, tokens, items)
            baseline = medians.get("ECExampleConnector (disk)")
            for label, (save, load) in medians.items():
                ratio = (
                    f"{save / baseline[0]:.2f}x / {load / baseline[1]:.2f}x"
                    if baseline is not None and not label.startswith("EC")
                    else ""
                )
                rows.append(
                    (
                        f"{size}, {megabytes:.2f} MB",
                        label,
                        f"{save * 1e3:.2f}",
                        f"{megabytes / save:,.0f}",
                        f"{load * 1e3:.2f}",
                        f"{megabytes / load:,.0f}",
                        ratio,
                    )
                )
    print(f"tier cost per encoder output (bf16, hidden {HIDDEN}), median of {items} items per size")
    header = ("item", "store", "save ms", "save MB/s", "load ms", "load MB/s", "save / load vs ECExample")
    print_table(rows, header)
    if example is None:
        print("(vLLM is not installed here: run with .venv-vllm/bin/python for the ECExampleConnector rows)")


if __name__ == "__main__":
    main()
