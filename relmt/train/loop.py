"""The training loop: one plain function, read top to bottom (no Trainer class, no callbacks).

Each update takes `update_freq` micro-batches, backpropagates their summed label-smoothed loss and
divides the gradients by the number of target tokens in the whole update (all ranks), then steps
Adam at the scheduled learning rate. Every `eval_every` updates it validates, every `save_every` it
checkpoints; at the end it scores the test splits with the best weights and writes metrics.json.
Resuming restores model, optimizer, scaler, RNG and the data position, so it continues exactly.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

from relmt import checkpoint, runtime
from relmt.config import BestMetric, Config, Precision, to_dict
from relmt.data.batching import Batch, BatchSampler, collate
from relmt.data.dataset import prepare
from relmt.data.tokenizer import PAD_ID
from relmt.errors import UserError
from relmt.evaluate.metrics import bucketed_bleu
from relmt.model.transformer import build_model
from relmt.train import distributed
from relmt.train.loss import label_smoothed_nll
from relmt.train.optim import build_optimizer, learning_rate
from relmt.train.validate import split_loss, translate_split

log = logging.getLogger(__name__)

# fp16: below this loss scale, gradient overflows count as a diverged run (fairseq's min_loss_scale)
MIN_LOSS_SCALE = 1e-4
# Settings that change the data or the batch order: a resume with other values would not continue
# the saved run but silently train on other batches. Other settings (max_steps, eval_every,
# logging, device, decoding) may change on resume.
BATCH_ORDER_KEYS = ("seed", "train.max_tokens", "train.max_sentences", "train.update_freq")
DATA_KEYS_FREE_ON_RESUME = ("data.cache_dir", "data.num_proc", "data.length_buckets")


@dataclass
class TrainState:
    """Counters that, with the weights, optimizer and RNG, make a resumed run continue exactly."""

    step: int = 0
    epoch: int = 0
    batch: int = 0  # the next micro-batch of `epoch`
    best_value: float | None = None
    best_step: int = 0
    bad_in_row: int = 0
    bad_total: int = 0
    train_seconds: float = 0.0
    src_tokens: int = 0
    tgt_tokens: int = 0


def autocast_dtype(precision: Precision, device: torch.device) -> torch.dtype | None:
    """relmt.runtime.autocast_dtype, with fp16 on a CPU refused for training."""
    if precision == Precision.fp16 and device.type == "cpu":
        # CPU autocast to fp16 is emulated: it trains about 5x slower than fp32 and gains nothing
        raise UserError("train.precision=fp16 needs a CUDA device (train.device resolved to cpu): use fp32, "
                        "or bf16, on a CPU")
    return runtime.autocast_dtype(precision, device)


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
    """{"train": {"lr": 1}} -> {"train.lr": 1}"""
    out: dict[str, object] = {}
    for k, v in values.items():
        if isinstance(v, dict):
            out.update(flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def check_resume_config(saved: dict, current: dict, path: Path) -> None:
    """Refuse a resume whose model, data or batch order differs from the saved run's; log the
    other settings that changed. Keys one side lacks (added to relmt since) are not compared."""
    old, new = flat(saved), flat(current)
    changed = [k for k in new if k in old and old[k] != new[k] and k not in ("train.resume", "out_dir")]
    refused = [k for k in changed if k.startswith("model.") or k in BATCH_ORDER_KEYS
               or (k.startswith("data.") and k not in DATA_KEYS_FREE_ON_RESUME)]
    if refused:
        diffs = ", ".join(f"{k}={new[k]} (saved: {old[k]})" for k in refused)
        raise UserError(f"{path}: cannot resume with {diffs}: the model, data or batch order would differ "
                        "from the saved run's; restore those settings, or start a new run directory")
    if changed:
        log.info("resuming with changed settings: %s", ", ".join(f"{k}={new[k]} (was {old[k]})" for k in changed))


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


def improved(value: float, best: float | None, metric: BestMetric) -> bool:
    return best is None or (value > best if metric == BestMetric.bleu else value < best)


def train_step(model: torch.nn.Module, net: torch.nn.Module, optimizer: torch.optim.Optimizer,
               scaler: torch.amp.GradScaler, batches: list[Batch], lr: float, label_smoothing: float,
               amp: torch.dtype | None, dist: distributed.Dist, ddp: DistributedDataParallel | None = None,
               clip_norm: float = 0.0) -> tuple[float, float, float, float, float]:
    """One update: forward and backward over `batches` (micro-batches on the device), then one
    optimizer step at learning rate `lr`, unless the summed loss or the gradient norm is NaN/inf
    (then no step).

    `net` is what runs the forward (model, its DDP wrapper, or a compiled one); `model` owns the
    parameters. Returns (smoothed loss, nll, target tokens, source tokens) summed over ranks, and
    the gradient norm before clipping (NaN when the loss was not finite, so it was not computed).
    """
    for g in optimizer.param_groups:
        g["lr"] = lr
    sums = [0.0, 0.0, 0, 0]
    for j, batch in enumerate(batches):
        with ddp.no_sync() if ddp is not None and j < len(batches) - 1 else nullcontext():
            with torch.autocast(dist.device.type, dtype=amp or torch.float32, enabled=amp is not None):
                logits = net(batch.src, batch.tgt_in)
            loss, nll = label_smoothed_nll(logits, batch.tgt_out, label_smoothing)
            scaler.scale(loss).backward()
        sums = [sums[0] + loss.item(), sums[1] + nll.item(), sums[2] + batch.n_tgt_tokens,
                sums[3] + batch.n_src_tokens]
    loss_sum, nll_sum, n_tgt, n_src = distributed.all_reduce_sum(sums, dist)
    grad_norm = math.nan
    if math.isfinite(loss_sum):
        # DDP averaged the gradients over ranks; make them d(sum of losses) / (target tokens).
        params = [p for p in model.parameters() if p.grad is not None]
        scaler.unscale_(optimizer)
        torch._foreach_mul_([p.grad for p in params], dist.world_size / n_tgt)
        grad_norm = torch.nn.utils.clip_grad_norm_(params, clip_norm or math.inf).item()
        # An inf/NaN gradient with a finite loss would make every weight NaN after one Adam step:
        # skip the step, as fairseq does. Every rank holds the same reduced gradients, so all skip.
        if math.isfinite(grad_norm):
            scaler.step(optimizer)
        scaler.update()  # with fp16, lowers the loss scale after the inf that unscale_ found
    optimizer.zero_grad(set_to_none=True)
    return loss_sum, nll_sum, n_tgt, n_src, grad_norm


def train(cfg: Config) -> dict:
    """Train as configured; returns (and writes to out_dir/metrics.json) the run's figures."""
    t_start = time.perf_counter()
    tcfg, out = cfg.train, Path(cfg.out_dir)
    ckpt_dir = out / "checkpoints"
    dist = distributed.setup(tcfg.device, tcfg.dist_timeout_minutes)
    if not dist.is_main:
        logging.getLogger().setLevel(logging.WARNING)  # only rank 0 logs and saves
    amp = autocast_dtype(tcfg.precision, dist.device)  # device and precision fail before the data work
    if tcfg.num_threads:
        torch.set_num_threads(tcfg.num_threads)
    runtime.tune_cpu()
    torch.manual_seed(cfg.seed + dist.rank)  # dropout masks differ across ranks

    # A resume is checked before the data is prepared: a refused one should not wait for a cache build.
    last, ck, ck_path = ckpt_dir / "last.pt", None, None
    if tcfg.resume:
        ck_path, ck = resume_checkpoint(ckpt_dir)
        check_resume_config(ck["config"], to_dict(cfg), ck_path)
    elif last.is_file():
        raise UserError(f"{out} already holds a run ({last}): pass train.resume=true to continue it, "
                        "or choose another hydra.run.dir")

    # Data: rank 0 builds the cache if needed, then every other rank loads it.
    corpus = prepare(cfg.data) if dist.is_main else None
    distributed.barrier(dist)
    corpus = corpus or prepare(cfg.data)
    tokenizer, train_ids = corpus.tokenizer, corpus.ids("train")
    sampler = BatchSampler(train_ids, tcfg.max_tokens, cfg.seed, True, dist.rank, dist.world_size,
                           tcfg.max_sentences)
    if not sampler.epoch(0):
        raise UserError(f"data '{cfg.data.name}': no training batches (is the train split empty?)")
    log.info("train: %d pairs, %d batches per epoch per rank, padding %.1f%%; effective batch = "
             "%d ranks x %d tokens x update_freq %d", len(train_ids), len(sampler.epoch(0)),
             100 * sampler.padding_fraction(), dist.world_size, tcfg.max_tokens, tcfg.update_freq)

    model = build_model(cfg.model, tokenizer.vocab_size, PAD_ID).to(dist.device)
    n_params = sum(p.numel() for p in model.parameters())
    log.info("model: %s positions, %.2fM parameters", cfg.model.positions.value, n_params / 1e6)
    optimizer = build_optimizer(model, tcfg)
    scaler = torch.amp.GradScaler(dist.device.type, enabled=amp == torch.float16)
    state = TrainState()
    spm = {"path": str(tokenizer.path), "sha256": tokenizer.sha256(), "model": tokenizer.model_bytes()}

    if ck is not None:
        if ck["spm"]["sha256"] != spm["sha256"]:
            raise UserError(f"{ck_path}: trained with another vocabulary ({ck['spm']['path']})")
        checkpoint.load_model_state(model, ck["model"], ck_path)
        optimizer.load_state_dict(ck["optim"])
        scaler.load_state_dict(ck["scaler"])
        state = TrainState(**ck["state"])
        checkpoint.set_rng_state(ck["rng"][dist.rank % len(ck["rng"])])
        ck = None  # the model copied the weights: drop the loaded ones
        log.info("resumed from %s at step %d (epoch %d, batch %d)", ck_path, state.step, state.epoch,
                 state.batch)

    ddp = DistributedDataParallel(model) if dist.world_size > 1 else None
    net = torch.compile(ddp or model) if tcfg.compile else (ddp or model)
    writer, history = None, None
    if dist.is_main:
        # After a kill -9 the log holds the steps since the last save; the resumed run logs them again.
        if ck_path is not None:
            trim_history(out / "metrics.jsonl", state.step)
        writer = SummaryWriter(str(out / "tb"), purge_step=state.step + 1 if ck_path is not None else None)
        history = (out / "metrics.jsonl").open("a")
    bar = tqdm(total=tcfg.max_steps or None, initial=state.step, unit="step", dynamic_ncols=True,
               disable=not (dist.is_main and tcfg.progress and sys.stderr.isatty()))

    def record(tag: str, values: dict) -> None:
        if dist.is_main:
            for k, v in values.items():
                if isinstance(v, (int, float)):
                    writer.add_scalar(f"{tag}/{k}", v, state.step)
            history.write(json.dumps({"step": state.step, "tag": tag, **values}) + "\n")
            history.flush()

    def save(names: list[str]) -> None:
        rngs = distributed.gather(checkpoint.rng_state(), dist)
        if dist.is_main:
            payload = {"format": checkpoint.CHECKPOINT_FORMAT, "model": model.state_dict(),
                       "optim": optimizer.state_dict(), "scaler": scaler.state_dict(), "step": state.step,
                       "position": {"epoch": state.epoch, "batch": state.batch}, "rng": rngs,
                       "state": asdict(state), "config": to_dict(cfg), "spm": spm}
            checkpoint.save(payload, ckpt_dir, names)
            checkpoint.prune(ckpt_dir, tcfg.keep_last)

    def update(group: list, lr: float) -> tuple[float, float, float, float, float]:
        """One update over micro-batches `group`; NaN/inf losses skip it, and too many in a row stop."""
        batches = [collate(train_ids, index).to(dist.device) for index in group]
        out = train_step(model, net, optimizer, scaler, batches, lr, tcfg.label_smoothing, amp, dist, ddp,
                         tcfg.clip_norm)
        loss, grad_norm = out[0], out[4]
        if math.isfinite(loss) and math.isfinite(grad_norm):
            state.bad_in_row = 0
            return out
        state.bad_total += 1
        if scaler.is_enabled() and math.isfinite(loss) and scaler.get_scale() >= MIN_LOSS_SCALE:
            # fp16: an overflowing gradient is GradScaler's cue to halve the loss scale and go on;
            # only a collapsed scale means the run diverged (fairseq's min_loss_scale)
            log.info("step %d: fp16 gradient overflow; update skipped, loss scale now %g", state.step + 1,
                     scaler.get_scale())
            return out
        state.bad_in_row += 1
        what = f"loss is {loss}" if not math.isfinite(loss) else f"gradient norm is {grad_norm} (loss {loss:.4g})"
        log.warning("step %d: %s; update skipped (%d in a row)", state.step + 1, what, state.bad_in_row)
        if state.bad_in_row >= tcfg.max_bad_steps:
            raise UserError(
                f"the loss or gradient was NaN/inf for {state.bad_in_row} updates in a row (step {state.step + 1}, "
                f"lr {lr:.3g}, precision {tcfg.precision.value}): lower train.lr, set train.clip_norm, or "
                f"use train.precision=fp32; the last checkpoint is {last}")
        return out

    def log_window(w: dict, lr: float) -> None:
        stats = {"loss": w["loss"] / w["tgt"], "nll": w["nll"] / w["tgt"],
                 "ppl": math.exp(min(w["nll"] / w["tgt"], 50)), "lr": lr,
                 "grad_norm": w["grad_norm"] / w["updates"], "tokens_per_s": w["tgt"] / w["seconds"],
                 "src_tgt_tokens_per_s": (w["src"] + w["tgt"]) / w["seconds"], "epoch": state.epoch}
        record("train", stats)
        log.info("step %d | loss %.3f | ppl %.2f | lr %.3g | |g| %.3g | %.0f tgt tok/s", state.step,
                 stats["loss"], stats["ppl"], lr, stats["grad_norm"], stats["tokens_per_s"])
        bar.set_postfix(loss=f"{stats['loss']:.3f}", lr=f"{lr:.2e}", tok_s=f"{stats['tokens_per_s']:.0f}")

    def validate() -> dict:
        """Validation loss (and BLEU) on rank 0, shared with every rank."""
        valid = {}
        if dist.is_main:
            valid = split_loss(model, corpus, "valid", tcfg.max_tokens, tcfg.label_smoothing, dist.device, amp)
            if tcfg.valid_bleu:
                valid.update(translate_split(model, corpus, "valid", cfg.decode, dist.device, amp)[0])
            record("valid", valid)
            log.info("step %d | valid loss %.3f | ppl %.2f%s", state.step, valid["loss"], valid["ppl"],
                     f" | BLEU {valid['bleu']:.2f}" if "bleu" in valid else "")
        return distributed.gather(valid, dist)[0]

    def done() -> bool:
        return bool((tcfg.max_steps and state.step >= tcfg.max_steps)
                    or (tcfg.max_epochs and state.epoch >= tcfg.max_epochs))

    valid: dict = {}
    interrupted = False
    window = dict.fromkeys(("loss", "nll", "tgt", "src", "seconds", "grad_norm", "updates"), 0.0)
    batches = sampler.epoch(state.epoch)
    with stop_signals() as received:
        while not done() and not interrupted:
            t0 = time.perf_counter()
            lr = learning_rate(tcfg, cfg.model.d_model, state.step + 1)
            group = batches[state.batch: state.batch + tcfg.update_freq]
            loss_sum, nll_sum, n_tgt, n_src, grad_norm = update(group, lr)
            state.step += 1
            state.batch += len(group)
            if state.batch >= len(batches):
                state.epoch, state.batch = state.epoch + 1, 0
                batches = sampler.epoch(state.epoch)
            seconds = time.perf_counter() - t0
            state.train_seconds += seconds
            state.src_tokens, state.tgt_tokens = state.src_tokens + int(n_src), state.tgt_tokens + int(n_tgt)
            for k, v in zip(window, (loss_sum, nll_sum, n_tgt, n_src, seconds, grad_norm, 1)):
                window[k] += v
            bar.update(1)
            if state.step % tcfg.log_every == 0:
                log_window(window, lr)
                window = dict.fromkeys(window, 0.0)

            interrupted = distributed.any_rank("signal" in received, dist)
            names = [f"step_{state.step}.pt", "last.pt"] if state.step % tcfg.save_every == 0 else []
            if state.step % tcfg.eval_every == 0 or done():
                valid = validate()
                use_bleu = tcfg.best_metric == BestMetric.bleu and "bleu" in valid
                if improved(valid["bleu"] if use_bleu else valid["loss"], state.best_value, tcfg.best_metric):
                    state.best_value, state.best_step = valid["bleu"] if use_bleu else valid["loss"], state.step
                    names.append("best.pt")
            if (done() or interrupted) and "last.pt" not in names:
                names.append("last.pt")
            if names:
                save(names)
    bar.close()

    metrics = {"status": "completed" if done() else "interrupted", "run_dir": str(out), "steps": state.step,
               "epochs": state.epoch, "params": n_params, "wall_seconds": time.perf_counter() - t_start,
               "train_seconds": state.train_seconds,
               "tokens_per_s": state.tgt_tokens / max(state.train_seconds, 1e-9),
               "src_tgt_tokens_per_s": (state.src_tokens + state.tgt_tokens) / max(state.train_seconds, 1e-9),
               "skipped_updates": state.bad_total, "final_valid": valid,
               "best": {"metric": tcfg.best_metric.value, "value": state.best_value, "step": state.best_step}}
    if dist.world_size > 1:  # DDP must leave every rank with the same weights; check it once
        digest = hashlib.sha256(b"".join(p.detach().cpu().numpy().tobytes() for p in model.parameters()))
        metrics["ddp_params_in_sync"] = len(set(distributed.gather(digest.hexdigest(), dist))) == 1
    if interrupted:
        log.warning("stopped by %s after step %d; %s holds the state. Resume with the same command plus "
                    "train.resume=true hydra.run.dir=%s", received.get("signal", "a signal on another rank"),
                    state.step, last, out)
    elif dist.is_main:
        if tcfg.average_last:  # Shaw §4.1: the big model averages its last 20 checkpoints
            averaged = checkpoint.average(checkpoint.step_files(ckpt_dir)[-tcfg.average_last:])
            checkpoint.save(averaged, ckpt_dir, ["averaged.pt"])
            metrics["averaged"] = averaged["averaged"]
        test_ckpt = ckpt_dir / f"{tcfg.test_checkpoint}.pt"
        if test_ckpt.is_file() and test_ckpt != last:
            checkpoint.load_model_state(model, checkpoint.load(test_ckpt)["model"], test_ckpt)
        metrics["test_checkpoint"] = str(test_ckpt if test_ckpt.is_file() else last)
        metrics["test_checkpoint_rule"] = tcfg.test_checkpoint
        metrics["test"], hyps, splits = {}, [], [s for s in corpus.splits if s not in ("train", "valid")]
        for split in splits:
            out_file = out / "translations" / f"{split}.{cfg.data.tgt}"
            metrics["test"][split], split_hyps = translate_split(model, corpus, split, cfg.decode, dist.device,
                                                                 amp, out_file)
            hyps += split_hyps
        if splits:  # length generalisation: BLEU by source length over all test splits together
            refs = [r for s in splits for r in corpus.texts(s, "tgt")]
            srcs = [x for s in splits for x in corpus.texts(s, "src")]
            metrics["by_source_length"] = {"splits": splits, "buckets": bucketed_bleu(
                hyps, refs, srcs, tuple(cfg.data.length_buckets))}
    if dist.is_main:
        (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
        history.close()
        writer.close()
    distributed.barrier(dist)
    distributed.cleanup()
    return metrics
