"""vllm-mlx 0.6.0's own test suite, run stock and with visioncache installed: the per-test outcomes
side by side, and every test whose outcome differs.

The sdist is downloaded (``pip download --no-deps --no-binary :all: vllm-mlx==0.6.0``) and
unpacked into a work directory; its ``tests/`` run twice there, as its developers run them
(``python -m pytest tests`` from the sdist's root), each run in its own process, with HOME at a
fresh directory and the Hugging Face Hub offline. Both runs load the same plugin
(``benchmarks/_vllm_mlx_suite_plugin.py``: records outcomes, keeps a module's ``sys.exit`` at
import from ending the session, provides the ``tests/_mlx_stub.py`` the sdist omits as upstream's
is where mlx is installed: a no-op); the second also installs visioncache into vllm-mlx before any
test runs (``install()``, as an embedding application does), nothing of vllm-mlx's edited. Tests
that need a network, a GPU or macOS fail or skip in both: the same outcome. Exit status 1 when an
outcome differs.

    .venv/bin/python benchmarks/compare_vllm_mlx_suite.py [--work-dir DIR] [--json PATH] [-k EXPR]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VERSION = "0.6.0"
RUNS = ("stock", "visioncache")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--work-dir", type=Path, help="where the sdist is unpacked and run (default: a temp dir)"
    )
    parser.add_argument("--json", type=Path, help="write both runs' outcomes per test here")
    parser.add_argument("-k", dest="keyword", help="pytest -k expression: run only the matching tests")
    parser.add_argument("--timeout", type=int, default=3600, help="seconds per run (default 3600)")
    return parser.parse_args(argv)


def fetch_sdist(work_dir: Path) -> Path:
    """The unpacked vllm-mlx sdist's root (downloaded once per work directory)."""
    root = work_dir / f"vllm_mlx-{VERSION}"
    if (root / "tests").is_dir():
        return root
    download = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
    download += ["--disable-pip-version-check", "-q", "-d", str(work_dir), f"vllm-mlx=={VERSION}"]
    subprocess.run(download, check=True)
    with tarfile.open(work_dir / f"vllm_mlx-{VERSION}.tar.gz") as archive:
        archive.extractall(work_dir, filter="data")
    return root


def run_suite(sdist: Path, run: str, work_dir: Path, keyword: str | None, timeout: int) -> dict[str, str]:
    """One run of the sdist's tests: node id -> outcome (several phases' outcomes joined by +)."""
    record = work_dir / f"{run}.jsonl"
    record.unlink(missing_ok=True)
    home = Path(tempfile.mkdtemp(prefix=f"{run}-home-", dir=work_dir))
    env = {name: value for name, value in os.environ.items() if not name.startswith("VISIONCACHE_")}
    env.update(
        HOME=str(home),
        HF_HUB_OFFLINE="1",
        # the plugin's folder, not the repository root: its tests/ would shadow vllm-mlx's
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "benchmarks"), env.get("PYTHONPATH")])),
        VLLM_MLX_SUITE_RECORD=str(record),
        VLLM_MLX_SUITE_VISIONCACHE="1" if run == "visioncache" else "0",
    )
    command = [
        sys.executable,
        "-m",
        "pytest",
        "tests",
        "-q",
        "-p",
        "no:cacheprovider",
        "--continue-on-collection-errors",
    ]
    command += ["-p", "_vllm_mlx_suite_plugin"]
    if keyword:
        command += ["-k", keyword]
    log = work_dir / f"{run}.log"
    with open(log, "wb") as output:
        subprocess.run(command, cwd=sdist, env=env, stdout=output, stderr=subprocess.STDOUT, timeout=timeout)
    outcomes: dict[str, list[str]] = collections.defaultdict(list)
    for line in record.read_text().splitlines() if record.exists() else []:
        entry = json.loads(line)
        outcomes[entry["test"]].append(entry["outcome"])
    if not outcomes:
        raise SystemExit(f"the {run} run recorded no test (see {log})")
    return {test: "+".join(phases) for test, phases in outcomes.items()}


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="vllm-mlx-suite-"))
    work_dir.mkdir(parents=True, exist_ok=True)
    sdist = fetch_sdist(work_dir.resolve())
    results, seconds = {}, {}
    for run in RUNS:
        started = time.monotonic()
        results[run] = run_suite(sdist, run, work_dir.resolve(), args.keyword, args.timeout)
        seconds[run] = time.monotonic() - started
    stock, ours = results["stock"], results["visioncache"]
    print(f"vllm-mlx {VERSION}'s tests/ ({sdist}), stock vs with visioncache installed")
    print(f"{'outcome':<24}{'stock':>8}{'visioncache':>13}")
    for outcome in sorted(set(stock.values()) | set(ours.values())):
        counts = [sum(value == outcome for value in run.values()) for run in (stock, ours)]
        print(f"{outcome:<24}{counts[0]:>8}{counts[1]:>13}")
    print(f"{'tests':<24}{len(stock):>8}{len(ours):>13}")
    print(f"run time: stock {seconds['stock']:.0f} s, visioncache {seconds['visioncache']:.0f} s")
    differing = sorted(test for test in stock.keys() | ours.keys() if stock.get(test) != ours.get(test))
    for test in differing:
        print(f"DIFFERS {test}: stock {stock.get(test, 'not run')}, visioncache {ours.get(test, 'not run')}")
    print(f"{len(differing)} test(s) with another outcome with visioncache installed")
    if args.json:
        args.json.write_text(json.dumps({"seconds": seconds, **results}, indent=1, sort_keys=True))
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
