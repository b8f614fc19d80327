"""The length-generalisation report: BLEU by source length for abs, rel and both (and rope, alibi and t5 where
they ran), the buckets longer than any training sentence marked (the argument of Shaw et al. 2018 §3.2 for
clipping), and a verdict on those sentences for rel against abs and for each later method against abs and rel.
The cutoff N comes from the runs' config (data.train_max_src_words, the toy corpus's max_words) or
--train-max-words N | DATA=N."""

from dataclasses import dataclass, field
from pathlib import Path

from relmt.report.aggregate import DASH, PAIR_HEADER, fmt, md_table, pair_cells, plural
from relmt.report.build import Report, group_runs, load
from relmt.report.claims import Claim, judged
from relmt.report.markdown import md_claim, md_intro, md_signatures, no_refs
from relmt.report.paper import BEYOND
from relmt.report.runs import ReportError
from relmt.report.significance import Comparison, compare_unseen
from relmt.report.tables import Group, analyse_tables, length_table, positions_runs
from relmt.report.verdicts import AHEAD, RULES


@dataclass
class LengthGroup:
    group: Group
    max_words: int | None
    source: str  # where max_words came from
    table: dict | None
    significance: list[Comparison] = field(default_factory=list)
    claims: list[Claim] = field(default_factory=list)  # rel ≥ abs, then each later method against abs and rel


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


def weighted_diff(item: LengthGroup, seen: str, system: str = "rel", baseline: str = "abs"
                  ) -> tuple[float, float, int] | None:
    """(system − baseline, baseline) averaged over the buckets whose seen_in_training is `seen`, weighted by their
    sentences (a bucket of a few very long sentences counts less than one of hundreds), and the number of buckets."""
    rows = [r for r in (item.table or {}).get("rows", []) if r.get("seen_in_training") == seen
            and r["bleu"].get(system) is not None and r["bleu"].get(baseline) is not None]
    cells = [(max(r["sentences"]), r["bleu"][system].mean, r["bleu"][baseline].mean) for r in rows]
    if not (total := sum(n for n, _, _ in cells)):
        return None
    return sum(n * (x - b) for n, x, b in cells) / total, sum(n * b for n, _, b in cells) / total, len(cells)


def unseen_claim(item: LengthGroup, system: str = "rel", baseline: str = "abs") -> Claim | None:
    """system ≥ baseline on the buckets longer than training, confirmed on those sentences pooled by the paired
    test: Shaw's rel against abs (§3.2), and each later method (issue 31) against abs and against rel."""
    if (unseen := weighted_diff(item, "no", system, baseline)) is None:
        return None
    mean_diff, base_mean, buckets = unseen
    diff = f"{system} − {baseline}"
    measured = {f"mean {diff}": mean_diff}
    if base_mean > 0:  # Rosendahl et al. (2019) state their gains relative to abs: 4.4-11.9% beyond training lengths
        measured[f"mean {diff} in % of {baseline}"] = 100 * mean_diff / base_mean
    if seen := weighted_diff(item, "yes", system, baseline):  # for contrast: is the lead larger beyond them?
        measured[f"{diff} on lengths seen in training"] = seen[0]
    c = next((c for c in item.significance if (c.baseline, c.system) == (baseline, system)), None)
    note = ("relative positions clipped at k generalise to lengths not seen in training (§3.2, argued, not measured); "
            "Rosendahl et al. (2019) measured rel 4.4–11.9% above abs there") if system == "rel" else None
    return judged(f"{system} ≥ {baseline} on sentences longer than any in training",
                  f"BLEU by length, {item.group.data}, {item.group.model} model", None, measured,
                  f"{diff} above 0 on the sentences longer than training (> {item.max_words} words) pooled"
                  f"{'' if system == 'rel' else ' (held), below 0 (did not hold), each by its 95% interval'}; the "
                  f"means are over the {plural(buckets, 'bucket')} there, weighted by their sentences",
                  [(c, AHEAD)], note)


def unseen_claims(item: LengthGroup) -> list[Claim]:
    pairs = [("rel", "abs"), *((m, b) for m in BEYOND for b in ("abs", "rel"))]
    return [c for system, baseline in pairs if (c := unseen_claim(item, system, baseline)) is not None]


def build_length_report(sources: list[str], title: str, command: str | None, cutoffs: dict[str | None, int],
                        refs: dict[str | None, Path] | None = None, n_samples: int = 1000) -> Report:
    """The length-generalisation report of the runs under `sources`."""
    refs = refs or {}
    runs, skipped, warnings = load(sources)
    items = []
    for group in group_runs(runs):
        analyse_tables(group)
        max_words, source = cutoff(group, cutoffs)
        item = LengthGroup(group, max_words, source, length_table(group, max_words=max_words))
        group.refs = refs.get(group.data, refs.get(None))
        if group.refs is not None and max_words is not None and item.table is not None:
            item.significance = compare_unseen(positions_runs(group), group.refs, max_words, n_samples)
        item.claims = unseen_claims(item)
        items.append(item)
    return Report(title, command, list(sources), runs, skipped, [i.group for i in items], refs, n_samples,
                  extra={"length": items}, warnings=warnings)


def md_item(item: LengthGroup, report: Report) -> str:
    g, table, seen = item.group, item.table, item.max_words is not None
    head = f"## {g.data}, {g.model} model (trained on sources of at most {item.max_words or DASH} words: {item.source})"
    if table is None:
        return f"{head}\n\nNo run of the positions comparison has BLEU by source length."
    diff = "rel" in table["columns"] and "abs" in table["columns"]
    rows = [[r["bucket"], DASH.join(map(str, r["sentences"])),
             *([{"no": "**no**"}.get(r.get("seen_in_training"), r.get("seen_in_training") or DASH)] if seen else []),
             *(fmt(r["bleu"][c]) for c in table["columns"]),
             *([f"{rel.mean - a.mean:+.2f}" if (rel := r["bleu"].get("rel")) and (a := r["bleu"].get("abs")) else DASH]
               if diff else [])] for r in table["rows"]]
    header = ["source words", "sentences", *(["seen in training"] if seen else []), *table["columns"],
              *(["rel − abs"] if diff else [])]
    k = f"; rel and both at k = {g.k_default}" if g.k_default is not None else ""
    parts = [f"{head}\n\n{plural(len(g.runs), 'run')}, seeds {', '.join(map(str, table['seeds'])) or DASH}; sacreBLEU "
             f"per source-length bucket over {' + '.join(table['splits']) or 'the test splits'} pooled, mean ± std "
             f"(n seeds){k}. \"seen in training\": **no** for a bucket whose shortest source is longer than any "
             "training source, partly when the cutoff falls inside it.\n\n" + md_table(header, rows), md_signatures(g)]
    if tested := item.significance:
        missing = [f"{c.system} vs {c.baseline}: {why}" for c in tested for why in c.missing]
        parts.append(f"Paired bootstrap on the {next((c.sentences for c in tested if c.sentences), 0)} test sentences "
                     f"longer than training, seed by seed ({report.n_samples} resamples, sacreBLEU; 95% interval of "
                     "system − baseline, two-sided p; p < 0.05 counts as significant):\n\n"
                     + md_table(["comparison", *PAIR_HEADER], [[f"{c.system} vs {c.baseline}", *pair_cells(t)]
                                                               for c in tested for t in c.tests]))
        parts.append("Not tested: " + "; ".join(missing) + "." if missing else None)
    elif g.refs is None and seen:
        parts.append(f"No paired test: {no_refs(report, g)}.")
    return "\n\n".join(p for p in parts if p)


def length_markdown(report: Report, name: str) -> str:
    items: list[LengthGroup] = report.extra["length"]
    claims = [md_claim(c) for i in items for c in i.claims]
    parts = [f"# {report.title}", md_intro(report), *(md_item(i, report) for i in items), "## Claims",
             "\n".join(claims) or "- No claim could be checked: no bucket is known to be longer than training, "
                                  "or abs or rel is missing.", RULES,
             "## Plot", f"![BLEU by source length]({name}_buckets.png)"]
    return "\n\n".join(parts) + "\n"
