"""docs/plugins.md documents every hook spec (datasette's rule), every group and every operator
variable, and its Python examples are valid Python."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from brigade.plugins.groups import ALL_GROUPS
from brigade.plugins.hookspecs import REGISTRATION_HOOKS

DOC = Path(__file__).resolve().parents[2] / "docs" / "plugins.md"


def sections() -> dict[str, str]:
    """``### `name``` heading -> its text up to the next heading."""
    text = DOC.read_text()
    parts = re.split(r"^### `([a-z_]+)`\s*$", text, flags=re.MULTILINE)
    return {parts[i]: parts[i + 1].split("\n## ")[0] for i in range(1, len(parts), 2)}


@pytest.mark.parametrize("hook", REGISTRATION_HOOKS)
def test_every_hookspec_has_a_section_with_a_complete_example(hook):
    body = sections().get(hook)
    assert body is not None, f"docs/plugins.md has no '### `{hook}`' section"
    assert "register(" in body
    assert re.search(rf"@hookimpl\s*\ndef {hook}\(register\):", body), f"no example implementation of {hook}"


def test_no_section_documents_a_hook_that_does_not_exist():
    assert set(sections()) == set(REGISTRATION_HOOKS)


def test_groups_and_operator_variables_are_documented():
    text = DOC.read_text()
    for group in ALL_GROUPS:
        assert f"`{group.name}`" in text
    for var in ("BRIGADE_PLUGINS", "BRIGADE_ENDPOINT_PLUGINS", "BRIGADE_PLATFORM", "BRIGADE_PLUGINS_STRICT"):
        assert f"`{var}" in text
    assert "`builtin` plugin is **always loaded**" in text


def test_python_examples_parse():
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.DOTALL)
    assert len(blocks) >= len(REGISTRATION_HOOKS)
    for block in blocks:
        ast.parse(block)
