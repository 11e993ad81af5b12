"""Counts real vision-encoder calls in vLLM: wraps the model class's ``embed_multimodal``.

Every call appends one line, the number of items it encoded, to the file named by
``VISIONCACHE_TEST_ENCODER_LOG`` (O_APPEND: whole lines from several processes). The class is
``VISIONCACHE_TEST_ENCODER_MODEL`` (``module:Class``; Qwen2-VL's by default). vLLM's start-up
profiling and warm-up encode dummy items too, so tests read the count before and after a workload.
`install` wraps the class now; `install_on_import` (the servers' ``sitecustomize``) wraps it when
vLLM imports the model module, so the many Python processes a server starts do not all pay for
importing vLLM at start-up.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

ENV = "VISIONCACHE_TEST_ENCODER_LOG"
MODEL_ENV = "VISIONCACHE_TEST_ENCODER_MODEL"
DEFAULT_MODEL = "vllm.model_executor.models.qwen2_vl:Qwen2VLForConditionalGeneration"


def _model() -> tuple[str, str]:
    module, _, name = os.environ.get(MODEL_ENV, DEFAULT_MODEL).partition(":")
    return module, name


def _wrap(model_class: Any, log: str) -> None:
    original = model_class.embed_multimodal
    if getattr(original, "_visioncache_counted", False):
        return

    @functools.wraps(original)
    def counted(self: Any, **kwargs: object) -> Any:
        outputs = original(self, **kwargs)
        with open(log, "a") as handle:
            handle.write(f"{len(outputs)}\n")
        return outputs

    counted._visioncache_counted = True  # type: ignore[attr-defined]
    model_class.embed_multimodal = counted


def install() -> None:
    """Wrap the model class now (idempotent); a no-op without the environment variable."""
    log = os.environ.get(ENV)
    if log:
        module, name = _model()
        _wrap(getattr(importlib.import_module(module), name), log)


class _WrapOnImport(importlib.abc.MetaPathFinder):
    """Lets the model module import as usual, then wraps its class."""

    def __init__(self, log: str) -> None:
        self.log = log
        self.module, self.name = _model()

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.module:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        loader, log, name = spec.loader, self.log, self.name

        class WrappingLoader(importlib.abc.Loader):
            def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
                return loader.create_module(spec)

            def exec_module(self, module: ModuleType) -> None:
                loader.exec_module(module)
                _wrap(getattr(module, name), log)

        spec.loader = WrappingLoader()
        return spec


def install_on_import() -> None:
    """Wrap the model class when vLLM imports it; a no-op without the environment variable."""
    log = os.environ.get(ENV)
    if log:
        sys.meta_path.insert(0, _WrapOnImport(log))


def encoded_items(log: str | os.PathLike[str]) -> int:
    """Items encoded so far, by every process writing to ``log``."""
    path = Path(log)
    if not path.exists():
        return 0
    return sum(int(line) for line in path.read_text().split())
