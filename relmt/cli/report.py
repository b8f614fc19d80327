"""`relmt-report`: the paper's tables, claims and plots, or a row per run, from relmt-train run directories.

    relmt-report RUN_DIRS... out=DIR name=NAME [kind=K] [title=T] [command=C] [refs=DIR | refs=[DATA=DIR,...]]
                 [bootstrap_samples=1000] [train_max_words=N | train_max_words=[DATA=N,...]] [overwrite=false]

RUN_DIRS are run directories or folders holding them (searched recursively). Runs not "completed" and duplicates
(the seed and settings of another run) are skipped and listed; runs averaged as seeds whose other settings differ get
a warning. Runs are grouped by data set and model preset, seeds shown as mean ± sample std (n); a sweep job's row is
named after its values of the swept keys (model.positions=rel,seed=2). kind=tables writes
NAME.md (Tables 1-3, the paired tests seed by seed with refs=, BLEU by source length, learning curves, the claims),
NAME_k.png (a k sweep), NAME_length.png, NAME_curves.png and NAME.json; runs (the default unless the runs are on
the paper's data or a claim has a paired test) NAME.md, a row per run, and NAME.json; length (the default for
name=length) NAME.md, NAME_buckets.png and NAME.json, the buckets longer than training marked; tuning NAME.md.
refs: the folder of the reference files {split}.{tgt} (and {split}.{src} for kind=length), which enables the paired
bootstrap tests on each run's translations/; DATA=DIR for the runs of data set DATA only (config.yaml's data.name).
train_max_words: for kind=length, the longest training source in words of runs whose config does not record it.
A report of the same name in out is not replaced unless overwrite=true. The --out DIR, --name NAME (...) options of
before still work, with a note to use key=value.
"""

import json
import re
import sys
from dataclasses import asdict, dataclass, field, is_dataclass
from pathlib import Path
from typing import Any

from relmt.cli.common import closest, guarded, parse_args
from relmt.errors import UserError
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
    """refs= values: "DIR" (key None: every data set) or "DATA=DIR" (one data set; DATA has no "/")."""
    out: dict[str | None, Path] = {}
    for value in values:
        data, sep, folder = value.partition("=")
        data, folder = (data, folder) if sep and "/" not in data else (None, value)
        if not Path(folder).is_dir():
            raise ReportError(f"refs={value}: {folder} is not a directory")
        out[data] = Path(folder)
    return out


def parse_cutoffs(values: list[str]) -> dict[str | None, int]:
    """train_max_words= values: "N" (key None: every data set) or "DATA=N"."""
    out: dict[str | None, int] = {}
    for value in values:
        data, _, n = value.rpartition("=")
        if not n.isdigit() or int(n) < 1:
            raise ReportError(f"train_max_words={value}: give N or DATA=N with N >= 1 words")
        out[data or None] = int(n)
    return out


@dataclass
class ReportArgs:
    out: str = "???"  # the output folder
    name: str = "???"  # the output files' base name: NAME.md, NAME.json, NAME_*.png
    kind: str = ""  # tables | runs | length | tuning; "": length for name=length, else tables or runs by the runs
    title: str = ""  # the markdown title (default: Results, Runs, Length generalisation or Tuning)
    command: str = ""  # the command that produced the runs, quoted in the report
    refs: list[str] = field(default_factory=list)  # DIR or DATA=DIR: the reference files, for the paired tests
    bootstrap_samples: int = 1000  # paired bootstrap resamples
    train_max_words: list[str] = field(default_factory=list)  # N or DATA=N (kind=length)
    overwrite: bool = False  # replace a report of the same name in out


KINDS = ("tables", "runs", "length", "tuning")
EXAMPLE = "relmt-report runs/mine out=reports name=mine"
TEXT_KEYS = ("out", "name", "kind", "title", "command")  # taken as written: a title may hold ': ' or '#'
LIST_KEYS = ("refs", "train_max_words")  # repeatable, or one [a,b] list
# the options of before issue 74, which still work (with a note)
OLD_OPTIONS = {"--out": "out", "--name": "name", "--kind": "kind", "--title": "title", "--command": "command",
               "--refs": "refs", "--bootstrap-samples": "bootstrap_samples", "--train-max-words": "train_max_words"}
ARGUMENT = re.compile(r"[A-Za-z_]\w*=")


def yaml_text(value: str) -> str:
    """`value` as a single-quoted YAML string, its ${...} escaped for OmegaConf, so that parse_args reads it as
    written (a title may hold ': ', '#' or a quote; a command a shell's ${VAR})."""
    return "'" + value.replace("'", "''").replace("${", "\\${") + "'"


def split_argv(argv: list[str]) -> tuple[list[str], list[tuple[str, str]], list[str]]:
    """The run directories, the (key, value) arguments and the old options used. A word is an argument when it
    starts with key= (key a plain name: a sweep job's directory, model.positions=rel, or a path with a / is a
    run directory) and is not an existing path; --out DIR and the other options of before become arguments."""
    dirs, pairs, old = [], [], []
    words = iter(argv)
    for word in words:
        option, eq, value = word.partition("=")
        if option in OLD_OPTIONS:
            if not eq:
                value = next(words, None)
                if value is None:
                    raise UserError(f"{option} needs a value; write {OLD_OPTIONS[option]}=... (e.g. {EXAMPLE})")
            pairs.append((OLD_OPTIONS[option], value))
            old.append(option)
        elif word.startswith("-"):
            raise UserError(f"{word}: relmt-report takes key=value arguments, e.g. {EXAMPLE} (relmt-report --help)")
        elif ARGUMENT.match(word) and not Path(word).exists():
            pairs.append((option, value))
        else:
            dirs.append(word)
    return dirs, pairs, old


def read_args(argv: list[str]) -> tuple[list[str], ReportArgs]:
    """The run directories and the checked arguments (relmt.cli.common.parse_args, as every command's)."""
    import yaml

    dirs, pairs, old = split_argv(argv)
    if old:
        said = ", ".join(dict.fromkeys(old))
        print(f"relmt-report: note: {said} {'is' if len(old) == 1 else 'are'} deprecated; write "
              f"{', '.join(dict.fromkeys(OLD_OPTIONS[o] + '=...' for o in old))} (key=value, as the other commands)",
              file=sys.stderr)
    args, lists = [], {key: [] for key in LIST_KEYS}
    for key, value in pairs:
        if key in lists:
            try:
                loaded = yaml.safe_load(value) if value.startswith("[") else None
            except yaml.YAMLError:
                raise UserError(f"{key}={value}: not a list YAML can read; give {key}=VALUE, once per value") from None
            lists[key] += [str(v) for v in loaded] if isinstance(loaded, list) else [value]
        else:
            args.append(f"{key}={yaml_text(value) if key in TEXT_KEYS else value}")
    args += [f"{key}=[{', '.join(map(yaml_text, values))}]" for key, values in lists.items() if values]
    parsed = parse_args(ReportArgs, args, EXAMPLE)
    if not dirs:
        raise UserError(f"no run directories: give them before the arguments, e.g. {EXAMPLE}")
    if parsed.kind and parsed.kind not in KINDS:
        raise UserError(f"kind={parsed.kind}: not a report kind{closest(parsed.kind, list(KINDS))}; the kinds are "
                        f"{', '.join(KINDS)}")
    if parsed.bootstrap_samples < 1:
        raise UserError(f"bootstrap_samples={parsed.bootstrap_samples}: must be >= 1")
    parsed.kind = parsed.kind or ("length" if parsed.name == "length" else "")  # "": tables or runs, by the runs
    return dirs, parsed


def refuse_to_overwrite(out: Path, name: str) -> None:
    """A report of this name in `out` (NAME.md or NAME.json) is replaced only with overwrite=true."""
    there = [p for p in (out / f"{name}.md", out / f"{name}.json") if p.is_file()]
    if there:
        raise UserError(f"{there[0]}: a report named {name} is there already; give overwrite=true to replace it, "
                        f"or another name= or out=")


def _report(argv: list[str]) -> None:
    dirs, args = read_args(argv)
    out = Path(args.out)
    if not args.overwrite:
        refuse_to_overwrite(out, args.name)
    try:
        refs = parse_refs(args.refs)
        title = args.title or {"length": "Length generalisation", "tuning": "Tuning"}.get(args.kind, "Results")
        command = args.command or None
        if args.kind == "tuning":
            out.mkdir(parents=True, exist_ok=True)
            write_page(out / f"{args.name}.md", text := tuning_markdown(dirs, title, command))
        elif args.kind == "length":
            report = build_report(dirs, title, command, refs, args.bootstrap_samples,
                                  parse_cutoffs(args.train_max_words))
            text = write_outputs(report, out, args.name, args.kind)
        else:
            report = build_report(dirs, title, command, refs, args.bootstrap_samples)
            kind = args.kind or ("tables" if paper_experiment(report) else "runs")
            report.title = args.title or ("Results" if kind == "tables" else "Runs")
            text = write_outputs(report, out, args.name, kind)
    except ReportError as exc:
        raise UserError(str(exc)) from None
    print(text, end="")


def main(argv: list[str] | None = None) -> int:
    """Console script `relmt-report`: exit 0, or 2 with one line on stderr for bad input."""
    return guarded("relmt-report", _report, argv)


if __name__ == "__main__":
    sys.exit(main())
