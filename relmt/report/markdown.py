"""The paper-tables report as markdown: the header, one section per group, the claims, the plots."""

from __future__ import annotations

from collections import Counter

from relmt.report import paper
from relmt.report.aggregate import key, seeds_of, tok
from relmt.report.build import Report
from relmt.report.claims import Claim
from relmt.report.controls import md_controls, md_stages
from relmt.report.curves import best, sampled
from relmt.report.repeats import md_repeats, repeats_table
from relmt.report.tables import TOKENIZED, Group, k_sweep
from relmt.report.text import DASH, PAIR_HEADER, fmt, md_intro, md_table, no_refs, pair_cells, plural, yes_no
from relmt.report.verdicts import RULES

# The metric blocks of a table for a data set the paper has no numbers for (PaperNumbers.differences).
BLOCKS = (("bleu", "sacreBLEU", "sacreBLEU (detokenized, tokenizer 13a, cased)"),
          ("chrf", "chrF", "chrF (sacreBLEU's chrF2, character 6-grams)"),
          ("lowercased_bleu", "lc-tok BLEU", "lowercased tokenized BLEU (Moses tokens, lowercased, "
                                             "tokenize=none: the metric most Multi30k papers print; not sacreBLEU)"))


# How each signature's figure is named where the report lists the signatures.
SIGNATURE_NAMES = {"bleu": "sacreBLEU", "chrf": "chrF",
                   "tokenized_bleu": "tokenized BLEU (sacreBLEU on pre-tokenized text)"}


def md_signatures(group: Group) -> str | None:
    """The sacreBLEU signatures the figures of the group's runs were computed with, and how many runs
    used each: one signature per metric when they agree, all of them (the commonest first) when the runs
    differ."""
    runs = [*group.runs, *group.variants]
    parts = []
    for metric, label in SIGNATURE_NAMES.items():
        counts = Counter(sig for r in runs for sig in r.signatures.get(metric, ()))
        if len(counts) == 1:
            parts.append(f"{label} `{next(iter(counts))}`")
        elif counts:
            parts.append(f"{label} " + ", ".join(f"`{sig}` ({plural(n, 'run')})" for sig, n in counts.most_common()))
    return "Signatures: " + "; ".join(parts) + "." if parts else None


def bleu_columns(group: Group) -> list[str]:
    return ["valid"] + group.splits


def rules_text(counts: dict[str, int]) -> str:
    if len(counts) == 1:
        return paper.RULE_TEXT[next(iter(counts))]
    return ", ".join(f"{rule} in {plural(n, 'run')}" for rule, n in counts.items())


def md_checkpoints(table: dict, with_paper: bool) -> str:
    ckpt = table["checkpoints"]
    valid = paper.RULE_TEXT[ckpt["valid"]].split(" (")[0]
    text = (f"Checkpoints: the valid columns score the {valid} checkpoint (validation after the final update); "
            f"the test columns score {rules_text(ckpt['test']) if ckpt['test'] else DASH}.")
    if with_paper:
        text += f" The paper reports {paper.PAPER_RULE_TEXT[ckpt['paper']]}."
    if ckpt["mixed"]:
        text += f" **Mixed checkpoint rules**: this table's columns come from {', '.join(ckpt['used'])}."
    if with_paper and not ckpt["matches_paper"]:
        text += (f" **Not the paper's rule**: the column beside the paper scores "
                 f"{' and '.join(ckpt['beside_paper'])}, the paper {ckpt['paper']}.")
    return text


def md_notes(group: Group, table: dict) -> str:
    """The lines under a table with the paper's column: its metrics and its checkpoint rules, with flags."""
    side = table["beside_paper"]
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
    return f"{metric}\n\n{md_checkpoints(table, with_paper=True)}"


def md_beside_paper(group: Group, table: dict, first: list[str], cells) -> str:
    """A table with the paper's column: sacreBLEU per split, then the tokenized BLEU beside the paper."""
    beside = table["beside_paper"]["split"]
    header = [*first, *(f"{c} sacreBLEU" for c in bleu_columns(group)), f"{beside} {TOKENIZED}", table["paper_label"]]
    rows = [[*cells(r), *(fmt(r["bleu"][c]) for c in bleu_columns(group)), fmt(r["bleu"].get(tok(beside))),
             fmt(r["paper"])] for r in table["rows"]]
    return f"{md_table(header, rows)}\n\n{md_notes(group, table)}"


def md_blocks(group: Group, table: dict, first: list[str], cells) -> str:
    """A table without the paper's column: one block per metric, each with the valid and test columns."""
    parts = []
    for metric, short, label in BLOCKS:
        if not any(r["bleu"].get(key(c, metric)) for r in table["rows"] for c in bleu_columns(group)):
            parts.append(f"No run here has {label.split(' (')[0]} (a metrics.json from before relmt stored it).")
            continue
        header = [*first, *(f"{c} {short}" for c in bleu_columns(group))]
        # sacreBLEU keeps every row; another metric leaves out the rows whose runs lack it (older runs)
        shown = [r for r in table["rows"]
                 if metric == "bleu" or any(r["bleu"].get(key(c, metric)) for c in bleu_columns(group))]
        rows = [[*cells(r), *(fmt(r["bleu"].get(key(c, metric))) for c in bleu_columns(group))] for r in shown]
        left = len(table["rows"]) - len(shown)
        note = f" ({plural(left, 'row')} left out: {'its runs lack' if left == 1 else 'their runs lack'} {short})"
        note = note if left else ""
        parts.append(f"**{label}**{note}\n\n{md_table(header, rows)}")
    labels = "; ".join(f"`{label}`" for label in table.get("lowercased_labels", []))
    if labels:
        parts.append(f"The lowercased tokenized BLEU was computed as {labels}.")
    parts.append(md_checkpoints(table, with_paper=False))
    return "\n\n".join(parts)


def md_any(group: Group, table: dict, first: list[str], cells) -> str:
    render = md_blocks if table["paper_label"] is None else md_beside_paper
    return render(group, table, first, cells)


def md_positions(group: Group, table: dict) -> str:
    if table["paper_label"] is None:
        about = (f"The paper has no numbers for this data set, so it has no column here; its findings are the claims "
                 f"checked below: {paper.TABLE1_DIFFERENCES}; {paper.BOTH_FINDING}.")
    else:
        about = "The paper reports newstest2014 BLEU."
    return (f"### Table 1 analogue: position representations (Shaw et al. 2018, Table 1)\n\n"
            f"a^K and a^V on; rel and both at k = {group.k_default}. Each cell: mean ± std (n seeds). {about}\n\n"
            + md_any(group, table, ["positions"], lambda r: [r["positions"]]))


def md_k(group: Group, table: dict) -> str:
    about = ("The paper reports newstest2013 (development set) BLEU, so its column compares with the valid columns."
             if table["paper_label"] else
             f"No paper column: the paper's Table 2 is another data set ({paper.TABLE2_FINDING}); its shape is "
             "checked as claims below.")
    return ("### Table 2 analogue: clipping distance k (Shaw et al. 2018, Table 2)\n\n"
            f"rel positions, a^K and a^V on. {about}\n\n" + md_any(group, table, ["k"], lambda r: [str(r["k"])]))


def md_kv(group: Group, table: dict) -> str:
    about = ("The paper reports newstest2013 (development set) BLEU, so its column compares with the valid columns."
             if table["paper_label"] else
             f"No paper column: the paper's Table 3 is another data set ({paper.TABLE3_FINDING}); its shape is "
             "checked as claims below.")
    if table.get("no_no_from"):
        about += (" The (no, no) row is the k = 0 runs of Table 2: like a model without a^K and a^V, they carry "
                  "no position information (one label shifts every score of a row alike), and the paper's two "
                  "rows agree (12.5).")
    return ("### Table 3 analogue: a^K and a^V (Shaw et al. 2018, Table 3)\n\n"
            f"rel positions, k = {group.k_default}. {about}\n\n"
            + md_any(group, table, ["a^K", "a^V"],
                     lambda r: [yes_no(r["relative_keys"]), yes_no(r["relative_values"])]))


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


def md_significance(group: Group, report: Report) -> str | None:
    """Every seed pair's paired bootstrap, and per comparison and test set the count significant."""
    if group.tables["positions"] is None or len(group.tables["positions"]["rows"]) < 2:
        return None
    head = "### Significance: paired bootstrap, seed by seed"
    if group.refs is None:
        return f"{head}\n\nNot tested: {no_refs(report, group)}."
    if not group.significance:
        return f"{head}\n\nNo seed pair to test: the positions comparison lacks abs and rel, or rel and both."
    detail, summary, missing = [], [], []
    for c in group.significance:
        name = f"{c.system} vs {c.baseline}"
        detail += [[name, c.split, *pair_cells(t)] for t in c.tests]
        summary += [[name, c.split, str(len(c.tests)), str(c.significant()), str(c.significant(+1)),
                     str(c.significant(-1))]] if c.tests else []
        missing += [f"{name} on {c.split}: {why}" for why in c.missing]
    text = (f"{head}\n\nsacreBLEU of seed s of the baseline and seed s of the system on the same sentences, tested "
            f"with a paired bootstrap ({report.n_samples} resamples, resampling seed 12345): the 95% percentile "
            "interval of system − baseline and the two-sided p; a seed pair is significant when p < 0.05, that is "
            f"when its interval excludes 0. References: `{group.refs}`.\n\n"
            + md_table(["comparison", "test set", *PAIR_HEADER], detail)
            + "\n\n" + md_table(["comparison", "test set", "seed pairs", "significant (p < 0.05)",
                                 "system ahead, significant", "system behind, significant"], summary))
    if missing:
        text += "\n\nNot tested: " + "; ".join(missing) + "."
    return text


def md_curves(group: Group, name: str) -> str | None:
    curves = group.curves
    if curves is None:
        return None
    header = ["update", *curves["columns"]]
    rows = [[str(r["step"]), *(fmt(r["bleu"][c]) for c in curves["columns"])] for r in sampled(curves["rows"])]
    peaks = "; ".join(f"{c} {b[1].mean:.2f} at update {b[0]}" for c in curves["columns"] if (b := best(curves, c)))
    return ("### Learning curves: validation sacreBLEU against updates\n\n"
            f"The runs of the positions comparison, mean ± std (n seeds) at {len(rows)} of the "
            f"{len(curves['rows'])} validations (`{name}_curves.png` plots them all). Highest mean: {peaks}.\n\n"
            + md_table(header, rows))


def md_group(group: Group, report: Report, name: str) -> str:
    pair = f" ({group.pair})" if group.pair else ""
    beams = sorted({r.beam for r in group.runs if r.beam is not None})
    kd = (f"k_default = {group.k_default} (the most common k among rel runs with a^K and a^V on; "
          "Tables 1 and 3 use it)") if group.k_default is not None else "no rel run with a^K and a^V on"
    variants = (f" and {plural(len(group.variants), 'run')} of controlled experiments (below)"
                if group.variants else "")
    about = (f"{plural(len(group.runs), 'run')}{variants}; seeds {', '.join(map(str, seeds_of(group.runs))) or DASH}; "
             f"beam {', '.join(map(str, beams)) or DASH}; {kd}.")
    guessed = sum(r.model_guessed for r in group.runs)
    if guessed == len(group.runs):
        about += (f" The model preset \"{group.model}\" is guessed from d_model: these runs' config.yaml "
                  "predates model.name.")
    elif guessed:
        about += (f" For {guessed} of the {len(group.runs)} runs the model preset \"{group.model}\" is guessed from "
                  "d_model (their config.yaml predates model.name).")
    minutes = [r.minutes for r in group.runs if r.minutes]
    if minutes:
        threads = sorted({str(r.threads or "default") for r in group.runs})
        low, high = f"{min(minutes):.0f}", f"{max(minutes):.0f}"
        span = low if low == high else f"{low}–{high}"
        timed = sum(r.test_seconds is not None for r in group.runs if r.minutes)
        test = ("test decoding included" if timed == len(minutes) else "test decoding not included" if not timed
                else f"test decoding included for {timed} of {len(minutes)} runs")
        about += (f" Wall time per run: {span} min (training and validation; {test}; "
                  f"train.num_threads {', '.join(threads)}).")
    cutoff = f"; training sources ≤ {group.train_max_words} words" if group.train_max_words else ""
    parts = [f"## {group.data}{pair}, {group.model} model (d_model {group.runs[0].d_model}{cutoff})", about]
    parts += [s for s in (md_signatures(group),) if s]
    renderers = {"positions": lambda t: md_positions(group, t), "k": lambda t: md_k(group, t),
                 "kv": lambda t: md_kv(group, t)}
    parts += [render(group.tables[n]) for n, render in renderers.items() if group.tables[n]]
    parts += [s for s in (md_significance(group, report),) if s]
    parts += [s for s in (md_repeats(repeats_table(group)),) if s]
    if group.tables["length"]:
        parts.append(md_length(group.tables["length"]))
    parts += [s for s in (md_curves(group, name), md_stages(group.stages), md_controls(group.controls)) if s]
    if not any(group.tables.values()):
        parts.append("No run of this group fits any table.")
    return "\n\n".join(parts)


def md_claim(claim: Claim, paper: bool = True) -> str:
    measured = ", ".join(f"{k} {v:.2f}" for k, v in claim.measured.items())
    text = f"- **{claim.name}** ({claim.table}): {claim.verdict}. Criterion: {claim.criterion}. Measured: {measured}."
    if claim.test:
        text += f" Paired bootstrap: {claim.test}."
    if claim.paper and paper:
        text += f" Paper: {claim.paper}."
    return text


def md_claims(groups: list[Group]) -> str:
    parts = ["## Claims", RULES]
    for group in groups:
        # what the paper found is said once per claim, not again for each test set
        lines = [md_claim(c, paper=i == 0 or c.paper != group.claims[i - 1].paper) for i, c in enumerate(group.claims)]
        lines = lines or ["- No claim could be checked: the runs it needs are missing."]
        parts.append(f"### {group.name}\n\n" + "\n".join(lines))
    return "\n\n".join(parts)


def markdown(report: Report, name: str) -> str:
    parts = [f"# {report.title}", md_intro(report), *(md_group(g, report, name) for g in report.groups),
             md_claims(report.groups), "## Plots",
             f"![BLEU against the clipping distance k]({name}_k.png)" if k_sweep(report.groups)
             else "No plot of BLEU against k: these runs hold a single k.",
             f"![BLEU by source length]({name}_length.png)",
             f"![Validation BLEU against updates]({name}_curves.png)"]
    return "\n\n".join(parts) + "\n"
