#!/usr/bin/env python
"""Training throughput of every position mode: target tokens/s, peak memory, MFU and step time / abs's,
with OpenNMT-py 3.5.1 beside relmt on the same workload (--onmt).

Workloads:
- WMT-like, the default: real English-German text from ../shared/data (--shared-data), the largest raw
  en-de text there: the first 20,000 pairs of the WMT14 training data (Europarl v7;
  europarl20k_ende/train) and newstest2014 (wmt14_ende/test, 3,003 pairs). A joint 32k BPE
  sentencepiece vocabulary is trained on it, with relmt-prepare's own pipeline and filters (256 tokens
  a side, length ratio 3). Batches come from the real length distribution, sorted and packed as the
  trainer packs them, to about 25,000 target tokens (and as many source tokens) each: the paper's batch
  (Shaw §4.1), here one step on one GPU. --tgt-tokens 25000 sets the trainer's token budget, which counts
  padded source + target tokens, so that the batches hold that many target tokens on average: on this
  text the sampler's batches are about 30% padding, so the budget is about 75,000.
  The prepared data is cached in --data (default data/bench/wmt_like: spm.model, the token ids as int16
  .npy, meta.json; about 4 MB, so that a GPU call can carry it); `--prepare-only` builds it ahead of time
  on a CPU. Defaults: --sizes base big, every position mode, --precision auto (bf16 on CUDA).
- --peer-corpus: the synthetic corpus the CPU peers were measured on (../shared/bench/make_peer_corpus.py,
  seed 1234, 20k pairs, word vocabulary). --text-dir: any folder of {split}.{lang} files. Defaults for
  both: the small model (3+3 layers, d_model 256), abs rel both, 8192 padded tokens, fp32.

Every step is the trainer's own update (relmt.train.step.train_step with relmt.train.optim's Adam, fused
on CUDA): forward, label-smoothed loss, backward, Adam. The modes are timed paired: each step's batch is
run by every mode in turn, the order rotating from step to step, so drift in the machine's speed falls
on all of them alike. On CUDA every timed batch first runs once per mode untimed (--shape-warmup): a new
batch shape pays kernel set-up once, which otherwise landed on whichever mode ran it first
(docs/results/gpu/gpu_checks.md). Peak memory (CUDA) is a mode's own parameters and Adam state plus the most
its step allocated on top of what was resident before it (torch.cuda.max_memory_allocated), so the modes
held side by side do not count each other. Model FLOPs per token are counted with
torch.utils.flop_counter on the timed batch of median size; MFU divides the achieved FLOP/s by the peak of
a large matmul measured in the same process (bf16 on CUDA, fp32 on CPU). "MFU at abs's FLOPs" counts
only abs's FLOPs for every mode: the useful work, whatever a position method adds.

    python scripts/bench/bench_train.py --prepare-only                        # on a CPU: data/bench/wmt_like
    python scripts/bench/bench_train.py --device cuda --onmt abs rel --out train.json --md train.md
    python scripts/bench/bench_train.py --sizes tiny --steps 2 --device cpu     # a smoke run
    python scripts/bench/bench_train.py --peer-corpus ../shared/bench/make_peer_corpus.py \\
        --out docs/results/performance/train_cpu.json --md docs/results/performance/train_cpu.md
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from relmt.bench import command_line, flop_counter, hardware, markdown_table, sync, write_json
from relmt.config import DataConfig, ModelConfig, PosKind, Precision, Source, SpmModel, TrainConfig, compose
from relmt.data.batching import BatchSampler, collate
from relmt.data.dataset import SplitIds, prepare
from relmt.data.tokenizer import PAD_ID, Tokenizer
from relmt.model import routes
from relmt.model.linear import bound_onednn_caches, use_cpu_gemm
from relmt.model.transformer import build_model
from relmt.runtime import autocast_dtype, resolve_device, tune_cpu
from relmt.train.distributed import Dist
from relmt.train.optim import build_optimizer
from relmt.train.step import compile_for_training, train_step

ROOT = Path(__file__).resolve().parents[2]
PEER_SEED = 1234
# The real en-de text of ../shared/data (each folder's SOURCE.md says where it comes from)
WMT_LIKE = (("europarl20k_ende", "train"), ("wmt14_ende", "test"))
ALL_MODES = ["abs", "rel", "both", "rope", "alibi", "t5"]
DEFAULTS = {  # per workload: what the options left unset mean
    "wmt": dict(sizes=["base", "big"], positions=ALL_MODES, tgt_tokens=25000, vocab_size=32000,
                spm_model_type="bpe", precision="auto"),
    "text": dict(sizes=["small"], positions=["abs", "rel", "both"], max_padded_tokens=8192, vocab_size=8000,
                 spm_model_type="word", precision="fp32"),
}


# --- the WMT-like workload -------------------------------------------------------------------------

def prepare_wmt_like(shared: Path, out: Path, vocab_size: int, cache_dir: Path) -> Path:
    """Build `out` from the real en-de text under `shared` once: relmt-prepare's vocabulary and filters,
    then the training ids written small (int16: the vocabulary is under 32,768) for a GPU call to carry."""
    if (out / "meta.json").is_file():
        return out
    files = [shared / folder / f"{split}.{lang}" for folder, split in WMT_LIKE for lang in ("en", "de")]
    if missing := [str(f) for f in files if not f.is_file()]:
        raise SystemExit(f"the WMT-like workload reads {', '.join(missing)}: give --shared-data (the folder of "
                         "europarl20k_ende and wmt14_ende) or --peer-corpus / --text-dir")
    with tempfile.TemporaryDirectory() as tmp:
        text = Path(tmp)
        for lang in ("en", "de"):
            lines = [line for folder, split in WMT_LIKE
                     for line in (shared / folder / f"{split}.{lang}").read_text(encoding="utf-8").splitlines()]
            (text / f"train.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
            (text / f"valid.{lang}").write_text("\n".join(lines[:10]) + "\n", encoding="utf-8")
        data = DataConfig(name="wmt_like", source=Source.text, dir=str(text), src="en", tgt="de",
                          splits={"train": "train", "valid": "valid"}, vocab_size=vocab_size,
                          spm_model_type=SpmModel.bpe, cache_dir=str(cache_dir))
        corpus = prepare(data)
        ids = corpus.ids("train")
        assert corpus.tokenizer.vocab_size <= np.iinfo(np.int16).max
        out.mkdir(parents=True, exist_ok=True)
        for name, array, dtype in (("src", ids.src, np.int16), ("tgt", ids.tgt, np.int16),
                                   ("src_offsets", ids.src_offsets, np.int32),
                                   ("tgt_offsets", ids.tgt_offsets, np.int32)):
            np.save(out / f"{name}.npy", np.asarray(array).astype(dtype))
        (out / "spm.model").write_bytes(corpus.tokenizer.model_bytes())
        meta = {"sources": [f"{folder}/{split}.{{en,de}}" for folder, split in WMT_LIKE],
                "md5": {str(f.relative_to(shared)): hashlib.md5(f.read_bytes()).hexdigest() for f in files},
                "pairs_read": corpus.meta["splits"]["train"]["pairs"], "pairs": len(ids),
                "dropped": corpus.meta["splits"]["train"]["dropped"], "vocab_size": corpus.tokenizer.vocab_size,
                "spm_model_type": "bpe", "src_tokens": int(ids.src_lens.sum()), "tgt_tokens": int(ids.tgt_lens.sum()),
                "filters": {"max_tokens_per_side": data.max_tokens_per_side, "max_length_ratio": data.max_length_ratio}}
        (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return out


def load_wmt_like(folder: Path) -> tuple[SplitIds, int, dict]:
    """The prepared training ids (as the trainer's int32 / int64 arrays), vocabulary size and meta."""
    arrays = {name: np.load(folder / f"{name}.npy") for name in ("src", "src_offsets", "tgt", "tgt_offsets")}
    ids = SplitIds(arrays["src"].astype(np.int32), arrays["src_offsets"].astype(np.int64),
                   arrays["tgt"].astype(np.int32), arrays["tgt_offsets"].astype(np.int64))
    return ids, Tokenizer(folder / "spm.model").vocab_size, json.loads((folder / "meta.json").read_text())


def budget_for(ids: SplitIds, tgt_tokens: int, seed: int = 1) -> int:
    """The max_padded_tokens at which the trainer's batches of an epoch hold `tgt_tokens` target tokens on
    average: the padding a budget pays depends on the corpus's lengths."""
    budget = 2 * tgt_tokens
    for _ in range(4):
        mean = statistics.fmean(int(ids.tgt_lens[b].sum()) for b in BatchSampler(ids, budget, seed).epoch(0))
        budget = round(budget * tgt_tokens / mean)
    return budget


def peer_corpus(generator: Path, out: Path) -> Path:
    """Write the peer benchmark corpus once (deterministic: seed 1234, 20k/500/500 pairs)."""
    if not (out / "train.src").is_file():
        subprocess.run([sys.executable, str(generator), str(out), "--seed", str(PEER_SEED)], check=True)
    return out


def workload(args: argparse.Namespace) -> tuple[SplitIds, int, str]:
    """The training ids, the vocabulary size and a sentence saying what they are."""
    if args.peer_corpus or args.text_dir:
        text_dir = peer_corpus(args.peer_corpus, Path(args.cache_dir) / "peer-corpus") if args.peer_corpus \
            else args.text_dir
        data = DataConfig(name="bench", source=Source.text, dir=str(text_dir), src=args.src_lang, tgt=args.tgt_lang,
                          splits={"train": "train", "valid": "valid"}, vocab_size=args.vocab_size,
                          spm_model_type=SpmModel(args.spm_model_type), max_length_ratio=0, cache_dir=args.cache_dir)
        corpus = prepare(data)
        ids, vocab = corpus.ids("train"), corpus.tokenizer.vocab_size
        return ids, vocab, f"{shown(text_dir)} ({len(ids)} pairs, {args.spm_model_type} vocabulary of {vocab})"
    folder = prepare_wmt_like(args.shared_data, args.data, args.vocab_size, Path(args.cache_dir))
    ids, vocab, meta = load_wmt_like(folder)
    return ids, vocab, (f"WMT-like, real en-de text from {shown(args.shared_data)}: {' + '.join(meta['sources'])} "
                        f"({meta['pairs']} pairs after relmt-prepare's filters, BPE vocabulary of {vocab}; "
                        f"prepared in {shown(folder)})")


def shown(path: str | Path) -> str:
    """A path as a committed page names it: relative to the checkout, not this machine's absolute one."""
    return os.path.relpath(path, ROOT) if Path(path).is_absolute() else str(path)


# --- measuring -------------------------------------------------------------------------------------

def matmul_peak(device: torch.device, dtype: torch.dtype, n: int) -> float:
    """FLOP/s of an n x n x n matmul: the practical peak that MFU is measured against."""
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    sync(device)
    reps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < 2.0:
        a @ b
        reps += 1
    sync(device)
    return 2 * n ** 3 * reps / (time.perf_counter() - t0)


def state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Parameters and Adam's moments: what a mode keeps resident between steps."""
    tensors = list(model.parameters()) + [t for s in optimizer.state.values() for t in s.values()
                                          if isinstance(t, torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in tensors)


def top_ops(step, batches: list, device: torch.device, n: int = 12) -> list[dict]:
    """torch.profiler over `step` on `batches`: the n entries with the most self time, per step, on the device
    (kernels, on CUDA) or the CPU: where a mode's step time goes beside abs's."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        for batch in batches:
            step(batch)
        sync(device)
    attr = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    events = [e for e in prof.key_averages() if getattr(e, attr, 0) > 0]
    total = sum(getattr(e, attr) for e in events)
    return [{"op": e.key[:90], "ms_per_step": getattr(e, attr) / 1e3 / len(batches), "share": getattr(e, attr) / total,
             "calls_per_step": e.count / len(batches)}
            for e in sorted(events, key=lambda e: -getattr(e, attr))[:n]]


def measure_size(size: str, args: argparse.Namespace, vocab: int, batches: list, device: torch.device,
                 amp: torch.dtype | None, peak: float, shape_warmup: bool) -> list[dict]:
    """Every positions mode of one model size on the same batches, timed paired; one row per mode."""
    preset = compose([f"model={size}"]).model
    runs = {}
    for kind in [(pos, loss) for pos in args.positions for loss in args.loss]:
        torch.manual_seed(1)
        cfg = ModelConfig(**{**preset.__dict__, "positions": PosKind(kind[0]), "max_relative_position": args.k})
        model = build_model(cfg, vocab, PAD_ID).to(device).train()
        net = compile_for_training(model) if args.compile else model
        optimizer = build_optimizer(model, TrainConfig())  # the trainer's Adam: fused on CUDA
        scaler = torch.amp.GradScaler(device.type, enabled=amp == torch.float16)
        runs[kind] = (model, net, optimizer, scaler)
    dist = Dist(0, 1, device)

    def step(kind: tuple[str, str], batch) -> None:
        model, net, optimizer, scaler = runs[kind]
        train_step(model, net, optimizer, scaler, [batch], 1e-4, 0.1, amp, dist, chunked_loss=kind[1] == "chunked")

    timed = batches[args.warmup:]
    if shape_warmup:
        for batch in timed:
            for kind in runs:
                step(kind, batch)
    seconds, step_peak = dict.fromkeys(runs, 0.0), dict.fromkeys(runs, 0)
    kinds = list(runs)
    for i, batch in enumerate(batches):
        for kind in kinds[i % len(kinds):] + kinds[:i % len(kinds)]:  # rotated: no mode always goes first
            sync(device)
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
                before = torch.cuda.memory_allocated(device)
            t0 = time.perf_counter()
            step(kind, batch)
            sync(device)
            if i >= args.warmup:
                seconds[kind] += time.perf_counter() - t0
                if device.type == "cuda":
                    step_peak[kind] = max(step_peak[kind], torch.cuda.max_memory_allocated(device) - before)
    profiles = {kind: top_ops(lambda b, kind=kind: step(kind, b), timed[:args.profile_steps], device)
                for kind in runs} if args.profile_steps else {}
    src = sum(b.n_src_tokens for b in timed)
    tgt = sum(b.n_tgt_tokens for b in timed)
    median = sorted(timed, key=lambda b: b.n_src_tokens + b.n_tgt_tokens)[len(timed) // 2]
    rows = []
    for kind, (model, _net, optimizer, scaler) in runs.items():
        # FlopCounterMode has no formula for oneDNN's linear products (CPU float32 training: relmt/model/linear.py),
        # which it counted as 0 FLOPs: count the same step through torch's own (the same arithmetic)
        with use_cpu_gemm("mkl"), flop_counter() as counter:
            train_step(model, model, optimizer, scaler, [median], 1e-4, 0.1, amp, dist,
                       chunked_loss=kind[1] == "chunked")
        flops_per_token = counter.get_total_flops() / (median.n_src_tokens + median.n_tgt_tokens)
        tps = (src + tgt) / seconds[kind]
        rows.append({"system": "relmt", "size": size, "positions": kind[0], "steps": len(timed),
                     "loss": kind[1] if len(args.loss) > 1 else None,
                     "step_ms": 1000 * seconds[kind] / len(timed), "tgt_tokens_per_s": tgt / seconds[kind],
                     "src_tgt_tokens_per_s": tps, "flops_per_token": flops_per_token,
                     "mfu": flops_per_token * tps / peak,
                     "peak_mib": (state_bytes(model, optimizer) + step_peak[kind]) / 2 ** 20
                     if device.type == "cuda" else None} | ({"top_ops": profiles[kind]} if profiles else {}))
    runs.clear()  # the models go before the next size
    return relative_to_abs(rows, peak)


def make_batches(ids: SplitIds, budget: int, args: argparse.Namespace,
                 device: torch.device, batch_by: str = "source") -> tuple[list, BatchSampler]:
    """The warm-up and timed batches, on the device: the trainer's first batches of an epoch at `budget`."""
    sampler = BatchSampler(ids, budget, seed=1, batch_by=batch_by)
    order = sampler.epoch(0)
    return [collate(ids, order[i % len(order)], args.pad_to_multiple).to(device)
            for i in range(args.warmup + args.steps)], sampler


def measure_fitting(size: str, args: argparse.Namespace, ids: SplitIds, vocab: int, batches: list,
                    device: torch.device, amp: torch.dtype | None, peak: float, shape_warmup: bool,
                    batch_by: str = "source") -> list[dict]:
    """measure_size; where the GPU runs out of memory, once more on batches of two thirds the budget (the
    rows say so), else a row naming the error: the other sizes and OpenNMT-py still run."""
    budget = args.max_padded_tokens
    try:
        return [r | {"max_padded_tokens": budget}
                for r in measure_size(size, args, vocab, batches, device, amp, peak, shape_warmup)]
    except torch.cuda.OutOfMemoryError:
        pass  # out of the except block first, so that its traceback frees the models
    gc.collect()
    torch.cuda.empty_cache()
    smaller = budget * 2 // 3
    print(f"{size}: CUDA out of memory at {budget} padded tokens a batch; again at {smaller}", flush=True)
    try:
        rows = measure_size(size, args, vocab, make_batches(ids, smaller, args, device, batch_by)[0], device, amp, peak,
                            shape_warmup)
        return [r | {"max_padded_tokens": smaller, "note": f"out of memory at {budget}"} for r in rows]
    except torch.cuda.OutOfMemoryError:
        pass
    return [{"system": "relmt", "size": size, "positions": " ".join(args.positions), "max_padded_tokens": smaller,
             "error": f"CUDA out of memory at {budget} and at {smaller} padded tokens a batch"}]


def relative_to_abs(rows: list[dict], peak: float) -> list[dict]:
    """Each mode's step time and peak memory over abs's, and its MFU at abs's FLOPs per token."""
    for r in rows:  # abs with the same loss route
        base = next((b for b in rows if b["positions"] == "abs" and b.get("loss") == r.get("loss")), None)
        if base is None:
            continue
        r["over_abs_step_time"] = r["step_ms"] / base["step_ms"]
        r["mfu_abs_flops"] = base["flops_per_token"] * r["src_tgt_tokens_per_s"] / peak
        if r["peak_mib"] is not None:
            r["over_abs_memory"] = r["peak_mib"] / base["peak_mib"]
    return rows


def run_onmt(args: argparse.Namespace, size: str, pos: str, device: torch.device, budget: int) -> dict | None:
    """OpenNMT-py 3.5.1 on the same prepared data (scripts/peers/onmt_train.py, its own process); None,
    with a message, where it failed."""
    out = Path(args.onmt_work) / f"{size}-{pos}.json"
    cmd = [sys.executable, str(ROOT / "scripts/peers/onmt_train.py"), "--data", str(args.data), "--size", size,
           "--positions", pos, "--k", str(args.k), "--batch-tokens", str(budget // 2),
           "--steps", str(args.onmt_steps), "--warmup", str(args.onmt_warmup), "--work", str(args.onmt_work),
           "--device", device.type, "--timeout", str(args.onmt_timeout), "--json", str(out)]
    print("+", " ".join(cmd), flush=True)
    result = subprocess.run(cmd, text=True)
    if result.returncode != 0 or not out.is_file():
        print(f"OpenNMT-py {size} {pos}: failed (exit {result.returncode})", flush=True)
        return None
    return json.loads(out.read_text())


# --- the run ---------------------------------------------------------------------------------------

def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", "--data-out", dest="data", type=Path, default=ROOT / "data/bench/wmt_like",
                    help="the prepared WMT-like workload: read, or built here first (default data/bench/wmt_like)")
    ap.add_argument("--shared-data", type=Path, default=ROOT.parent / "shared/data",
                    help="where the WMT-like text is read from (default ../shared/data)")
    ap.add_argument("--prepare-only", action="store_true", help="build --data and stop (on a CPU, ahead of a GPU call)")
    ap.add_argument("--peer-corpus", type=Path, help="or: path to make_peer_corpus.py: generate and use its corpus")
    ap.add_argument("--text-dir", type=Path, help="or: a folder of {split}.{lang} files")
    ap.add_argument("--src-lang", default="src")
    ap.add_argument("--tgt-lang", default="tgt")
    ap.add_argument("--vocab-size", type=int, help="upper bound (default 32000 WMT-like, 8000 otherwise)")
    ap.add_argument("--spm-model-type", help="--text-dir / --peer-corpus: sentencepiece model type (default word)")
    ap.add_argument("--cache-dir", default="data/cache")
    ap.add_argument("--sizes", nargs="+", help="model presets from configs/model (default base big WMT-like, "
                                               "small otherwise)")
    ap.add_argument("--positions", nargs="+", choices=[k.value for k in PosKind],
                    help=f"default {' '.join(ALL_MODES)} WMT-like, abs rel both otherwise")
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--max-padded-tokens", type=int,
                    help="per batch: size x (longest source + longest target + 1), as train.max_padded_tokens "
                         "(default: set by --tgt-tokens WMT-like, 8192 otherwise)")
    ap.add_argument("--tgt-tokens", type=int,
                    help="WMT-like: the target tokens a batch should hold on average; sets --max-padded-tokens "
                         "(default 25000, the paper's batch)")
    ap.add_argument("--pad-to-multiple", type=int, default=0, help="as train.pad_to_multiple")
    ap.add_argument("--loss", nargs="+", choices=["whole", "chunked"], default=["whole"],
                    help="the output layer and loss: whole logits, or chunked (train.output_loss); each a mode of "
                         "the paired timing")
    ap.add_argument("--batch-by", nargs="+", choices=["source", "longest"], default=["source"],
                    help="the batch order (train.batch_by); each its own batches, padding and rows")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--precision", choices=[p.value for p in Precision],
                    help="default auto WMT-like (bf16 on CUDA, fp32 on CPU), fp32 otherwise")
    ap.add_argument("--compile", action="store_true", help="compile the model as train.compile=true does")
    ap.add_argument("--route", choices=list(routes.ROUTES), default="auto",
                    help="the attention route of relative and biased attention (RELMT_ATTENTION), for every mode")
    ap.add_argument("--profile-steps", type=int, default=0,
                    help="after timing, profile this many timed batches per mode: its top operators (kernels on CUDA)")
    ap.add_argument("--shape-warmup", choices=["auto", "on", "off"], default="auto",
                    help="run every timed batch once per mode, untimed, before timing (auto: on CUDA, where the "
                         "first step of a new batch shape pays one-off kernel set-up; docs/results/gpu/gpu_checks.md)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--peak-n", type=int, default=0, help="matmul size for the peak (default 2048 CPU, 8192 GPU)")
    ap.add_argument("--no-tune-cpu", action="store_true",
                    help="leave malloc and denormals at their defaults (relmt.runtime.tune_cpu is not called)")
    ap.add_argument("--onmt", nargs="*", default=[], choices=["abs", "rel"],
                    help="also train OpenNMT-py 3.5.1 (importable as onmt) with these positions, WMT-like only")
    ap.add_argument("--onmt-sizes", nargs="+", help="default: --sizes")
    ap.add_argument("--onmt-steps", type=int, default=50, help="OpenNMT-py updates per run")
    ap.add_argument("--onmt-warmup", type=int, default=20, help="updates before OpenNMT-py's timing starts")
    ap.add_argument("--onmt-timeout", type=int, default=150, help="seconds per OpenNMT-py run")
    ap.add_argument("--onmt-work", type=Path, default=Path(tempfile.gettempdir()) / "relmt-onmt")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--md", type=Path)
    args = ap.parse_args()
    defaults = DEFAULTS["text" if args.peer_corpus or args.text_dir else "wmt"]
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.onmt and (args.peer_corpus or args.text_dir):
        ap.error("--onmt runs on the WMT-like workload only")
    return args


def main() -> None:
    args = parse_args()
    bound_onednn_caches()  # before the first oneDNN call, as relmt-train does (relmt/model/linear.py)
    if args.prepare_only:
        folder = prepare_wmt_like(args.shared_data, args.data, args.vocab_size, Path(args.cache_dir))
        print(json.dumps(json.loads((folder / "meta.json").read_text()), indent=2))
        print(f"{folder}: {sum(f.stat().st_size for f in folder.iterdir()) / 2 ** 20:.1f} MiB")
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    tuned = {} if args.no_tune_cpu else tune_cpu()
    device = resolve_device(args.device)
    ids, vocab, described = workload(args)
    if args.max_padded_tokens is None:
        args.max_padded_tokens = budget_for(ids, args.tgt_tokens)
    orders = {order: make_batches(ids, args.max_padded_tokens, args, device, order) for order in args.batch_by}
    batches, sampler = orders[args.batch_by[0]]
    timed = batches[args.warmup:]
    per_batch = {"src": statistics.fmean(b.n_src_tokens for b in timed),
                 "tgt": statistics.fmean(b.n_tgt_tokens for b in timed)}
    amp = autocast_dtype(Precision(args.precision), device)
    shape_warmup = args.shape_warmup == "on" or (args.shape_warmup == "auto" and device.type == "cuda")
    peak = matmul_peak(device, amp or torch.float32, args.peak_n or (8192 if device.type == "cuda" else 2048))
    print(f"{described}; {len(sampler.epoch(0))} batches of at most {args.max_padded_tokens} padded tokens, "
          f"{per_batch['src']:.0f} source + {per_batch['tgt']:.0f} target tokens per timed batch, padding "
          f"{100 * sampler.padding_fraction():.1f}%, matmul peak {peak / 1e9:.0f} GFLOP/s",
          flush=True)

    rows = []
    for size in args.sizes:  # each size, then OpenNMT-py at it; the report is rewritten after each part
        for order, (order_batches, order_sampler) in orders.items():  # each order its own batches
            extra = {"batch_by": order, "padding": order_sampler.padding_fraction()} if len(orders) > 1 else {}
            with routes.use_route(args.route):
                rows += [r | extra | ({"route": args.route} if args.route != "auto" else {})
                         for r in measure_fitting(size, args, ids, vocab, order_batches, device, amp, peak,
                                                  shape_warmup, order)]
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()  # the GPU to OpenNMT-py's process, or the next size
        for r in [r for r in rows if r["size"] == size and "error" not in r]:
            peak_mib = f", peak {r['peak_mib']:.0f} MiB" if r["peak_mib"] is not None else ""
            variant = "".join(f" {r[k]}" for k in ("loss", "batch_by") if r.get(k))
            print(f"{size} {r['positions']}{variant}: {r['tgt_tokens_per_s']:.0f} tgt tok/s, "
                  f"{r['step_ms']:.0f} ms/step, MFU {100 * r['mfu']:.1f}%{peak_mib}", flush=True)
        report(args, rows, device, peak, tuned, vocab, sampler, described, per_batch, shape_warmup)
        budget = rows[-1].get("max_padded_tokens", args.max_padded_tokens)  # smaller where relmt's ran out
        for pos in args.onmt if size in (args.onmt_sizes or args.sizes) else []:
            if (row := run_onmt(args, size, pos, device, budget)) is not None:
                ours = next((r for r in rows if r["size"] == size and r["positions"] == pos), None)
                if ours is not None:
                    ours["over_onmt"] = ours["tgt_tokens_per_s"] / row["tgt_tokens_per_s"]
                rows.append({"system": "OpenNMT-py 3.5.1", **row})
                report(args, rows, device, peak, tuned, vocab, sampler, described, per_batch, shape_warmup)


def report(args: argparse.Namespace, rows: list[dict], device: torch.device, peak: float, tuned: dict, vocab: int,
           sampler: BatchSampler, described: str, per_batch: dict, shape_warmup: bool) -> None:
    columns = [("system", "system"), ("size", "model"), ("positions", "positions"), ("loss", "loss"),
               ("batch_by", "batch_by"), ("padding", "padding"), ("route", "route"),
               ("tgt_tokens_per_s", "target tok/s"), ("src_tgt_tokens_per_s", "source+target tok/s"),
               ("step_ms", "ms/step"), ("over_abs_step_time", "step time / abs"), ("peak_mib", "peak MiB"),
               ("over_abs_memory", "memory / abs"), ("mfu", "MFU"), ("mfu_abs_flops", "MFU at abs's FLOPs"),
               ("over_onmt", "tok/s / OpenNMT-py's"), ("note", "note"), ("error", "error")]
    columns = [c for c in columns if any(r.get(c[0]) is not None for r in rows)]
    table = markdown_table(rows, columns)
    hw = hardware(device)
    print("\n" + table, flush=True)
    settings = {k: shown(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    payload = {"command": command_line(), "hardware": hw, "settings": settings, "rows": rows, "workload": described,
               "peak_flops": peak, "cpu_tuning": tuned, "vocab_size": vocab, "mean_tokens_per_batch": per_batch,
               "padding_fraction": sampler.padding_fraction()}
    if args.out:
        write_json(args.out, payload)
    if args.md:
        precision = sorted({r["precision"] for r in rows if "precision" in r})
        onmt = " OpenNMT-py trains the same text, pieces and batch budget in its own process " \
               f"({', '.join(precision)}; on CUDA fp16 amp, its only mixed precision without apex; " \
               "scripts/peers/onmt_train.py), timed from its log over updates " \
               f"{args.onmt_warmup + 1}..{args.onmt_steps}." if args.onmt else ""
        args.md.parent.mkdir(parents=True, exist_ok=True)
        args.md.write_text(
            f"# Training throughput ({device.type})\n\n"
            f"Workload: {described}. Batches of at most {args.max_padded_tokens} padded source + target tokens "
            f"({per_batch['src']:.0f} source and {per_batch['tgt']:.0f} target tokens per timed batch on average, "
            f"{100 * sampler.padding_fraction():.1f}% padding), {args.precision} "
            f"({'compiled, ' if args.compile else ''}{hw['torch_threads']} threads), k = {args.k}. Each mode ran the "
            f"same {args.steps} batches, timed paired step by step (the order of the modes rotating) after "
            f"{args.warmup} warm-up steps{' and one untimed pass over the timed batches' if shape_warmup else ''}. "
            f"MFU = counted model FLOPs per token x tokens/s / the measured matmul peak "
            f"({peak / 1e9:.0f} GFLOP/s).{onmt}\n\n"
            f"- command: `{command_line()}`\n- hardware: {hw.get('gpu', hw['cpu'])}, torch {hw['torch']}\n"
            f"- date: {hw['date']} (git {hw['git']})\n\n{table}\n{profile_section(rows, args.profile_steps)}")


def profile_section(rows: list[dict], steps: int) -> str:
    """Each profiled mode's top operators (--profile-steps), one table per mode."""
    profiled = [r for r in rows if r.get("top_ops")]
    if not profiled:
        return ""
    columns = [("op", "operator or kernel"), ("ms_per_step", "self ms per step"), ("share", "share"),
               ("calls_per_step", "calls per step")]
    return "\n## Where each step goes (torch.profiler, self time, " + f"{steps} timed batches)\n" + "".join(
        f"\n### {r['size']} {r['positions']}\n\n{markdown_table(r['top_ops'], columns)}\n" for r in profiled)


if __name__ == "__main__":
    main()
