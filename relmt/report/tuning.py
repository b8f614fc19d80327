"""The tuning report: one row per run, on the validation split only (test sets play no part in tuning): the settings
in which the runs' config.yaml differ, valid sacreBLEU at every validation and at the end, chrF, lowercased tokenized
BLEU, and the averaged last checkpoints' sacreBLEU where scripts/score_averaged.sh scored them."""

import json

import yaml

from relmt.host import host
from relmt.report.runs import ReportError, Run, find_run_dirs, read_runs
from relmt.report.text import DASH, md_table

# Settings that differ between runs without being a choice being tuned.
IGNORED = ("out_dir", "data.dir", "data.cache_dir", "train.resume", "train.progress", "train.num_threads")


def flatten(cfg: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in cfg.items():
        out.update(flatten(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
    return out


def tuning_markdown(sources: list[str], title: str, command: str | None) -> str:
    runs, skipped = read_runs(find_run_dirs(sources))
    if not runs:
        raise ReportError(f"{' '.join(sources)}: no completed runs")
    configs = [flatten(yaml.safe_load((r.path / "config.yaml").read_text())) for r in runs]
    keys = [k for k in sorted({k for c in configs for k in c})
            if k not in IGNORED and len({repr(c.get(k)) for c in configs}) > 1]
    steps = sorted({s for r in runs for s, _ in r.curve})
    header = ["run", *keys, *(f"valid BLEU @{s}" for s in steps), "final sacreBLEU", "chrF",
              "lowercased tok. BLEU", "averaged checkpoints: sacreBLEU", "minutes"]
    best = max(runs, key=lambda r: r.valid.get("bleu", float("-inf")))
    h = host()
    parts = [f"# {title}", f"Made by `relmt-report {' '.join(sources)} --kind tuning` on {h['date']} ({h['cpu']}, "
             f"{h['cpu_count']} cores, torch {h['torch']}, relmt {h['git']}).",
             *([f"Runs: `{command}`."] if command else []),
             "Validation split only: the tuning runs decode no test set. BLEU is sacreBLEU (cased, 13a) unless named "
             "otherwise; 'minutes' is the run's wall time.",
             md_table(header, [row(r, c, keys, steps) for r, c in zip(runs, configs)]),
             f"Highest final valid sacreBLEU: {best.path.name} ({best.valid.get('bleu', float('nan')):.2f}).",
             *(["Left out: " + "; ".join(f"{p} ({why})" for p, why in skipped)] if skipped else [])]
    return "\n\n".join(parts) + "\n"


def row(run: Run, cfg: dict[str, object], keys: list[str], steps: list[int]) -> list[str]:
    curve, averaged = dict(run.curve), run.path / "averaged_valid.json"  # scripts/score_averaged.sh writes it
    return [run.path.name, *(str(cfg.get(k, DASH)) for k in keys),
            *(f"{curve[s]:.2f}" if s in curve else DASH for s in steps),
            *(f"{run.valid[m]:.2f}" if m in run.valid else DASH for m in ("bleu", "chrf", "lowercased_bleu")),
            f"{json.loads(averaged.read_text())['sacrebleu']['score']:.2f}" if averaged.is_file() else DASH,
            f"{run.wall_seconds / 60:.0f}" if run.wall_seconds else DASH]
