"""A missing optional dependency fails one way everywhere: `MissingExtraError`, an ImportError
naming the ``pip install 'visioncache[extra]'`` that fixes it (each guard checked with its
package hidden, in a fresh interpreter)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from visioncache.errors import MissingExtraError, VisionCacheError
from visioncache.extras import EXTRAS, requires

ROOT = Path(__file__).resolve().parents[1]
# Run with ``hidden`` unimportable (None in sys.modules): what a fresh install without it sees.
PROBE = """
import sys
for name in {hidden!r}:
    sys.modules[name] = None
from visioncache.errors import MissingExtraError
try:
{code}
except MissingExtraError as error:
    print("MISSING:", error)
else:
    print("IMPORTED")
"""

GUARDS = [
    ("redis", ["redis"], "import visioncache.tiers.redis"),
    (
        "redis",
        ["redis"],
        "import visioncache; visioncache.TierSettings(redis_url='redis://h/0').build_chain()",
    ),
    ("metrics", ["prometheus_client"], "import visioncache.metrics"),
    (
        "handles",
        ["cryptography", "cryptography.hazmat.primitives.ciphers.aead"],
        "from visioncache.integrations.handles import HandleCodec; HandleCodec(None)",
    ),
    ("hf", ["torch"], "import visioncache.integrations.transformers"),
    ("hf", ["transformers"], "from visioncache.integrations.transformers import CachedVisionModel"),
    ("hf", ["av"], "from visioncache.integrations.video.decode import probe_video as f; f(b'not a video')"),
    (
        "hf",
        ["matplotlib"],
        "from visioncache.bench.plot import plot_results; plot_results([], [], 0, '', 'x.png')",
    ),
    (
        "mlx",
        ["mlx", "mlx.core"],
        "from visioncache.integrations.mlx_vlm.imports import import_mlx; import_mlx()",
    ),
    (
        "mlx",
        ["mlx_vlm"],
        "from visioncache.integrations.mlx_vlm.imports import import_mlx_vlm_utils as f; f()",
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize(("extra", "hidden", "code"), GUARDS, ids=[f"{g[0]}-{g[1][0]}" for g in GUARDS])
def test_a_missing_extra_names_its_pip_install(
    extra: str, hidden: list[str], code: str, tmp_path: Path
) -> None:
    script = PROBE.format(hidden=hidden, code="    " + code)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert f"pip install 'visioncache[{extra}]'" in done.stdout and done.stdout.startswith("MISSING:"), (
        done.stdout
    )


def test_the_vllm_mlx_integration_names_its_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from visioncache.integrations.vllm_mlx import compat

    monkeypatch.setattr(compat, "installed_version", lambda: None)
    with pytest.raises(MissingExtraError, match=r"pip install 'visioncache\[vllm-mlx\]'"):
        compat.import_batch_generator_module()


@pytest.mark.slow
def test_a_command_prints_the_missing_extra_without_a_traceback(tmp_path: Path) -> None:
    script = "import sys; sys.modules['redis'] = None; from visioncache.cli import main; sys.exit(main())"
    command = [sys.executable, "-c", script, "stats", "--redis", "redis://127.0.0.1:1/0"]
    done = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "pip install 'visioncache[redis]'" in done.stderr


def test_the_error_is_an_import_error_and_a_visioncache_error() -> None:
    with pytest.raises(ImportError) as raised, requires("redis", "a test"):
        import visioncache_no_such_module  # type: ignore[import-not-found]  # noqa: F401
    assert isinstance(raised.value, VisionCacheError) and raised.value.name == "visioncache_no_such_module"
    with pytest.raises(ValueError, match="unknown extra"), requires("no-such-extra", "a test"):
        pass


def test_the_extras_named_are_the_ones_pyproject_declares() -> None:
    declared = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    assert set(EXTRAS) == declared - {"dev", "vllm-mlx-deps"}
