"""The reports as markdown: the paper's tables (a section per group, the claims, the plots), a row per run for a
user's own runs (runs_markdown), and the tuning report on the validation split only (tuning_markdown)."""

import json
from collections import Counter
from dataclasses import replace

import yaml

from relmt.host import host
from relmt.report import paper
from relmt.report.aggregate import DASH, PAIR_HEADER, aggregate, fmt, key, md_table, pair_cells, plural, seeds_of
from relmt.report.build import Report
from relmt.report.claims import Claim
from relmt.report.controls import md_controls, md_stages
from relmt.report.length import LengthGroup
from relmt.report.repeats import md_repeats, repeats_table
from relmt.report.runs import ReportError, Run, find_run_dirs, flatten, read_runs
from relmt.report.tables import TOKENIZED, Group, k_sweep, positions_runs, sampled
from relmt.report.verdicts import RULES

# The metric blocks of a table for a data set the paper has no numbers for (PaperNumbers.differences).
BLOCKS = (("bleu", "sacreBLEU", "sacreBLEU (detokenized, tokenizer 13a, cased)"),
          ("chrf", "chrF", "chrF (sacreBLEU's chrF2, character 6-grams)"),
          ("lowercased_bleu", "lc-tok BLEU", "lowercased tokenized BLEU (Moses tokens, lowercased, "
                                             "tokenize=none: the metric most Multi30k papers print; not sacreBLEU)"))
SIGNATURE_NAMES = {"bleu": "sacreBLEU", "chrf": "chrF", "tokenized_bleu": "tokenized BLEU (sacreBLEU on pre-tokenized "
                                                                            "text)"}
ABLATION_ABOUT = ("The paper reports newstest2013 (development set) BLEU, so its column compares with the valid "
                  "columns.")


def no_refs(report: Report, group: Group) -> str:
    """Why a group has no paired tests: no refs= at all, or none for its data set."""
    if not report.refs:
        return ("the report was built without `refs=DIR`, the folder of the reference files `{split}.{tgt}` that "
                "each run's translations/ are tested against")
    return f"no `refs=` folder for data set {group.data} (give `refs={group.data}=DIR` or a plain `refs=DIR`)"


def md_intro(report: Report) -> str:
    sources, seeds = ", ".join(f"`{s}`" for s in report.sources), ", ".join(map(str, seeds_of(report.runs))) or DASH
    text = f"Read {plural(len(report.runs), 'completed run')} from {sources}; seeds found: {seeds}."
    duplicates = [(p, why) for p, why in report.skipped if why.startswith("a duplicate")]
    if skipped := [(p, why) for p, why in report.skipped if (p, why) not in duplicates]:
        listed = "; ".join(f"`{p}` ({why})" for p, why in skipped)
        verb = "is" if len(skipped) == 1 else "are"
        text += f' Skipped {plural(len(skipped), "run")} that {verb} not "completed": {listed}.'
    if duplicates:
        listed = "; ".join(f"`{p}` ({why})" for p, why in duplicates)
        text += f" Left out {plural(len(duplicates), 'duplicate run')}: {listed}."
    text += "\n\n" + "\n".join(f"**Warning:** {w}." for w in report.warnings) if report.warnings else ""
    text += f"\n\nThe runs were produced by: `{report.command}`" if report.command else ""
    hw = host()
    return text + (f"\n\nThis report: {hw['date']}, on {hw['cpu']} ({hw['cpu_count']} cores), torch {hw['torch']}, "
                   f"git {hw['git']}.")


def md_signatures(group: Group) -> str | None:
    """The sacreBLEU signatures of the group's figures: one per metric when the runs agree, else each with
    its count of runs, the commonest first."""
    parts = []
    for metric, label in SIGNATURE_NAMES.items():
        counts = Counter(sig for r in [*group.runs, *group.variants] for sig in r.signatures.get(metric, ()))
        shown = [f"`{sig}`" + (f" ({plural(n, 'run')})" if len(counts) > 1 else "") for sig, n in counts.most_common()]
        parts += [f"{label} " + ", ".join(shown)] if shown else []
    return "Signatures: " + "; ".join(parts) + "." if parts else None


def rules_text(counts: dict[str, int]) -> str:
    if len(counts) == 1:
        return paper.RULE_TEXT[next(iter(counts))]
    return ", ".join(f"{rule} in {plural(n, 'run')}" for rule, n in counts.items())


def md_checkpoints(table: dict, with_paper: bool) -> str:
    ckpt = table["checkpoints"]
    text = (f"Checkpoints: the valid columns score the {paper.RULE_TEXT[ckpt['valid']].split(' (')[0]} checkpoint "
            f"(validation after the final update); the test columns score "
            f"{rules_text(ckpt['test']) if ckpt['test'] else DASH}.")
    text += f" The paper reports {paper.PAPER_RULE_TEXT[ckpt['paper']]}." if with_paper else ""
    if ckpt["mixed"]:
        text += f" **Mixed checkpoint rules**: this table's columns come from {', '.join(ckpt['used'])}."
    if with_paper and not ckpt["matches_paper"]:
        text += (f" **Not the paper's rule**: the column beside the paper scores "
                 f"{' and '.join(ckpt['beside_paper'])}, the paper {ckpt['paper']}.")
    return text


def md_notes(group: Group, table: dict) -> str:
    """The lines under a table with the paper's column: its metrics and its checkpoint rules, with flags."""
    side = table["beside_paper"]
    labels = "; ".join(f"`{label}`" for label in side["labels"]) or "Moses + compound splitting, tokenize=none"
    metric = ("Metric: the relmt BLEU columns are sacreBLEU (detokenized, tokenizer 13a). Beside the paper's column is "
              f"**{side['split']} {TOKENIZED}**, the paper-comparable metric (the paper does not name its BLEU; this "
              f"is t2t's EN-DE convention, about 0.7 above sacreBLEU on one published model), computed as {labels}.")
    if group.pair == "EN-FR":
        metric += (" tensor2tensor states this convention for EN-DE (its get_ende_bleu.sh) and not for EN-FR; relmt "
                   "uses it for EN-FR too, as fairseq's EN-FR figures (compound-split) do.")
    if side["scored"] and not side["with_metric"]:
        metric += (f" No run here has {TOKENIZED} (a metrics.json from before relmt stored it), so that column "
                   "shows – and no relmt figure is comparable with the paper's.")
    elif missing := side["scored"] - side["with_metric"]:
        metric += (f" {missing} of the {side['scored']} runs scored on {side['split']} have no {TOKENIZED} (an older "
                   "metrics.json); its cells average the runs that have it (n in each cell).")
    return f"{metric}\n\n{md_checkpoints(table, with_paper=True)}"


def md_any(group: Group, table: dict, first: list[str], cells) -> str:
    """With the paper's column: sacreBLEU per split, then the tokenized BLEU beside the paper's. Without it:
    one block per metric, each with the valid and test columns."""
    columns = ["valid", *group.splits]
    if table["paper_label"] is not None:
        beside = table["beside_paper"]["split"]
        header = [*first, *(f"{c} sacreBLEU" for c in columns), f"{beside} {TOKENIZED}", table["paper_label"]]
        rows = [[*cells(r), *(fmt(r["bleu"][c]) for c in columns), fmt(r["bleu"].get(key(beside, "tokenized_bleu"))),
                 fmt(r["paper"])] for r in table["rows"]]
        return f"{md_table(header, rows)}\n\n{md_notes(group, table)}"
    parts = []
    for metric, short, label in BLOCKS:
        # sacreBLEU keeps every row; another metric leaves out the rows whose runs lack it (older runs)
        shown = [r for r in table["rows"] if metric == "bleu" or any(r["bleu"].get(key(c, metric)) for c in columns)]
        if not any(r["bleu"].get(key(c, metric)) for r in table["rows"] for c in columns):
            parts.append(f"No run here has {label.split(' (')[0]} (a metrics.json from before relmt stored it).")
            continue
        left = len(table["rows"]) - len(shown)
        note = f" ({plural(left, 'row')} left out: {'its runs lack' if left == 1 else 'their runs lack'} {short})"
        rows = [[*cells(r), *(fmt(r["bleu"].get(key(c, metric))) for c in columns)] for r in shown]
        table_md = md_table([*first, *(f"{c} {short}" for c in columns)], rows)
        parts.append(f"**{label}**{note if left else ''}\n\n{table_md}")
    if labels := "; ".join(f"`{label}`" for label in table.get("lowercased_labels", [])):
        parts.append(f"The lowercased tokenized BLEU was computed as {labels}.")
    return "\n\n".join([*parts, md_checkpoints(table, with_paper=False)])


def md_tables(group: Group) -> list[str]:
    """Tables 1-3, each with what its paper column (or the lack of one) means."""
    def about(number: int, finding: str) -> str:
        return (f"No paper column: the paper's Table {number} is another data set ({finding}); its shape is checked "
                "as claims below.")
    kv = group.tables["kv"] or {}
    no_no = (" The (no, no) row is the k = 0 runs of Table 2: like a model without a^K and a^V, they carry no position "
             "information (one label shifts every score of a row alike), and the paper's two rows agree (12.5)."
             if kv.get("no_no_from") else "")
    specs = (("positions", "Table 1 analogue: position representations", f"a^K and a^V on; rel and both at k = "
              f"{group.k_default}. Each cell: mean ± std (n seeds).", "The paper reports newstest2014 BLEU.",
              f"The paper has no numbers for this data set, so it has no column here; its findings are the claims "
              f"checked below: {paper.TABLE1_DIFFERENCES}; {paper.BOTH_FINDING}.", ["positions"],
              lambda r: [r["positions"]]),
             ("k", "Table 2 analogue: clipping distance k", "rel positions, a^K and a^V on.", ABLATION_ABOUT,
              about(2, paper.TABLE2_FINDING), ["k"], lambda r: [str(r["k"])]),
             ("kv", "Table 3 analogue: a^K and a^V", f"rel positions, k = {group.k_default}.", ABLATION_ABOUT + no_no,
              about(3, paper.TABLE3_FINDING) + no_no, ["a^K", "a^V"],
              lambda r: ["yes" if r[f"relative_{x}"] else "no" for x in ("keys", "values")]))
    return [f"### {head} (Shaw et al. 2018, Table {i})\n\n{what} {with_paper if t['paper_label'] else without}\n\n"
            + md_any(group, t, first, cells) for i, (name, head, what, with_paper, without, first, cells)
            in enumerate(specs, start=1) if (t := group.tables[name])]


def md_length(table: dict) -> str:
    rows = [[r["bucket"], DASH.join(str(n) for n in r["sentences"]), *(fmt(r["bleu"][c]) for c in table["columns"])]
            for r in table["rows"]]
    rules = table["checkpoints"]["test"]
    mixed = f" **Mixed checkpoint rules**: {', '.join(rules)}." if len(rules) > 1 else ""
    return ("### BLEU by source length (length generalisation, the motivation of clipping in Shaw et al. 2018 §3.2)"
            f"\n\nsacreBLEU per source-length bucket over {' + '.join(table['splits']) or 'the test splits'} pooled, "
            "for the runs of the positions comparison; mean ± std (n seeds).\n\n"
            f"{md_table(['source words', 'sentences', *table['columns']], rows)}\n\n"
            f"Checkpoints: the test splits score {rules_text(rules)}.{mixed}")


def md_significance(group: Group, report: Report) -> str | None:
    """Per comparison and test set the test over all seeds, every seed pair's paired bootstrap, and the count of
    pairs significant."""
    if group.tables["positions"] is None or len(group.tables["positions"]["rows"]) < 2:
        return None
    head = "### Significance: all seeds at once, and seed by seed"
    if group.refs is None:
        return f"{head}\n\nNot tested: {no_refs(report, group)}."
    if not group.significance:
        return f"{head}\n\nNo seed pair to test: the positions comparison lacks abs and rel, or rel and both."
    named = [(f"{c.system} vs {c.baseline}", c) for c in group.significance]
    detail = [[name, c.split, *pair_cells(t)] for name, c in named for t in [c.overall, *c.tests] if t]
    summary = [[name, c.split, str(len(c.tests)), *(str(c.significant(d)) for d in (0, 1, -1))]
               for name, c in named if c.tests]
    missing = [f"{name} on {c.split}: {why}" for name, c in named for why in c.missing]
    text = (f"{head}\n\nsacreBLEU on the same sentences, {report.n_samples} resamples, resampling seed 12345: the "
            "95% percentile interval of system − baseline and the two-sided p, significant when p < 0.05, that is "
            "when the interval excludes 0. The row \"all (n + m)\" tests the means over every seed of both systems "
            "at once (sentences and seeds resampled, Clark et al. 2011) and decides the claims; the rows below it "
            "test seed s of the baseline against seed s of the system (a paired bootstrap), and their counts decide "
            f"nothing. References: `{group.refs}`.\n\n"
            + md_table(["comparison", "test set", *PAIR_HEADER], detail) + "\n\n"
            + md_table(["comparison", "test set", "seed pairs", "significant (p < 0.05)", "system ahead, significant",
                        "system behind, significant"], summary))
    return text + ("\n\nNot tested: " + "; ".join(missing) + "." if missing else "")


def md_curves(group: Group, name: str) -> str | None:
    if (curves := group.curves) is None:
        return None
    rows = [[str(r["step"]), *(fmt(r["bleu"][c]) for c in curves["columns"])] for r in sampled(curves["rows"])]
    best = {c: max(((r["step"], r["bleu"][c]) for r in curves["rows"] if r["bleu"].get(c)), default=None,
                   key=lambda cell: cell[1].mean) for c in curves["columns"]}  # the highest mean, and its update
    peaks = "; ".join(f"{c} {b[1].mean:.2f} at update {b[0]}" for c, b in best.items() if b)
    return ("### Learning curves: validation sacreBLEU against updates\n\n"
            f"The runs of the positions comparison, mean ± std (n seeds) at {len(rows)} of the "
            f"{len(curves['rows'])} validations (`{name}_curves.png` plots them all). Highest mean: {peaks}.\n\n"
            + md_table(["update", *curves["columns"]], rows))


def md_speed(group: Group) -> str | None:
    """Each position kind's training speed (target tokens per second of update steps, from metrics.json),
    with the threads and the CPU it ran on where the run recorded them."""
    runs = [r for r in positions_runs(group) if r.tokens_per_s]
    if not runs:
        return None
    rows = []
    for kind in [p for p in paper.POSITIONS if any(r.positions == p for r in runs)]:
        members = [r for r in runs if r.positions == kind]
        stat = aggregate(r.tokens_per_s for r in members)
        rows.append([kind, str(stat.n), f"{stat.mean:,.0f} ± {stat.std:,.0f}",
                     ", ".join(sorted({str(r.threads or "default") for r in members})),
                     "; ".join(f"{cpu} ({n})" for cpu, n in Counter(r.cpu or "not recorded" for r in members).items())])
    return ("### Training speed\n\nTarget tokens per second of update steps (validation excluded), mean ± std over the "
            "runs of the positions comparison. Runs may come from different sessions, with other work on the same "
            "cores, and the CPU can differ between sessions (the last column): a paired measurement of the modes' step "
            "times is `scripts/bench/bench_train.py --positions ...`.\n\n"
            + md_table(["positions", "runs", "target tok/s", "threads", "CPU (runs)"], rows))


def md_about(group: Group) -> str:
    """Runs, seeds, beams, k_default, guessed presets and wall time, in one paragraph."""
    beams = sorted({r.beam for r in group.runs if r.beam is not None})
    kd = (f"k_default = {group.k_default} (the most common k among rel runs with a^K and a^V on; "
          "Tables 1 and 3 use it)") if group.k_default is not None else "no rel run with a^K and a^V on"
    variants = f" and {plural(len(group.variants), 'run')} of controlled experiments (below)" if group.variants else ""
    about = (f"{plural(len(group.runs), 'run')}{variants}; seeds {', '.join(map(str, seeds_of(group.runs))) or DASH}; "
             f"beam {', '.join(map(str, beams)) or DASH}; {kd}.")
    guessed = sum(r.model_guessed for r in group.runs)
    if guessed == len(group.runs):
        about += (f" The model preset \"{group.model}\" is guessed from d_model: these runs' config.yaml "
                  "predates model.name.")
    elif guessed:
        about += (f" For {guessed} of the {len(group.runs)} runs the model preset \"{group.model}\" is guessed from "
                  "d_model (their config.yaml predates model.name).")
    if minutes := [r.minutes for r in group.runs if r.minutes]:
        threads = sorted({str(r.threads or "default") for r in group.runs})
        low, high = f"{min(minutes):.0f}", f"{max(minutes):.0f}"
        timed = sum(r.test_seconds is not None for r in group.runs if r.minutes)
        test = ("test decoding included" if timed == len(minutes) else "test decoding not included" if not timed
                else f"test decoding included for {timed} of {len(minutes)} runs")
        about += (f" Wall time per run: {low if low == high else f'{low}–{high}'} min (training and validation; "
                  f"{test}; threads {', '.join(threads)}).")
    return about


def md_group(group: Group, report: Report, name: str) -> str:
    pair = f" ({group.pair})" if group.pair else ""
    cutoff = f"; training sources ≤ {group.train_max_words} words" if group.train_max_words else ""
    parts = [f"## {group.data}{pair}, {group.model} model (d_model {group.runs[0].d_model}{cutoff})", md_about(group),
             md_signatures(group), *md_tables(group), md_significance(group, report), md_repeats(repeats_table(group)),
             md_length(group.tables["length"]) if group.tables["length"] else None, md_curves(group, name),
             md_speed(group), md_stages(group.stages), md_controls(group.controls)]
    if not any(group.tables.values()):
        parts.append("No run of this group fits any table.")
    return "\n\n".join(p for p in parts if p)


def md_claim(claim: Claim, paper: bool = True) -> str:
    measured = ", ".join(f"{k} {v:.2f}" for k, v in claim.measured.items())
    text = f"- **{claim.name}** ({claim.table}): {claim.verdict}. Criterion: {claim.criterion}. Measured: {measured}."
    text += f" Tests: {claim.test}." if claim.test else ""
    return text + (f" Paper: {claim.paper}." if claim.paper and paper else "")


def md_claims(groups: list[Group]) -> str:
    parts = ["## Claims", RULES]
    for g in groups:  # what the paper found is said once per claim, not again for each test set
        lines = [md_claim(c, paper=i == 0 or c.paper != g.claims[i - 1].paper) for i, c in enumerate(g.claims)]
        parts.append(f"### {g.name}\n\n" + "\n".join(lines or ["- No claim could be checked: the runs it needs are "
                                                               "missing."]))
    return "\n\n".join(parts)


def markdown(report: Report, name: str) -> str:
    k_plot = (f"![BLEU against the clipping distance k]({name}_k.png)" if k_sweep(report.groups)
              else "No plot of BLEU against k: these runs hold a single k.")
    parts = [f"# {report.title}", md_intro(report), *(md_group(g, report, name) for g in report.groups),
             md_claims(report.groups), "## Plots", k_plot, f"![BLEU by source length]({name}_length.png)",
             f"![Validation BLEU against updates]({name}_curves.png)"]
    return "\n\n".join(parts) + "\n"


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
        parts.append(f"Paired tests on the {next((c.sentences for c in tested if c.sentences), 0)} test sentences "
                     f"longer than training ({report.n_samples} resamples, sacreBLEU; 95% interval of system − "
                     "baseline, two-sided p; p < 0.05 counts as significant): over all seeds at once (\"all (n + m)\", "
                     "which decides the claims), then seed by seed:\n\n"
                     + md_table(["comparison", *PAIR_HEADER], [[f"{c.system} vs {c.baseline}", *pair_cells(t)]
                                                               for c in tested for t in [c.overall, *c.tests] if t]))
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


# Settings that differ between runs without being a choice being tuned.
IGNORED = ("out_dir", "data.dir", "data.cache_dir", "train.resume", "train.progress", "threads",
           "train.num_threads")  # the second: runs saved before issue 74 named the threads so


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

    def row(run: Run, cfg: dict[str, object]) -> list[str]:
        curve, averaged = dict(run.curve), run.path / "averaged_valid.json"  # scripts/reproduce/score_averaged.sh
        return [run.name, *(str(cfg.get(k, DASH)) for k in keys),
                *(f"{curve[s]:.2f}" if s in curve else DASH for s in steps),
                *(f"{run.valid[m]:.2f}" if m in run.valid else DASH for m in ("bleu", "chrf", "lowercased_bleu")),
                f"{json.loads(averaged.read_text())['sacrebleu']['score']:.2f}" if averaged.is_file() else DASH,
                f"{run.wall_seconds / 60:.0f}" if run.wall_seconds else DASH]
    h = host()
    parts = [f"# {title}", f"Made by `relmt-report {' '.join(sources)} kind=tuning` on {h['date']} ({h['cpu']}, "
             f"{h['cpu_count']} cores, torch {h['torch']}, relmt {h['git']}).",
             *([f"Runs: `{command}`."] if command else []),
             "Validation split only: the tuning runs decode no test set. BLEU is sacreBLEU (cased, 13a) unless named "
             "otherwise; 'minutes' is the run's wall time.",
             md_table(header, [row(r, c) for r, c in zip(runs, configs)]),
             f"Highest final valid sacreBLEU: {best.name} ({best.valid.get('bleu', float('nan')):.2f}).",
             *(["Left out: " + "; ".join(f"{p} ({why})" for p, why in skipped)] if skipped else [])]
    return "\n\n".join(parts) + "\n"


def runs_markdown(report: Report) -> str:
    """Runs that are none of the paper's experiments: one row each, with the settings in which their config.yaml
    differ, valid and test sacreBLEU, the updates and the training speed; no paper column, claim or rule."""
    settings = [{"seed": json.dumps(r.seed), **dict(r.settings)} for r in report.runs]
    keys = [k for k in dict.fromkeys(k for s in settings for k in s) if len({s.get(k) for s in settings}) > 1]
    splits = list(dict.fromkeys(split for r in report.runs for split in r.test))
    rows = [[r.name, *(s.get(k, DASH).strip('"') for k in keys),
             *(DASH if (b := r.score(split)) is None else f"{b:.2f}" for split in ("valid", *splits)),
             str(r.updates or DASH), f"{r.tokens_per_s:,.0f}" if r.tokens_per_s else DASH]
            for r, s in zip(report.runs, settings)]
    header = ["run", *keys, *(f"{s} sacreBLEU" for s in ("valid", *splits)), "updates", "target tok/s"]
    rules = " and ".join(sorted({r.test_rule for r in report.runs}))
    intro = md_intro(replace(report, warnings=[]))  # no warning about seeds averaged: each run is its own row
    return (f"# {report.title}\n\n{intro}\n\n{md_table(header, rows)}\n\nsacreBLEU (cased, 13a): valid "
            f"after the last update, test of the {rules} checkpoint. The paper's Tables 1-3, its claims and their "
            "verdicts apply to runs on its data sets or with a paired test (`refs=DIR`): `kind=tables`.\n"
            + by_corpus_markdown(report))


def by_corpus_markdown(report: Report) -> str:
    """Runs on several corpora (data.source=corpora; a multilingual run's language pairs): a row per run and
    corpus, with its pair and the sacreBLEU of each of its evaluation splits ({corpus}_{split}; the valid split
    of data.valid_corpus is the run's `valid`). Empty when no run has several corpora."""
    rows, kinds = [], []
    for r in report.runs:
        for name, src, tgt in r.corpora:
            scores = {split.removeprefix(f"{name}_"): r.score(split) for split in r.test
                      if split.startswith(f"{name}_")}
            if name == r.valid_corpus:
                scores = {"valid": r.score("valid"), **scores}
            kinds += [k for k in scores if k not in kinds]
            rows.append((r.name, name, f"{src}→{tgt}", scores))
    if not rows:
        return ""
    table = [[run, name, pair, *(DASH if (b := scores.get(k)) is None else f"{b:.2f}" for k in kinds)]
             for run, name, pair, scores in rows]
    return ("\n## By corpus and language pair\n\n"
            + md_table(["run", "corpus", "pair", *(f"{k} sacreBLEU" for k in kinds)], table) + "\n")
