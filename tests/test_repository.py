"""The repository reads as a product: no tracked file points outside it or reads as a journal of how it was made.

Every tracked text file (``git ls-files``; binaries skipped) is checked for paths into folders that are not part of
the repository (a design folder beside it, a machine's home or work directory), for design notes that are not in
it, for citations of chapters of a book instead of the mechanism in words, and for work-round names (numbered
sessions, lettered calls, one-off run scripts, numbered reviews, issues or rounds) in file names and text. Every
relative markdown link in a tracked ``.md`` file must resolve to a tracked file.

The patterns are spelled so that this file does not match them itself (``[t]`` in a character class, escaped dots).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from functools import lru_cache
from pathlib import Path, PurePosixPath

import pytest

REPO = Path(__file__).resolve().parents[1]

# What points outside the repository. Each pattern is written so that it does not match its own source text.
OUTSIDE = {
    "a path into the design folder beside the repository": re.compile(r"(?<![\w-])share[d]/"),
    "a machine's work directory": re.compile(r"(?<![\w.-])/wor[k]/"),
    "a machine's root home directory": re.compile(r"(?<![\w.-])/roo[t]/"),
    "a design note that is not in the repository": re.compile(r"\b(?:DESIG[N]|MODE[L]|STYL[E]|AP[I])\.md\b"),
    "a chapter of a book instead of the mechanism in words":
        re.compile(r"(?i)\bboo[k](?:'s)? ch(?:\.|apter)|\bc[h]\. ?[0-9]"),
}

# Work-round names, in text and in file names.
JOURNAL = {
    "a numbered session": re.compile(r"(?i)(?<![a-z])sessio[n][\s_]?[0-9]+"),
    "a lettered call": re.compile(r"\bcal[l]\s[A-Z]{1,2}\b"),
    "a one-off run script": re.compile(r"\bru[n]_[a-z]{1,2}\.sh\b"),
    "a numbered review": re.compile(r"(?i)(?<![a-z])revie[w][\s_]?[0-9]+"),
    "a numbered issue": re.compile(r"(?i)\bissu[e]\s[0-9]+"),
    "a numbered round": re.compile(r"(?i)\broun[d]\s[0-9]"),
}
# File and folder names only: result folders named after work rounds and tests named after chapters of a book.
JOURNAL_NAMES = {
    "a work-round folder": re.compile(r"(?i)^(?:session[0-9]+|call_[a-z]{1,2}[0-9]?)$"),
    "a chapter of a book": re.compile(r"(?i)book_ch[0-9]"),
}

# Justified exceptions, as (path prefix, pattern name). Benchmark result files record the command line and the
# output path each run was made with, on the machine that ran it: data, not a pointer to follow; their logs keep
# `brigade bench`'s progress lines, which count the interleaved measurement rounds of --repeats.
ALLOWED = {
    ("benchmarks/results/", "a machine's root home directory"),
    ("benchmarks/results/", "a numbered round"),
}

MARKDOWN_LINK = re.compile(r"\]\(([^)\s]+)\)")


@lru_cache(maxsize=1)
def tracked_files() -> tuple[str, ...]:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    return tuple(name for name in out.decode().split("\0") if name and (REPO / name).is_file())


def text_of(name: str) -> str | None:
    """The file's text, or None for a binary file (a NUL byte, or not UTF-8)."""
    data = (REPO / name).read_bytes()
    if b"\0" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def allowed(name: str, what: str) -> bool:
    return any(name.startswith(prefix) and what == rule for prefix, rule in ALLOWED)


def findings(patterns: dict[str, re.Pattern]) -> list[str]:
    found = []
    for name in tracked_files():
        text = text_of(name)
        if text is None:
            continue
        for what, pattern in patterns.items():
            if allowed(name, what):
                continue
            for match in pattern.finditer(text):  # over the whole text: a name may wrap onto the next line
                number = text.count("\n", 0, match.start()) + 1
                found.append(f"{name}:{number}: {what}: {match.group(0)!r}")
    return found


def test_no_tracked_file_points_outside_the_repository():
    found = findings(OUTSIDE)
    assert not found, "\n".join(found[:100]) + (f"\n... and {len(found) - 100} more" if len(found) > 100 else "")


def test_no_tracked_file_reads_as_a_journal():
    found = findings(JOURNAL)
    for name in tracked_files():
        path = PurePosixPath(name)
        for what, pattern in {**JOURNAL, **JOURNAL_NAMES}.items():
            if any(pattern.search(part) for part in path.parts):
                found.append(f"{name}: {what} in the file's name")
                break
    assert not found, "\n".join(found[:100]) + (f"\n... and {len(found) - 100} more" if len(found) > 100 else "")


def test_every_relative_markdown_link_resolves_to_a_tracked_file():
    tracked = set(tracked_files())
    folders = {str(parent) for name in tracked for parent in PurePosixPath(name).parents}
    broken = []
    for name in tracked:
        if not name.endswith(".md"):
            continue
        for number, line in enumerate((REPO / name).read_text().splitlines(), 1):
            for target in MARKDOWN_LINK.findall(line):
                if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                    continue  # a URL (http:, mailto:) or an anchor in the same page
                path = target.split("#", 1)[0].split("?", 1)[0]
                resolved = (REPO / PurePosixPath(name).parent / path).resolve()
                try:
                    relative = resolved.relative_to(REPO).as_posix()
                except ValueError:
                    broken.append(f"{name}:{number}: {target} leaves the repository")
                    continue
                if relative not in tracked and relative not in folders:
                    broken.append(f"{name}:{number}: {target} is not a tracked file")
    assert not broken, "\n".join(broken)
