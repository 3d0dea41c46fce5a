"""The docs are for users first: every page of docs/ opens with a "## Use it" section of commands that run on the
set-up's model (each ``brigade`` command's flags parse; each Python block compiles), lines stay within 120
characters, GPU figures live in benchmarks.md and performance-notes.md only, no page carries internal remarks, and
architecture.md keeps its sentences short."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted((ROOT / "docs").glob("*.md"))
FIGURE_PAGES = {"benchmarks.md", "performance-notes.md"}
MAX_LINE = 120
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
INTERNAL = re.compile(r"\bthe lead\b|not yet run|\bwork round|\bround \d|\bthis session\b|\bnext session\b", re.I)
ENV_ASSIGNMENT = re.compile(r"^[A-Z_][A-Z0-9_]*=")


def use_it_section(text: str) -> str:
    """The page's first ``## `` section, which must be "## Use it"; returns its body."""
    match = re.search(r"^## (.*)$", text, re.M)
    assert match is not None and match.group(1) == "Use it", f"first section: {match and match.group(1)!r}"
    end = re.search(r"^## ", text[match.end():], re.M)
    return text[match.end():match.end() + end.start()] if end else text[match.end():]


def brigade_commands(shell: str) -> list[list[str]]:
    """Each ``brigade ...`` command of a shell block, as argv after ``brigade`` (continuations joined, comments,
    leading VAR=value assignments and a trailing ``&`` dropped)."""
    commands, pending = [], ""
    for line in shell.replace("\\\n", " ").splitlines():
        pending += ("\n" if pending else "") + line
        try:
            words = shlex.split(pending, comments=True)
        except ValueError:  # a quoted argument (JSON) that goes on over the next line
            continue
        pending = ""
        while words and ENV_ASSIGNMENT.match(words[0]):
            words.pop(0)
        if words and words[-1] == "&":
            words.pop()
        if words[:1] == ["brigade"]:
            commands.append(words[1:])
    return commands


@pytest.fixture(scope="module")
def parser():
    from brigade.entrypoints.cli.main import build_parser
    from brigade.plugins import load_plugins, plugin_choices

    load_plugins("api")
    return build_parser(plugin_choices())


@pytest.mark.parametrize("page", DOCS, ids=[p.name for p in DOCS])
def test_each_page_opens_with_a_runnable_use_it_section(page, parser):
    blocks = FENCE.findall(use_it_section(page.read_text()))
    assert blocks, f"{page.name}: its Use it section has no command block"
    num_commands = 0
    for language, body in blocks:
        if language == "python":
            compile(body, f"{page.name}:Use it", "exec")
            continue
        for argv in brigade_commands(body):
            num_commands += 1
            try:
                _, extra = parser.parse_known_args(argv)
            except SystemExit:
                pytest.fail(f"{page.name}: `brigade {shlex.join(argv)}` does not parse")
            assert not extra, f"{page.name}: `brigade {shlex.join(argv)}`: unknown {extra}"
    assert num_commands or page.name == "architecture.md", f"{page.name}: no brigade command in Use it"


@pytest.mark.parametrize("page", DOCS, ids=[p.name for p in DOCS])
def test_pages_keep_lines_short_and_say_nothing_internal(page):
    for number, line in enumerate(page.read_text().splitlines(), 1):
        assert len(line) <= MAX_LINE, f"{page.name}:{number}: {len(line)} characters"
        assert not INTERNAL.search(line), f"{page.name}:{number}: {line}"
        if page.name not in FIGURE_PAGES:
            assert "H200" not in line, f"{page.name}:{number}: GPU figures belong in benchmarks.md: {line}"


def test_architecture_sentences_are_short():
    text = (ROOT / "docs" / "architecture.md").read_text()
    prose = FENCE.sub("", text)
    prose = "\n".join(line for line in prose.splitlines() if not line.startswith(("#", "|")))
    sentences = [s for s in re.split(r"(?<=[.!?])\s+|\n\n", prose) if len(s.split()) > 2]
    mean = sum(len(s.split()) for s in sentences) / len(sentences)
    assert mean < 30, f"architecture.md averages {mean:.1f} words a sentence"
