"""LoRA adapters that reach the encoder, identified by their content: the files vLLM loads them from.

With ``--enable-tower-connector-lora`` vLLM applies a request's adapter to the vision tower and
connector, so the encoder output depends on the adapter. vLLM names it in the item identifier by
its ``lora_name``, and a reload can point that name at other weights: its OpenAI server's in-place
reload (``/v1/load_lora_adapter`` with ``load_inplace``) keeps the name and the id and changes the
path, or the files at the path. Here an adapter is identified by a digest of every regular file of
its directory (relative names and contents: ``adapter_config.json``, the weights, any extra
embeddings), never by its name, id or path: the same weights under two names share entries, and a
name pointing at other weights misses.

What the workers run is what they loaded, and they load an adapter's files when vLLM first sees
its id (``add_lora``, or the first request naming it), again when a request asks for it
(``load_inplace``), and after evicting it from their LRU. So the digest is taken at those moments
and kept per id, with the state of the files it read (device, inode, size, modification and change
times of each). A request naming a known id whose files changed since, without ``load_inplace``,
may run either version: it gets no digest, and its items no key (encoded, neither loaded nor
saved). A directory vLLM cannot read as local files (a tensorizer URI, say) gets none either.
The limit is the file system's: a file rewritten in place with the same size within one timestamp
tick looks unchanged (as in `visioncache.identity`'s path memo).
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from blake3 import blake3

from visioncache.integrations.fingerprint import fingerprint

__all__ = ["AdapterIdentities", "adapter_digest"]

_MAX_ADAPTERS = 4096  # ids remembered; vLLM reuses an id only for a reload of one name
_FileState = tuple[tuple[str, int, int, int, int, int], ...]


def _files(directory: Path) -> list[Path]:
    return sorted(path for path in directory.rglob("*") if path.is_file())


def _state(directory: Path) -> _FileState | None:
    """(relative name, device, inode, size, mtime_ns, ctime_ns) of every file, or None."""
    if not directory.is_dir():
        return None
    files = _files(directory)
    if not files:
        return None
    states = []
    for path in files:
        status = path.stat()
        states.append(
            (
                path.relative_to(directory).as_posix(),
                status.st_dev,
                status.st_ino,
                status.st_size,
                status.st_mtime_ns,
                status.st_ctime_ns,
            )
        )
    return tuple(states)


def adapter_digest(directory: str | os.PathLike[str]) -> str | None:
    """The content digest of an adapter directory (every regular file, by relative name), or
    None when it holds no files."""
    root = Path(directory)
    if not root.is_dir():
        return None
    parts = []
    for path in _files(root):
        hasher = blake3(max_threads=blake3.AUTO)
        hasher.update_mmap(path)
        parts.append(f"{path.relative_to(root).as_posix()}:{hasher.hexdigest()}")
    return fingerprint(["visioncache/vllm-lora-adapter/v1", *parts]) if parts else None


@dataclass(frozen=True)
class _Loaded:
    directory: str
    state: _FileState | None
    digest: str | None


def _vllm_resolve(lora_path: str) -> str:
    """The directory vLLM's workers load ``lora_path`` from (its own resolution)."""
    from vllm.lora.utils import get_adapter_absolute_path

    return str(get_adapter_absolute_path(lora_path))


class AdapterIdentities:
    """Adapter id -> the content digest of what the workers loaded for it (see the module docstring)."""

    def __init__(self, resolve: Callable[[str], str] = _vllm_resolve) -> None:
        self._resolve = resolve
        self._by_id: OrderedDict[int, _Loaded] = OrderedDict()

    def _read(self, lora_path: str) -> _Loaded:
        try:
            directory = self._resolve(lora_path)
        except Exception:  # not resolvable here: vLLM fails the request itself
            return _Loaded(lora_path, None, None)
        before = _state(Path(directory))
        digest = adapter_digest(directory) if before is not None else None
        if before is None or _state(Path(directory)) != before:  # changed while read: no identity
            return _Loaded(directory, None, None)
        return _Loaded(directory, before, digest)

    def _remember(self, lora_id: int, loaded: _Loaded) -> None:
        self._by_id[lora_id] = loaded
        self._by_id.move_to_end(lora_id)
        while len(self._by_id) > _MAX_ADAPTERS:
            self._by_id.popitem(last=False)

    def loaded(self, lora_request: Any) -> None:
        """The engine's ``add_lora`` ran: the workers (re)loaded this adapter's files now."""
        self._remember(int(lora_request.lora_int_id), self._read(str(lora_request.lora_path)))

    def digest(self, lora_request: Any) -> str | None:
        """The content digest of the adapter a request's items are encoded with; None when it
        cannot be known (see the module docstring)."""
        lora_id, lora_path = int(lora_request.lora_int_id), str(lora_request.lora_path)
        known = self._by_id.get(lora_id)
        try:
            directory = self._resolve(lora_path)
        except Exception:  # not resolvable here: vLLM fails the request itself
            return None
        unchanged = (
            known is not None and known.directory == directory and _state(Path(directory)) == known.state
        )
        if unchanged:
            return known.digest if known is not None else None
        if known is None or getattr(lora_request, "load_inplace", False):
            current = self._read(lora_path)  # what the workers load now
            self._remember(lora_id, current)
            return current.digest
        return None  # the workers may run the files they loaded or the ones there now
