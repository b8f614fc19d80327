"""The tuning report: runs that differ in a few settings, compared on the validation split only.

Each row is one run: the settings in which the runs differ (read from their config.yaml, so no
setting is typed by hand), the valid sacreBLEU at every validation, and the final validation's
sacreBLEU, chrF and lowercased tokenized BLEU, and, where scripts/score_averaged.sh has scored it,
the valid sacreBLEU of the averaged last checkpoints. Test sets play no part in tuning.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from relmt.report.runs import ReportError, Run, find_run_dirs, read_runs
from relmt.report.text import DASH, host, md_table

# Settings that differ between runs without being a choice being tuned.
IGNORED = ("out_dir", "data.dir", "data.cache_dir", "train.resume", "train.progress", "train.num_threads")


def flatten(cfg: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in cfg.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


def differing(configs: list[dict[str, object]]) -> list[str]:
    """The flattened keys whose values are not the same in every run."""
    keys = sorted({k for c in configs for k in c})
    return [k for k in keys if k not in IGNORED and len({repr(c.get(k)) for c in configs}) > 1]


def tuning_markdown(sources: list[str], title: str, command: str | None) -> str:
    runs, skipped = read_runs(find_run_dirs(sources))
    if not runs:
        raise ReportError(f"{' '.join(sources)}: no completed runs")
    configs = [flatten(yaml.safe_load((r.path / "config.yaml").read_text())) for r in runs]
    keys = differing(configs)
    steps = sorted({s for r in runs for s, _ in r.curve})
    header = ["run", *keys, *(f"valid BLEU @{s}" for s in steps), "final sacreBLEU", "chrF",
              "lowercased tok. BLEU", "averaged checkpoints: sacreBLEU", "minutes"]
    rows = [row(r, c, keys, steps) for r, c in zip(runs, configs)]
    best = max(runs, key=lambda r: r.valid.get("bleu", float("-inf")))
    h = host()
    lines = [f"# {title}", "", f"Made by `relmt-report {' '.join(sources)} --kind tuning` on {h['date']} "
             f"({h['cpu']}, {h['cpu_count']} cores, torch {h['torch']}, relmt {h['git']})."]
    if command:
        lines += ["", f"Runs: `{command}`."]
    lines += ["", "Validation split only: the tuning runs decode no test set. BLEU is sacreBLEU (cased, 13a) "
              "unless named otherwise; 'minutes' is the run's wall time.", "", md_table(header, rows), "",
              f"Highest final valid sacreBLEU: {best.path.name} ({best.valid.get('bleu', float('nan')):.2f})."]
    if skipped:
        lines += ["", "Left out: " + "; ".join(f"{p} ({why})" for p, why in skipped)]
    return "\n".join(lines) + "\n"


def row(run: Run, cfg: dict[str, object], keys: list[str], steps: list[int]) -> list[str]:
    curve = dict(run.curve)
    cells = [Path(run.path).name, *(str(cfg.get(k, DASH)) for k in keys)]
    cells += [f"{curve[s]:.2f}" if s in curve else DASH for s in steps]
    cells += [f"{run.valid[m]:.2f}" if m in run.valid else DASH for m in ("bleu", "chrf", "lowercased_bleu")]
    averaged = run.path / "averaged_valid.json"  # scripts/score_averaged.sh: relmt-score of averaged.pt on valid
    cells.append(f"{json.loads(averaged.read_text())['sacrebleu']['score']:.2f}" if averaged.is_file() else DASH)
    cells.append(f"{run.wall_seconds / 60:.0f}" if run.wall_seconds else DASH)
    return cells
