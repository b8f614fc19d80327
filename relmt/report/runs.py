"""Reading run directories as relmt-train leaves them: config.yaml and metrics.json (required),
metrics.jsonl (the learning curve) and translations/<split>.<tgt> (for the paired tests)."""

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

METRICS = ("bleu", "tokenized_bleu", "chrf", "lowercased_bleu")  # per split in metrics.json (train/validate.py)
D_MODEL_GUESS = {128: "toy", 256: "small", 512: "base", 1024: "big"}  # runs from before model.name
RULES = ("best", "last", "averaged")
SIGNATURES = {"bleu": "signature", "chrf": "chrf_signature", "tokenized_bleu": "tokenized_signature"}


class ReportError(Exception):
    """Bad input: reported as one line on stderr with exit code 2."""


# --- a sweep job's name: the swept overrides (configs/config.yaml's hydra.sweep.subdir, and the report's run cells)

SWEEP_FUNCTIONS = ("range(", "choice(", "glob(", "interval(")


def override_key(override: str) -> str:
    """The key an override sets, as Hydra's override_dirname and exclude_keys see it: `model.positions` for
    `model.positions=abs,rel`, `+foo=1` and `~foo`; `model` for a group's `model=tiny`."""
    return override.split("=", 1)[0].lstrip("+~")


def is_sweep(override: str) -> bool:
    """Whether a command-line override sweeps (a,b; range, choice, glob, interval), by Hydra's grammar: a quoted
    'a,b' or a list [a,b] is one value. An override the grammar refuses is judged by its text."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        return OverridesParser.create().parse_override(override).is_sweep_override()
    except Exception:  # noqa: BLE001 -- Hydra refuses it where it matters; here it only names a directory
        value = override.partition("=")[2]
        return value.startswith(SWEEP_FUNCTIONS) or ("," in value and value[:1] not in "[{'\"")


def swept_keys(overrides: list[str]) -> set[str]:
    """The keys that a sweep's overrides, as given on the command line, sweep."""
    return {override_key(str(o)) for o in overrides if is_sweep(str(o))}


def sweep_dirname(job: list[str], given: list[str] | None, exclude: list[str] | tuple[str, ...] = ()) -> str:
    """A sweep job's directory name: its own overrides (`job`, Hydra's hydra.overrides.task) of the keys that the
    sweep's overrides as given (`given`, multirun.yaml's) sweep, but the `exclude` keys, sorted and joined as
    Hydra's override_dirname joins them: `model.positions=rel,seed=2`. Where nothing is swept (`relmt-train -m
    seed=1`) or `given` is unknown (None), Hydra's override_dirname itself: every override but the excluded."""
    swept = swept_keys(given) - set(exclude) if given is not None else set()
    keys = swept or {override_key(str(o)) for o in job} - set(exclude)
    return ",".join(sorted(str(o) for o in job if override_key(str(o)) in keys))


def sweep_job_name(path: Path) -> str | None:
    """The sweep_dirname of a run directory made by a sweep (its parent holds Hydra's multirun.yaml, and it
    .hydra/overrides.yaml), so that a sweep made before configs/config.yaml named its jobs so (issue 74) still
    gets the short name; None for a run of its own or files that do not read."""
    try:
        sweep = yaml.safe_load((path.parent / "multirun.yaml").read_text())["hydra"]
        job = yaml.safe_load((path / ".hydra" / "overrides.yaml").read_text())
        exclude = ((sweep.get("job") or {}).get("config") or {}).get("override_dirname", {}).get("exclude_keys")
        return sweep_dirname([str(o) for o in job], [str(o) for o in sweep["overrides"]["task"]], exclude or ())
    except (OSError, yaml.YAMLError, KeyError, TypeError, AttributeError):
        return None


@dataclass(frozen=True)
class Run:
    """What the report needs from one completed run directory."""

    path: Path
    data: str
    model: str  # config.yaml's model.name, or a guess from d_model (model_guessed)
    model_guessed: bool
    d_model: int
    positions: str
    k: int
    keys: bool
    values: bool
    seed: int | None
    beam: int | None
    valid: dict[str, float]  # final validation: metric -> value
    test: dict[str, dict[str, float]]  # split -> metric -> value, in the order of metrics.json
    buckets: list[dict] = field(default_factory=list)  # by_source_length
    length_splits: list[str] = field(default_factory=list)
    tok_label: str | None = None  # how the tokenized BLEU was computed
    lc_label: str | None = None  # how the lowercased tokenized BLEU was computed
    test_rule: str = "unknown"  # the checkpoint the test splits scored: best | last | averaged
    src: str | None = None  # data.src, data.tgt: suffixes of translations/ and reference files
    tgt: str | None = None
    source_splits: dict[str, str] = field(default_factory=dict)  # split -> the corpus's own name for it
    train_max_words: int | None = None  # longest training source in words, where the config records it
    curve: list[tuple[int, float]] = field(default_factory=list)  # (update, valid sacreBLEU)
    wall_seconds: float | None = None
    train_seconds: float | None = None  # time in update steps, summed over resumed sessions
    test_seconds: float | None = None  # the final test decoding and scoring
    tokens_per_s: float | None = None  # target tokens per second of update steps
    cpu: str | None = None  # the machine metrics.json names (runs from before relmt stored it: None)
    device: str | None = None
    threads: int | None = None
    updates: int | None = None  # train.max_steps
    frozen: tuple[str, ...] = ()  # train.freeze
    signatures: dict[str, tuple[str, ...]] = field(default_factory=dict)  # figure -> its sacreBLEU signatures
    settings: tuple[tuple[str, str], ...] = ()  # every setting that can change a result but the seed (`settings`)
    # data.source=corpora: each corpus's (name, src, tgt), and the corpus whose valid split is `valid`
    corpora: tuple[tuple[str, str, str], ...] = ()
    valid_corpus: str | None = None
    sweep_name: str | None = None  # a sweep job's swept overrides (`sweep_job_name`), which name its row

    @property
    def name(self) -> str:
        """How the report's rows name the run: a sweep job by its swept overrides, else its directory's name."""
        return self.sweep_name or self.path.name

    @property
    def minutes(self) -> float | None:
        """Training and validation (at least the update steps' time, which older resumed runs undercount
        in wall_seconds), plus the final test decoding where recorded."""
        seconds = max(self.wall_seconds or 0.0, self.train_seconds or 0.0)
        return (seconds + (self.test_seconds or 0.0)) / 60 if seconds else None

    @property
    def full_rel(self) -> bool:
        return self.keys and self.values  # the paper's relative attention: a^K and a^V

    def score(self, split: str, metric: str = "bleu") -> float | None:
        return (self.valid if split == "valid" else self.test.get(split, {})).get(metric)

    def translations(self, split: str) -> Path | None:
        return self.path / "translations" / f"{split}.{self.tgt}" if self.tgt else None


def find_run_dirs(paths: Iterable[str]) -> list[Path]:
    """Every directory at or under `paths` holding both metrics.json and config.yaml, sorted, once each."""
    found: dict[Path, Path] = {}
    for arg in paths:
        if not Path(arg).is_dir():
            raise ReportError(f"{arg}: not a directory")
        for metrics in Path(arg).rglob("metrics.json"):
            if (metrics.parent / "config.yaml").is_file():
                found.setdefault(metrics.parent.resolve(), metrics.parent)
    return sorted(found.values())


def checkpoint_rule(cfg: dict, metrics: dict) -> str:
    """The test splits' checkpoint rule: the name of the file scored (the loop falls back to last.pt),
    else metrics.json's test_checkpoint_rule, else config.yaml's train.test_checkpoint."""
    named = Path(str(metrics.get("test_checkpoint") or "")).stem
    for rule in (named, metrics.get("test_checkpoint_rule"), (cfg.get("train") or {}).get("test_checkpoint")):
        if rule in RULES:
            return str(rule)
    return "unknown"


def train_max_words(data: dict) -> int | None:
    """data.train_max_src_words (a length-filtered corpus), or the toy corpus's max_words."""
    if data.get("train_max_src_words"):
        return int(data["train_max_src_words"])
    toy = data.get("toy") or {}
    return int(toy["max_words"]) if data.get("source") == "toy" and toy.get("max_words") else None


def read_curve(path: Path) -> list[tuple[int, float]]:
    """(update, valid sacreBLEU) from metrics.jsonl, the last record of each update; a line cut short by
    a kill is skipped."""
    points: dict[int, float] = {}
    for line in path.read_text().split("\n") if path.is_file() else []:
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if isinstance(r, dict) and r.get("tag") == "valid" and isinstance(r.get("step"), int) \
                and isinstance(r.get("bleu"), (int, float)):
            points[r["step"]] = float(r["bleu"])
    return sorted(points.items())


# Settings that never change a run's figures (where it ran, how it logged) or that the report compares
# on their own (the seed); every other key of config.yaml must agree for runs to count as seeds of one
# configuration. data.length_buckets only changes how BLEU by length is cut.
NOT_COMPARED = ("seed", "out_dir", "train.resume", "train.progress", "threads", "train.num_threads",
                "train.device", "train.log_every", "train.dist_timeout_minutes", "data.dir", "data.cache_dir",
                "data.num_proc", "data.length_buckets", "model.name")


def settings(cfg: dict) -> tuple[tuple[str, str], ...]:
    """config.yaml as (key, value) pairs, with today's defaults for keys added since it was written (so a
    run from before data.lowercase agrees with one that has it false), minus NOT_COMPARED."""
    from omegaconf import OmegaConf

    from relmt.config import Config, upgrade_config, upgrade_decode_config

    try:  # the schema's defaults under the saved values (no value checks: "???" stays)
        full = OmegaConf.to_container(OmegaConf.merge(OmegaConf.structured(Config),
                                                      upgrade_config(upgrade_decode_config(cfg))), enum_to_str=True)
    except Exception:  # noqa: BLE001 - a config this relmt cannot read is compared as it is
        full = cfg
    flat = flatten(full, leaves=("splits",))
    return tuple(sorted((k, json.dumps(v, sort_keys=True)) for k, v in flat.items() if k not in NOT_COMPARED))


def flatten(cfg: dict, prefix: str = "", leaves: tuple[str, ...] = ()) -> dict[str, object]:
    """{"model.d_model": 512, ...}: nested dicts as dotted keys, and lists of them by index (data.corpora.0.name: a
    corpus's settings are cells of their own, not one cell of JSON), but for the keys in `leaves` (kept whole)."""
    out: dict[str, object] = {}
    for k, v in cfg.items():
        if isinstance(v, list) and v and all(isinstance(x, dict) for x in v) and k not in leaves:
            v = {str(i): x for i, x in enumerate(v)}
        nested = isinstance(v, dict) and k not in leaves
        out.update(flatten(v, f"{prefix}{k}.", leaves) if nested else {f"{prefix}{k}": v})
    return out


def figures(result: dict) -> dict[str, float]:
    return {m: float(v) for m in METRICS if isinstance(v := result.get(m), (int, float)) and not math.isnan(v)}


def load_run(path: Path) -> Run:
    """Parse one run directory; raises KeyError/TypeError/ValueError on a malformed one."""
    cfg = yaml.safe_load((path / "config.yaml").read_text())
    metrics = json.loads((path / "metrics.json").read_text())
    model, data, train = cfg["model"], cfg["data"], cfg.get("train") or {}
    lengths, valid, tests = (metrics.get(k) or {} for k in ("by_source_length", "final_valid", "test"))
    results = (valid, *tests.values())
    labels = {k: next((r[k] for r in results if r.get(k)), None) for k in ("tokenized_label", "lowercased_label")}
    guessed = not model.get("name")
    corpora = tuple((str(c["name"]), str(c.get("src") or data.get("src")), str(c.get("tgt") or data.get("tgt")))
                    for c in data.get("corpora") or ())
    with_valid = [str(c["name"]) for c in data.get("corpora") or () if c.get("source") == "toy" or
                  "valid" in (c.get("splits") or {})]
    return Run(path=path, data=str(data["name"]), model=str(model.get("name") or D_MODEL_GUESS.get(
                   int(model["d_model"]), f"d{model['d_model']}")), model_guessed=guessed,
               d_model=int(model["d_model"]), positions=str(model["positions"]), k=int(model["max_relative_position"]),
               keys=bool(model["relative_keys"]), values=bool(model["relative_values"]), seed=cfg.get("seed"),
               beam=(cfg.get("decode") or {}).get("beam"), valid=figures(valid),
               test={split: figures(r) for split, r in tests.items() if r.get("bleu") is not None},
               buckets=list(lengths.get("buckets") or []), length_splits=list(lengths.get("splits") or []),
               tok_label=labels["tokenized_label"], lc_label=labels["lowercased_label"],
               test_rule=checkpoint_rule(cfg, metrics), src=data.get("src"), tgt=data.get("tgt"),
               source_splits={str(k): str(v) for k, v in (data.get("splits") or {}).items()},
               train_max_words=train_max_words(data), curve=read_curve(path / "metrics.jsonl"),
               wall_seconds=metrics.get("wall_seconds"), train_seconds=metrics.get("train_seconds"),
               test_seconds=metrics.get("test_seconds"), tokens_per_s=metrics.get("tokens_per_s"),
               cpu=(metrics.get("host") or {}).get("cpu"), device=train.get("device"),
               threads=cfg.get("threads", train.get("num_threads")), updates=train.get("max_steps"),
               frozen=tuple(str(p) for p in train.get("freeze") or ()),
               signatures={m: tuple(sorted({str(r[k]) for r in results if r.get(k)})) for m, k in SIGNATURES.items()},
               settings=settings(cfg), corpora=corpora,
               valid_corpus=data.get("valid_corpus") or (with_valid[0] if with_valid else None),
               sweep_name=sweep_job_name(path))


def read_runs(dirs: list[Path]) -> tuple[list[Run], list[tuple[Path, str]]]:
    """Completed runs, and (dir, reason) for each one left out (one broken directory hides no other)."""
    runs, skipped = [], []
    for path in dirs:
        try:
            status = json.loads((path / "metrics.json").read_text()).get("status")
            if status != "completed":
                skipped.append((path, f'status "{status}"'))
                continue
            runs.append(load_run(path))
        except (OSError, KeyError, TypeError, ValueError, AttributeError, yaml.YAMLError) as exc:
            skipped.append((path, f"unreadable ({type(exc).__name__}: {exc})"))
    return runs, skipped
