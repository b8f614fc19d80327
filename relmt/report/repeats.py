"""BLEU on test sentences with and without a repeated source word (issue 12 §4: the toy findings).

One hypothesis for why relative positions alone lag on the toy corpus: a sentence that repeats a
word ("the dog saw the dog") gives two identical keys, which content attention cannot tell apart;
absolute encodings make them differ, relative ones only relative to the query. If that is the
cause, rel should lose to abs mostly on the sentences with a repeated word. The split is made on
the source side of the --refs folder ({split}.{src}); a word counts as repeated when it occurs twice
(case-insensitive, punctuation included as its own word).
"""

from __future__ import annotations

from pathlib import Path

from sacrebleu.metrics import BLEU

from relmt.report.aggregate import Stat, aggregate
from relmt.report.controls import configurations, usual_updates
from relmt.report.runs import read_lines
from relmt.report.tables import Group
from relmt.report.text import DASH, md_table

SUBSETS = ("repeated word", "no repeated word")


def has_repeat(sentence: str) -> bool:
    words = sentence.lower().split()
    return len(set(words)) < len(words)


def repeats_table(group: Group) -> dict | None:
    """{split: {configuration: {subset: Stat}}, plus sentence counts}, for splits whose sources and
    references are in group.refs; every configuration with translations (Tables 1-3 and the controlled
    experiments: a^K alone is one suspect); None without a reference folder or translations."""
    if group.refs is None:
        return None
    out: dict[str, dict] = {}
    every = group.runs + group.variants
    updates = usual_updates(every)
    for split in group.splits:
        runs = [r for r in every if r.translations(split) and r.translations(split).is_file()]
        src_file, ref_file = (Path(group.refs) / f"{group.runs[0].source_splits.get(split, split)}.{lang}"
                              for lang in (group.runs[0].src, group.runs[0].tgt))
        if not runs or not src_file.is_file() or not ref_file.is_file():
            continue
        sources, refs = read_lines(src_file), read_lines(ref_file)
        members = {s: [i for i, x in enumerate(sources) if has_repeat(x) == (s == SUBSETS[0])] for s in SUBSETS}
        rows: dict[str, dict[str, Stat | None]] = {}
        for setting, chosen in configurations(runs).items():
            hyps = [read_lines(r.translations(split)) for r in chosen]
            rows[setting.label(group.k_default, updates)] = {
                s: aggregate(BLEU().corpus_score([h[i] for i in idx], [[refs[i] for i in idx]]).score
                             for h in hyps if len(h) == len(refs)) if idx else None
                for s, idx in members.items()}
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
