"""From run directories to a Report: read, group by data set and model preset, analyse each group."""

from dataclasses import dataclass, field
from pathlib import Path

from relmt.report.claims import check_claims
from relmt.report.controls import Setting, controls_table, split_variants, stages_table
from relmt.report.length import analyse_length
from relmt.report.runs import ReportError, Run, find_run_dirs, read_runs
from relmt.report.significance import compare_group
from relmt.report.tables import Group, analyse_tables, learning_curves, positions_runs


@dataclass
class Report:
    title: str
    command: str | None
    sources: list[str]
    runs: list[Run]
    skipped: list[tuple[Path, str]]
    groups: list[Group]
    refs: dict[str | None, Path] = field(default_factory=dict)  # refs=: data set (None: any) -> folder
    n_samples: int = 1000
    extra: dict = field(default_factory=dict)  # what a report kind adds (the length report's LengthGroups)
    warnings: list[str] = field(default_factory=list)  # runs averaged as seeds whose settings differ


def group_runs(runs: list[Run]) -> list[Group]:
    """Groups by data set, model preset and recorded training cutoff, ordered by data name, model width and
    preset name. Controlled-experiment runs go to the group's variants (a group of variants only keeps them)."""
    groups = []
    for k in sorted({(r.data, r.d_model, r.model, r.train_max_words or 0) for r in runs}):
        members = [r for r in runs if (r.data, r.d_model, r.model, r.train_max_words or 0) == k]
        standard, variants = split_variants(members)
        groups.append(Group(k[0], k[2], standard, variants=variants) if standard else Group(k[0], k[2], members))
    return groups


def analyse(group: Group) -> Group:
    analyse_tables(group)
    group.significance = compare_group(group) if group.refs is not None else []
    group.curves = learning_curves(positions_runs(group))
    group.claims = check_claims(group)
    group.controls = controls_table(group)
    group.stages = stages_table(group.runs + group.variants, group.k_default)
    return group


def check_seeds(runs: list[Run]) -> tuple[list[Run], list[tuple[Path, str]], list[str]]:
    """Runs that a table cell would average as seeds (one data set, model, cutoff and Setting), held to every
    setting but the seed (runs.settings): a run with the seed and settings of an earlier one is a duplicate and
    left out (named with it); runs whose other settings differ are kept, with a warning naming them."""
    duplicates, warnings, cells = [], [], {}
    for r in runs:
        cells.setdefault((r.data, r.model, r.d_model, r.train_max_words, Setting.of(r)), []).append(r)
    for members in cells.values():
        first: dict[tuple, Run] = {}
        for r in members:
            if (twin := first.setdefault((r.seed, r.settings), r)) is not r:
                duplicates.append((r.path, f"a duplicate of {twin.path}: seed {r.seed}, the same settings"))
        if len(values := [dict(s) for s in dict.fromkeys(r.settings for r in first.values())]) > 1:
            differ = sorted(k for k in set().union(*values) if len({v.get(k) for v in values}) > 1)
            listed = "; ".join(f"{k}: " + ", ".join(sorted({str(v.get(k, '–')) for v in values})) for k in differ)
            names = ", ".join(f"`{r.path}`" for r in first.values())
            warnings.append(f"{names} are averaged as seeds of one configuration but differ in {listed}")
    left_out = {path for path, _ in duplicates}
    return [r for r in runs if r.path not in left_out], duplicates, warnings


def build_report(sources: list[str], title: str, command: str | None, refs: dict[str | None, Path] | None = None,
                 n_samples: int = 1000, cutoffs: dict[str | None, int] | None = None) -> Report:
    """The completed runs under `sources` (duplicates left out, the skipped named), grouped and analysed: the
    paper's tables, or with `cutoffs` (train_max_words=) the length report. ReportError if there is no run."""
    if not (dirs := find_run_dirs(sources)):
        raise ReportError(f"no run directories (with metrics.json and config.yaml) found in {', '.join(sources)}")
    runs, skipped = read_runs(dirs)
    if not runs:
        listed = "; ".join(f"{p} ({why})" for p, why in skipped)
        raise ReportError(f"none of the {len(dirs)} run directories is a completed run: {listed}")
    runs, duplicates, warnings = check_seeds(runs)
    refs, groups = refs or {}, group_runs(runs)
    for g in groups:  # the reference folder for the group's data set, else the one for all
        g.refs, g.n_samples = refs.get(g.data, refs.get(None)), n_samples
    if cutoffs is None:
        groups, extra = [analyse(g) for g in groups], {}
    else:
        extra = {"length": [analyse_length(g, cutoffs) for g in groups]}
    return Report(title, command, list(sources), runs, skipped + duplicates, groups, refs, n_samples, extra, warnings)
