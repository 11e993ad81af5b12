"""What `compare_ec_example.py` does to a connector's directory, and how it reads what happened.

The faults act on entry files the same way for both connectors (`_ec_engine.ENTRY_FILES`: vLLM's
ECExampleConnector keeps one safetensors file per item, visioncache's disk tier one value file
per entry beside its SQLite index). `outcome` turns one engine's report, compared with vLLM
alone's outputs for the same requests, into the words the table prints.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks._ec_engine import entry_files

FLIPPED_BYTES = 64
HUNG = -1000  # the return code a run gets when it was killed for not finishing in time
# What the visioncache connector counts that says how it met a fault (ECExampleConnector counts nothing).
COUNTED = (("hits", "hits"), ("tier_corrupt", "corrupt entries dropped"), ("tier_errors", "tier errors"))


def truncate_entries(directory: Path) -> int:
    """Cut every entry file to half its size (a torn write, a partial copy); how many."""
    files = entry_files(directory)
    for path in files:
        with path.open("r+b") as handle:
            handle.truncate(path.stat().st_size // 2)
    return len(files)


def corrupt_entries(directory: Path) -> int:
    """Flip 64 bytes in the middle of every entry file, its size unchanged (bit rot, a bad copy:
    the middle of a file is tensor data for both formats); how many."""
    files = entry_files(directory)
    for path in files:
        data = bytearray(path.read_bytes())
        middle = len(data) // 2
        data[middle : middle + FLIPPED_BYTES] = bytes(b ^ 0xFF for b in data[middle : middle + FLIPPED_BYTES])
        path.write_bytes(bytes(data))
    return len(files)


def directory_bytes(directory: Path) -> tuple[int, int]:
    """Bytes of every regular file under the directory, and how many entry files it holds."""
    total = sum(path.stat().st_size for path in directory.rglob("*") if path.is_file())
    return total, len(entry_files(directory))


@contextlib.contextmanager
def small_tmpfs(directory: Path, size_bytes: int) -> Iterator[bool]:
    """A tmpfs of ``size_bytes`` mounted on ``directory`` (True), or False where mounting is not
    allowed (not root, no mount namespace): the scenario is then skipped."""
    directory.mkdir(parents=True, exist_ok=True)
    command = ["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(directory)]
    try:
        mounted = subprocess.run(command, capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        mounted = False
    try:
        yield mounted
    finally:
        if mounted:
            subprocess.run(["umount", str(directory)], capture_output=True, timeout=60)


def copy_dir(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    return target


def first_error(errors: list[str]) -> str:
    return errors[0].split(":", 1)[0] if errors else ""


def outcome(report: dict[str, Any] | None, reference: list[Any], returncode: int = 0) -> str:
    """What a run did, in the table's words: did it start, which requests failed and whether the
    engine still served a new image afterwards (the probe), did the answered requests match vLLM
    alone, and how many items it encoded."""
    if report is None and returncode == HUNG:
        return "hang: the engine never finished (killed after the run's timeout)"
    if report is None:
        return f"crash: the engine process died (exit {returncode})"
    if report.get("start_error"):
        return f"fails to start ({first_error([report['start_error']])})"
    outputs: list[Any] = report["outputs"]
    failed = [index for index, output in enumerate(outputs) if output is None]
    errors = [e for e in (report.get("warm_up_error"), *report.get("errors", [])) if e]
    parts = []
    if errors:
        requests = f"{len(failed)} of {len(outputs)} requests failed" if failed else "its warm-up failed"
        if report.get("probe_error"):
            parts.append(f"crash: {requests} ({first_error(errors)}), then a new image failed too")
        else:
            parts.append(f"{requests} ({first_error(errors)})")
    elif report.get("probe_error"):
        parts.append(f"a new image failed after the workload ({first_error([report['probe_error']])})")
    served = [index for index, output in enumerate(outputs) if output is not None]
    wrong = [index for index in served if outputs[index] != reference[index]]
    encoded = int(report.get("encoded", 0))
    if wrong:
        parts.append(f"WRONG OUTPUT: {len(wrong)} of {len(served)} answered requests differ from vLLM alone")
    elif served and not failed:
        parts.append("served from the cache, identical" if encoded == 0 else f"encoded {encoded}, identical")
    elif served:
        parts.append(f"the {len(served)} answered identical")
    counted = [
        f"{int(value)} {label}" for key, label in COUNTED if (value := report.get("connector", {}).get(key))
    ]
    return "; ".join(parts) + (f" ({', '.join(counted)})" if counted else "")


def markdown_table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines
