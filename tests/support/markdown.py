"""What the docs test reads from Markdown: fenced code blocks, inline code spans, links, commands.

A fenced block opens with three backticks and an info string: its language (``python``, ``bash``,
``json``, ``text``) and options (``parse-only``); it closes with three backticks alone.
Commands are split the way a POSIX shell splits them (`shlex`), which is enough for the docs'
one-line and backslash-continued commands.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Block", "Command", "code_spans", "commands", "fenced_blocks", "links", "prose"]

_FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<info>[^`]*)$")
_LINK = re.compile(r"\[[^\]]*\]\((?P<target>[^)\s]+)\)")
_SPAN = re.compile(r"`([^`]+)`")
_SEPARATORS = {";", "&&", "||", "|", "&"}
_KEYWORDS = {"do", "then", "else", "done", "fi", "for", "while", "if"}


@dataclass(frozen=True)
class Block:
    """One fenced code block of a page."""

    page: Path
    line: int  # of the opening fence, 1-based
    language: str
    options: frozenset[str]
    code: str

    def where(self, root: Path) -> str:
        return f"{self.page.relative_to(root)}:{self.line}"


@dataclass(frozen=True)
class Command:
    """One simple command: its variable assignments (``export`` included) and its words."""

    assignments: dict[str, str]
    words: list[str]


def fenced_blocks(page: Path) -> list[Block]:
    blocks: list[Block] = []
    lines = page.read_text().splitlines()
    index = 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        indent, info, opened_at = len(opening["indent"]), opening["info"].split(), index + 1
        body: list[str] = []
        index += 1
        while index < len(lines) and lines[index].strip() != "```":
            body.append(lines[index][indent:])
            index += 1
        if index == len(lines):
            raise AssertionError(f"{page}: the code block opened at line {opened_at} never closes")
        language = info[0] if info else ""
        blocks.append(Block(page, opened_at, language, frozenset(info[1:]), "\n".join(body) + "\n"))
        index += 1
    return blocks


def prose(page: Path) -> str:
    """The page without its fenced blocks."""
    kept: list[str] = []
    inside = False
    for line in page.read_text().splitlines():
        fence = line.strip() == "```" if inside else _FENCE.match(line) is not None
        if fence:
            inside = not inside
        elif not inside:
            kept.append(line)
    return "\n".join(kept)


def code_spans(text: str) -> list[str]:
    """Inline code spans, whitespace (line breaks included) collapsed to single spaces."""
    return [" ".join(span.split()) for span in _SPAN.findall(text)]


def links(text: str) -> list[str]:
    return _LINK.findall(text)


def commands(script: str) -> Iterator[Command]:
    """The simple commands of a shell snippet, without comments; backslash-continued lines and
    quotes spanning lines joined. An unclosed quote raises ValueError."""
    for line in _logical_lines(script):
        words: list[str] = []
        for token in [*line, ";"]:
            if token not in _SEPARATORS:
                words.append(token)
                continue
            assignments: dict[str, str] = {}
            while words and (words[0] in _KEYWORDS or words[0] == "export" or _assignment(words[0])):
                head = words.pop(0)
                if _assignment(head):
                    name, _, value = head.partition("=")
                    assignments[name] = value
                elif head == "for":  # for NAME in WORDS: nothing to run
                    words = []
            if words or assignments:
                yield Command(assignments, words)
            words = []


def _logical_lines(script: str) -> Iterator[list[str]]:
    buffer = ""
    for line in re.sub(r"\\\n", " ", script).splitlines():
        buffer = f"{buffer}\n{line}" if buffer else line
        try:
            words = _split(buffer)
        except ValueError:  # a quote still open: it goes on on the next line
            continue
        buffer = ""
        yield words
    if buffer:
        _split(buffer)


def _split(line: str) -> list[str]:
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    return list(lexer)


def _assignment(word: str) -> bool:
    return re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", word, flags=re.DOTALL) is not None
