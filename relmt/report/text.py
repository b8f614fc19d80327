"""Markdown building blocks and the report's header (sources, skipped runs, command, host)."""

from __future__ import annotations

import datetime as dt
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

from relmt.report.aggregate import Stat, seeds_of

if TYPE_CHECKING:  # build imports the analyses, which render with these blocks
    from relmt.report.build import Report

DASH = "–"


def fmt(stat: Stat | float | None) -> str:
    if stat is None:
        return DASH
    return str(stat) if isinstance(stat, Stat) else f"{stat:.1f}"


def md_table(header: list[str], rows: list[list[str]]) -> str:
    """A markdown table; a "|" inside a cell (e.g. "|difference|") is escaped so it does not split the cell."""
    def line(cells: list[str]) -> str:
        return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"
    return "\n".join([line(header), "|" + "|".join("---" for _ in header) + "|", *map(line, rows)])


PAIR_HEADER = ["seed", "baseline BLEU", "system BLEU", "system − baseline", "95% interval", "p"]


def pair_cells(t) -> list[str]:
    """One seed pair's row (relmt.report.significance.PairTest) under PAIR_HEADER."""
    return [str(t.seed), f"{t.baseline:.2f}", f"{t.system:.2f}", f"{t.difference:+.2f}",
            f"[{t.low:+.2f}, {t.high:+.2f}]", f"{t.p_value:.3f}"]


def plural(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def yes_no(flag: bool) -> str:
    return "yes" if flag else "no"


def host() -> dict[str, str]:
    """What the report was made on (date, CPU, torch and git versions); torch is not imported for it."""
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name")), cpu)
    except OSError:
        pass
    try:
        torch = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch = "not installed"
    try:
        git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False,
                             cwd=Path(__file__).parent).stdout.strip() or "unknown"
    except OSError:
        git = "unknown"
    return {"date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "cpu": cpu,
            "cpu_count": str(os.cpu_count()), "torch": torch, "git": git}


def no_refs(report: Report, group) -> str:
    """Why a group has no paired tests: no --refs at all, or none for its data set."""
    if not report.refs:
        return ("the report was built without `--refs DIR`, the folder of the reference files `{split}.{tgt}` that "
                "each run's translations/ are tested against")
    return f"no `--refs` folder for data set {group.data} (give `--refs {group.data}=DIR` or a plain `--refs DIR`)"


def md_intro(report: Report) -> str:
    sources = ", ".join(f"`{s}`" for s in report.sources)
    seeds = ", ".join(map(str, seeds_of(report.runs))) or DASH
    text = f"Read {plural(len(report.runs), 'completed run')} from {sources}; seeds found: {seeds}."
    if report.skipped:
        listed = "; ".join(f"`{p}` ({why})" for p, why in report.skipped)
        verb = "is" if len(report.skipped) == 1 else "are"
        text += f' Skipped {plural(len(report.skipped), "run")} that {verb} not "completed": {listed}.'
    if report.command:
        text += f"\n\nThe runs were produced by: `{report.command}`"
    hw = host()
    text += (f"\n\nThis report: {hw['date']}, on {hw['cpu']} ({hw['cpu_count']} cores), torch {hw['torch']}, "
             f"git {hw['git']}.")
    return text
