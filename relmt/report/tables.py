"""Analogues of the paper's Tables 1-3, BLEU by source length and learning curves, as JSON-able dicts per group:
Stats per metric and split (aggregate.key), the paper's numbers where they apply, and the checkpoint rules."""

from collections import Counter
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from relmt.report import paper
from relmt.report.aggregate import Stat, aggregate, bleu_stats, ordered_union, seeds_of
from relmt.report.paper import PaperNumbers
from relmt.report.runs import Run

TOKENIZED = "tokenized BLEU"
LENGTH_SPLIT = "test_long"  # the toy corpus's split of sentences longer than any in training
PAPER_K = 16  # the paper's default clipping distance (base model)
Rows = list[tuple[Hashable, list[Run], dict[str, Stat | None]]]


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
    n_samples: int = 1000  # their bootstrap resamples
    significance: list = field(default_factory=list)  # relmt.report.significance.Comparison
    curves: dict | None = None
    claims: list = field(default_factory=list)  # relmt.report.claims.Claim
    variants: list[Run] = field(default_factory=list)  # runs outside Tables 1-3 (relmt.report.controls)
    controls: dict | None = None
    stages: dict | None = None

    pair: str | None = field(init=False)  # the paper's translation direction for its own data sets
    numbers: PaperNumbers = field(init=False)
    train_max_words: int | None = field(init=False)  # the runs' training cutoff (runs are grouped by it)
    name: str = field(init=False)

    def __post_init__(self) -> None:
        self.pair, self.numbers = paper.PAIRS.get(self.data), paper.paper_numbers(self.data)
        self.train_max_words = self.runs[0].train_max_words if self.runs else None
        cutoff = f", trained on sources of ≤ {self.train_max_words} words" if self.train_max_words else ""
        self.name = f"{self.data}, {self.model} model{cutoff}"

    @property
    def main_split(self) -> str | None:
        return self.splits[0] if self.splits else None


def default_k(runs: list[Run]) -> int | None:
    """The most common k among rel runs with a^K and a^V on (of both runs if there is none); ties (a k sweep with as
    many seeds per k as the shared rel run) go to the k most used by both, then to the paper's 16, then the smallest."""
    rel, both = (Counter(r.k for r in runs if r.positions == p and r.full_rel) for p in ("rel", "both"))
    counts = rel or both
    return max(counts, key=lambda k: (counts[k], both[k], k == PAPER_K, -k)) if counts else None


def positions_runs(group: Group) -> list[Run]:
    """The positions comparison: k and the flags change no abs or none model; rel and both at k_default."""
    return [r for r in group.runs if r.positions in paper.TABLELESS or (r.full_rel and r.k == group.k_default)]


def grouped_rows(runs: list[Run], by: Callable[[Run], Hashable], order: Iterable[Hashable], splits: list[str]) -> Rows:
    """(key value, its runs, their stats) for each key value in `order` that has runs."""
    rows = [(value, [r for r in runs if by(r) == value]) for value in order]
    return [(value, members, bleu_stats(members, splits)) for value, members in rows if members]


def make_table(group: Group, rows: Rows, name: str | tuple[str, ...], numbers: dict, label: str | None,
               beside: str, kind: str, **extra: str | None) -> dict:
    """JSON-able rows (the key under `name`, seeds, stats, the paper's number; no paper column for a data set the
    paper has no numbers for), the metric beside the paper's column (tokenized BLEU of split `beside`) and each
    column's checkpoint rule, flagging mixed rules and one not the paper's (Table 1's follows the model size)."""
    if group.numbers == PaperNumbers.differences:
        label, numbers = None, {}
    out = [{**(dict(zip(name, value)) if isinstance(name, tuple) else {name: value}), "seeds": seeds_of(members),
            "runs": len(members), "bleu": stats, "paper": numbers.get(value)} for value, members, stats in rows]
    runs = [r for _, members, _ in rows for r in members]
    has_tok = [r for r in runs if r.score(beside, "tokenized_bleu") is not None]
    test_rules = dict(sorted(Counter(r.test_rule for r in runs if r.test).items()))
    used = set(test_rules) | ({paper.VALID_RULE} if any(r.score("valid") is not None for r in runs) else set())
    beside_rules = {paper.VALID_RULE} if beside == "valid" else {r.test_rule for r in has_tok or runs}
    rule = paper.RULE.get(group.model if kind == "positions" else "base", paper.RULE["base"])
    side = {"split": beside, "metric": TOKENIZED, "scored": sum(r.score(beside) is not None for r in runs),
            "with_metric": len(has_tok), "labels": ordered_union([r.tok_label] for r in runs if r.tok_label)}
    return {"paper_label": label, "rows": out, **extra, "beside_paper": side,
            "lowercased_labels": ordered_union([r.lc_label] for r in runs if r.lc_label),
            "checkpoints": {"valid": paper.VALID_RULE, "test": test_rules, "paper": rule,
                            "beside_paper": sorted(beside_rules), "used": sorted(used), "mixed": len(used) > 1,
                            "matches_paper": beside_rules == {rule}}}


def positions_table(group: Group) -> dict | None:
    """Table 1: abs, rel, both (and none); the paper's numbers are newstest2014, so the test split's
    tokenized BLEU sits beside them."""
    rows = grouped_rows(positions_runs(group), lambda r: r.positions, paper.POSITIONS, group.splits)
    if group.pair is None:  # the toy corpus: the reference direction, marked as another data set
        label, numbers = "paper (base, WMT14 EN-DE newstest2014; a different dataset)", paper.TABLE1[("base", "EN-DE")]
    elif numbers := paper.TABLE1.get((group.model, group.pair)):
        label = f"paper ({group.model}, WMT14 {group.pair} newstest2014)"
    else:
        label, numbers = f"paper (WMT14 {group.pair} newstest2014; no {group.model} model in the paper)", {}
    beside = group.main_split or "test"
    return make_table(group, rows, "positions", numbers, label, beside, "positions") if rows else None


def ablation_label(group: Group) -> str:
    """Tables 2 and 3 are base EN-DE newstest2013 (validation) BLEU: valid tokenized BLEU sits beside them."""
    other = [what for what, same in (("dataset", group.pair == "EN-DE"), ("model", group.model == "base")) if not same]
    suffix = f"; a different {' and '.join(other)}" if other else ""
    return f"paper (base, WMT14 EN-DE newstest2013{suffix})"


def k_table(group: Group) -> dict | None:
    """Table 2: rel runs with a^K and a^V on, one row per k (one k is no sweep)."""
    runs = [r for r in group.runs if r.positions == "rel" and r.full_rel]
    rows = grouped_rows(runs, lambda r: r.k, sorted({r.k for r in runs}), group.splits)
    return make_table(group, rows, "k", paper.TABLE2, ablation_label(group), "valid", "k") if len(rows) > 1 else None


def kv_table(group: Group) -> dict | None:
    """Table 3: rel runs at k_default, one row per (a^K, a^V). Without (no, no) runs, Table 2's k = 0 runs
    fill that row: neither carries position information, and the paper's two rows agree (12.5)."""
    runs = [r for r in group.runs if r.positions == "rel" and r.k == group.k_default]
    filled = None
    if group.k_default != 0 and not any(not r.keys and not r.values for r in runs):
        if k0 := [r for r in group.runs if r.positions == "rel" and r.k == 0 and r.full_rel]:
            runs, filled = runs + k0, "k = 0"
    rows = grouped_rows(runs, lambda r: (False, False) if r.k == 0 != group.k_default else (r.keys, r.values),
                        paper.TABLE3, group.splits)
    if len(rows) < (3 if filled else 2):  # (yes, yes) alone is no ablation, nor is it with the k = 0 row alone
        return None
    return make_table(group, rows, ("relative_keys", "relative_values"), paper.TABLE3, ablation_label(group),
                      "valid", "kv", no_no_from=filled)


def seen_in_training(label: str, max_words: int | None) -> str | None:
    """"yes", "partly" or "no": whether training had sources as long as the bucket's ("11-20", "61+")."""
    if max_words is None:
        return None
    lo, _, hi = label.rstrip("+").partition("-")
    if int(lo) > max_words:
        return "no"
    return "yes" if hi and int(hi) <= max_words else "partly"


def length_table(group: Group, max_words: int | None = None) -> dict | None:
    """BLEU by source-length bucket per position kind of the positions comparison; with `max_words`, each
    bucket says whether training saw sources that long. A differing sentence count shows as a range."""
    runs = [r for r in positions_runs(group) if r.buckets]
    columns = [p for p in paper.POSITIONS if any(r.positions == p for r in runs)]
    rows = []
    for label in ordered_union([b["bucket"] for b in r.buckets] for r in runs):
        cells = [(r, b) for r in runs for b in r.buckets if b["bucket"] == label]
        row = {"bucket": label, "sentences": sorted({b["sentences"] for _, b in cells}),
               "bleu": {p: aggregate(b.get("bleu") for r, b in cells if r.positions == p) for p in columns}}
        rows.append({**row, "seen_in_training": seen_in_training(label, max_words)} if max_words is not None else row)
    return {"splits": ordered_union(r.length_splits for r in runs), "columns": columns, "rows": rows,
            "seeds": seeds_of(runs),
            "checkpoints": {"test": dict(sorted(Counter(r.test_rule for r in runs).items()))}} if runs else None


def k_sweep(groups: list[Group]) -> bool:
    """Whether any group holds two or more k: a BLEU-against-k plot needs a sweep."""
    return any(g.tables.get("k") and len({r["k"] for r in g.tables["k"]["rows"]}) > 1 for g in groups)


def analyse_tables(group: Group) -> None:
    group.splits = ordered_union(r.test for r in group.runs)
    group.k_default = default_k(group.runs)
    group.tables = {"positions": positions_table(group), "k": k_table(group), "kv": kv_table(group),
                    "length": length_table(group)}


def learning_curves(runs: list[Run]) -> dict | None:
    """Validation sacreBLEU against updates, mean ± std over seeds per position kind:
    {"columns", "rows": [{"step", "bleu": {kind: Stat | None}}], "seeds"} at every update any run validated at."""
    runs = [r for r in runs if r.curve]
    columns = [p for p in paper.POSITIONS if any(r.positions == p for r in runs)]
    points = [dict(r.curve) for r in runs]
    rows = [{"step": step, "bleu": {p: aggregate(c.get(step) for r, c in zip(runs, points) if r.positions == p)
                                    for p in columns}} for step in sorted({s for c in points for s in c})]
    seeds = {p: seeds_of(r for r in runs if r.positions == p) for p in columns}
    return {"columns": columns, "rows": rows, "seeds": seeds} if runs else None


def sampled(rows: list[dict], n: int = 8) -> list[dict]:
    """At most `n` rows spread evenly over the curve, always the first and the last (the plot shows them all)."""
    if len(rows) <= n:
        return rows
    return [rows[i] for i in sorted({round(i * (len(rows) - 1) / (n - 1)) for i in range(n)})]

