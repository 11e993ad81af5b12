"""The seam table (`compat.SEAMS`) is the one list of vllm-mlx names the integration touches.

Tied to the code three ways: every seam exists, as the table says, in the supported vllm-mlx; what
`install` replaces is exactly the table's patched seams; no module of the integration imports
vllm-mlx except through `compat.checked_module`, and each module it asks for has seams in the table.
And each kind of check catches its breakage, before anything is patched.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from visioncache import ConfigurationError
from visioncache.integrations import vllm_mlx
from visioncache.integrations.vllm_mlx import compat, install, patches
from visioncache.integrations.vllm_mlx.compat import GENERATOR, SCHEDULER, SEAMS, Seam, seam_problems

PACKAGE = Path(vllm_mlx.__file__).parent
MODULES = sorted({seam.module for seam in SEAMS})


def modules_of_the_integration() -> list[tuple[Path, ast.Module]]:
    return [(path, ast.parse(path.read_text())) for path in sorted(PACKAGE.glob("*.py"))]


@pytest.mark.parametrize("module", MODULES)
def test_every_seam_exists_in_the_supported_vllm_mlx(module: str) -> None:
    assert seam_problems(importlib.import_module(module)) == []


def test_install_replaces_exactly_the_patched_seams() -> None:
    table = {(seam.module, seam.owner, seam.name) for seam in SEAMS if seam.use == "patched"}
    objects = {GENERATOR: "MLLMBatchGenerator", SCHEDULER: "MLLMScheduler"}

    def code() -> dict[tuple[str, str, str], Any]:
        found = {}
        for module_name, class_name in objects.items():
            module = importlib.import_module(module_name)
            for name, value in vars(module).items():
                found[(module_name, "", name)] = value
            for name, value in vars(getattr(module, class_name)).items():
                found[(module_name, class_name, name)] = value
        return found

    before = code()
    installation = install(model_id="m")
    try:
        during = code()
    finally:
        installation.uninstall()
    changed = {where for where in before if during.get(where) is not before[where]}
    assert changed == table
    assert code() == before


def test_the_replacements_are_named_by_the_table() -> None:
    def stock(*args: Any) -> None:
        return None

    host: Any = SimpleNamespace(
        originals={name: staticmethod(stock) for name in patches.GENERATOR_METHODS},
        scheduler_originals={name: stock for name in patches.SCHEDULER_METHODS},
        original_guard=stock,
        handles=None,
    )
    generator, scheduler = patches.replacements(host)
    patched_here = {seam.name for seam in SEAMS if seam.use == "patched" and seam.module == GENERATOR}
    assert set(generator) == set(patches.GENERATOR_METHODS) | {patches.GUARD} == patched_here
    assert set(scheduler) == set(patches.SCHEDULER_METHODS) == {"__init__", "add_request"}


def test_vllm_mlx_is_imported_only_through_the_seam_table() -> None:
    asked: set[str] = set()
    for path, tree in modules_of_the_integration():
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "checked_module"
                and path.name != "compat.py"
            ):
                assert isinstance(node.args[0], ast.Constant), f"{path.name}: name the module literally"
                asked.add(node.args[0].value)
                continue
            else:
                continue
            direct = [name for name in names if name == "vllm_mlx" or name.startswith("vllm_mlx.")]
            assert direct == [] or path.name == "compat.py", f"{path.name} imports {direct} directly"
    assert asked <= set(MODULES), f"modules asked for with no seam in the table: {asked - set(MODULES)}"


@pytest.mark.parametrize(
    ("seam", "found"),
    [
        (Seam("vllm_mlx.models.mllm", "NO_SUCH_LIMIT", "read"), "no NO_SUCH_LIMIT"),
        (Seam(GENERATOR, "NoSuchClass.method", "patched"), "no NoSuchClass"),
        (Seam(GENERATOR, "MLLMBatchGenerator._process_prompts", "patched", ("batch",)), "lacks ['batch']"),
        (Seam(GENERATOR, "MLLMBatchRequest", "read", ("no_such_field",)), "lacks ['no_such_field']"),
        (Seam(GENERATOR, "MLLMBatchGenerator._never_assigned", "assigned"), "nothing assigns"),
    ],
)
def test_each_kind_of_seam_check_catches_its_breakage(
    seam: Seam, found: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(compat, "SEAMS", (seam,))
    [problem] = seam_problems(importlib.import_module(seam.module))
    assert found in problem


def test_a_seam_missing_outside_the_generator_is_refused_when_its_module_is_first_asked_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before the table, vllm-mlx's image limit and the server's names were used unchecked."""
    mllm = importlib.import_module("vllm_mlx.models.mllm")
    monkeypatch.setattr(compat, "_checked", set())
    monkeypatch.delattr(mllm, "MAX_IMAGE_SIZE")
    with pytest.raises(ConfigurationError, match=r"vllm-mlx 0\.6\.0 does not have .*no MAX_IMAGE_SIZE"):
        compat.checked_module("vllm_mlx.models.mllm")
