"""A report page rewritten over the same runs keeps its old stamp, so a rerun changes no committed page."""

from __future__ import annotations

from relmt.cli.report import write_page

PAGE = ("# toy\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n"
        "This report: {date}, on AMD EPYC (2 cores), torch 2.13.0+cpu, git {git}.")


def test_a_page_that_differs_only_in_its_stamp_is_left_as_it_was(tmp_path):
    page = tmp_path / "toy.md"
    first = PAGE.format(date="2026-11-20 10:00 UTC", git="abc1234")
    write_page(page, first)
    write_page(page, PAGE.format(date="2026-11-26 16:00 UTC", git="def5678"))
    assert page.read_text() == first
    changed = PAGE.replace("| 1 | 2 |", "| 1 | 3 |").format(date="2026-11-26 16:00 UTC", git="def5678")
    write_page(page, changed)
    assert page.read_text() == changed
