"""TableLayout and wrap_text: listings fit the terminal width, the last column wrapping, other columns cut."""

from __future__ import annotations

from brigade.entrypoints.cli.text_table import MIN_LAST_COLUMN, TableLayout, format_table, wrap_text


def test_a_narrow_table_is_left_as_it_is():
    lines = format_table([("NAME", "STATUS"), ("a", "loaded")], width=100)
    assert lines == ["NAME  STATUS", "a     loaded"]


def test_the_last_column_wraps_under_itself():
    status = "disabled by allowlist: endpoint plugins are denied by default; BRIGADE_ENDPOINT_PLUGINS is unset"
    lines = format_table([("NAME", "DISTRIBUTION", "STATUS"), ("reset_prefix_cache", "brigade-reset 0.1.0", status)],
                         width=60)
    assert all(len(line) <= 60 for line in lines)
    column = lines[0].index("STATUS")
    assert all(line[:column].strip() == "" for line in lines[2:]) and len(lines) > 2
    assert " ".join(line[column:] for line in lines[1:]) == status


def test_wide_fixed_columns_are_cut_to_leave_the_last_its_minimum():
    rows = [("NAME", "KERNEL", "OP"), ("n" * 50, "k" * 70, "rms_norm")]
    layout = TableLayout.fit(rows, width=100)
    assert layout.last_width >= MIN_LAST_COLUMN
    lines = [line for row in rows for line in layout.format(row)]
    assert all(len(line) <= 100 for line in lines)
    assert "…" in lines[1] and lines[1].endswith("rms_norm")


def test_wrap_text_indents_every_line():
    lines = wrap_text("scope: every process; hooks: " + ", ".join(["attention_backends"] * 8), width=50, indent=4)
    assert len(lines) > 1 and all(len(line) <= 50 and line.startswith("    ") for line in lines)
