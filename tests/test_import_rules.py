"""The import rules the folders express, read from the source with ``ast`` (every import, lazy ones
inside functions and TYPE_CHECKING blocks included):

- ``identity/`` imports nothing of the store, the tiers, the levels or the cache;
- ``store/`` imports nothing of the tiers, the levels or the cache;
- an engine's folder under ``integrations/`` imports only package faces (a package's
  ``__init__``: ``visioncache``, ``visioncache.identity``, ``visioncache.tiers``, another engine's
  folder, ...), its own folder's modules, the root package's single-module rooms
  (``visioncache.errors``, ``visioncache.trees``, ...) and the integrations' shared
  ``fingerprint`` module: never into another folder's modules.

Neither rule may import the ``visioncache`` face by name from identity or store: the face imports
the cache. A submodule named in ``from visioncache import forking`` counts as that module.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "visioncache"
MODULES = {
    ".".join(("visioncache", *path.relative_to(PACKAGE).with_suffix("").parts)).removesuffix(
        ".__init__"
    ): path
    for path in PACKAGE.rglob("*.py")
}
FACES = {name for name, path in MODULES.items() if path.name == "__init__.py"}
SHARED_INTEGRATION_MODULES = {"visioncache.integrations.fingerprint"}
# folder -> what it may not import (a module or anything below it)
FORBIDDEN = {
    "visioncache.identity": (
        "visioncache.store",
        "visioncache.tiers",
        "visioncache.level",
        "visioncache.cache",
    ),
    "visioncache.store": ("visioncache.tiers", "visioncache.level", "visioncache.cache"),
}


def imported_modules(source: str) -> list[tuple[int, str]]:
    """(line, module) for every visioncache import in ``source``; ``from X import name`` gives
    ``X.name`` when that is a module, else ``X``."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [
                (node.lineno, alias.name) for alias in node.names if alias.name.split(".")[0] == "visioncache"
            ]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] != "visioncache":
                continue
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                found.append((node.lineno, submodule if submodule in MODULES else node.module))
    return found


def violations(module: str, source: str) -> list[str]:
    """What ``module`` (with ``source``) imports against the rules."""
    problems = []
    for line, imported in imported_modules(source):
        for folder, forbidden in FORBIDDEN.items():
            if module.startswith(folder + ".") and (
                imported == "visioncache"
                or any(imported == f or imported.startswith(f + ".") for f in forbidden)
            ):
                problems.append(f"{module}:{line} imports {imported} ({folder} must not)")
        parts = module.split(".")
        if parts[:2] == ["visioncache", "integrations"] and len(parts) > 3:
            own = ".".join(parts[:3])
            allowed = (
                imported in FACES
                or imported == own
                or imported.startswith(own + ".")
                or imported in SHARED_INTEGRATION_MODULES
                or (imported.count(".") == 1 and imported in MODULES)  # a root module: visioncache.errors
            )
            if not allowed:
                problems.append(f"{module}:{line} imports {imported}, not a package face")
    return problems


def test_the_folders_import_by_the_rules() -> None:
    problems = [
        problem for name, path in sorted(MODULES.items()) for problem in violations(name, path.read_text())
    ]
    assert problems == []


@pytest.mark.parametrize(
    ("module", "source"),
    [
        ("visioncache.identity.hasher", "from visioncache.store.store import Store"),
        ("visioncache.identity.keys", "def f():\n    from visioncache.cache import VisionEmbeddingCache"),
        ("visioncache.identity.pil", "from visioncache import VisionEmbeddingCache"),
        ("visioncache.store.store", "import visioncache.tiers.chain"),
        ("visioncache.store.eviction", "from visioncache.level import Level"),
        (
            "visioncache.integrations.vllm_mlx.step",
            "from visioncache.integrations.mlx_vlm.features import check_model",
        ),
        ("visioncache.integrations.vllm.item_store", "from visioncache.tiers.chain import TierChain"),
        ("visioncache.integrations.transformers.video", "from visioncache.identity.hasher import frame"),
    ],
)
def test_each_rule_catches_what_breaks_it(module: str, source: str) -> None:
    assert len(violations(module, source)) == 1


def test_what_the_rules_allow() -> None:
    allowed = [
        ("visioncache.identity.hasher", "from visioncache.errors import InvalidImageError"),
        ("visioncache.store.store", "from visioncache import forking"),
        (
            "visioncache.integrations.vllm_mlx.step",
            "from visioncache.integrations.mlx_vlm import check_model",
        ),
        ("visioncache.integrations.vllm_mlx.step", "from visioncache.integrations.vllm_mlx.compat import x"),
        ("visioncache.integrations.vllm.item_store", "from visioncache.tiers import TierChain"),
        (
            "visioncache.integrations.video.clip",
            "from visioncache.integrations.fingerprint import fingerprint",
        ),
    ]
    assert [problem for module, source in allowed for problem in violations(module, source)] == []
