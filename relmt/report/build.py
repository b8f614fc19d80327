"""From run directories to a Report: read, group by data set and model preset, analyse each group."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from relmt.report.claims import check_claims
from relmt.report.controls import controls_table, split_variants, stages_table
from relmt.report.curves import learning_curves
from relmt.report.runs import ReportError, Run, find_run_dirs, read_runs
from relmt.report.significance import compare_group
from relmt.report.tables import Group, analyse_tables, positions_runs


@dataclass
class Report:
    title: str
    command: str | None
    sources: list[str]
    runs: list[Run]
    skipped: list[tuple[Path, str]]
    groups: list[Group]
    refs: dict[str | None, Path] = field(default_factory=dict)  # --refs: data set (None: any) -> folder
    n_samples: int = 1000
    extra: dict = field(default_factory=dict)  # what a report kind adds (the length report's cutoffs)


def group_runs(runs: list[Run]) -> list[Group]:
    """Groups by data set, model preset and recorded training-length cutoff, ordered by data name, then
    model width, then preset name. A group's controlled-experiment runs go to its variants (a group of
    variants only keeps them as its runs)."""
    keys = sorted({(r.data, r.d_model, r.model, r.train_max_words or 0) for r in runs})
    groups = []
    for k in keys:
        data, _, model, _ = k
        members = [r for r in runs if (r.data, r.d_model, r.model, r.train_max_words or 0) == k]
        standard, variants = split_variants(members)
        groups.append(Group(data, model, standard, variants=variants) if standard else Group(data, model, members))
    return groups


def parse_refs(values: list[str]) -> dict[str | None, Path]:
    """--refs values: "DIR" (key None: every data set) or "DATA=DIR" (one data set; DATA has no "/")."""
    out: dict[str | None, Path] = {}
    for value in values:
        data, sep, folder = value.partition("=")
        data, folder = (data, folder) if sep and "/" not in data else (None, value)
        if not Path(folder).is_dir():
            raise ReportError(f"--refs {value}: {folder} is not a directory")
        out[data] = Path(folder)
    return out


def refs_for(refs: dict[str | None, Path], data: str) -> Path | None:
    """The reference folder of data set `data`: its own --refs DATA=DIR, else a plain --refs DIR."""
    return refs.get(data, refs.get(None))


def analyse(group: Group, refs: dict[str | None, Path], n_samples: int) -> Group:
    """One group's tables, paired tests (with a reference folder for its data set), curves and claims."""
    analyse_tables(group)
    group.refs = refs_for(refs, group.data)
    if group.refs is not None:
        group.significance = compare_group(group, group.refs, n_samples)
    group.curves = learning_curves(positions_runs(group))
    group.claims = check_claims(group)
    group.controls = controls_table(group.runs, group.variants, group.splits, group.k_default, group.refs, n_samples)
    group.stages = stages_table(group.runs + group.variants, group.k_default)
    return group


def load(sources: list[str]) -> tuple[list[Run], list[tuple[Path, str]]]:
    """The completed runs under `sources` and the directories skipped; ReportError if there is none."""
    dirs = find_run_dirs(sources)
    if not dirs:
        raise ReportError(f"no run directories (with metrics.json and config.yaml) found in {', '.join(sources)}")
    runs, skipped = read_runs(dirs)
    if not runs:
        listed = "; ".join(f"{p} ({why})" for p, why in skipped)
        raise ReportError(f"none of the {len(dirs)} run directories is a completed run: {listed}")
    return runs, skipped


def build_report(sources: list[str], title: str, command: str | None, refs: dict[str | None, Path] | None = None,
                 n_samples: int = 1000) -> Report:
    """The paper-tables report of the runs under `sources`."""
    refs = refs or {}
    runs, skipped = load(sources)
    groups = [analyse(g, refs, n_samples) for g in group_runs(runs)]
    return Report(title, command, list(sources), runs, skipped, groups, refs, n_samples)
