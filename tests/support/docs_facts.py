"""What the docs may name, read from the repository itself: `visioncache` subcommands and flags,
``make`` targets, pip extras, ``VISIONCACHE_*`` settings, cited files and tests.

`Facts.problems(command)` says what is wrong with one shell command of the docs (an empty list when
nothing is); `Facts.missing_path(token)` what is wrong with a cited path. Only what is cheap to
check is checked: other programs' flags (vllm-mlx's, vLLM's, curl's) pass.
"""

from __future__ import annotations

import argparse
import functools
import glob
import importlib.metadata
import json
import re
from pathlib import Path

from tests.support.markdown import Command

__all__ = ["ROOT", "Facts", "RecordingEnviron", "settings_written_in_src"]

ROOT = Path(__file__).parents[2]
_PYTHON = re.compile(r"^(?:\S*/)?python(?:3(?:\.\d+)?)?$")
_TOP = ("src/", "tests/", "benchmarks/", "docs/", "examples/", ".ci/")
_PATH = re.compile(r"^(?:\.\./)?[\w.-]+(?:/[\w.*{},-]+)+/?(?:::\w+)?$")
_EXTENSIONS = (".py", ".md", ".txt", ".json", ".png", ".toml")
_EXTRA = re.compile(r"^visioncache\[(?P<extras>[\w,-]+)\]")


class Facts:
    """The repository's commands, flags, targets, extras and settings (each read once)."""

    @functools.cached_property
    def subcommands(self) -> dict[str, set[str]]:
        from visioncache.cli import build_parser

        parser = build_parser()
        (subparsers,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        return {name: _options(sub) for name, sub in subparsers.choices.items()}

    @functools.cached_property
    def serve_mlx_flags(self) -> set[str]:
        from visioncache.integrations.vllm_mlx.launcher import build_parser

        return _options(build_parser())

    @functools.cached_property
    def make_targets(self) -> set[str]:
        text = (ROOT / "Makefile").read_text()
        return set(re.findall(r"^([\w.-]+)\s*:(?!=)", text, flags=re.MULTILINE))

    @functools.cached_property
    def extras(self) -> set[str]:
        """The installed distribution's extras (pyproject.toml's optional-dependencies)."""
        return set(importlib.metadata.metadata("visioncache").get_all("Provides-Extra") or ())

    def problems(self, command: Command) -> list[str]:
        """What `command` names that does not exist (subcommands, flags, targets, extras, scripts)."""
        words = command.words
        if not words:
            return []
        program, args = words[0], words[1:]
        if program == "make":
            return [f"no make target {t!r}" for t in args if "=" not in t and t not in self.make_targets]
        if program.endswith("visioncache"):
            return self._visioncache(args)
        if program == "pip" or (_PYTHON.match(program) and args[:2] == ["-m", "pip"]):
            return self._pip(args)
        if not _PYTHON.match(program):
            return []
        if args[:1] == ["-m"] and len(args) > 1:
            return self._module(args[1], args[2:])
        if args and args[0].endswith(".py"):
            return self._script(args[0], args[1:])
        return []

    def _visioncache(self, args: list[str]) -> list[str]:
        if not args:
            return []
        if args[0] not in self.subcommands:
            return [f"no subcommand `visioncache {args[0]}` (there are {sorted(self.subcommands)})"]
        if args[0] == "serve-mlx":
            return self._serve_mlx(args[1:])
        known = self.subcommands[args[0]]
        return [f"`visioncache {args[0]}` has no flag {flag}" for flag in _flags(args) if flag not in known]

    def _serve_mlx(self, args: list[str]) -> list[str]:
        ours = [flag for flag in _flags(args) if flag.startswith("--vision-cache-")]
        known = self.serve_mlx_flags
        return [f"`visioncache serve-mlx` has no flag {flag}" for flag in ours if flag not in known]

    def _pip(self, args: list[str]) -> list[str]:
        wrong = []
        for word in args:
            match = _EXTRA.match(word)
            for extra in match["extras"].split(",") if match else ():
                if extra not in self.extras:
                    wrong.append(f"no extra visioncache[{extra}] in pyproject.toml")
        return wrong

    def _module(self, module: str, args: list[str]) -> list[str]:
        if module == "visioncache":
            return self._visioncache(args)
        if module == "visioncache.integrations.vllm_mlx":
            return self._serve_mlx(args[1:]) if args[:1] == ["serve"] else [f"no command {args[:1]}"]
        if module == "pytest":
            return [problem for arg in args if (problem := self.missing_path(arg.split("::")[0]))]
        if module.startswith("vllm.") and "--ec-transfer-config" in args:
            return self._ec_transfer_config(args[args.index("--ec-transfer-config") + 1])
        return []

    def _script(self, script: str, args: list[str]) -> list[str]:
        path = ROOT / script
        if not path.is_file():
            return [f"no script {script}"]
        text = path.read_text() + (ROOT / "benchmarks" / "_timing.py").read_text()
        return [f"{script} has no flag {flag}" for flag in _flags(args) if f'"{flag}"' not in text]

    def _ec_transfer_config(self, text: str, environ: dict[str, str] | None = None) -> list[str]:
        from visioncache.errors import ConfigurationError
        from visioncache.integrations.vllm.config import ConnectorConfig

        try:
            config = json.loads(text)
        except json.JSONDecodeError as error:
            return [f"--ec-transfer-config is not JSON: {error}"]
        wrong = []
        if config.get("ec_connector_module_path") != "visioncache.integrations.vllm":
            wrong.append("ec_connector_module_path must be visioncache.integrations.vllm")
        extra = config.get("ec_connector_extra_config", {})
        secret_names = [extra["hmac_secret_env"]] if "hmac_secret_env" in extra else []
        try:
            ConnectorConfig.from_extra_config(extra, environ={name: "secret" for name in secret_names})
        except ConfigurationError as error:
            wrong.append(f"ec_connector_extra_config: {error}")
        return wrong

    def missing_path(self, token: str) -> str | None:
        """Why `token`, a path as the docs cite it (from the repository root, or from
        src/visioncache/ for a module), names nothing; None when it names something."""
        path, _, test = token.partition("::")
        if token.startswith("...::"):
            return f"{token}: name the test file (tests/...::test_name), not ..."
        candidates = [ROOT / p for p in _expand(path)]
        if not path.startswith(_TOP):
            candidates += [ROOT / "src" / "visioncache" / p for p in _expand(path)]
        found = [Path(match) for c in candidates for match in glob.glob(str(c))]
        if not found:
            return f"{token}: no such file or folder"
        if test and not any(re.search(rf"^\s*(?:async )?def {test}\(", f.read_text(), re.M) for f in found):
            return f"{token}: no test {test} in {path}"
        return None

    @staticmethod
    def looks_like_a_path(token: str) -> bool:
        if not _PATH.match(token) or "..." in token.split("::")[0].split("/"):
            return False
        return token.startswith(_TOP) or token.split("::")[0].endswith(_EXTENSIONS)


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {option for action in parser._actions for option in action.option_strings}


def _flags(args: list[str]) -> list[str]:
    return [arg.split("=", 1)[0] for arg in args if arg.startswith("--")]


def _expand(path: str) -> list[str]:
    """Shell brace expansion: ``a_{x,y}.{txt,json}`` -> ``a_x.txt``, ``a_x.json``, ..."""
    match = re.search(r"\{([^{}]*)\}", path)
    if match is None:
        return [path]
    choices = [path[: match.start()] + choice + path[match.end() :] for choice in match[1].split(",")]
    return [expanded for choice in choices for expanded in _expand(choice)]


def settings_written_in_src() -> set[str]:
    """Every ``VISIONCACHE_*`` name written out in src/ (beside those built from a prefix)."""
    return {
        name
        for module in (ROOT / "src" / "visioncache").rglob("*.py")
        for name in re.findall(r"\bVISIONCACHE_[A-Z0-9_]*[A-Z0-9]\b", module.read_text())
    }


class RecordingEnviron(dict[str, str]):
    """An ``os.environ`` stand-in that records every name looked up."""

    def __init__(self, values: dict[str, str]) -> None:
        super().__init__(values)
        self.read: set[str] = set()

    def get(self, key: str, default: object = None) -> object:  # type: ignore[override]
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key: str) -> str:
        self.read.add(key)
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        self.read.add(str(key))
        return super().__contains__(key)
