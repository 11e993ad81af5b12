"""Every code block in README.md and docs/*.md runs or parses, and everything the docs name exists.

- ``python`` blocks run as written (the README's quick start prints what it says); a block marked
  ``python parse-only`` (it needs a model, a server or a GPU) is parsed, and what it imports from
  visioncache must exist;
- ``bash`` blocks and inline commands: every ``visioncache`` subcommand and flag, ``make`` target,
  pip extra, benchmark script and flag, and vLLM ``--ec-transfer-config`` they name exists or parses;
- ``json`` blocks parse; ``text`` blocks (layouts, signatures) are prose;
- every ``VISIONCACHE_*`` variable named is one the settings read; every cited file, folder and
  ``tests/...::test_name`` exists, and every link between pages resolves.

The convention for writers is in DEVELOPERS.md ("Docs").
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import io
import json
import os
import re
from pathlib import Path

import pytest

from tests.support.docs_facts import ROOT, Facts, RecordingEnviron, settings_written_in_src
from tests.support.markdown import Block, code_spans, commands, fenced_blocks, links, prose
from tests.support.optional import needs_redis
from visioncache.errors import MissingExtraError

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CITING = [*PAGES, ROOT / "DEVELOPERS.md"]  # pages whose citations must resolve
LANGUAGES = {"python", "bash", "json", "text"}
BLOCKS = [block for page in PAGES for block in fenced_blocks(page)]
FACTS = Facts()


def of(language: str, *, parse_only: bool | None = None) -> list[pytest.param]:
    chosen = [b for b in BLOCKS if b.language == language]
    if parse_only is not None:
        chosen = [b for b in chosen if ("parse-only" in b.options) == parse_only]
    return [pytest.param(block, id=block.where(ROOT)) for block in chosen]


def run_block(block: Block) -> str:
    """Run a python block in a fresh namespace; what it printed."""
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        exec(compile(block.code, block.where(ROOT), "exec"), {"__name__": "__docs__"})
    return output.getvalue()


@pytest.fixture
def sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A block runs in an empty directory, with no VISIONCACHE_* setting of the caller's."""
    monkeypatch.chdir(tmp_path)
    for name in [name for name in os.environ if name.startswith("VISIONCACHE_")]:
        monkeypatch.delenv(name)


def test_every_block_names_its_language() -> None:
    unnamed = [b.where(ROOT) for b in BLOCKS if b.language not in LANGUAGES]
    assert unnamed == [], f"open each block with one of {sorted(LANGUAGES)} (text for prose)"
    unknown = [b.where(ROOT) for b in BLOCKS if b.options - {"parse-only"}]
    assert unknown == [], "the only block option is parse-only"
    assert not [b.where(ROOT) for b in BLOCKS if "parse-only" in b.options and b.language != "python"]


def test_the_pages_hold_runnable_python() -> None:
    assert of("python", parse_only=False), "no python block runs: the quick start went missing"


@pytest.mark.parametrize("block", of("python", parse_only=False))
def test_python_block_runs(block: Block, sandbox: None) -> None:
    run_block(block)


def test_quick_start_prints_the_stated_counts(sandbox: None) -> None:
    readme = [b for b in BLOCKS if b.page.name == "README.md" and b.language == "python"]
    quick_start = next(block for block in readme if "encode_batch" in block.code)
    assert "parse-only" not in quick_start.options
    printed = run_block(quick_start).strip()
    stated = re.search(r"print\(.*\)\s*#\s*(\d+ \d+)", quick_start.code)
    assert stated is not None and printed == stated[1] == "3 4"


@pytest.mark.parametrize("block", of("python", parse_only=True))
def test_parse_only_python_block_parses_and_imports_what_exists(block: Block) -> None:
    tree = ast.parse(block.code, filename=block.where(ROOT))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("visioncache"):
            try:
                module = importlib.import_module(node.module or "")
            except MissingExtraError as error:  # a core-only install: the page's engine is absent
                pytest.skip(f"{block.where(ROOT)}: {error}")
            exported = set(getattr(module, "__all__", ()))
            for alias in node.names:
                assert alias.name in exported or hasattr(module, alias.name), (
                    f"{block.where(ROOT)}: {node.module} has no {alias.name}"
                )
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("visioncache"):
                    try:
                        importlib.import_module(alias.name)
                    except MissingExtraError as error:
                        pytest.skip(f"{block.where(ROOT)}: {error}")


def test_json_blocks_parse() -> None:
    for block in (b for b in BLOCKS if b.language == "json"):
        try:
            json.loads(block.code)
        except json.JSONDecodeError as error:
            raise AssertionError(f"{block.where(ROOT)}: {error}") from None


@pytest.mark.parametrize("block", of("bash"))
def test_bash_block_names_what_exists(block: Block) -> None:
    problems = [problem for command in commands(block.code) for problem in FACTS.problems(command)]
    paths = [w for c in commands(block.code) for w in c.words if FACTS.looks_like_a_path(w)]
    problems += [problem for word in paths if (problem := FACTS.missing_path(word))]
    assert problems == [], block.where(ROOT)


@pytest.mark.parametrize("page", CITING, ids=lambda page: page.name)
def test_inline_commands_name_what_exists(page: Path) -> None:
    problems = []
    for span in code_spans(prose(page)):
        try:
            spans_commands = list(commands(span))
        except ValueError:  # not shell: an unclosed quote, as in `"iVBORw0KGgo...`
            continue
        for command in spans_commands:
            problems += [f"`{span}`: {problem}" for problem in FACTS.problems(command)]
    assert problems == []


@needs_redis  # the Redis settings are read by building a Redis tier
def test_every_setting_named_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from visioncache import VisionEmbeddingCache

    environ = RecordingEnviron({k: v for k, v in os.environ.items() if not k.startswith("VISIONCACHE_")})
    environ.update(
        VISIONCACHE_DISK_DIR=str(tmp_path / "disk"),
        VISIONCACHE_REDIS_URL="redis://127.0.0.1:1/0",  # constructing a cache opens nothing
        VISIONCACHE_HMAC_SECRET="docs",
    )
    monkeypatch.setattr(os, "environ", environ)
    VisionEmbeddingCache.from_env(namespace="docs-test").close()
    read = {name for name in environ.read if name.startswith("VISIONCACHE_")} | settings_written_in_src()
    assert {"VISIONCACHE_DISK_DIR", "VISIONCACHE_REDIS_URL", "VISIONCACHE_HMAC_SECRET"} <= read
    named = {
        (page.name, name)
        for page in CITING
        for name in re.findall(r"\bVISIONCACHE_[A-Z0-9_]*[A-Z0-9]\b", page.read_text())
    }
    assert sorted((page, name) for page, name in named if name not in read) == []


@pytest.mark.parametrize("page", CITING, ids=lambda page: page.name)
def test_cited_files_folders_and_tests_exist(page: Path) -> None:
    text = prose(page)
    words = [word for span in code_spans(text) for word in span.split()]
    cited = [word.rstrip(".,;:)") for word in words if FACTS.looks_like_a_path(word.rstrip(".,;:)"))]
    problems = [problem for word in cited if (problem := FACTS.missing_path(word))]
    problems += [f"{word}: write the test's file" for word in words if word.startswith("...::")]
    assert problems == []


@pytest.mark.parametrize("page", CITING, ids=lambda page: page.name)
def test_links_between_pages_resolve(page: Path) -> None:
    targets = [t.split("#")[0] for t in links(prose(page)) if not re.match(r"^[a-z]+:|^#", t)]
    assert [t for t in targets if not (page.parent / t).exists()] == []


def test_code_cites_pages_that_exist_and_nothing_outside_the_repository() -> None:
    sources = [
        f for folder in ("src", "tests", "benchmarks", "examples") for f in (ROOT / folder).rglob("*.py")
    ]
    problems = []
    for source in sources:
        text = source.read_text()
        where = source.relative_to(ROOT)
        problems += [
            f"{where}: {page}"
            for page in re.findall(r"\bdocs/[\w-]+\.md", text)
            if not (ROOT / page).exists()
        ]
        outside = re.findall(r"\bDESIGN\.md|\bseed_api\.md|\.\./shared/", text)
        problems += [f"{where}: cites {name}, not in the repository (cite docs/...)" for name in outside]
    assert problems == []


def test_the_checks_catch_what_they_claim() -> None:
    """The checks themselves: a renamed test, a missing flag, target, extra or script fails."""
    assert FACTS.missing_path("tests/test_docs.py::test_the_checks_catch_what_they_claim") is None
    assert FACTS.missing_path("tests/test_docs.py::test_renamed_away") is not None
    assert FACTS.missing_path("docs/results/bench_cpu_full.{txt,json}") is None
    assert FACTS.missing_path("tiers/chain.py") is None and FACTS.missing_path("tiers/nowhere.py")
    wrong = [
        "visioncache bench --no-such-flag",
        "visioncache serve-mlx MODEL --vision-cache-no-such-flag",
        "visioncache no-such-command",
        "make no-such-target",
        "pip install 'visioncache[no-such-extra]'",
        "python benchmarks/bench_tiers.py --no-such-flag",
        "python benchmarks/no_such_script.py",
        "python -m pytest tests/no_such_folder",
        """python -m vllm.x --ec-transfer-config '{"ec_connector_module_path":
            "visioncache.integrations.vllm", "ec_connector_extra_config": {"no_such_key": 1}}'""",
    ]
    for line in wrong:
        assert [p for c in commands(line) for p in FACTS.problems(c)], line
    right = "make demo && visioncache bench --vision full --turns 3; pip install 'visioncache[hf,redis]'"
    assert [p for c in commands(right) for p in FACTS.problems(c)] == []
