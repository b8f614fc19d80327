"""The training loop: one plain function, read top to bottom (no Trainer class, no callbacks).

Each update takes `update_freq` micro-batches, backpropagates their summed label-smoothed loss and
divides the gradients by the number of target tokens in the whole update (all ranks), then steps
Adam at the scheduled learning rate. Every `eval_every` updates it validates, every `save_every` it
checkpoints (the last update too, step file included); at the end it scores the test splits and
writes metrics.json.
Resuming restores model, optimizer, scaler, RNG and the data position, so it continues exactly.

`train` calls functions that take and return plain values: one update and its NaN/inf check
(relmt/train/step.py), `log_window`, `validate`, `improved`, `finished` (max_steps, max_epochs or
train.patience); saving and resuming (relmt/train/resume.py); the weights a fine-tuning run starts
from (relmt/train/init.py); the summary and the scoring of the test splits (relmt/train/finish.py).
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import numpy as np
import torch
import yaml
from torch.nn.parallel import DistributedDataParallel
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

from relmt import checkpoint, runtime
from relmt.config import AUTO_CHUNK_VOCAB, Config, OutputLoss, TrainConfig, to_dict
from relmt.data import mix as mixing
from relmt.data.batching import BatchSampler, collate
from relmt.data.dataset import Corpus, SplitIds, prepare
from relmt.data.regularise import Resampler
from relmt.data.tokenizer import PAD_ID
from relmt.errors import UserError
from relmt.model import linear, routes
from relmt.model.transformer import build_model
from relmt.train import distributed, finish, init, resume
from relmt.train.optim import build_optimizer, learning_rate
from relmt.train.resume import TrainState
from relmt.train.step import compile_for_training, count_skipped, train_step
from relmt.train.validate import split_loss, translate_split

log = logging.getLogger(__name__)

# the sums over the updates of one logging window
WINDOW = ("loss", "nll", "tgt", "src", "seconds", "grad_norm", "updates")


@contextmanager
def stop_signals() -> Iterator[dict[str, str]]:
    """The first SIGTERM / SIGINT sets a flag; the loop finishes its update, saves last.pt and
    returns. A second one raises KeyboardInterrupt at once, e.g. to leave a long validation.
    (Only the main thread may install handlers; a sweep worker thread keeps the defaults.)"""
    received: dict[str, str] = {}

    def handler(signum: int, frame: object) -> None:
        name = signal.Signals(signum).name
        if "signal" in received:
            raise KeyboardInterrupt(f"a second signal ({name}): stopped at once, without saving")
        received["signal"] = name
        log.warning("%s: stopping after this update and saving last.pt; send it again to stop at once", name)

    if threading.current_thread() is not threading.main_thread():
        yield received
        return
    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield received
    finally:
        for s, h in old.items():
            signal.signal(s, h)


@dataclass
class RunLog:
    """Rank 0's metrics.jsonl and TensorBoard events (other ranks hold None instead)."""

    writer: SummaryWriter
    history: TextIO

    def record(self, step: int, tag: str, values: dict) -> None:
        for k, v in values.items():
            if isinstance(v, (int, float)):
                self.writer.add_scalar(f"{tag}/{k}", v, step)
        self.history.write(json.dumps({"step": step, "tag": tag, **values}) + "\n")
        self.history.flush()

    def close(self) -> None:
        self.history.close()
        self.writer.close()


def save_config(out: Path, cfg: Config) -> None:
    """out/config.yaml, the resolved config that relmt-report reads (what OmegaConf.save writes).
    Written only once the run is accepted: a refused command must not leave its config behind."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))


def open_run_log(out: Path, step: int, resumed: bool) -> RunLog:
    """Append to out/metrics.jsonl and out/tb. After a kill -9 the log holds the steps since the last
    save, which a resumed run logs again: those records and events are dropped first. A fresh start
    begins both anew: what is there was logged by an attempt killed before its first checkpoint, and
    this run logs those steps again. (A run's results, metrics.json, are never here on a fresh start:
    resume.check_results refuses that, and train.overwrite=true has removed them.)"""
    if resumed:
        resume.trim_history(out / "metrics.jsonl", step)
    else:
        earlier = [p for p in (out / "metrics.jsonl", out / "tb") if p.exists()]
        (out / "metrics.jsonl").unlink(missing_ok=True)
        shutil.rmtree(out / "tb", ignore_errors=True)
        if earlier:
            log.info("%s: no checkpoint to resume, so the run starts afresh; removed the earlier attempt's %s",
                     out, ", ".join(p.name for p in earlier))
    writer = SummaryWriter(str(out / "tb"), purge_step=step + 1 if resumed else None)
    return RunLog(writer, (out / "metrics.jsonl").open("a"))


EARLY_UPDATES = 10  # a first progress line after this many updates, before the first log_every


def duration(seconds: float) -> str:
    """'2h05m', '4m10s', '9s'."""
    s = round(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def eta(step: int, first_step: int, max_steps: int, seconds: float) -> str:
    """' | ETA 1h02m' from the wall time per update of this session so far (validation included), or ''
    without a step limit."""
    if not max_steps or step <= first_step:
        return ""
    return f" | ETA {duration(seconds / (step - first_step) * max(max_steps - step, 0))}"


def log_window(window: dict[str, float], lr: float, step: int, epoch: int, run_log: RunLog | None,
               bar: tqdm, until: str = "") -> None:
    """Log the training figures of the updates summed in `window` (per target token, per second)."""
    stats = {"loss": window["loss"] / window["tgt"], "nll": window["nll"] / window["tgt"],
             "ppl": math.exp(min(window["nll"] / window["tgt"], 50)), "lr": lr,
             "grad_norm": window["grad_norm"] / window["updates"],
             "tokens_per_s": window["tgt"] / window["seconds"],
             "src_tgt_tokens_per_s": (window["src"] + window["tgt"]) / window["seconds"],
             "tgt_tokens": int(window["tgt"]), "updates": int(window["updates"]), "epoch": epoch}
    if run_log is not None:
        run_log.record(step, "train", stats)
    log.info("step %d | loss %.3f | ppl %.2f | lr %.3g | |g| %.3g | %.0f tgt tok/s%s", step, stats["loss"],
             stats["ppl"], lr, stats["grad_norm"], stats["tokens_per_s"], until)
    bar.set_postfix(loss=f"{stats['loss']:.3f}", lr=f"{lr:.2e}", tok_s=f"{stats['tokens_per_s']:.0f}")


def validate(model: torch.nn.Module, corpus: Corpus, cfg: Config, dist: distributed.Dist,
             amp: torch.dtype | None, step: int, run_log: RunLog | None) -> dict:
    """Validation loss (and BLEU) at `step`, measured on rank 0 and shared with every rank."""
    valid = {}
    if dist.is_main:
        valid = split_loss(model, corpus, "valid", cfg.train.max_padded_tokens, cfg.train.label_smoothing,
                           dist.device, amp)
        if cfg.train.valid_bleu:
            valid.update(translate_split(model, corpus, "valid", cfg.decode, dist.device, amp)[0])
        run_log.record(step, "valid", valid)
        log.info("step %d | valid loss %.3f | ppl %.2f%s", step, valid["loss"], valid["ppl"],
                 f" | BLEU {valid['bleu']:.2f}" if "bleu" in valid else "")
    return distributed.gather(valid, dist)[0]


def improved(valid: dict, best: float | None, metric: str) -> float | None:
    """valid[metric], the validation figure that picks best.pt ("bleu" or "loss":
    resume.ranking_metric), if it beats `best` (a figure of the same metric), else None."""
    value = valid[metric]
    if best is None or (value > best if metric == "bleu" else value < best):
        return value
    return None


def reached_limit(state: TrainState, tcfg: TrainConfig) -> bool:
    """Whether train.max_steps or train.max_epochs (0 = no limit) is reached."""
    return bool((tcfg.max_steps and state.step >= tcfg.max_steps)
                or (tcfg.max_epochs and state.epoch >= tcfg.max_epochs))


def out_of_patience(state: TrainState, tcfg: TrainConfig) -> bool:
    """Whether the last train.patience validations (0 or None = off) brought no new best."""
    return bool(tcfg.patience) and state.validations_since_best >= tcfg.patience


def finished(state: TrainState, tcfg: TrainConfig) -> bool:
    """Whether training is over: a step or epoch limit is reached, or patience ran out (early stopping)."""
    return reached_limit(state, tcfg) or out_of_patience(state, tcfg)


def stopped_early(state: TrainState, tcfg: TrainConfig) -> dict | None:
    """metrics.json's record of an early stop, logged as well; None unless train.patience ended the
    run (a run whose patience ran out at its max_steps did not stop early)."""
    if not out_of_patience(state, tcfg) or reached_limit(state, tcfg):
        return None
    metric = resume.ranking_metric(tcfg.best_metric, tcfg.valid_bleu)
    log.info("early stopping: no improvement of valid %s for %d validations; best at step %d", metric,
             state.validations_since_best, state.best_step)
    return {"step": state.step, "best_step": state.best_step, "patience": tcfg.patience, "metric": metric}


def train(cfg: Config) -> dict:
    """Train as configured; returns (and writes to out_dir/metrics.json) the run's figures."""
    t_start = time.perf_counter()
    tcfg, out = cfg.train, Path(cfg.out_dir)
    ckpt_dir = out / "checkpoints"
    last = ckpt_dir / "last.pt"
    dist = distributed.setup(tcfg.device, tcfg.dist_timeout_minutes)
    if not dist.is_main:
        logging.getLogger().setLevel(logging.WARNING)  # only rank 0 logs and saves
    amp = runtime.autocast_dtype(tcfg.precision, dist.device, "train.precision")  # fails before the data work
    routes.report(reset=True)  # metrics.json names the routes this run took (a sweep runs jobs in one process)
    runtime.choose_threads(cfg.threads, dist.device)  # threads=0: the cores free at start
    runtime.tune_cpu()
    torch.manual_seed(cfg.seed + dist.rank)  # dropout masks differ across ranks
    # A resume is checked before the data is prepared: a refused one should not wait for a cache build.
    batch_source = resume.batch_source(cfg.data, dist.world_size)
    ck_path, ck = resume.open_checkpoint(cfg, ckpt_dir, batch_source)
    if (done := resume.check_results(out, cfg, can_resume=ck is not None)) is not None:
        log.info("%s already completed (metrics.json): nothing to train or score", out)
        return done
    source = init.open_source(cfg, resuming=ck is not None)  # train.init_from; checked before the data work too

    # Data: rank 0 builds the cache if needed, then every other rank loads it.
    corpus = prepare(cfg.data) if dist.is_main else None
    distributed.barrier(dist)
    corpus = corpus or prepare(cfg.data)
    tokenizer, train_ids = corpus.tokenizer, corpus.ids("train")
    sampler = BatchSampler(train_ids, tcfg.max_padded_tokens, cfg.seed, True, dist.rank, dist.world_size,
                           tcfg.max_sentences, tcfg.batch_by.value)
    # Subword regularisation: each epoch's pieces sampled by rank 0 and stored in the run, for a resume and the
    # other ranks (sentencepiece's sampling is not reproducible across processes).
    resampler = (Resampler(train_ids, tokenizer, cfg.data.spm_alpha, cfg.data.spm_nbest, cfg.seed,
                           store=out / "pieces", sample=dist.is_main, resumed=ck is not None)
                 if cfg.data.spm_alpha > 0 else None)

    # Several corpora (data.corpora): each epoch's pairs drawn by weight (relmt/data/mix.py)
    labels, corpus_names = corpus.corpus_labels("train"), [c.name for c in cfg.data.corpora]
    mix = None if labels is None else mixing.Mix(labels, [c.weight for c in cfg.data.corpora], corpus_names,
                                                      cfg.seed)
    if mix is not None:
        log.info("the mix: each epoch draws %s", mix.plan())

    def epoch_batches(epoch: int) -> tuple[SplitIds, list, np.ndarray | None]:
        """An epoch's training ids, its batches and (several corpora) each pair's corpus: the cached ids, or with
        subword regularisation the epoch's sampled ones; with several corpora, the pairs the epoch draws. Batched
        by their own lengths."""
        if resampler is None and mix is None:
            return train_ids, sampler.epoch(epoch), None
        ids, epoch_labels = train_ids, None
        if resampler is not None:
            if dist.is_main:
                ids = resampler.epoch(epoch)
            distributed.barrier(dist)  # rank 0 has stored the epoch's pieces
            if not dist.is_main:
                ids = resampler.epoch(epoch)
        if mix is not None:
            index = mix.epoch(epoch)
            ids, epoch_labels = mixing.take(ids, index), mix.labels[index]
        return ids, BatchSampler(ids, tcfg.max_padded_tokens, cfg.seed, True, dist.rank, dist.world_size,
                                 tcfg.max_sentences, tcfg.batch_by.value).epoch(epoch), epoch_labels
    seen = np.zeros((2, len(corpus_names)), dtype=np.int64)  # this rank's pairs, target tokens per corpus, to add

    def count_mix() -> None:
        """Adds every rank's counts since the last call to the state's (at each log line and checkpoint)."""
        counts = seen.ravel().tolist()
        if dist.world_size > 1:
            counts = [int(round(c)) for c in distributed.all_reduce_sum([float(c) for c in counts], dist)]
        k = len(corpus_names)
        state.mix_pairs = [a + b for a, b in zip(state.mix_pairs or [0] * k, counts[:k])]
        state.mix_tokens = [a + b for a, b in zip(state.mix_tokens or [0] * k, counts[k:])]
        seen[:] = 0
    chunked = tcfg.output_loss == OutputLoss.chunked or (tcfg.output_loss == OutputLoss.auto
                                                          and tokenizer.vocab_size >= AUTO_CHUNK_VOCAB)
    if not sampler.epoch(0):
        raise UserError(f"data '{cfg.data.name}': no training batches (is the train split empty?)")
    log.info("train: %d pairs, %d batches per epoch per rank, padding %.1f%%; effective batch = "
             "%d ranks x %d padded tokens x update_freq %d", len(train_ids), len(sampler.epoch(0)),
             100 * sampler.padding_fraction(), dist.world_size, tcfg.max_padded_tokens, tcfg.update_freq)
    log.info("the output layer and loss: %s (train.output_loss=%s, a vocabulary of %d)",
             "chunked" if chunked else "whole logits", tcfg.output_loss.value, tokenizer.vocab_size)

    model = build_model(cfg.model, tokenizer.vocab_size, PAD_ID).to(dist.device)
    n_params = sum(p.numel() for p in model.parameters())
    log.info("model: %s positions, %.2fM parameters", cfg.model.positions.value, n_params / 1e6)
    if dist.device.type == "cpu":
        caches = ", ".join(f"{k}={v}" for k, v in linear.bound_onednn_caches().items())
        log.info("linear maps on the CPU: %s in float32 training (%s; oneDNN caches %s; relmt/model/linear.py)",
                 linear.cpu_gemm(), f"{linear.ENV}={linear.setting()}", caches)
    optimizer = build_optimizer(model, tcfg)
    scaler = torch.amp.GradScaler(dist.device.type, enabled=amp == torch.float16)
    spm = {"path": str(tokenizer.path), "sha256": tokenizer.sha256(), "model": tokenizer.model_bytes()}
    state = TrainState()
    if ck is not None:
        state = resume.restore(ck, ck_path, model, optimizer, scaler, spm["sha256"], dist.rank)
        ck = None  # the model copied the weights: drop the loaded ones
    elif source is not None:  # fine-tuning: the weights only; optimizer, schedule and data position are fresh
        state.init_from = init.load_weights(source, model, spm)
        source = None
    resume.restart_best_if_changed(state, tcfg)  # the saved best ranks by this run's metric, or starts afresh
    wall_before = state.wall_seconds  # earlier sessions of a resumed run, up to the checkpoint

    def wall() -> float:
        return wall_before + time.perf_counter() - t_start

    ddp = DistributedDataParallel(model) if dist.world_size > 1 else None
    net = compile_for_training(ddp or model) if tcfg.compile else (ddp or model)
    if dist.is_main:  # the run is accepted: nothing in its directory changed before this point
        if tcfg.overwrite:
            resume.clear_run(out)
        elif ck_path is not None:  # a completed run trained on to larger limits keeps its old results
            resume.keep_completed_results(out, state.step)
        save_config(out, cfg)
    run_log = open_run_log(out, state.step, ck_path is not None) if dist.is_main else None
    bar = tqdm(total=tcfg.max_steps or None, initial=state.step, unit="step", dynamic_ncols=True,
               disable=not (dist.is_main and tcfg.progress and sys.stderr.isatty()))

    valid = state.last_valid  # a resume after the last update has no validation left to run
    interrupted = False
    window = dict.fromkeys(WINDOW, 0.0)
    epoch_ids, batches, epoch_labels = epoch_batches(state.epoch)
    if state.batch >= len(batches):  # a resumed epoch sampled anew (its stored pieces gone) cut into fewer batches
        log.warning("resume: epoch %d now holds %d batches, fewer than the saved position %d (its pieces were "
                    "sampled anew); training goes on from the start of epoch %d", state.epoch, len(batches),
                    state.batch, state.epoch + 1)
        state.epoch, state.batch = state.epoch + 1, 0
        epoch_ids, batches, epoch_labels = epoch_batches(state.epoch)
    first_step, t_session = state.step, time.perf_counter()  # this session's updates, for the ETA
    with stop_signals() as received:
        while not finished(state, tcfg) and not interrupted:
            t0 = time.perf_counter()
            lr = learning_rate(tcfg, cfg.model.d_model, state.step + 1)
            indices = batches[state.batch: state.batch + tcfg.update_freq]
            group = [collate(epoch_ids, index, tcfg.pad_to_multiple).to(dist.device) for index in indices]
            if epoch_labels is not None:
                for index in indices:
                    seen[0] += np.bincount(epoch_labels[index], minlength=len(corpus_names))
                    seen[1] += np.bincount(epoch_labels[index], weights=epoch_ids.tgt_lens[index],
                                           minlength=len(corpus_names)).astype(np.int64)
            loss_sum, nll_sum, n_tgt, n_src, grad_norm = train_step(
                model, net, optimizer, scaler, group, lr, tcfg.label_smoothing, amp, dist, ddp, tcfg.clip_norm,
                chunked)
            fp16_scale = scaler.get_scale() if scaler.is_enabled() else None
            state.bad_in_row, skipped = count_skipped(loss_sum, grad_norm, fp16_scale, state.bad_in_row,
                                                      state.step + 1, lr, tcfg, last)
            state.bad_total += int(skipped)
            state.step += 1
            state.batch += len(group)
            if state.batch >= len(batches):
                state.epoch, state.batch = state.epoch + 1, 0
                epoch_ids, batches, epoch_labels = epoch_batches(state.epoch)
            seconds = time.perf_counter() - t0
            state.train_seconds += seconds
            state.src_tokens, state.tgt_tokens = state.src_tokens + int(n_src), state.tgt_tokens + int(n_tgt)
            for k, v in zip(WINDOW, (loss_sum, nll_sum, n_tgt, n_src, seconds, grad_norm, 1)):
                window[k] += v
            bar.update(1)
            until = eta(state.step, first_step, tcfg.max_steps, time.perf_counter() - t_session)
            if state.step % tcfg.log_every == 0:
                log_window(window, lr, state.step, state.epoch, run_log, bar, until)
                window = dict.fromkeys(WINDOW, 0.0)
                if mix is not None:
                    count_mix()
                    realised = mixing.seen(state.mix_pairs, state.mix_tokens, corpus_names)
                    if run_log is not None:
                        run_log.record(state.step, "mix", realised)
                        log.info("step %d | mix seen so far: %s", state.step, mixing.describe(realised))
            elif state.step - first_step == EARLY_UPDATES and dist.is_main:  # progress before the first log line
                log.info("step %d | first %d updates: %.0f tgt tok/s, %.2f s per update%s", state.step,
                         EARLY_UPDATES, window["tgt"] / window["seconds"], window["seconds"] / window["updates"],
                         until)

            interrupted = distributed.any_rank("signal" in received, dist)
            names = [f"step_{state.step}.pt", "last.pt"] if state.step % tcfg.save_every == 0 else []
            if state.step % tcfg.eval_every == 0 or finished(state, tcfg):
                valid = state.last_valid = validate(model, corpus, cfg, dist, amp, state.step, run_log)
                best = improved(valid, state.best_value, state.best_metric)
                if best is not None:
                    state.best_value, state.best_step = best, state.step
                    names.append("best.pt")
                state.validations_since_best = 0 if best is not None else state.validations_since_best + 1
            if finished(state, tcfg) and "last.pt" not in names:  # a step file too, for train.average_last
                names += [f"step_{state.step}.pt", "last.pt"]
            if interrupted and "last.pt" not in names:
                names.append("last.pt")
            if names and mix is not None:
                count_mix()
            if names:
                state.wall_seconds = wall()
                resume.save_checkpoints(ckpt_dir, names, model, optimizer, scaler, state, cfg, spm, dist,
                                        batch_source)
                # a resume starts from last.pt: earlier epochs' pieces go once it is of this epoch (best.pt alone
                # does not move it; a step_N.pt fallback older than last.pt samples its epoch anew, with a warning)
                if resampler is not None and "last.pt" in names:
                    resampler.forget_before(state.epoch)
    bar.close()

    # A signal during the final update still stops the run: its tests are not scored, so it is not
    # completed; a resume finds nothing left to train and scores them.
    if mix is not None:
        count_mix()
    metrics = finish.summary(state, finished(state, tcfg) and not interrupted, out, n_params, wall(), valid,
                             stopped_early(state, tcfg),
                             mixing.seen(state.mix_pairs, state.mix_tokens, corpus_names) if mix else None)
    if dist.world_size > 1:
        metrics["ddp_params_in_sync"] = finish.params_in_sync(model, dist)
    if interrupted:
        log.warning("stopped by %s after step %d; %s holds the state: train.resume=true with this run "
                    "directory (%s) continues it", received.get("signal", "a signal on another rank"), state.step,
                    last, out)
    elif dist.is_main:
        metrics.update(finish.score_tests(model, corpus, cfg, ckpt_dir, out, dist.device, amp))
    if resampler is not None:  # the next epoch's pieces stored before the run ends, for a resume (Resampler.settle)
        resampler.settle()
    if run_log is not None:
        checkpoint.write_text(out / "metrics.json", json.dumps(metrics, indent=2) + "\n")  # atomic: never cut short
        run_log.close()
    # DDP's reducer holds the process group: freed here, while every rank is still at this point, not when this
    # function returns (a rank whose peer had already exited hung in ProcessGroupGloo's destructor, joining its
    # worker thread: py-spy on the hung rank of a make test run, 2026-11-29)
    net = ddp = None  # noqa: F841
    distributed.barrier(dist)
    distributed.cleanup()
    return metrics
