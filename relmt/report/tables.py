"""Analogues of the paper's Tables 1-3 and BLEU by source length, as JSON-able dicts per group.

A group is the runs of one data set and model preset. Its tables hold Stats per metric and split
(keys from relmt.report.aggregate.key), the paper's numbers where they apply, and notes on the
metric beside the paper's column and on the checkpoint rules behind every column.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from relmt.report import paper
from relmt.report.aggregate import Rows, aggregate, default_k, grouped_rows, ordered_union, seeds_of
from relmt.report.paper import PaperNumbers
from relmt.report.runs import Run

TOKENIZED = "tokenized BLEU"
LENGTH_SPLIT = "test_long"  # the toy corpus's split of sentences longer than any in training


@dataclass
class Group:
    """The runs of one data set and model preset, with their tables, tests, curves and claims."""

    data: str
    model: str
    runs: list[Run]
    splits: list[str] = field(default_factory=list)
    k_default: int | None = None
    tables: dict[str, dict | None] = field(default_factory=dict)
    refs: Path | None = None  # the folder of the reference files for the paired tests
    significance: list = field(default_factory=list)  # relmt.report.significance.Comparison
    curves: dict | None = None
    claims: list = field(default_factory=list)  # relmt.report.claims.Claim
    variants: list[Run] = field(default_factory=list)  # runs outside Tables 1-3 (relmt.report.controls)
    controls: dict | None = None
    stages: dict | None = None

    @property
    def train_max_words(self) -> int | None:
        """The training cutoff the runs' config records (runs are grouped by it)."""
        return self.runs[0].train_max_words if self.runs else None

    @property
    def name(self) -> str:
        cutoff = f", trained on sources of ≤ {self.train_max_words} words" if self.train_max_words else ""
        return f"{self.data}, {self.model} model{cutoff}"

    @property
    def pair(self) -> str | None:
        return paper.PAIRS.get(self.data)

    @property
    def numbers(self) -> PaperNumbers:
        return paper.paper_numbers(self.data)

    @property
    def main_split(self) -> str | None:
        return self.splits[0] if self.splits else None

    @property
    def claim_splits(self) -> list[str]:
        """The test sets the claims are checked on: all but the toy corpus's long-sentence split,
        which has a claim of its own."""
        return [s for s in self.splits if s != LENGTH_SPLIT]

    @property
    def model_guessed(self) -> bool:
        return any(r.model_guessed for r in self.runs)


def positions_runs(group: Group) -> list[Run]:
    """Runs in the positions comparison: the flags and k do not change an abs or none model, so only
    rel and both runs must have a^K, a^V on and k = k_default."""
    return [r for r in group.runs
            if r.positions in ("abs", "none") or (r.full_rel and r.k == group.k_default)]


def table1_paper(group: Group) -> tuple[str, dict[str, float]]:
    """Column label and numbers of the paper's Table 1 for this group."""
    if group.pair is None:  # the toy corpus: the reference direction, marked as another data set
        return "paper (base, WMT14 EN-DE newstest2014; a different dataset)", paper.TABLE1[("base", "EN-DE")]
    if (group.model, group.pair) in paper.TABLE1:
        return f"paper ({group.model}, WMT14 {group.pair} newstest2014)", paper.TABLE1[(group.model, group.pair)]
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
    return paper.RULE["base"] if table != "positions" else paper.RULE.get(group.model, paper.RULE["base"])


def table_notes(group: Group, runs: list[Run], beside: str, table: str) -> dict:
    """What a table measured: the metric beside the paper's column (tokenized BLEU of split `beside`),
    and the checkpoint rule of each kind of column, with flags for mixed rules and for a rule that
    differs from the paper's."""
    scored = [r for r in runs if r.score(beside) is not None]
    has_tok = [r for r in runs if r.score(beside, "tokenized_bleu") is not None]
    test_rules = dict(sorted(Counter(r.test_rule for r in runs if r.test).items()))
    used = set(test_rules) | ({paper.VALID_RULE} if any(r.score("valid") is not None for r in runs) else set())
    beside_rules = {paper.VALID_RULE} if beside == "valid" else {r.test_rule for r in has_tok or runs}
    rule = paper_rule(group, table)
    # "scored": runs with sacreBLEU on that split; those of them without tokenized BLEU are older runs
    return {"beside_paper": {"split": beside, "metric": TOKENIZED, "scored": len(scored), "with_metric": len(has_tok),
                             "labels": ordered_union([r.tok_label] for r in runs if r.tok_label)},
            "lowercased_labels": ordered_union([r.lc_label] for r in runs if r.lc_label),
            "checkpoints": {"valid": paper.VALID_RULE, "test": test_rules, "paper": rule,
                            "beside_paper": sorted(beside_rules), "used": sorted(used), "mixed": len(used) > 1,
                            "matches_paper": beside_rules == {rule}}}


def table_rows(rows: Rows, name: str | tuple[str, ...], numbers: Callable[[Any], float | None]) -> list[dict]:
    """JSON-able rows: the key under `name` (a tuple of names for a tuple key), seeds, stats, paper."""
    out = []
    for value, members, stats in rows:
        keyed = dict(zip(name, value)) if isinstance(name, tuple) else {name: value}
        out.append({**keyed, "seeds": seeds_of(members), "runs": len(members), "bleu": stats,
                    "paper": numbers(value)})
    return out


def members(rows: Rows) -> list[Run]:
    return [r for _, runs, _ in rows for r in runs]


def no_numbers(_: Any) -> None:
    return None


def positions_table(group: Group) -> dict | None:
    """Table 1 analogue: abs, rel, both (and none) at k_default with a^K and a^V on. The paper's
    numbers are newstest2014 (test) BLEU, so the test split's tokenized BLEU sits beside them."""
    label, numbers = table1_paper(group)
    rows = grouped_rows(positions_runs(group), lambda r: r.positions, paper.POSITIONS, group.splits)
    if not rows:
        return None
    if group.numbers == PaperNumbers.differences:
        label, numbers = None, {}
    return {"paper_label": label, "rows": table_rows(rows, "positions", numbers.get),
            **table_notes(group, members(rows), group.main_split or "test", "positions")}


def k_table(group: Group) -> dict | None:
    """Table 2 analogue: rel runs with a^K and a^V on, one row per k."""
    runs = [r for r in group.runs if r.positions == "rel" and r.full_rel]
    rows = grouped_rows(runs, lambda r: r.k, sorted({r.k for r in runs}), group.splits)
    # One k is no sweep, only a copy of Table 1's rel row.
    if len(rows) < 2:
        return None
    differences = group.numbers == PaperNumbers.differences
    # The paper's Table 2 is newstest2013 (validation) BLEU: valid tokenized BLEU sits beside it.
    return {"paper_label": None if differences else ablation_paper_label(group),
            "rows": table_rows(rows, "k", no_numbers if differences else paper.TABLE2.get),
            **table_notes(group, members(rows), "valid", "k")}


def kv_table(group: Group) -> dict | None:
    """Table 3 analogue: rel runs at k_default, one row per (a^K, a^V).

    Without (no, no) runs, the k = 0 runs of Table 2 fill that row: neither carries position
    information (a single label shifts every score of a row alike, PAPER.md §Method), and the
    paper's two rows agree (12.5)."""
    runs = [r for r in group.runs if r.positions == "rel" and r.k == group.k_default]
    filled = None
    if group.k_default != 0 and not any(not r.keys and not r.values for r in runs):
        k0 = [r for r in group.runs if r.positions == "rel" and r.k == 0 and r.full_rel]
        if k0:
            runs, filled = runs + k0, "k = 0"

    def flags(r: Run) -> tuple[bool, bool]:
        return (False, False) if r.k == 0 and r.k != group.k_default else (r.keys, r.values)

    rows = grouped_rows(runs, flags, paper.TABLE3, group.splits)
    # (yes, yes) alone is no ablation, nor is it with the borrowed k = 0 row alone (that is Table 2 again)
    if len(rows) < (3 if filled else 2):
        return None
    differences = group.numbers == PaperNumbers.differences
    return {"paper_label": None if differences else ablation_paper_label(group),
            "rows": table_rows(rows, ("relative_keys", "relative_values"),
                               no_numbers if differences else paper.TABLE3.get),
            "no_no_from": filled,
            **table_notes(group, members(rows), "valid", "kv")}  # Table 3 is newstest2013 BLEU too


def bucket_bleu(run: Run, label: str) -> float | None:
    return next((b.get("bleu") for b in run.buckets if b.get("bucket") == label), None)


def bucket_range(label: str) -> tuple[int, int | None]:
    """The source lengths of a bucket label from relmt.evaluate.metrics: "11-20" -> (11, 20), "61+" -> (61, None)."""
    if label.endswith("+"):
        return int(label[:-1]), None
    lo, hi = label.split("-")
    return int(lo), int(hi)


def seen_in_training(label: str, max_words: int | None) -> str | None:
    """"yes", "partly" or "no": whether training had sources as long as the bucket's; None if unknown."""
    if max_words is None:
        return None
    lo, hi = bucket_range(label)
    if lo > max_words:
        return "no"
    return "yes" if hi is not None and hi <= max_words else "partly"


def length_table(group: Group, runs: list[Run] | None = None, max_words: int | None = None) -> dict | None:
    """BLEU by source-length bucket for each position kind of the positions comparison; with
    `max_words`, each bucket says whether training saw sources that long."""
    runs = [r for r in (positions_runs(group) if runs is None else runs) if r.buckets]
    if not runs:
        return None
    columns = [p for p in paper.POSITIONS if any(r.positions == p for r in runs)]
    rows = []
    for label in ordered_union([b["bucket"] for b in r.buckets] for r in runs):
        # The same test sets give the same counts; a differing count is shown as a range.
        counts = sorted({b["sentences"] for r in runs for b in r.buckets if b["bucket"] == label})
        stats = {p: aggregate(bucket_bleu(r, label) for r in runs if r.positions == p) for p in columns}
        row = {"bucket": label, "sentences": counts, "bleu": stats}
        if max_words is not None:
            row["seen_in_training"] = seen_in_training(label, max_words)
        rows.append(row)
    return {"splits": ordered_union(r.length_splits for r in runs), "columns": columns, "rows": rows,
            "seeds": seeds_of(runs), "checkpoints": {"test": dict(sorted(Counter(r.test_rule for r in runs).items()))}}


def k_sweep(groups: list[Group]) -> bool:
    """Whether any group's runs hold two or more k: a BLEU-against-k plot needs a sweep (Table 2)."""
    return any(g.tables.get("k") and len({r["k"] for r in g.tables["k"]["rows"]}) > 1 for g in groups)


def analyse_tables(group: Group) -> None:
    """Fill the group's splits, k_default and tables."""
    group.splits = ordered_union(r.test for r in group.runs)
    group.k_default = default_k(group.runs)
    group.tables = {"positions": positions_table(group), "k": k_table(group), "kv": kv_table(group),
                    "length": length_table(group)}
