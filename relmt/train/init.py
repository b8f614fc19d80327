"""Fine-tuning (train.init_from): a new run that starts from another run's weights.

Only the weights are taken, as fairseq's --finetune-from-model and OpenNMT-py's train_from with
reset_optim=all do: the optimizer, the learning-rate schedule (the first update is warm-up's first
step), the data position and the RNG start as in any new run. The checkpoint (a step_N.pt, last.pt,
best.pt or one written by relmt-average) is loaded with its checksum verified, and it must hold the
same model as the new run: a mismatch is an error naming the model.* keys that differ.

A checkpoint trained with another sentencepiece model (a new domain, an added language; issue 61) is
taken onto the run's vocabulary: the embedding rows (and so the tied output rows) of the pieces both
vocabularies hold are copied, matched by the piece's text, and the rest keep the fresh model's
initialisation. The log and metrics.json say how many rows were kept.

train.resume takes precedence. init_from only seeds a fresh run: once the run directory holds a
checkpoint, train.resume=true continues that run and does not read init_from again, so the same
command can be requeued after a preemption (fairseq ignores --finetune-from-model in the same way
once checkpoint_last.pt exists). train.freeze keeps the matched parameters at the loaded values.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from relmt import checkpoint
from relmt.config import Config, to_dict
from relmt.data.tokenizer import Tokenizer
from relmt.errors import UserError

log = logging.getLogger(__name__)

# model.* keys that may differ from the checkpoint's: they change neither the parameters nor what
# the model computes at inference. Every other key shapes the parameters or defines their meaning.
FREE_MODEL_KEYS = ("name", "dropout", "attention_dropout", "activation_dropout")
# what is kept of the loaded checkpoint: the weights and what identifies them, not its optimizer
KEPT = ("model", "config", "spm", "step", "checksum")


def check_model(saved: dict, current: dict, path: Path) -> None:
    """Refuse a checkpoint whose model config differs from the run's in a key that matters, naming
    each such key with both values; log the free ones (dropouts, the preset's name) that differ.
    Keys one side lacks (added to relmt since) are not compared: the weights' shapes still are."""
    changed = [k for k in current if k in saved and saved[k] != current[k]]
    refused = [k for k in changed if k not in FREE_MODEL_KEYS]
    if refused:
        diffs = ", ".join(f"model.{k}={current[k]} (checkpoint: {saved[k]})" for k in refused)
        raise UserError(f"train.init_from={path}: its model differs from this run's: {diffs}; fine-tuning "
                        "keeps the model, so set these keys to the checkpoint's values")
    if changed:
        log.info("train.init_from: fine-tuning with %s",
                 ", ".join(f"model.{k}={current[k]} (checkpoint: {saved[k]})" for k in changed))


def open_source(cfg: Config, resuming: bool) -> tuple[Path, dict] | None:
    """The checkpoint train.init_from names (its weights, config, vocabulary, step and checksum),
    with its model config checked against `cfg` before any data work; None when init_from is unset,
    or when the run resumes from its own checkpoint instead."""
    if not cfg.train.init_from:
        return None
    path = Path(cfg.train.init_from)
    if resuming:
        log.info("train.init_from=%s is not loaded: train.resume continues this run from its own checkpoint "
                 "(init_from only seeds a fresh run)", path)
        return None
    problem = None
    try:
        ck = checkpoint.load(path, mmap=True)  # the optimizer state is mapped, never read
    except UserError as e:
        problem = str(e)
    if problem is not None:  # raised outside the except block, so that the message appears once
        raise UserError(f"train.init_from: {problem}")
    check_model(ck["config"].get("model", {}), to_dict(cfg.model), path)
    return path, {k: ck[k] for k in KEPT if k in ck}


def describe_vocabulary(spm: dict) -> str:
    """'PATH (N pieces, sha256 0123456789ab)' for a checkpoint's or a run's `spm` entry."""
    pieces = Tokenizer(spm.get("path", "?"), spm["model"]).vocab_size if spm.get("model") else "?"
    return f"{spm.get('path', '?')} ({pieces} pieces, sha256 {str(spm.get('sha256'))[:12]})"


def pieces(spm: dict) -> list[str]:
    sp = Tokenizer(spm.get("path", "?"), spm["model"]).sp
    return [sp.id_to_piece(i) for i in range(sp.get_piece_size())]


def onto_vocabulary(weights: dict, model: torch.nn.Module, theirs: dict, ours: dict, path: Path) -> tuple[dict, dict]:
    """The checkpoint's weights with their embedding tables (src_embed, tgt_embed: the output layer is tied to the
    latter) remapped onto the run's vocabulary: the row of each piece both sentencepiece models hold is the
    checkpoint's, every other row the fresh model's. Returns them and {kept, rows, checkpoint_rows}."""
    if not theirs.get("model"):
        raise UserError(f"train.init_from={path}: the checkpoint does not hold its sentencepiece model, so its "
                        "embedding rows cannot be matched to this run's pieces")
    old = {p: i for i, p in enumerate(pieces(theirs))}
    new = pieces(ours)
    shared = [(i, old[p]) for i, p in enumerate(new) if p in old]
    rows, src = torch.tensor([i for i, _ in shared]), torch.tensor([j for _, j in shared])
    fresh = model.state_dict()
    out = dict(weights)
    for key in ("src_embed.weight", "tgt_embed.weight"):
        if key in weights:
            # built on the host, where the checkpoint's weights are (the model may be on CUDA already)
            table = fresh[key].detach().to("cpu", copy=True)
            table[rows] = weights[key][src].to(table.dtype)
            out[key] = table
    return out, {"kept": len(shared), "rows": len(new), "checkpoint_rows": len(old)}


def load_weights(source: tuple[Path, dict], model: torch.nn.Module, spm: dict) -> dict:
    """Copy the source checkpoint's weights into `model`; trained with another vocabulary than the run's (`spm`:
    path, sha256, model bytes), onto the run's (`onto_vocabulary`). Returns what metrics.json records of it:
    path, step and checksum, and with another vocabulary how many embedding rows were kept."""
    path, ck = source
    theirs = ck.get("spm") or {}
    weights, vocabulary = ck["model"], None
    if theirs.get("sha256") != spm["sha256"]:
        weights, vocabulary = onto_vocabulary(weights, model, theirs, spm, path)
        log.info("train.init_from: another vocabulary: %d of this run's %d embedding rows (pieces both "
                 "sentencepiece models hold) come from %s (%d rows), the other %d start fresh; its %s, this run's %s",
                 vocabulary["kept"], vocabulary["rows"], path, vocabulary["checkpoint_rows"],
                 vocabulary["rows"] - vocabulary["kept"], describe_vocabulary(theirs), describe_vocabulary(spm))
    checkpoint.load_model_state(model, weights, path)
    record = {"path": str(path), "step": ck.get("step"), "checksum": ck.get("checksum")}
    if vocabulary is not None:
        record["vocabulary"] = vocabulary
    log.info("train.init_from: weights of %s (step %s); the optimizer, learning-rate schedule and data "
             "position start fresh", path, record["step"])
    return record
