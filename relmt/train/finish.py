"""The end of a training run: the figures of metrics.json, and for a completed run the scoring of
the test splits with the weights that train.test_checkpoint names (averaged first if asked)."""

from __future__ import annotations

import hashlib
import logging
import time
from pathlib import Path

import torch

from relmt import checkpoint
from relmt.config import Config
from relmt.data.dataset import Corpus
from relmt.evaluate.metrics import bucketed_bleu
from relmt.host import host
from relmt.model import routes
from relmt.train import distributed
from relmt.train.resume import TrainState
from relmt.train.validate import translate_split

log = logging.getLogger(__name__)


def summary(state: TrainState, completed: bool, out: Path, n_params: int, wall_seconds: float, valid: dict,
            stopped_early: dict | None = None, mix: dict | None = None) -> dict:
    """The run's figures for metrics.json: progress, speed and the machine it was measured on (the last
    session's, for a resumed run), skipped updates, the last and the best validation, where train.patience
    stopped the run (else None), the checkpoint train.init_from started it from (else None) and, with several
    corpora, the mix trained on (relmt/data/mix.py's `seen`; else None), and the attention routes that ran
    (relmt.model.routes.report: whether auto's flex fell back to chunked). A run stopped early is completed, like
    one that reached max_steps."""
    seconds = max(state.train_seconds, 1e-9)
    return {"status": "completed" if completed else "interrupted", "stopped_early": stopped_early,
            "init_from": state.init_from, "run_dir": str(out), "steps": state.step,
            "epochs": state.epoch, "params": n_params, "wall_seconds": wall_seconds,
            "train_seconds": state.train_seconds, "tokens_per_s": state.tgt_tokens / seconds,
            "src_tgt_tokens_per_s": (state.src_tokens + state.tgt_tokens) / seconds,
            "host": host(),
            "skipped_updates": state.bad_total, "final_valid": valid,
            "best": {"metric": state.best_metric, "value": state.best_value, "step": state.best_step},
            "mix": mix, "attention_routes": routes.report()}


def params_in_sync(model: torch.nn.Module, dist: distributed.Dist) -> bool:
    """Whether every rank holds the same weights (DDP must keep them equal; checked once, at the end)."""
    digest = hashlib.sha256(b"".join(p.detach().cpu().numpy().tobytes() for p in model.parameters()))
    return len(set(distributed.gather(digest.hexdigest(), dist))) == 1


def score_tests(model: torch.nn.Module, corpus: Corpus, cfg: Config, ckpt_dir: Path, out: Path,
                device: torch.device, amp: torch.dtype | None) -> dict:
    """Rank 0, after the last update: average the last train.average_last step checkpoints into
    averaged.pt if asked, load the weights train.test_checkpoint names into `model` (the final
    ones if that file is missing), translate every test split into out/translations/ and score it,
    and BLEU by source length over all test splits together. Returns the metrics.json entries, with
    test_seconds, the time this took (a run's wall_seconds ends at its last update)."""
    start, tcfg, last, metrics = time.perf_counter(), cfg.train, ckpt_dir / "last.pt", {}
    if tcfg.average_last:  # Shaw §4.1: the big model averages its last 20 checkpoints
        averaged = checkpoint.average(checkpoint.step_files(ckpt_dir)[-tcfg.average_last:])
        checkpoint.save(averaged, ckpt_dir, ["averaged.pt"])
        metrics["averaged"] = averaged["averaged"]
    test_ckpt = ckpt_dir / f"{tcfg.test_checkpoint.value}.pt"
    if test_ckpt.is_file() and test_ckpt != last:
        checkpoint.load_model_state(model, checkpoint.load(test_ckpt)["model"], test_ckpt)
    metrics["test_checkpoint"] = str(test_ckpt if test_ckpt.is_file() else last)
    metrics["test_checkpoint_rule"] = tcfg.test_checkpoint.value
    metrics["test"], hyps, splits = {}, [], [s for s in corpus.splits if s not in ("train", "valid")]
    for split in splits:
        out_file = out / "translations" / f"{split}.{cfg.data.tgt}"
        metrics["test"][split], split_hyps = translate_split(model, corpus, split, cfg.decode, device, amp, out_file)
        hyps += split_hyps
    if splits:  # length generalisation: BLEU by source length over all test splits together
        refs = [r for s in splits for r in corpus.texts(s, "tgt")]
        srcs = [x for s in splits for x in corpus.texts(s, "src")]
        metrics["by_source_length"] = {"splits": splits, "buckets": bucketed_bleu(
            hyps, refs, srcs, tuple(cfg.data.length_buckets))}
    metrics["test_seconds"] = time.perf_counter() - start
    log.info("test splits %s scored in %.0f s", ", ".join(splits) or "(none)", metrics["test_seconds"])
    return metrics
