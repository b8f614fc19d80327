#!/usr/bin/env python
"""Shaw, Uszkoreit & Vaswani (2018) Tables 1-3 from relmt training runs: markdown, plots and JSON.

Reads run directories written by relmt-train (each holds config.yaml and metrics.json), or
directories that contain them (a Hydra multirun sweep dir, searched recursively), skips runs
whose status is not "completed", aggregates seeds as mean ± sample std (n), and writes into --out:
- NAME.md: analogues of the paper's Tables 1-3 with the paper's numbers beside relmt's, BLEU by
  source length, and a check of the paper's claims against the measured means (also printed);
  under each table, the checkpoint rule and the BLEU metric it used, flagged where they mix or
  differ from the paper's;
- NAME_k.png: BLEU against the clipping distance k (symlog x axis, so that k = 0 shows);
- NAME_length.png: BLEU by source-length bucket for abs, rel and both;
- NAME.json: everything aggregated, machine-readable.
Runs are grouped by data set and model size; a report may hold several groups.

Two metrics (PAPER.md, BLEU conventions): sacreBLEU in the relmt columns, and beside the paper's
numbers the tokenized, compound-split BLEU that the paper's figures follow (metrics.json's
"tokenized_bleu"; a run written before relmt stored it shows "–" there, and the table says so).

    python scripts/paper_tables.py runs/reproduce_toy --out docs/results --name toy --title "Toy corpus"
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter
from collections.abc import Callable, Hashable, Iterable
from dataclasses import asdict, dataclass, field, is_dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from relmt.bench import hardware

PAIRS = {"wmt14_en_de": "EN-DE", "wmt_t2t_en_de": "EN-DE", "wmt14_en_fr": "EN-FR"}
MODEL_LABELS = {128: "toy", 256: "small", 512: "base", 1024: "big"}
POSITIONS = ("abs", "rel", "both", "none")
PAPER_K = 16  # the paper's default clipping distance (base model)
# Shaw et al. 2018 Table 1: newstest2014 BLEU; no row for abs + rel ("both").
PAPER_TABLE1 = {("base", "EN-DE"): {"abs": 26.5, "rel": 26.8}, ("big", "EN-DE"): {"abs": 27.9, "rel": 29.2},
                ("base", "EN-FR"): {"abs": 38.2, "rel": 38.7}, ("big", "EN-FR"): {"abs": 41.2, "rel": 41.5}}
# Table 2: base model, EN-DE newstest2013 BLEU against k.
PAPER_TABLE2 = {0: 12.5, 1: 25.5, 2: 25.8, 4: 25.9, 16: 25.8, 64: 25.9, 256: 25.8}
# Table 3: base model, EN-DE newstest2013 BLEU; keys are (a^K on, a^V on), in the order of the rows.
PAPER_TABLE3 = {(True, True): 25.8, (True, False): 25.8, (False, True): 25.3, (False, False): 12.5}
# The checkpoint the paper reports (PAPER.md, Setup): the base model's last one, no averaging; the big
# model's average of its last 20. Tables 2 and 3 are base-model tables.
PAPER_RULE = {"base": "last", "big": "averaged"}
RULES = ("best", "last", "averaged")
RULE_TEXT = {"best": "best (the checkpoint with the best validation score)",
             "last": "last (the weights after the final update)",
             "averaged": "averaged (the mean of the last train.average_last step checkpoints)",
             "unknown": "unknown (neither metrics.json nor config.yaml says)"}
PAPER_RULE_TEXT = {"last": "the last checkpoint, no averaging",
                   "averaged": "the average of the last 20 checkpoints (saved every 10 minutes)"}
# metrics.json's final_valid is the validation at the end of training (relmt/train/loop.py validates
# when the last update is done), so the valid columns always score the last checkpoint.
VALID_RULE = "last"
TOKENIZED = "tokenized BLEU"
EPS = 1e-9  # float slack for the "≤" criteria, so that e.g. 25.8 - 25.3 counts as 0.5
DASH = "–"
THRESHOLDS_NOTE = ("The thresholds in these criteria are our own choice for judging noisy small-scale runs, "
                   "not the paper's.")


class ReportError(Exception):
    """Bad input: reported as one line on stderr with exit code 2."""


@dataclass(frozen=True)
class Run:
    """What the tables need from one completed run directory."""

    path: Path
    data: str
    d_model: int
    positions: str
    k: int
    keys: bool
    values: bool
    seed: int | None
    beam: int | None
    valid_bleu: float | None  # sacreBLEU
    test_bleu: dict[str, float]  # split -> sacreBLEU, in the order of metrics.json
    buckets: list[dict] = field(default_factory=list)  # by_source_length buckets
    length_splits: list[str] = field(default_factory=list)
    valid_tok: float | None = None  # tokenized, compound-split BLEU; None in an older metrics.json
    test_tok: dict[str, float] = field(default_factory=dict)
    tok_label: str | None = None  # how the tokenized BLEU was computed (Moses language etc.)
    test_rule: str = "unknown"  # which checkpoint the test splits scored: best | last | averaged

    @property
    def full_rel(self) -> bool:
        """a^K and a^V both on: the paper's relative attention."""
        return self.keys and self.values


@dataclass(frozen=True)
class Stat:
    """Mean ± sample standard deviation over n seeds."""

    mean: float
    std: float
    n: int

    def __str__(self) -> str:
        return f"{self.mean:.2f} ± {self.std:.2f} ({self.n})"


@dataclass
class Claim:
    """One of the paper's claims checked against the aggregated means."""

    name: str
    table: str
    criterion: str
    measured: dict[str, float]
    held: bool


@dataclass
class Group:
    """The runs of one data set and model size, with their tables and claims."""

    data: str
    model: str
    runs: list[Run]
    splits: list[str] = field(default_factory=list)
    k_default: int | None = None
    tables: dict[str, dict | None] = field(default_factory=dict)
    claims: list[Claim] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.data}, {self.model} model"

    @property
    def pair(self) -> str | None:
        return PAIRS.get(self.data)

    @property
    def main_split(self) -> str | None:
        return self.splits[0] if self.splits else None


@dataclass
class Report:
    title: str
    command: str | None
    sources: list[str]
    runs: list[Run]
    skipped: list[tuple[Path, str]]
    groups: list[Group]


# ---------------------------------------------------------------- reading runs


def find_run_dirs(paths: Iterable[str]) -> list[Path]:
    """Every directory at or under `paths` holding both metrics.json and config.yaml, sorted, once each."""
    found: dict[Path, Path] = {}
    for arg in paths:
        root = Path(arg)
        if not root.is_dir():
            raise ReportError(f"{arg}: not a directory")
        for metrics in root.rglob("metrics.json"):
            if (metrics.parent / "config.yaml").is_file():
                found.setdefault(metrics.parent.resolve(), metrics.parent)
    return sorted(found.values())


def model_label(d_model: int) -> str:
    return MODEL_LABELS.get(d_model, f"d{d_model}")


def checkpoint_rule(cfg: dict, metrics: dict) -> str:
    """The checkpoint rule of the test splits: the name of metrics.json's test_checkpoint, the file
    that was scored (best.pt, last.pt, averaged.pt; the loop falls back to last.pt when the asked-for
    one is missing), else metrics.json's test_checkpoint_rule, else config.yaml's
    train.test_checkpoint, else "unknown"."""
    named = Path(str(metrics.get("test_checkpoint") or "")).stem
    for rule in (named, metrics.get("test_checkpoint_rule"), (cfg.get("train") or {}).get("test_checkpoint")):
        if rule in RULES:
            return str(rule)
    return "unknown"


def load_run(path: Path) -> Run:
    """Parse one run directory; raises KeyError/TypeError/ValueError on a malformed one."""
    cfg = yaml.safe_load((path / "config.yaml").read_text())
    metrics = json.loads((path / "metrics.json").read_text())
    model, decode = cfg["model"], cfg.get("decode") or {}
    lengths = metrics.get("by_source_length") or {}
    valid, tests = metrics.get("final_valid") or {}, metrics.get("test") or {}
    labels = [r.get("tokenized_label") for r in (valid, *tests.values()) if r.get("tokenized_label")]
    return Run(path=path, data=str(cfg["data"]["name"]), d_model=int(model["d_model"]),
               positions=str(model["positions"]), k=int(model["max_relative_position"]),
               keys=bool(model["relative_keys"]), values=bool(model["relative_values"]),
               seed=cfg.get("seed"), beam=decode.get("beam"), valid_bleu=valid.get("bleu"),
               test_bleu={split: float(r["bleu"]) for split, r in tests.items() if r.get("bleu") is not None},
               buckets=list(lengths.get("buckets") or []), length_splits=list(lengths.get("splits") or []),
               valid_tok=valid.get("tokenized_bleu"),
               test_tok={split: float(r["tokenized_bleu"]) for split, r in tests.items()
                         if r.get("tokenized_bleu") is not None},
               tok_label=labels[0] if labels else None, test_rule=checkpoint_rule(cfg, metrics))


def read_runs(dirs: list[Path]) -> tuple[list[Run], list[tuple[Path, str]]]:
    """Completed runs, and (dir, reason) for each one left out."""
    runs, skipped = [], []
    for path in dirs:
        try:
            status = json.loads((path / "metrics.json").read_text()).get("status")
            if status != "completed":
                skipped.append((path, f'status "{status}"'))
                continue
            runs.append(load_run(path))
        except (OSError, KeyError, TypeError, ValueError, AttributeError, yaml.YAMLError) as exc:
            # One broken directory in a sweep should not hide the others; it is listed as skipped.
            skipped.append((path, f"unreadable ({type(exc).__name__}: {exc})"))
    return runs, skipped


# ---------------------------------------------------------------- aggregation


def aggregate(values: Iterable[float | None]) -> Stat | None:
    """Mean ± std (n) of the values present; sample std (ddof=1) when n > 1, else 0."""
    xs = np.array([v for v in values if v is not None and not math.isnan(v)], dtype=float)
    if xs.size == 0:
        return None
    return Stat(float(xs.mean()), float(xs.std(ddof=1)) if xs.size > 1 else 0.0, int(xs.size))


def tok(split: str) -> str:
    """The stats key of a split's tokenized BLEU."""
    return f"tok:{split}"


def bleu_stats(runs: list[Run], splits: list[str]) -> dict[str, Stat | None]:
    """Validation and test sacreBLEU (keys "valid" and the split names) and tokenized BLEU (keys
    "tok:valid", "tok:SPLIT") over `runs`."""
    stats = {"valid": aggregate(r.valid_bleu for r in runs)}
    stats.update({s: aggregate(r.test_bleu.get(s) for r in runs) for s in splits})
    stats[tok("valid")] = aggregate(r.valid_tok for r in runs)
    stats.update({tok(s): aggregate(r.test_tok.get(s) for r in runs) for s in splits})
    return stats


def ordered_union(lists: Iterable[Iterable[str]]) -> list[str]:
    """Items in order of first appearance."""
    return list(dict.fromkeys(x for xs in lists for x in xs))


def default_k(runs: list[Run]) -> int | None:
    """The most common k among rel runs with a^K and a^V on (both runs if there is no such rel run).

    Ties are common (a k sweep with as many seeds per k as the shared rel run), so they go to
    the k most used by "both" runs, then to the paper's 16, then to the smallest k."""
    rel = Counter(r.k for r in runs if r.positions == "rel" and r.full_rel)
    both = Counter(r.k for r in runs if r.positions == "both" and r.full_rel)
    counts = rel or both
    if not counts:
        return None
    return max(counts, key=lambda k: (counts[k], both[k], k == PAPER_K, -k))


def positions_runs(group: Group) -> list[Run]:
    """Runs in the positions comparison: the flags and k do not change an abs or none model, so only
    rel and both runs must have a^K, a^V on and k = k_default."""
    return [r for r in group.runs
            if r.positions in ("abs", "none") or (r.full_rel and r.k == group.k_default)]


def grouped_rows(runs: list[Run], key: Callable[[Run], Hashable], order: Iterable[Hashable],
                 splits: list[str]) -> list[tuple[Hashable, list[Run], dict[str, Stat | None]]]:
    """(key value, its runs, their BLEU stats) for each key value in `order` that has runs."""
    rows = []
    for value in order:
        members = [r for r in runs if key(r) == value]
        if members:
            rows.append((value, members, bleu_stats(members, splits)))
    return rows


def seeds_of(runs: Iterable[Run]) -> list[int]:
    return sorted({r.seed for r in runs if r.seed is not None})


def table1_paper(group: Group) -> tuple[str, dict[str, float]]:
    """Column label and numbers of the paper's Table 1 for this group."""
    if group.pair is None:  # toy, multi30k: show the reference direction, marked as another data set
        return "paper (base, WMT14 EN-DE newstest2014; a different dataset)", PAPER_TABLE1[("base", "EN-DE")]
    if (group.model, group.pair) in PAPER_TABLE1:
        return f"paper ({group.model}, WMT14 {group.pair} newstest2014)", PAPER_TABLE1[(group.model, group.pair)]
    return f"paper (WMT14 {group.pair} newstest2014; no {group.model} model in the paper)", {}


def ablation_paper_label(group: Group) -> str:
    """Tables 2 and 3 are base EN-DE only; say when this group is something else."""
    other = [what for what, same in (("dataset", group.pair == "EN-DE"), ("model", group.model == "base"))
             if not same]
    suffix = f"; a different {' and '.join(other)}" if other else ""
    return f"paper (base, WMT14 EN-DE newstest2013{suffix})"


def paper_rule(group: Group, table: str) -> str:
    """The checkpoint rule behind the paper's numbers in `table`: Tables 2 and 3 are base-model tables;
    Table 1 follows the group's model size, with the base model's rule for sizes the paper lacks."""
    return PAPER_RULE["base"] if table != "positions" else PAPER_RULE.get(group.model, PAPER_RULE["base"])


def table_notes(group: Group, runs: list[Run], beside: str, table: str) -> dict:
    """What a table measured: the metric beside the paper's column (tokenized BLEU of split `beside`),
    and the checkpoint rule of each kind of column, with flags for mixed rules and for a rule that
    differs from the paper's."""
    scored = [r for r in runs if (r.valid_bleu if beside == "valid" else r.test_bleu.get(beside)) is not None]
    has_tok = [r for r in runs if (r.valid_tok if beside == "valid" else r.test_tok.get(beside)) is not None]
    test_rules = dict(sorted(Counter(r.test_rule for r in runs if r.test_bleu).items()))
    used = set(test_rules) | ({VALID_RULE} if any(r.valid_bleu is not None for r in runs) else set())
    beside_rules = {VALID_RULE} if beside == "valid" else {r.test_rule for r in has_tok or runs}
    paper = paper_rule(group, table)
    # "scored": runs with sacreBLEU on that split; those of them without tokenized BLEU are older runs
    return {"beside_paper": {"split": beside, "metric": TOKENIZED, "scored": len(scored), "with_metric": len(has_tok),
                             "labels": ordered_union([r.tok_label] for r in runs if r.tok_label)},
            "checkpoints": {"valid": VALID_RULE, "test": test_rules, "paper": paper,
                            "beside_paper": sorted(beside_rules), "used": sorted(used), "mixed": len(used) > 1,
                            "matches_paper": beside_rules == {paper}}}


def table_rows(rows: list[tuple[Hashable, list[Run], dict[str, Stat | None]]], name: str | tuple[str, ...],
               paper: Callable[[Any], float | None]) -> list[dict]:
    """JSON-able rows: the key under `name` (a tuple of names for a tuple key), seeds, stats, paper."""
    out = []
    for value, members, stats in rows:
        keyed = dict(zip(name, value)) if isinstance(name, tuple) else {name: value}
        out.append({**keyed, "seeds": seeds_of(members), "runs": len(members), "bleu": stats,
                    "paper": paper(value)})
    return out


def members(rows: list[tuple[Hashable, list[Run], dict[str, Stat | None]]]) -> list[Run]:
    return [r for _, runs, _ in rows for r in runs]


def positions_table(group: Group) -> dict | None:
    """Table 1 analogue: abs, rel, both (and none) at k_default with a^K and a^V on. The paper's
    numbers are newstest2014 (test) BLEU, so the test split's tokenized BLEU sits beside them."""
    label, paper = table1_paper(group)
    rows = grouped_rows(positions_runs(group), lambda r: r.positions, POSITIONS, group.splits)
    if not rows:
        return None
    return {"paper_label": label, "rows": table_rows(rows, "positions", paper.get),
            **table_notes(group, members(rows), group.main_split or "test", "positions")}


def k_table(group: Group) -> dict | None:
    """Table 2 analogue: rel runs with a^K and a^V on, one row per k."""
    runs = [r for r in group.runs if r.positions == "rel" and r.full_rel]
    rows = grouped_rows(runs, lambda r: r.k, sorted({r.k for r in runs}), group.splits)
    # One k is no sweep, only a copy of Table 1's rel row.
    if len(rows) < 2:
        return None
    # The paper's Table 2 is newstest2013 (validation) BLEU: valid tokenized BLEU sits beside it.
    return {"paper_label": ablation_paper_label(group), "rows": table_rows(rows, "k", PAPER_TABLE2.get),
            **table_notes(group, members(rows), "valid", "k")}


def kv_table(group: Group) -> dict | None:
    """Table 3 analogue: rel runs at k_default, one row per (a^K, a^V)."""
    runs = [r for r in group.runs if r.positions == "rel" and r.k == group.k_default]
    rows = grouped_rows(runs, lambda r: (r.keys, r.values), PAPER_TABLE3, group.splits)
    if len(rows) < 2:  # (yes, yes) alone is no ablation
        return None
    return {"paper_label": ablation_paper_label(group),
            "rows": table_rows(rows, ("relative_keys", "relative_values"), PAPER_TABLE3.get),
            **table_notes(group, members(rows), "valid", "kv")}  # Table 3 is newstest2013 BLEU too


def bucket_bleu(run: Run, label: str) -> float | None:
    return next((b.get("bleu") for b in run.buckets if b.get("bucket") == label), None)


def length_table(group: Group) -> dict | None:
    """BLEU by source-length bucket for each position kind of the positions comparison."""
    runs = [r for r in positions_runs(group) if r.buckets]
    if not runs:
        return None
    columns = [p for p in POSITIONS if any(r.positions == p for r in runs)]
    rows = []
    for label in ordered_union([b["bucket"] for b in r.buckets] for r in runs):
        # The same test sets give the same counts; a differing count is shown as a range.
        counts = sorted({b["sentences"] for r in runs for b in r.buckets if b["bucket"] == label})
        stats = {p: aggregate(bucket_bleu(r, label) for r in runs if r.positions == p) for p in columns}
        rows.append({"bucket": label, "sentences": counts, "bleu": stats})
    return {"splits": ordered_union(r.length_splits for r in runs), "columns": columns, "rows": rows,
            "checkpoints": {"test": dict(sorted(Counter(r.test_rule for r in runs).items()))}}


# ---------------------------------------------------------------- claims


def mean_of(table: dict | None, split: str | None, **match: Any) -> float | None:
    """Mean BLEU on `split` of the table row whose fields equal `match`, or None."""
    if table is None or split is None:
        return None
    for row in table["rows"]:
        if all(row.get(k) == v for k, v in match.items()):
            stat = row["bleu"].get(split)
            return stat.mean if stat else None
    return None


def claim_rel_ge_abs(group: Group) -> Claim | None:
    split = group.main_split
    rel, abs_ = (mean_of(group.tables["positions"], split, positions=p) for p in ("rel", "abs"))
    if rel is None or abs_ is None:
        return None
    return Claim("rel ≥ abs", "Table 1", f"mean BLEU(rel) ≥ mean BLEU(abs) on {split}",
                 {"rel": rel, "abs": abs_}, rel >= abs_ - EPS)


def claim_k0_collapses(group: Group) -> Claim | None:
    split, kd = group.main_split, group.k_default
    k0, kdef = (mean_of(group.tables["k"], split, k=k) for k in (0, kd))
    if k0 is None or kdef is None or kd == 0:
        return None
    return Claim("k = 0 collapses", "Table 2", f"BLEU(k=0) < 0.5 × BLEU(k={kd}) on {split}",
                 {"k=0": k0, f"k={kd}": kdef, f"0.5 × k={kd}": 0.5 * kdef}, k0 < 0.5 * kdef)


def claim_k_saturates(group: Group) -> Claim | None:
    split, table = group.main_split, group.tables["k"]
    if table is None:
        return None
    means = {row["k"]: mean_of(table, split, k=row["k"]) for row in table["rows"] if row["k"] >= 2}
    means = {k: m for k, m in means.items() if m is not None}
    if len(means) < 2:
        return None
    spread = max(means.values()) - min(means.values())
    ks = ", ".join(str(k) for k in means)
    return Claim("k ≥ 2 saturates", "Table 2", f"max − min of mean BLEU over k ≥ 2 (k = {ks}) ≤ 1.5 on {split}",
                 {**{f"k={k}": m for k, m in means.items()}, "spread": spread}, spread <= 1.5 + EPS)


def claim_keys_alone(group: Group) -> Claim | None:
    split, table = group.main_split, group.tables["kv"]
    keys_only = mean_of(table, split, relative_keys=True, relative_values=False)
    full = mean_of(table, split, relative_keys=True, relative_values=True)
    if keys_only is None or full is None:
        return None
    diff = abs(keys_only - full)
    return Claim("a^K alone is about as good as both", "Table 3",
                 f"|BLEU(a^K yes, a^V no) − BLEU(a^K yes, a^V yes)| ≤ 1.0 on {split}",
                 {"a^K only": keys_only, "a^K and a^V": full, "|difference|": diff}, diff <= 1.0 + EPS)


def claim_long_sentences(group: Group) -> Claim | None:
    if "test_long" not in group.splits:
        return None
    rel, abs_ = (mean_of(group.tables["positions"], "test_long", positions=p) for p in ("rel", "abs"))
    if rel is None or abs_ is None:
        return None
    return Claim("rel beats abs on longer sentences than seen in training", "Table 1, test_long",
                 "mean BLEU(rel) > mean BLEU(abs) on test_long", {"rel": rel, "abs": abs_}, rel > abs_)


def claim_both_no_gain(group: Group) -> Claim | None:
    split = group.main_split
    both, rel = (mean_of(group.tables["positions"], split, positions=p) for p in ("both", "rel"))
    if both is None or rel is None:
        return None
    return Claim("both gives no further gain over rel", "Table 1",
                 f"BLEU(both) − BLEU(rel) ≤ 0.5 on {split}",
                 {"both": both, "rel": rel, "both − rel": both - rel}, both - rel <= 0.5 + EPS)


CLAIMS = (claim_rel_ge_abs, claim_k0_collapses, claim_k_saturates, claim_keys_alone, claim_long_sentences,
          claim_both_no_gain)


# ---------------------------------------------------------------- building the report


def analyse(data: str, model: str, runs: list[Run]) -> Group:
    """One group's splits, k_default, tables and claims."""
    group = Group(data, model, runs, splits=ordered_union(r.test_bleu for r in runs), k_default=default_k(runs))
    group.tables = {"positions": positions_table(group), "k": k_table(group), "kv": kv_table(group),
                    "length": length_table(group)}
    group.claims = [c for c in (check(group) for check in CLAIMS) if c is not None]
    return group


def group_runs(runs: list[Run]) -> list[Group]:
    """Groups by data set and model size, ordered by data name then model width."""
    keys = sorted({(r.data, r.d_model) for r in runs})
    return [analyse(data, model_label(d), [r for r in runs if (r.data, r.d_model) == (data, d)]) for data, d in keys]


def build_report(sources: list[str], title: str, command: str | None) -> Report:
    dirs = find_run_dirs(sources)
    if not dirs:
        raise ReportError(f"no run directories (with metrics.json and config.yaml) found in {', '.join(sources)}")
    runs, skipped = read_runs(dirs)
    if not runs:
        listed = "; ".join(f"{p} ({why})" for p, why in skipped)
        raise ReportError(f"none of the {len(dirs)} run directories is a completed run: {listed}")
    return Report(title, command, list(sources), runs, skipped, group_runs(runs))


# ---------------------------------------------------------------- markdown


def fmt(stat: Stat | float | None) -> str:
    if stat is None:
        return DASH
    return str(stat) if isinstance(stat, Stat) else f"{stat:.1f}"


def md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def plural(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def yes_no(flag: bool) -> str:
    return "yes" if flag else "no"


def bleu_columns(group: Group) -> list[str]:
    return ["valid"] + group.splits


def bleu_header(group: Group, beside: str) -> list[str]:
    """sacreBLEU per split, then the tokenized BLEU of `beside` (the column next to the paper's)."""
    return [f"{c} sacreBLEU" for c in bleu_columns(group)] + [f"{beside} {TOKENIZED}"]


def bleu_cells(group: Group, row: dict, beside: str) -> list[str]:
    return [fmt(row["bleu"][c]) for c in bleu_columns(group)] + [fmt(row["bleu"].get(tok(beside)))]


def rules_text(counts: dict[str, int]) -> str:
    if len(counts) == 1:
        return RULE_TEXT[next(iter(counts))]
    return ", ".join(f"{rule} in {plural(n, 'run')}" for rule, n in counts.items())


def md_notes(group: Group, table: dict) -> str:
    """The lines under a table: its metrics and its checkpoint rules, with flags."""
    side, ckpt = table["beside_paper"], table["checkpoints"]
    split = side["split"]
    labels = "; ".join(f"`{label}`" for label in side["labels"]) or "Moses + compound splitting, tokenize=none"
    metric = (f"Metric: the relmt BLEU columns are sacreBLEU (detokenized, tokenizer 13a). Beside the paper's "
              f"column is **{split} {TOKENIZED}**, the paper-comparable metric (PAPER.md, BLEU conventions: "
              "the paper does not name its BLEU; this is t2t's EN-DE convention, about 0.7 above sacreBLEU on "
              f"one published model), computed as {labels}.")
    if group.pair == "EN-FR":
        metric += (" PAPER.md states this convention for EN-DE (t2t's get_ende_bleu.sh) and not for EN-FR; relmt "
                   "uses it for EN-FR too, as fairseq's EN-FR figures (compound-split) do.")
    missing = side["scored"] - side["with_metric"]
    if side["scored"] and not side["with_metric"]:
        metric += (f" No run here has {TOKENIZED} (a metrics.json from before relmt stored it), so that column "
                   "shows – and no relmt figure is comparable with the paper's.")
    elif missing:
        metric += (f" {missing} of the {side['scored']} runs scored on {split} have no {TOKENIZED} (an older "
                   "metrics.json); its cells average the runs that have it (n in each cell).")
    valid = RULE_TEXT[ckpt["valid"]].split(" (")[0]
    checkpoints = (f"Checkpoints: the valid columns score the {valid} checkpoint (validation after the final update); "
                   f"the test columns score {rules_text(ckpt['test']) if ckpt['test'] else DASH}. "
                   f"The paper reports {PAPER_RULE_TEXT[ckpt['paper']]}.")
    if ckpt["mixed"]:
        checkpoints += f" **Mixed checkpoint rules**: this table's columns come from {', '.join(ckpt['used'])}."
    if not ckpt["matches_paper"]:
        checkpoints += (f" **Not the paper's rule**: the column beside the paper scores "
                        f"{' and '.join(ckpt['beside_paper'])}, the paper {ckpt['paper']}.")
    return f"{metric}\n\n{checkpoints}"


def md_positions(group: Group, table: dict) -> str:
    beside = table["beside_paper"]["split"]
    header = ["positions", *bleu_header(group, beside), table["paper_label"]]
    rows = [[r["positions"], *bleu_cells(group, r, beside), fmt(r["paper"])] for r in table["rows"]]
    return (f"### Table 1 analogue: position representations (Shaw et al. 2018, Table 1)\n\n"
            f"a^K and a^V on; rel and both at k = {group.k_default}. Each cell: mean ± std (n seeds). "
            f"The paper reports newstest2014 BLEU.\n\n{md_table(header, rows)}\n\n{md_notes(group, table)}")


def md_k(group: Group, table: dict) -> str:
    header = ["k", *bleu_header(group, "valid"), table["paper_label"]]
    rows = [[str(r["k"]), *bleu_cells(group, r, "valid"), fmt(r["paper"])] for r in table["rows"]]
    return ("### Table 2 analogue: clipping distance k (Shaw et al. 2018, Table 2)\n\n"
            "rel positions, a^K and a^V on. The paper reports newstest2013 (development set) BLEU, "
            f"so its column compares with the valid columns.\n\n{md_table(header, rows)}\n\n{md_notes(group, table)}")


def md_kv(group: Group, table: dict) -> str:
    header = ["a^K", "a^V", *bleu_header(group, "valid"), table["paper_label"]]
    rows = [[yes_no(r["relative_keys"]), yes_no(r["relative_values"]), *bleu_cells(group, r, "valid"),
             fmt(r["paper"])] for r in table["rows"]]
    return ("### Table 3 analogue: a^K and a^V (Shaw et al. 2018, Table 3)\n\n"
            f"rel positions, k = {group.k_default}. The paper reports newstest2013 (development set) BLEU, "
            f"so its column compares with the valid columns.\n\n{md_table(header, rows)}\n\n{md_notes(group, table)}")


def md_length(table: dict) -> str:
    header = ["source words", "sentences", *table["columns"]]
    rows = [[r["bucket"], DASH.join(str(n) for n in r["sentences"]), *(fmt(r["bleu"][c]) for c in table["columns"])]
            for r in table["rows"]]
    splits = " + ".join(table["splits"]) or "the test splits"
    rules = table["checkpoints"]["test"]
    mixed = f" **Mixed checkpoint rules**: {', '.join(rules)}." if len(rules) > 1 else ""
    return ("### BLEU by source length (length generalisation, the motivation of clipping in Shaw et al. 2018 §3.2)"
            "\n\n"
            f"sacreBLEU per source-length bucket over {splits} pooled, for the runs of the positions "
            f"comparison; mean ± std (n seeds).\n\n{md_table(header, rows)}\n\n"
            f"Checkpoints: the test splits score {rules_text(rules)}.{mixed}")


def md_group(group: Group) -> str:
    pair = f" ({group.pair})" if group.pair else ""
    beams = sorted({r.beam for r in group.runs if r.beam is not None})
    kd = (f"k_default = {group.k_default} (the most common k among rel runs with a^K and a^V on; "
          "Tables 1 and 3 use it)") if group.k_default is not None else "no rel run with a^K and a^V on"
    parts = [f"## {group.data}{pair}, {group.model} model (d_model {group.runs[0].d_model})",
             f"{len(group.runs)} runs; seeds {', '.join(map(str, seeds_of(group.runs))) or DASH}; "
             f"beam {', '.join(map(str, beams)) or DASH}; {kd}."]
    renderers = {"positions": lambda t: md_positions(group, t), "k": lambda t: md_k(group, t),
                 "kv": lambda t: md_kv(group, t), "length": md_length}
    parts += [render(group.tables[name]) for name, render in renderers.items() if group.tables[name]]
    if not any(group.tables.values()):
        parts.append("No run of this group fits any table.")
    return "\n\n".join(parts)


def md_claim(claim: Claim) -> str:
    measured = ", ".join(f"{k} {v:.2f}" for k, v in claim.measured.items())
    verdict = "held" if claim.held else "did not hold"
    return f"- **{claim.name}** ({claim.table}): {verdict}. Criterion: {claim.criterion}. Measured: {measured}."


def md_claims(groups: list[Group]) -> str:
    parts = ["## Claims", f"Each claim is checked on the aggregated means above. {THRESHOLDS_NOTE}"]
    for group in groups:
        lines = [md_claim(c) for c in group.claims] or ["- No claim could be checked: the runs it needs are missing."]
        parts.append(f"### {group.name}\n\n" + "\n".join(lines))
    return "\n\n".join(parts)


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
    hw = hardware()
    text += (f"\n\nThis report: {hw['date']}, on {hw['cpu']} ({hw['cpu_count']} cores), torch {hw['torch']}, "
             f"git {hw['git']}.")
    return text


def markdown(report: Report, name: str) -> str:
    parts = [f"# {report.title}", md_intro(report), *(md_group(g) for g in report.groups), md_claims(report.groups),
             "## Plots", f"![BLEU against the clipping distance k]({name}_k.png)",
             f"![BLEU by source length]({name}_length.png)"]
    return "\n\n".join(parts) + "\n"


# ---------------------------------------------------------------- plots


def new_figure(width: float, height: float) -> Figure:
    """A figure on the Agg canvas (no pyplot, so no global state and no display needed)."""
    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig


def mean_std(stats: list[Stat | None]) -> tuple[list[float], list[float]]:
    """Means and stds for plotting, NaN for a missing cell (a gap in the line)."""
    return [s.mean if s else math.nan for s in stats], [s.std if s else math.nan for s in stats]


def no_data(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])


def plot_k(groups: list[Group], path: Path) -> None:
    """BLEU against k per group, with the paper's Table 2 for reference: the table's column beside the
    paper (valid tokenized BLEU), or, for runs without it, main-split sacreBLEU, labelled as such."""
    fig = new_figure(6.5, 4.2)
    ax = fig.add_subplot()
    ks: set[int] = set()
    for group in groups:
        table = group.tables["k"]
        if table is None:
            continue
        key, label = tok("valid"), f"valid {TOKENIZED}"
        if not any(r["bleu"].get(key) for r in table["rows"]):
            if group.main_split is None:
                continue
            key, label = group.main_split, f"{group.main_split} sacreBLEU"
        xs = [r["k"] for r in table["rows"]]
        means, stds = mean_std([r["bleu"].get(key) for r in table["rows"]])
        ax.errorbar(xs, means, yerr=stds, marker="o", capsize=3, label=f"{group.name}: {label}")
        ks.update(xs)
    if not ks:
        no_data(ax, "no k sweep in these runs")
    else:
        ax.plot(list(PAPER_TABLE2), list(PAPER_TABLE2.values()), "k--", marker="x", alpha=0.6,
                label=f"paper: base, WMT14 EN-DE newstest2013, {TOKENIZED}")
        ks.update(PAPER_TABLE2)
        ax.set_xscale("symlog", linthresh=1)  # symlog, not log: k = 0 is the paper's collapse point
        ax.set_xticks(sorted(ks))
        ax.set_xticklabels([str(k) for k in sorted(ks)])
        ax.minorticks_off()
        ax.set_xlabel("clipping distance k")
        ax.set_ylabel("BLEU")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    ax.set_title("BLEU against k (Shaw et al. 2018, Table 2)")
    fig.savefig(path, dpi=120, bbox_inches="tight")


def plot_length(groups: list[Group], path: Path) -> None:
    """BLEU by source-length bucket, one panel per group, a line per position kind."""
    shown = [g for g in groups if g.tables["length"]]
    fig = new_figure(5.5 * max(len(shown), 1), 4.2)
    if not shown:
        no_data(fig.add_subplot(), "no BLEU by source length in these runs")
    for i, group in enumerate(shown, start=1):
        ax, table = fig.add_subplot(1, len(shown), i), group.tables["length"]
        xs = list(range(len(table["rows"])))
        for column in table["columns"]:
            means, stds = mean_std([r["bleu"][column] for r in table["rows"]])
            ax.errorbar(xs, means, yerr=stds, marker="o", capsize=3, label=column)
        ax.set_xticks(xs)
        ax.set_xticklabels([f"{r['bucket']}\n({'–'.join(map(str, r['sentences']))})" for r in table["rows"]])
        ax.set_xlabel("source length in words (sentences)")
        ax.set_ylabel("BLEU")
        ax.set_title(f"{group.name} ({' + '.join(table['splits'])})", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.savefig(path, dpi=120, bbox_inches="tight")


# ---------------------------------------------------------------- JSON and main


def jsonable(obj: Any) -> Any:
    """Stats, claims and paths as plain JSON values; tuple keys never occur."""
    if is_dataclass(obj):
        return jsonable(asdict(obj))
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    return str(obj) if isinstance(obj, Path) else obj


def report_json(report: Report) -> dict:
    groups = [{"data": g.data, "model": g.model, "pair": g.pair, "d_model": g.runs[0].d_model,
               "k_default": g.k_default, "splits": g.splits, "main_split": g.main_split,
               "seeds": seeds_of(g.runs), "runs": [str(r.path) for r in g.runs], "tables": g.tables,
               "claims": g.claims} for g in report.groups]
    runs = [{**asdict(r), "model": model_label(r.d_model)} for r in report.runs]
    return jsonable({"title": report.title, "command": report.command, "sources": report.sources,
                     "seeds": seeds_of(report.runs), "runs": runs,
                     "skipped": [{"dir": p, "reason": why} for p, why in report.skipped],
                     "thresholds_note": THRESHOLDS_NOTE, "groups": groups})


def write_outputs(report: Report, out: Path, name: str) -> str:
    """Write NAME.md, NAME_k.png, NAME_length.png and NAME.json; return the markdown."""
    out.mkdir(parents=True, exist_ok=True)
    text = markdown(report, name)
    (out / f"{name}.md").write_text(text)
    plot_k(report.groups, out / f"{name}_k.png")
    plot_length(report.groups, out / f"{name}_length.png")
    (out / f"{name}.json").write_text(json.dumps(report_json(report), indent=2, ensure_ascii=False) + "\n")
    return text


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR",
                        help="run directories, or directories containing them (searched recursively)")
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument("--name", required=True, help="base name of the output files")
    parser.add_argument("--title", default="Results", help="markdown title (default: Results)")
    parser.add_argument("--command", default=None, help="the command that produced the runs, quoted in the report")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        report = build_report(args.run_dirs, args.title, args.command)
    except ReportError as exc:
        print(f"paper_tables.py: error: {exc}", file=sys.stderr)
        return 2
    print(write_outputs(report, args.out, args.name), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
