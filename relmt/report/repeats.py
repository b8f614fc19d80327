"""BLEU on test sentences with and without a repeated source word (issue 12 §4: the toy findings).

If rel lags abs because content attention cannot tell two identical keys apart ("the dog saw the dog"), rel should
lose mostly on the sentences whose source (case-insensitive, whitespace-split) repeats a word."""

from sacrebleu.metrics import BLEU

from relmt.report.aggregate import DASH, aggregate, md_table
from relmt.report.controls import configurations, usual_updates
from relmt.report.significance import lines
from relmt.report.tables import Group

SUBSETS = ("repeated word", "no repeated word")


def has_repeat(sentence: str) -> bool:
    words = sentence.lower().split()
    return len(set(words)) < len(words)


def repeats_table(group: Group) -> dict | None:
    """{split: {"rows": {configuration: {subset: Stat}}, "sentences"}} for every configuration with translations
    (variants too: a^K alone is one suspect) and sources and references in group.refs; None without any."""
    if group.refs is None:
        return None
    out, every, head = {}, group.runs + group.variants, group.runs[0]
    updates = usual_updates(every)
    for split in group.splits:
        runs = [r for r in every if r.translations(split) and r.translations(split).is_file()]
        src, ref = (group.refs / f"{head.source_splits.get(split, split)}.{lang}" for lang in (head.src, head.tgt))
        if not runs or not src.is_file() or not ref.is_file():
            continue
        sources, refs = lines(src), lines(ref)
        members = {s: [i for i, x in enumerate(sources) if has_repeat(x) == (s == SUBSETS[0])] for s in SUBSETS}
        rows = {}
        for setting, chosen in configurations(runs).items():
            hyps = [lines(r.translations(split)) for r in chosen]
            rows[setting.label(group.k_default, updates)] = {
                s: aggregate(BLEU().corpus_score([h[i] for i in idx], [[refs[i] for i in idx]]).score
                             for h in hyps if len(h) == len(refs)) if idx else None for s, idx in members.items()}
        out[split] = {"rows": rows, "sentences": {s: len(idx) for s, idx in members.items()}}
    return out or None


def md_repeats(table: dict | None) -> str | None:
    if not table:
        return None
    parts = ["### BLEU with and without a repeated source word",
             "sacreBLEU of each configuration (mean ± std over seeds) on the test sentences whose source "
             "repeats a word and on the others (relmt/report/repeats.py says why)."]
    for split, t in table.items():
        header = ["configuration", *(f"{s} ({t['sentences'][s]} sentences)" for s in SUBSETS)]
        rows = [[p, *(str(v[s]) if v[s] is not None else DASH for s in SUBSETS)] for p, v in t["rows"].items()]
        parts += [f"{split}:", md_table(header, rows)]
    return "\n\n".join(parts)
