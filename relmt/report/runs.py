"""Reading run directories as relmt-train leaves them.

A run directory holds config.yaml (the resolved config), metrics.json (status, final validation,
test scores, BLEU by source length), metrics.jsonl (one record per logged event; the "valid" ones
give the learning curve) and translations/<split>.<tgt> (one hypothesis per line). Only the first
two are required; a report section that needs a missing file says so instead of failing.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

# The figures stored per split in metrics.json (relmt/train/validate.py writes them).
METRICS = ("bleu", "tokenized_bleu", "chrf", "lowercased_bleu")
# Runs from before ModelConfig.name: the size guessed from d_model, as the old scripts/paper_tables.py did.
D_MODEL_GUESS = {128: "toy", 256: "small", 512: "base", 1024: "big"}
RULES = ("best", "last", "averaged")
# The sacreBLEU signature metrics.json stores beside a figure (relmt/train/validate.py), by figure.
SIGNATURES = {"bleu": "signature", "chrf": "chrf_signature", "tokenized_bleu": "tokenized_signature"}


class ReportError(Exception):
    """Bad input: reported as one line on stderr with exit code 2."""


@dataclass(frozen=True)
class Run:
    """What the report needs from one completed run directory."""

    path: Path
    data: str
    model: str  # the model preset's name (config.yaml's model.name), or a guess from d_model
    model_guessed: bool  # True for a run whose config.yaml predates model.name
    d_model: int
    positions: str
    k: int
    keys: bool
    values: bool
    seed: int | None
    beam: int | None
    valid: dict[str, float]  # final validation: metric -> value (METRICS)
    test: dict[str, dict[str, float]]  # split -> metric -> value, in the order of metrics.json
    buckets: list[dict] = field(default_factory=list)  # by_source_length buckets
    length_splits: list[str] = field(default_factory=list)
    tok_label: str | None = None  # how the tokenized BLEU was computed (Moses language etc.)
    lc_label: str | None = None  # how the lowercased tokenized BLEU was computed
    test_rule: str = "unknown"  # which checkpoint the test splits scored: best | last | averaged
    src: str | None = None  # data.src and data.tgt: the suffixes of translations/ and reference files
    tgt: str | None = None
    source_splits: dict[str, str] = field(default_factory=dict)  # split -> the corpus's own split name
    train_max_words: int | None = None  # longest training source in words, if the config records it
    curve: list[tuple[int, float]] = field(default_factory=list)  # (update, valid sacreBLEU)
    wall_seconds: float | None = None
    train_seconds: float | None = None  # time in update steps, summed over resumed sessions
    test_seconds: float | None = None  # the final test decoding and scoring (recorded since issue 12)
    device: str | None = None
    threads: int | None = None
    updates: int | None = None  # train.max_steps
    frozen: tuple[str, ...] = ()  # train.freeze: parameter patterns kept at their initial values
    signatures: dict[str, tuple[str, ...]] = field(default_factory=dict)  # figure -> its sacreBLEU signatures

    @property
    def minutes(self) -> float | None:
        """Wall time in minutes: training and validation (at least the update steps' time, which a run
        resumed before metrics.json summed wall time over sessions, keeping the last session's, still
        sums), plus the final test decoding where the run recorded it."""
        seconds = max(self.wall_seconds or 0.0, self.train_seconds or 0.0)
        return (seconds + (self.test_seconds or 0.0)) / 60 if seconds else None

    @property
    def full_rel(self) -> bool:
        """a^K and a^V both on: the paper's relative attention."""
        return self.keys and self.values

    def score(self, split: str, metric: str = "bleu") -> float | None:
        """A figure of the final validation (split "valid") or of a test split; None if absent."""
        return (self.valid if split == "valid" else self.test.get(split, {})).get(metric)

    def translations(self, split: str) -> Path | None:
        """translations/<split>.<tgt>, the hypotheses the test split was scored on."""
        return self.path / "translations" / f"{split}.{self.tgt}" if self.tgt else None


def find_run_dirs(paths: Iterable[str]) -> list[Path]:
    """Every directory at or under `paths` holding both metrics.json and config.yaml, sorted, once each."""
    found: dict[Path, Path] = {}
    for arg in paths:
        root = Path(arg)
        if not root.is_dir():
            raise ReportError(f"{arg}: not a directory")
        for metrics in root.rglob("metrics.json"):
            if (metrics.parent / "config.yaml").is_file():
                found.setdefault(metrics.parent.resolve(), metrics.parent)
    return sorted(found.values())


def model_name(model: dict) -> tuple[str, bool]:
    """(preset name, guessed?): model.name when config.yaml records it, else the old guess from d_model."""
    if model.get("name"):
        return str(model["name"]), False
    d = int(model["d_model"])
    return D_MODEL_GUESS.get(d, f"d{d}"), True


def checkpoint_rule(cfg: dict, metrics: dict) -> str:
    """The checkpoint rule of the test splits: the name of metrics.json's test_checkpoint, the file
    that was scored (best.pt, last.pt, averaged.pt; the loop falls back to last.pt when the asked-for
    one is missing), else metrics.json's test_checkpoint_rule, else config.yaml's
    train.test_checkpoint, else "unknown"."""
    named = Path(str(metrics.get("test_checkpoint") or "")).stem
    for rule in (named, metrics.get("test_checkpoint_rule"), (cfg.get("train") or {}).get("test_checkpoint")):
        if rule in RULES:
            return str(rule)
    return "unknown"


def train_max_words(data: dict) -> int | None:
    """The longest training source in words, where the config says: data.train_max_src_words (a
    length-filtered corpus), or the toy corpus's max_words (its train split has 1..L words)."""
    if data.get("train_max_src_words"):
        return int(data["train_max_src_words"])
    if data.get("source") == "toy" and (data.get("toy") or {}).get("max_words"):
        return int(data["toy"]["max_words"])
    return None


def read_curve(path: Path) -> list[tuple[int, float]]:
    """(update, valid sacreBLEU) from metrics.jsonl's "valid" records, the last record of each update
    (a resumed run logs some again); [] without the file. A line cut short by a kill is skipped."""
    if not path.is_file():
        return []
    points: dict[int, float] = {}
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if (isinstance(record, dict) and record.get("tag") == "valid" and isinstance(record.get("step"), int)
                and isinstance(record.get("bleu"), (int, float))):
            points[record["step"]] = float(record["bleu"])
    return sorted(points.items())


def figures(result: dict) -> dict[str, float]:
    """The METRICS present (and finite) in one split's result."""
    out = {}
    for m in METRICS:
        value = result.get(m)
        if isinstance(value, (int, float)) and not math.isnan(value):
            out[m] = float(value)
    return out


def load_run(path: Path) -> Run:
    """Parse one run directory; raises KeyError/TypeError/ValueError on a malformed one."""
    cfg = yaml.safe_load((path / "config.yaml").read_text())
    metrics = json.loads((path / "metrics.json").read_text())
    model, decode, data, train = cfg["model"], cfg.get("decode") or {}, cfg["data"], cfg.get("train") or {}
    name, guessed = model_name(model)
    lengths = metrics.get("by_source_length") or {}
    valid, tests = metrics.get("final_valid") or {}, metrics.get("test") or {}
    results = (valid, *tests.values())
    tok_labels = [r["tokenized_label"] for r in results if r.get("tokenized_label")]
    lc_labels = [r["lowercased_label"] for r in results if r.get("lowercased_label")]
    return Run(path=path, data=str(data["name"]), model=name, model_guessed=guessed, d_model=int(model["d_model"]),
               positions=str(model["positions"]), k=int(model["max_relative_position"]),
               keys=bool(model["relative_keys"]), values=bool(model["relative_values"]),
               seed=cfg.get("seed"), beam=decode.get("beam"), valid=figures(valid),
               test={split: figures(r) for split, r in tests.items() if r.get("bleu") is not None},
               buckets=list(lengths.get("buckets") or []), length_splits=list(lengths.get("splits") or []),
               tok_label=tok_labels[0] if tok_labels else None, lc_label=lc_labels[0] if lc_labels else None,
               test_rule=checkpoint_rule(cfg, metrics), src=data.get("src"), tgt=data.get("tgt"),
               source_splits={str(k): str(v) for k, v in (data.get("splits") or {}).items()},
               train_max_words=train_max_words(data), curve=read_curve(path / "metrics.jsonl"),
               wall_seconds=metrics.get("wall_seconds"), train_seconds=metrics.get("train_seconds"),
               test_seconds=metrics.get("test_seconds"),
               device=train.get("device"), threads=train.get("num_threads"), updates=train.get("max_steps"),
               frozen=tuple(str(p) for p in train.get("freeze") or ()),
               signatures={m: tuple(sorted({str(r[k]) for r in results if r.get(k)})) for m, k in SIGNATURES.items()})


def read_runs(dirs: list[Path]) -> tuple[list[Run], list[tuple[Path, str]]]:
    """Completed runs, and (dir, reason) for each one left out."""
    runs, skipped = [], []
    for path in dirs:
        try:
            status = json.loads((path / "metrics.json").read_text()).get("status")
            if status != "completed":
                skipped.append((path, f'status "{status}"'))
                continue
            runs.append(load_run(path))
        except (OSError, KeyError, TypeError, ValueError, AttributeError, yaml.YAMLError) as exc:
            # One broken directory in a sweep should not hide the others; it is listed as skipped.
            skipped.append((path, f"unreadable ({type(exc).__name__}: {exc})"))
    return runs, skipped


def read_lines(path: Path) -> list[str]:
    """A text file's lines without their newlines (translations and references are one per line)."""
    return path.read_text(encoding="utf-8").splitlines()
