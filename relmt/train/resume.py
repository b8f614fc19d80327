"""What makes a run resumable: the counters saved beside the weights, the checkpoint a resume
continues from (with a fallback when last.pt is damaged), the check that the resumed settings,
data and number of ranks still describe the same run, and the trimming of what was logged after
the saved step.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from relmt import checkpoint
from relmt.config import BestMetric, Config, DataConfig, TrainConfig, to_dict, upgrade_config
from relmt.data.dataset import cache_key
from relmt.errors import UserError
from relmt.train import distributed

log = logging.getLogger(__name__)

# Settings that change the data or the batch order: a resume with other values would not continue
# the saved run but silently train on other batches. Other settings (max_steps, eval_every,
# logging, device, decoding) may change on resume.
BATCH_ORDER_KEYS = ("seed", "train.max_padded_tokens", "train.max_sentences", "train.update_freq", "train.batch_by",
                    "data.spm_alpha", "data.spm_nbest")  # the last two: subword regularisation's sampled pieces
# batch-order keys added since some runs were saved, with the value those runs trained with
BATCH_ORDER_BEFORE = {"train.batch_by": "source", "data.spm_alpha": 0.0, "data.spm_nbest": -1}
DATA_KEYS_FREE_ON_RESUME = ("data.cache_dir", "data.num_proc", "data.length_buckets")
# Where the corpus lies: checkpoints that record the data's cache key (content-based) compare that
# instead, so the same corpus copied or moved elsewhere resumes.
DATA_LOCATION_KEYS = ("data.dir", "data.hf_path")


@dataclass
class TrainState:
    """Counters that, with the weights, optimizer and RNG, make a resumed run continue exactly."""

    step: int = 0
    epoch: int = 0
    batch: int = 0  # the next micro-batch of `epoch`
    best_value: float | None = None
    best_step: int = 0
    best_metric: str | None = None  # what best_value is: "bleu" or "loss" (the metric that picked best.pt)
    validations_since_best: int = 0  # validations in a row without a new best (train.patience)
    bad_in_row: int = 0
    bad_total: int = 0
    train_seconds: float = 0.0
    wall_seconds: float = 0.0  # the run's wall time up to its last checkpoint, summed over resumed sessions
    src_tokens: int = 0
    tgt_tokens: int = 0
    init_from: dict | None = None  # the checkpoint that seeded the run (train.init_from): path, step, checksum
    # the latest validation's figures: metrics.json's final_valid, kept here so that a run resumed
    # after its last update (stopped during the test decoding) still reports them
    last_valid: dict = field(default_factory=dict)
    # source=corpora: the pairs and target tokens trained on from each corpus so far, summed over ranks
    mix_pairs: list[int] = field(default_factory=list)
    mix_tokens: list[int] = field(default_factory=list)


def batch_source(data: DataConfig, world_size: int) -> dict:
    """What the batches depend on besides the config's batch-order keys, saved in checkpoints as
    "batches": the data's content (its cache key, which ignores where the files lie) and the number
    of ranks (each rank draws its own share of every epoch's batches)."""
    out = {"data": cache_key(data), "world_size": world_size}
    if data.corpora:  # the weights decide each epoch's pairs, though not the cached data
        out["mix"] = {c.name: c.weight for c in data.corpora}
    return out


def resume_checkpoint(ckpt_dir: Path) -> tuple[Path, dict]:
    """checkpoints/last.pt, or if it cannot be read, the newest step_N.pt that can (a crash or a
    full disk may damage last.pt while an older step file is intact)."""
    last = ckpt_dir / "last.pt"
    try:
        return last, checkpoint.load(last)
    except UserError as e:
        problem = e
    for path in reversed(checkpoint.step_files(ckpt_dir)):
        try:
            ck = checkpoint.load(path)
        except UserError as e:
            log.warning("%s", e)
            continue
        log.warning("%s; resuming from %s instead, the newest readable step checkpoint", problem, path)
        return path, ck
    raise UserError(f"{problem}; and no readable step_N.pt in {ckpt_dir} to resume from instead")


def flat(values: dict, prefix: str = "") -> dict[str, object]:
    """{"train": {"peak_lr": 1}} -> {"train.peak_lr": 1}"""
    out: dict[str, object] = {}
    for k, v in values.items():
        if isinstance(v, dict):
            out.update(flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def check_resume_config(saved: dict, current: dict, path: Path, saved_batches: dict | None = None,
                        batches: dict | None = None) -> None:
    """Refuse a resume whose model, data or batch order differs from the saved run's; log the
    other settings that changed. Keys one side lacks (added to relmt since) are not compared.
    With `saved_batches` and `batches` (batch_source() of the checkpoint and of this run) the data
    is compared by content, and the number of ranks must match."""
    old, new = {**BATCH_ORDER_BEFORE, **flat(saved)}, flat(current)
    free = ("train.resume", "train.overwrite", "out_dir")
    changed = [k for k in new if k in old and old[k] != new[k] and k not in free]
    data_keys = [k for k in changed if k.startswith("data.") and k not in DATA_KEYS_FREE_ON_RESUME]
    by_content = saved_batches is not None and batches is not None and "data" in saved_batches
    data_differs = not by_content or saved_batches["data"] != batches["data"]
    settings = [k for k in data_keys if not by_content or k not in DATA_LOCATION_KEYS]
    refused = [k for k in changed if k.startswith("model.") or k in BATCH_ORDER_KEYS
               or (k in settings and data_differs)]
    if refused:
        diffs = ", ".join(f"{k}={new[k]} (saved: {old[k]})" for k in refused)
        raise UserError(f"{path}: cannot resume with {diffs}: the model, data or batch order would differ "
                        "from the saved run's; restore those settings, or start a new run directory")
    if by_content and data_differs:  # the same data settings: the files themselves differ
        where = {"text": f"data.dir={new.get('data.dir')}", "hf": f"data.hf_path={new.get('data.hf_path')}"}.get(
            str(new.get("data.source")), "the toy corpus (relmt/data/toy.py changed)")
        raise UserError(f"{path}: cannot resume: the data in {where} differs from the saved run's (cache key "
                        f"{batches['data']}, saved: {saved_batches['data']}), so the batches would too; "
                        "point data.* at the saved run's corpus, or start a new run directory")
    if batches is not None and saved_batches is not None and batches["world_size"] != saved_batches["world_size"]:
        n, m = batches["world_size"], saved_batches["world_size"]
        raise UserError(f"{path}: cannot resume on {n} rank{'s' * (n != 1)} (saved on {m}): every rank's batches "
                        f"would differ from the saved run's; resume with {m} (torchrun --nproc-per-node {m}), "
                        "or start a new run directory")
    if batches is not None and saved_batches is not None and batches.get("mix") != saved_batches.get("mix"):
        raise UserError(f"{path}: cannot resume with the corpus weights {batches.get('mix')} (saved: "
                        f"{saved_batches.get('mix')}): every epoch would draw other pairs; restore data.corpora's "
                        "weights, or start a new run directory")
    if changed:
        log.info("resuming with changed settings: %s", ", ".join(f"{k}={new[k]} (was {old[k]})" for k in changed))


def open_checkpoint(cfg: Config, ckpt_dir: Path, batches: dict) -> tuple[Path | None, dict | None]:
    """With train.resume, the checkpoint to continue from and its contents, its config and
    `batches` (batch_source() of this run) checked against it; else (None, None), refusing (unless
    train.overwrite=true) a run directory that already holds a checkpoint (last.pt, or a step_N.pt
    saved just before a kill kept last.pt from being linked). With train.init_from as well, a run directory without
    checkpoints starts a fresh run from it instead (so that the same command can be requeued:
    relmt/train/init.py)."""
    last = ckpt_dir / "last.pt"
    saved_any = last.is_file() or bool(checkpoint.step_files(ckpt_dir))
    if cfg.train.overwrite:
        if cfg.train.resume:
            raise UserError("train.overwrite=true and train.resume=true ask for opposite things: overwrite trains "
                            "again from scratch, resume continues the saved run; pass one of them")
        return None, None
    if not cfg.train.resume:
        if saved_any:
            found = last if last.is_file() else checkpoint.step_files(ckpt_dir)[-1]
            raise UserError(f"{cfg.out_dir} already holds a run ({found}): pass train.resume=true to continue "
                            "it, train.overwrite=true to train again from scratch (replacing its checkpoints and "
                            "results), or choose another hydra.run.dir")
        return None, None
    if not saved_any:  # a requeued job that was stopped (or never started) before its first checkpoint
        log.info("train.resume=true: no checkpoint in %s yet, so the run starts from %s", ckpt_dir,
                 "train.init_from" if cfg.train.init_from else "scratch")
        return None, None
    path, ck = resume_checkpoint(ckpt_dir)
    saved = upgrade_config(ck["config"])
    if saved is not ck["config"]:
        renamed = sorted(set(saved["train"]) - set(ck["config"]["train"]))
        log.info("%s: saved before train.lr and train.max_tokens were renamed; read as %s", path,
                 ", ".join(f"train.{k}" for k in renamed))
    # checkpoints saved before "batches" hold one RNG state per rank: their number is the world size
    saved_batches = ck.get("batches") or {"world_size": len(ck["rng"])}
    check_resume_config(saved, to_dict(cfg), path, saved_batches, batches)
    return path, ck


def restore(ck: dict, path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
            scaler: torch.amp.GradScaler, spm_sha256: str, rank: int) -> TrainState:
    """Load a checkpoint's weights, optimizer, loss scale and this rank's RNG state; returns its
    counters."""
    if ck["spm"]["sha256"] != spm_sha256:
        raise UserError(f"{path}: trained with another vocabulary ({ck['spm']['path']})")
    checkpoint.load_model_state(model, ck["model"], path)
    optimizer.load_state_dict(ck["optim"])
    scaler.load_state_dict(ck["scaler"])
    state = TrainState(**ck["state"])
    if state.best_metric is None and state.best_value is not None:  # saved before the best named its metric
        saved = upgrade_config(ck["config"])["train"]
        state.best_metric = ranking_metric(BestMetric(saved.get("best_metric", "bleu")), saved.get("valid_bleu", True))
    if "validations_since_best" not in ck["state"]:  # saved before train.patience: count them in the log
        state.validations_since_best = validations_after(path.parent.parent / "metrics.jsonl", state.best_step,
                                                         state.step)
    checkpoint.set_rng_state(ck["rng"][rank % len(ck["rng"])])
    log.info("resumed from %s at step %d (epoch %d, batch %d)", path, state.step, state.epoch, state.batch)
    return state


def ranking_metric(best_metric: BestMetric, valid_bleu: bool) -> str:
    """The validation figure that picks best.pt: "bleu" when train.best_metric asks for it and
    train.valid_bleu measures it, else "loss"."""
    return "bleu" if best_metric == BestMetric.bleu and valid_bleu else "loss"


def restart_best_if_changed(state: TrainState, tcfg: TrainConfig) -> None:
    """A resume whose train.best_metric / train.valid_bleu rank by another figure than the saved best
    starts the best (and the patience count) afresh, saying so: a BLEU is never compared with a loss.
    best.pt keeps the saved best's weights until the new figure's first validation replaces them."""
    now = ranking_metric(tcfg.best_metric, tcfg.valid_bleu)
    if state.best_value is not None and state.best_metric not in (None, now):
        log.warning("the saved best is valid %s %.4g (step %d) but best.pt is now picked by valid %s "
                    "(train.best_metric=%s, train.valid_bleu=%s): the best and train.patience start afresh at "
                    "the next validation", state.best_metric, state.best_value, state.best_step, now,
                    tcfg.best_metric.value, str(tcfg.valid_bleu).lower())
        state.best_value, state.validations_since_best = None, 0
    state.best_metric = now


def save_checkpoints(ckpt_dir: Path, names: list[str], model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                     scaler: torch.amp.GradScaler, state: TrainState, cfg: Config, spm: dict,
                     dist: distributed.Dist, batches: dict) -> None:
    """Write checkpoints/<name> for each of `names` (rank 0; every rank must call it, as each
    rank's RNG state is gathered) and prune the step files beyond train.keep_last. `batches` is
    batch_source() of the run, which a resume compares."""
    rngs = distributed.gather(checkpoint.rng_state(), dist)
    if dist.is_main:
        payload = {"format": checkpoint.CHECKPOINT_FORMAT, "model": model.state_dict(),
                   "optim": optimizer.state_dict(), "scaler": scaler.state_dict(), "step": state.step,
                   "position": {"epoch": state.epoch, "batch": state.batch}, "rng": rngs,
                   "state": asdict(state), "config": to_dict(cfg), "spm": spm, "batches": batches}
        checkpoint.save(payload, ckpt_dir, names)
        checkpoint.prune(ckpt_dir, cfg.train.keep_last)


def logged(path: Path) -> list[dict]:
    """The records of metrics.jsonl (a line cut short by a kill is skipped)."""
    records = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def validations_after(path: Path, best_step: int, step: int) -> int:
    """How many validations metrics.jsonl logged after `best_step`, up to `step`: the count of
    validations without a new best, for a checkpoint saved before TrainState held it."""
    return sum(1 for r in logged(path) if r.get("tag") == "valid" and best_step < r.get("step", -1) <= step)


def trim_history(path: Path, step: int) -> None:
    """Keep only the metrics.jsonl records up to `step` (and drop a line cut short by a kill)."""
    if not path.is_file():
        return
    lines = path.read_text().splitlines()
    kept = []
    for line in lines:
        try:
            if json.loads(line)["step"] <= step:
                kept.append(line)
        except (ValueError, KeyError, TypeError):
            continue
    if len(kept) < len(lines):
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text("".join(f"{line}\n" for line in kept))
        os.replace(tmp, path)
        log.info("%s: dropped %d records logged after step %d, the resumed one", path, len(lines) - len(kept),
                 step)


STOPPING_KEYS = ("max_steps", "max_epochs", "patience")
# What a run directory holds besides Hydra's files: the checkpoints and the results. relmt-train removes
# them only for train.overwrite=true.
RUN_FILES = ("checkpoints", "metrics.json", "metrics.jsonl", "tb", "translations", "pieces")


def read_results(out: Path) -> dict | None:
    """out/metrics.json's figures, None where there is none; {"status": "unreadable"} for a file that
    is not a JSON object (cut short by a kill under relmt versions that wrote it in place)."""
    path = out / "metrics.json"
    if not path.is_file():
        return None
    try:
        figures = json.loads(path.read_text())
    except (OSError, ValueError):
        return {"status": "unreadable"}
    return figures if isinstance(figures, dict) else {"status": "unreadable"}


def stops_where_saved(out: Path, cfg: Config) -> bool:
    """Whether out/config.yaml stops training where `cfg` does (train.max_steps, max_epochs, patience)."""
    import yaml

    try:
        train = yaml.safe_load((out / "config.yaml").read_text())["train"]
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        return False
    now = to_dict(cfg)["train"]
    return all(train.get(k) == now[k] for k in STOPPING_KEYS)


def check_results(out: Path, cfg: Config, can_resume: bool) -> dict | None:
    """The guard of a finished run's results (issue 42 §1): relmt-train never deletes or overwrites
    them. Returns metrics.json of a completed run that train.resume=true would only finish again (the
    caller reports it as already completed); None where training may go on: no metrics.json, a run
    resumed from its checkpoints (`can_resume`) or train.overwrite=true. Anything else is refused,
    naming the ways out: train.resume=true, train.overwrite=true or another run directory."""
    figures = read_results(out)
    if figures is None or cfg.train.overwrite:
        return None
    status = figures.get("status")
    if cfg.train.resume and status == "completed" and stops_where_saved(out, cfg):
        return figures
    if cfg.train.resume and can_resume:  # an interrupted run finishes; a completed one trains on to new limits
        return None
    steps = f" after {figures['steps']} updates" if isinstance(figures.get("steps"), int) else ""
    what = {"completed": f"a completed run{steps}", "interrupted": f"an interrupted run{steps}"}.get(
        status, "a run whose metrics.json cannot be read")
    if not can_resume and cfg.train.resume:
        why = (f"its checkpoints are gone ({out / 'checkpoints'} holds no last.pt or step_N.pt), so it cannot "
               "be continued; ")
    elif status == "completed":
        why = "train.resume=true with its train.max_steps, max_epochs and patience reports it as done; "
    else:
        why = "train.resume=true continues it; "
    raise UserError(f"{out} holds {what} (metrics.json), and relmt-train never removes a run's results: {why}"
                    "train.overwrite=true trains again from scratch, replacing its checkpoints and results; or "
                    "choose another hydra.run.dir")


def clear_run(out: Path) -> None:
    """train.overwrite=true, once the run is accepted: remove what the run directory holds of an
    earlier run (checkpoints and results), logging it."""
    import shutil

    removed = [name for name in RUN_FILES if (out / name).exists()]
    for name in removed:
        path = out / name
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    if removed:
        log.warning("train.overwrite=true: removed the earlier run's %s from %s", ", ".join(removed), out)


def keep_completed_results(out: Path, step: int) -> None:
    """A completed run resumed to train on to larger limits: its metrics.json and translations/ move
    to out/completed_step_<step>/ before training goes on, so that the new ones replace nothing."""
    figures = read_results(out)
    if figures is None or figures.get("status") != "completed":
        return
    keep = out / f"completed_step_{step}"
    keep.mkdir(exist_ok=True)
    for name in ("metrics.json", "translations"):
        if (out / name).exists():
            os.replace(out / name, keep / name)
    log.info("%s was completed at step %d: its metrics.json and translations/ are kept in %s", out, step, keep)
