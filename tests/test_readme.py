"""The README's quick start runs as written and prints what it says."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

README = Path(__file__).parents[1] / "README.md"


def test_quick_start_runs_and_prints_the_stated_counts():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)
    quick_start = next(block for block in blocks if "encode_batch" in block)
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        exec(compile(quick_start, str(README), "exec"), {})
    assert output.getvalue().strip() == "3 4"
