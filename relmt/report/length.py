"""The length-generalisation report: BLEU by source length, the buckets longer than any training source marked (the
argument of Shaw et al. 2018 §3.2 for clipping), and on those sentences a verdict for rel against abs and for each
later method against abs and rel. The cutoff comes from the runs' config or train_max_words=."""

from dataclasses import dataclass, field

from relmt.report.aggregate import plural
from relmt.report.claims import BOTH_WAYS, Claim, judged
from relmt.report.significance import BEYOND_PAIRS, Comparison, compare_unseen
from relmt.report.tables import Group, analyse_tables, length_table, positions_runs
from relmt.report.verdicts import AHEAD


@dataclass
class LengthGroup:
    group: Group
    max_words: int | None
    source: str  # where max_words came from
    table: dict | None
    significance: list[Comparison] = field(default_factory=list)
    claims: list[Claim] = field(default_factory=list)  # rel ≥ abs, then each later method against abs and rel


def cutoff(group: Group, cutoffs: dict[str | None, int]) -> tuple[int | None, str]:
    """The group's training cutoff and where it came from; the run's config wins over the argument."""
    if recorded := group.runs[0].train_max_words:  # runs are grouped by it
        return recorded, "the runs' config"
    for data in (group.data, None):
        if data in cutoffs:
            return cutoffs[data], f"train_max_words={f'{data}=' if data else ''}{cutoffs[data]}"
    return None, "unknown: the config does not record it and no train_max_words= was given"


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
                  f"{'' if system == 'rel' else ' ' + BOTH_WAYS}; the means are over the {plural(buckets, 'bucket')} "
                  "there, weighted by their sentences", [(c, AHEAD)], note)


def analyse_length(group: Group, cutoffs: dict[str | None, int]) -> LengthGroup:
    analyse_tables(group)
    max_words, source = cutoff(group, cutoffs)
    item = LengthGroup(group, max_words, source, length_table(group, max_words=max_words))
    if group.refs is not None and max_words is not None and item.table is not None:
        item.significance = compare_unseen(positions_runs(group), group.refs, max_words, group.n_samples)
    pairs = [("rel", "abs"), *((system, baseline) for baseline, system in BEYOND_PAIRS)]
    item.claims = [c for system, baseline in pairs if (c := unseen_claim(item, system, baseline)) is not None]
    return item
