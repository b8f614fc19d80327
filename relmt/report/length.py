"""The length-generalisation report: BLEU by source length for abs, rel and both, with the buckets
longer than any training sentence marked (the argument of Shaw et al. 2018 §3.2 for clipping).

The runs are trained on a length-filtered corpus (train pairs with at most N source words) or on a
corpus with long test sentences; metrics.json's by_source_length holds their buckets. N comes from
the run's config (data.train_max_src_words, or the toy corpus's max_words) or from
--train-max-words (N for every run that does not record it, or DATA=N for one data set).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from relmt.report.aggregate import Stat
from relmt.report.build import Report, group_runs, load, refs_for
from relmt.report.claims import Claim, judged
from relmt.report.markdown import md_claim, md_signatures
from relmt.report.runs import ReportError
from relmt.report.significance import Comparison, compare_unseen
from relmt.report.tables import Group, analyse_tables, length_table, positions_runs
from relmt.report.text import DASH, PAIR_HEADER, fmt, md_intro, md_table, no_refs, pair_cells, plural
from relmt.report.verdicts import RULES, Rule


@dataclass
class LengthGroup:
    group: Group
    max_words: int | None
    source: str  # where max_words came from
    table: dict | None
    significance: list[Comparison] = field(default_factory=list)
    claim: Claim | None = None


def parse_cutoffs(values: list[str]) -> dict[str | None, int]:
    """--train-max-words values: "N" (key None: every data set) or "DATA=N"."""
    out: dict[str | None, int] = {}
    for value in values:
        data, _, n = value.rpartition("=")
        if not n.isdigit() or int(n) < 1:
            raise ReportError(f"--train-max-words {value}: give N or DATA=N with N >= 1 words")
        out[data or None] = int(n)
    return out


def cutoff(group: Group, cutoffs: dict[str | None, int]) -> tuple[int | None, str]:
    """The group's training cutoff and where it came from; the run's config wins over the argument."""
    recorded = group.runs[0].train_max_words  # runs are grouped by it
    if recorded:
        return recorded, "the runs' config"
    for data in (group.data, None):
        if data in cutoffs:
            return cutoffs[data], f"--train-max-words {f'{data}=' if data else ''}{cutoffs[data]}"
    return None, "unknown: the config does not record it and no --train-max-words was given"


def rel_abs_cells(item: LengthGroup, seen: str) -> list[tuple[int, float, float]]:
    """(sentences, mean BLEU of rel, of abs) for each bucket whose seen_in_training is `seen`."""
    rows = [r for r in (item.table or {}).get("rows", []) if r.get("seen_in_training") == seen]
    return [(max(r["sentences"]), r["bleu"]["rel"].mean, r["bleu"]["abs"].mean) for r in rows
            if isinstance(r["bleu"].get("rel"), Stat) and isinstance(r["bleu"].get("abs"), Stat)]


def weighted_diff(cells: list[tuple[int, float, float]]) -> float | None:
    """rel − abs averaged over the buckets weighted by their sentences, so a bucket of a handful of very
    long sentences does not count as much as one of hundreds."""
    total = sum(n for n, _, _ in cells)
    return sum(n * (rel - abs_) for n, rel, abs_ in cells) / total if total else None


def unseen_claim(item: LengthGroup) -> Claim | None:
    """rel ≥ abs on the buckets longer than training, confirmed on those sentences pooled by the paired test."""
    cells = rel_abs_cells(item, "no")
    mean_diff = weighted_diff(cells)
    if mean_diff is None:
        return None
    measured = {"mean rel − abs": mean_diff}
    abs_mean = sum(n * abs_ for n, _, abs_ in cells) / sum(n for n, _, _ in cells)
    if abs_mean > 0:  # Rosendahl et al. (2019) state their gains relative to abs: 4.4-11.9% beyond training lengths
        measured["mean rel − abs in % of abs"] = 100 * mean_diff / abs_mean
    seen_diff = weighted_diff(rel_abs_cells(item, "yes"))
    if seen_diff is not None:  # for contrast: is rel's lead larger beyond the training lengths than within?
        measured["rel − abs on lengths seen in training"] = seen_diff
    c = next((c for c in item.significance if (c.baseline, c.system) == ("abs", "rel")), None)
    return judged("rel ≥ abs on sentences longer than any in training",
                  f"BLEU by length, {item.group.data}, {item.group.model} model", None, measured,
                  f"rel − abs above 0 on the sentences longer than training (> {item.max_words} words) pooled; the "
                  f"means are over the {plural(len(cells), 'bucket')} there, weighted by their sentences",
                  [(c, Rule.ahead())],
                  "relative positions clipped at k generalise to lengths not seen in training (§3.2, argued, "
                  "not measured); Rosendahl et al. (2019) measured rel 4.4–11.9% above abs there")


def build_length_report(sources: list[str], title: str, command: str | None, cutoffs: dict[str | None, int],
                        refs: dict[str | None, Path] | None = None, n_samples: int = 1000) -> Report:
    """The length-generalisation report of the runs under `sources`."""
    refs = refs or {}
    runs, skipped = load(sources)
    items = []
    for group in group_runs(runs):
        analyse_tables(group)
        max_words, source = cutoff(group, cutoffs)
        item = LengthGroup(group, max_words, source, length_table(group, max_words=max_words))
        group.refs = refs_for(refs, group.data)
        if group.refs is not None and max_words is not None and item.table is not None:
            item.significance = compare_unseen(positions_runs(group), group.refs, max_words, n_samples)
        item.claim = unseen_claim(item)
        items.append(item)
    return Report(title, command, list(sources), runs, skipped, [i.group for i in items], refs, n_samples,
                  extra={"length": items})


def md_item(item: LengthGroup, report: Report) -> str:
    g, table = item.group, item.table
    head = f"## {g.data}, {g.model} model (trained on sources of at most {item.max_words or DASH} words: {item.source})"
    if table is None:
        return f"{head}\n\nNo run of the positions comparison has BLEU by source length."
    seen = item.max_words is not None
    diff = "rel" in table["columns"] and "abs" in table["columns"]
    header = ["source words", "sentences", *(["seen in training"] if seen else []), *table["columns"],
              *(["rel − abs"] if diff else [])]
    rows = []
    for r in table["rows"]:
        rel, abs_ = r["bleu"].get("rel"), r["bleu"].get("abs")
        cells = [r["bucket"], DASH.join(map(str, r["sentences"]))]
        cells += [{"no": "**no**"}.get(r.get("seen_in_training"), r.get("seen_in_training") or DASH)] if seen else []
        cells += [fmt(r["bleu"][c]) for c in table["columns"]]
        cells += [f"{rel.mean - abs_.mean:+.2f}" if rel and abs_ else DASH] if diff else []
        rows.append(cells)
    text = (f"{head}\n\n{plural(len(g.runs), 'run')}, seeds {', '.join(map(str, table['seeds'])) or DASH}; sacreBLEU "
            f"per source-length bucket over {' + '.join(table['splits']) or 'the test splits'} pooled, mean ± std "
            f"(n seeds){f'; rel and both at k = {g.k_default}' if g.k_default is not None else ''}. "
            "\"seen in training\": **no** for a bucket whose "
            "shortest source is longer than any training source, partly when the cutoff falls inside it.\n\n"
            + md_table(header, rows))
    signatures = md_signatures(g)
    if signatures:
        text += f"\n\n{signatures}"
    if item.significance:
        lines = [[f"{c.system} vs {c.baseline}", *pair_cells(t)] for c in item.significance for t in c.tests]
        missing = [f"{c.system} vs {c.baseline}: {why}" for c in item.significance for why in c.missing]
        sentences = next((c.sentences for c in item.significance if c.sentences), 0)
        text += (f"\n\nPaired bootstrap on the {sentences} test sentences longer than training, seed by seed "
                 f"({report.n_samples} resamples, sacreBLEU; 95% interval of system − baseline, two-sided p; p < 0.05 "
                 "counts as significant):\n\n" + md_table(["comparison", *PAIR_HEADER], lines))
        if missing:
            text += "\n\nNot tested: " + "; ".join(missing) + "."
    elif g.refs is None and seen:
        text += f"\n\nNo paired test: {no_refs(report, g)}."
    return text


def length_markdown(report: Report, name: str) -> str:
    items: list[LengthGroup] = report.extra["length"]
    claims = [md_claim(i.claim) for i in items if i.claim]
    parts = [f"# {report.title}", md_intro(report), *(md_item(i, report) for i in items), "## Claim",
             "\n".join(claims) or "- No claim could be checked: no bucket is known to be longer than training, "
                                  "or abs or rel is missing.", RULES,
             "## Plot", f"![BLEU by source length]({name}_buckets.png)"]
    return "\n\n".join(parts) + "\n"
