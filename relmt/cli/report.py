"""`relmt-report`: the paper's tables, claims and plots, or a row per run, from relmt-train run directories.

    relmt-report RUN_DIRS... --out DIR --name NAME [--kind K] [--title T] [--command C] [--refs DIR | DATA=DIR ...]

RUN_DIRS are run directories or folders holding them (searched recursively). Runs not "completed" and duplicates
(the seed and settings of another run) are skipped and listed; runs averaged as seeds whose other settings differ get
a warning. Runs are grouped by data set and model preset, seeds shown as mean ± sample std (n). --kind tables writes
NAME.md (Tables 1-3, the paired tests seed by seed with --refs, BLEU by source length, learning curves, the claims),
NAME_k.png (a k sweep), NAME_length.png, NAME_curves.png and NAME.json; runs (the default unless the runs are on
the paper's data or a claim has a paired test) NAME.md, a row per run, and NAME.json; length (the default for --name
length) NAME.md, NAME_buckets.png and NAME.json, the buckets longer than training marked; tuning NAME.md.
"""

import argparse
import json
import re
import sys
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

from relmt.report.aggregate import seeds_of
from relmt.report.build import Report, build_report
from relmt.report.markdown import length_markdown, markdown, runs_markdown, tuning_markdown
from relmt.report.paper import PaperNumbers
from relmt.report.plots import plot_curves, plot_k, plot_length
from relmt.report.runs import ReportError
from relmt.report.tables import k_sweep
from relmt.report.verdicts import NOT_TESTED, RULES


def jsonable(obj: Any) -> Any:
    """Stats, claims, comparisons and paths as plain JSON values; tuple keys never occur."""
    if is_dataclass(obj):  # a run's settings are its config.yaml, which lies beside it
        return jsonable({k: v for k, v in asdict(obj).items() if k != "settings"})
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    return str(obj) if isinstance(obj, Path) else obj


def report_json(report: Report) -> dict:
    groups = [{"data": g.data, "model": g.model, "model_guessed": any(r.model_guessed for r in g.runs), "pair": g.pair,
               "refs": g.refs, "paper_numbers": g.numbers.value, "d_model": g.runs[0].d_model, "k_default": g.k_default,
               "splits": g.splits, "main_split": g.main_split, "seeds": seeds_of(g.runs),
               "runs": [str(r.path) for r in g.runs], "tables": g.tables, "significance": g.significance,
               "curves": g.curves, "claims": g.claims, "variants": [str(r.path) for r in g.variants],
               "controls": g.controls, "stages": g.stages} for g in report.groups]
    doc = {"title": report.title, "command": report.command, "sources": report.sources, "seeds": seeds_of(report.runs),
           "runs": report.runs, "refs": {data or "*": folder for data, folder in report.refs.items()},
           "bootstrap_samples": report.n_samples, "skipped": [{"dir": p, "reason": why} for p, why in report.skipped],
           "warnings": report.warnings, "verdict_rules": RULES, "groups": groups}
    if "length" in report.extra:
        doc["length"] = [{"group": i.group.name, "train_max_words": i.max_words, "source": i.source,
                          "table": i.table, "significance": i.significance, "claims": i.claims}
                         for i in report.extra["length"]]
    return jsonable(doc)


STAMP = re.compile(r"^This report: .*$", re.M)  # the date, host and git hash a page was made with


def write_page(path: Path, text: str) -> None:
    """Write a report page, unless the one there differs only in its "This report: <date>, ..., git <hash>"
    line: a rerun over the same runs then leaves every page as it was (issue 45 §6)."""
    if path.is_file() and STAMP.sub("", path.read_text()) == STAMP.sub("", text):
        return
    path.write_text(text)


def write_outputs(report: Report, out: Path, name: str, kind: str) -> str:
    """Write the markdown, the plots and the JSON of `kind` into `out`; return the markdown."""
    out.mkdir(parents=True, exist_ok=True)
    if kind == "runs":
        text = runs_markdown(report)
    elif kind == "length":
        text = length_markdown(report, name)
        plot_length([(i.group.name, i.table, i.max_words) for i in report.extra["length"] if i.table],
                    out / f"{name}_buckets.png")
    else:
        text = markdown(report, name)
        k_plot = out / f"{name}_k.png"
        if k_sweep(report.groups):
            plot_k(report.groups, k_plot)
        else:  # a single k is no sweep; a plot left from an earlier report of these runs would mislead
            k_plot.unlink(missing_ok=True)
        plot_length([(g.name, g.tables["length"], None) for g in report.groups if g.tables["length"]],
                    out / f"{name}_length.png")
        plot_curves(report.groups, out / f"{name}_curves.png")
    write_page(out / f"{name}.md", text)
    (out / f"{name}.json").write_text(json.dumps(report_json(report), indent=2, ensure_ascii=False) + "\n")
    return text


def paper_experiment(report: Report) -> bool:
    """Whether the paper's columns, claims and rules apply: runs on one of its data sets, or a claim with a test."""
    return any(g.numbers == PaperNumbers.same or any(c.verdict != NOT_TESTED for c in g.claims) for g in report.groups)


def parse_refs(values: list[str]) -> dict[str | None, Path]:
    """--refs values: "DIR" (key None: every data set) or "DATA=DIR" (one data set; DATA has no "/")."""
    out: dict[str | None, Path] = {}
    for value in values:
        data, sep, folder = value.partition("=")
        data, folder = (data, folder) if sep and "/" not in data else (None, value)
        if not Path(folder).is_dir():
            raise ReportError(f"--refs {value}: {folder} is not a directory")
        out[data] = Path(folder)
    return out


def parse_cutoffs(values: list[str]) -> dict[str | None, int]:
    """--train-max-words values: "N" (key None: every data set) or "DATA=N"."""
    out: dict[str | None, int] = {}
    for value in values:
        data, _, n = value.rpartition("=")
        if not n.isdigit() or int(n) < 1:
            raise ReportError(f"--train-max-words {value}: give N or DATA=N with N >= 1 words")
        out[data or None] = int(n)
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="relmt-report", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR",
                        help="run directories, or directories containing them (searched recursively)")
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument("--name", required=True, help="base name of the output files")
    parser.add_argument("--kind", choices=("tables", "runs", "length", "tuning"), default=None,
                        help="tables (the paper's; the default for runs on its data sets or with a paired test), "
                             "runs (a row per run; the default otherwise), length (the default for --name length), "
                             "or tuning (valid split only, the settings in which the runs differ)")
    parser.add_argument("--title", default=None, help="markdown title (default: Results, Runs, or Length "
                                                      "generalisation)")
    parser.add_argument("--command", default=None, help="the command that produced the runs, quoted in the report")
    parser.add_argument("--refs", action="append", default=[], metavar="DIR|DATA=DIR",
                        help="folder of the reference files {split}.{tgt} (and {split}.{src} for --kind length): "
                             "enables the paired bootstrap tests on each run's translations/; DATA=DIR for the runs "
                             "of data set DATA only (config.yaml's data.name); repeatable")
    parser.add_argument("--bootstrap-samples", type=int, default=1000, help="paired bootstrap resamples (1000)")
    parser.add_argument("--train-max-words", action="append", default=[], metavar="N|DATA=N",
                        help="--kind length: the longest training source in words, for runs whose config does not "
                             "record it (DATA=N: only for data set DATA); repeatable")
    args = parser.parse_args(argv)
    args.kind = args.kind or ("length" if args.name == "length" else None)  # None: tables or runs, by the runs
    if args.bootstrap_samples < 1:
        parser.error("--bootstrap-samples must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    """Console script `relmt-report`: exit 0, or 2 with one line on stderr for bad input."""
    args = parse_args(argv)
    try:
        refs = parse_refs(args.refs)
        title = args.title or {"length": "Length generalisation", "tuning": "Tuning"}.get(args.kind, "Results")
        if args.kind == "tuning":
            args.out.mkdir(parents=True, exist_ok=True)
            write_page(args.out / f"{args.name}.md", text := tuning_markdown(args.run_dirs, title, args.command))
        elif args.kind == "length":
            report = build_report(args.run_dirs, title, args.command, refs, args.bootstrap_samples,
                                  parse_cutoffs(args.train_max_words))
            text = write_outputs(report, args.out, args.name, args.kind)
        else:
            report = build_report(args.run_dirs, title, args.command, refs, args.bootstrap_samples)
            kind = args.kind or ("tables" if paper_experiment(report) else "runs")
            report.title = args.title or ("Results" if kind == "tables" else "Runs")
            text = write_outputs(report, args.out, args.name, kind)
    except ReportError as exc:
        print(f"relmt-report: error: {exc}", file=sys.stderr)
        return 2
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
