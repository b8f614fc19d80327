#!/usr/bin/env python
"""Training throughput: tokens/s for abs, rel and both, the rel/abs step-time ratio, and MFU.

The workload defaults to the synthetic corpus the peer frameworks were measured on
(../shared/bench/make_peer_corpus.py, seed 1234, 20k pairs): a word-level vocabulary of the same
size as theirs, the small model (3+3 layers, d_model 256, 4 heads, FFN 1024, shared embeddings),
batches of about 4k tokens per side (--max-padded-tokens counts padded source + target, as
train.max_padded_tokens does), label smoothing 0.1, relative k = 16, fp32 on CPU. Every step is the
trainer's own update (relmt.train.step.train_step): forward, label-smoothed loss, backward, Adam.
The positions modes are timed paired: each step's batch is run by every mode in turn, the order
rotating from step to step, so drift in the machine's speed and one-off costs fall on all of them
alike. On CUDA every timed batch first runs once per mode untimed (--shape-warmup): a new batch shape
pays kernel set-up once, which otherwise landed on whichever mode ran it first.
Warm-up steps are excluded. Model FLOPs per step are counted once per mode with
torch.utils.flop_counter; MFU divides the achieved FLOP/s by the peak of a large matmul measured
in the same process (bf16 on CUDA, fp32 on CPU).

    python scripts/bench_train.py --peer-corpus ../shared/bench/make_peer_corpus.py \
        --out docs/results/train_cpu.json --md docs/results/train_cpu.md
    python scripts/bench_train.py --text-dir DIR --src-lang en --tgt-lang de     # any text corpus
    python scripts/bench_train.py --sizes base big --precision bf16              # on a GPU
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

from relmt.bench import command_line, hardware, markdown_table, sync, write_json
from relmt.config import DataConfig, ModelConfig, PosKind, Precision, Source, SpmModel, compose
from relmt.data.batching import BatchSampler, collate
from relmt.data.dataset import prepare
from relmt.data.tokenizer import PAD_ID
from relmt.model.transformer import build_model
from relmt.runtime import autocast_dtype, resolve_device, tune_cpu
from relmt.train.distributed import Dist
from relmt.train.step import train_step

PEER_SEED = 1234


def peer_corpus(generator: Path, out: Path) -> Path:
    """Write the peer benchmark corpus once (deterministic: seed 1234, 20k/500/500 pairs)."""
    if not (out / "train.src").is_file():
        subprocess.run([sys.executable, str(generator), str(out), "--seed", str(PEER_SEED)], check=True)
    return out


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peer-corpus", type=Path, help="path to make_peer_corpus.py: generate and use its corpus")
    ap.add_argument("--text-dir", type=Path, help="or: a folder of {split}.{lang} files")
    ap.add_argument("--src-lang", default="src")
    ap.add_argument("--tgt-lang", default="tgt")
    ap.add_argument("--vocab-size", type=int, default=8000, help="upper bound; word-level keeps every type")
    ap.add_argument("--spm-model-type", default="word")
    ap.add_argument("--cache-dir", default="data/cache")
    ap.add_argument("--sizes", nargs="+", default=["small"], help="model presets from configs/model")
    ap.add_argument("--positions", nargs="+", default=["abs", "rel", "both"])
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--max-padded-tokens", type=int, default=8192,
                    help="per batch: size x (longest source + longest target + 1), as train.max_padded_tokens")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--precision", default="fp32", choices=[p.value for p in Precision])
    ap.add_argument("--compile", action="store_true", help="torch.compile the model")
    ap.add_argument("--shape-warmup", choices=["auto", "on", "off"], default="auto",
                    help="run every timed batch once per mode, untimed, before timing (auto: on CUDA, where the "
                         "first step of a new batch shape pays one-off kernel set-up; docs/results/gpu_checks.md)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--peak-n", type=int, default=0, help="matmul size for the peak (default 2048 CPU, 8192 GPU)")
    ap.add_argument("--no-tune-cpu", action="store_true",
                    help="leave malloc and denormals at their defaults (relmt.runtime.tune_cpu is not called)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--md", type=Path)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    tuned = {} if args.no_tune_cpu else tune_cpu()
    device = resolve_device(args.device)
    text_dir = args.text_dir
    if args.peer_corpus:
        text_dir = peer_corpus(args.peer_corpus, Path(args.cache_dir) / "peer-corpus")
    if text_dir is None:
        ap.error("give --peer-corpus or --text-dir")
    data = DataConfig(name="bench", source=Source.text, dir=str(text_dir), src=args.src_lang, tgt=args.tgt_lang,
                      splits={"train": "train", "valid": "valid"}, vocab_size=args.vocab_size,
                      spm_model_type=SpmModel(args.spm_model_type), max_length_ratio=0, cache_dir=args.cache_dir)
    corpus = prepare(data)
    ids = corpus.ids("train")
    sampler = BatchSampler(ids, args.max_padded_tokens, seed=1)
    order = sampler.epoch(0)
    batches = [collate(ids, order[i % len(order)]).to(device) for i in range(args.warmup + args.steps)]
    amp = autocast_dtype(Precision(args.precision), device)
    shape_warmup = args.shape_warmup == "on" or (args.shape_warmup == "auto" and device.type == "cuda")
    peak = matmul_peak(device, amp or torch.float32, args.peak_n or (8192 if device.type == "cuda" else 2048))
    print(f"{len(ids)} training pairs, vocabulary {corpus.tokenizer.vocab_size}, padding "
          f"{100 * sampler.padding_fraction():.1f}%, matmul peak {peak / 1e9:.0f} GFLOP/s", flush=True)

    rows = []
    for size in args.sizes:
        preset = compose([f"model={size}"]).model
        runs = {}
        for kind in args.positions:
            torch.manual_seed(1)
            cfg = ModelConfig(**{**preset.__dict__, "positions": PosKind(kind), "max_relative_position": args.k})
            model = build_model(cfg, corpus.tokenizer.vocab_size, PAD_ID).to(device).train()
            net = torch.compile(model, dynamic=True) if args.compile else model
            optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
            scaler = torch.amp.GradScaler(device.type, enabled=amp == torch.float16)
            runs[kind] = (model, net, optimizer, scaler)
        dist = Dist(0, 1, device)
        seconds = {kind: 0.0 for kind in runs}
        tokens = {"src": 0, "tgt": 0}
        kinds = list(runs)
        if shape_warmup:
            for batch in batches[args.warmup:]:
                for model, net, optimizer, scaler in runs.values():
                    train_step(model, net, optimizer, scaler, [batch], 1e-4, 0.1, amp, dist)
        for i, batch in enumerate(batches):
            for kind in kinds[i % len(kinds):] + kinds[:i % len(kinds)]:  # rotated: no mode always goes first
                model, net, optimizer, scaler = runs[kind]
                sync(device)
                t0 = time.perf_counter()
                train_step(model, net, optimizer, scaler, [batch], 1e-4, 0.1, amp, dist)
                sync(device)
                if i >= args.warmup:
                    seconds[kind] += time.perf_counter() - t0
            if i >= args.warmup:
                tokens["src"] += batch.n_src_tokens
                tokens["tgt"] += batch.n_tgt_tokens
        for kind, (model, _net, optimizer, scaler) in runs.items():
            with FlopCounterMode(display=False) as counter:
                train_step(model, model, optimizer, scaler, [batches[0]], 1e-4, 0.1, amp, dist)
            flops_per_token = counter.get_total_flops() / (batches[0].n_src_tokens + batches[0].n_tgt_tokens)
            tps = (tokens["src"] + tokens["tgt"]) / seconds[kind]
            rows.append({"size": size, "positions": kind, "steps": args.steps,
                         "step_ms": 1000 * seconds[kind] / args.steps,
                         "tgt_tokens_per_s": tokens["tgt"] / seconds[kind], "src_tgt_tokens_per_s": tps,
                         "flops_per_token": flops_per_token, "mfu": flops_per_token * tps / peak})
        abs_row = next((r for r in rows if r["size"] == size and r["positions"] == "abs"), None)
        for r in rows:
            if abs_row and r["size"] == size:
                r["over_abs_step_time"] = r["step_ms"] / abs_row["step_ms"]
        for r in rows[-len(runs):]:
            print(f"{size} {r['positions']}: {r['tgt_tokens_per_s']:.0f} tgt tok/s, {r['src_tgt_tokens_per_s']:.0f} "
                  f"src+tgt tok/s, {r['step_ms']:.0f} ms/step, MFU {100 * r['mfu']:.1f}%", flush=True)

    columns = [("size", "model"), ("positions", "positions"), ("tgt_tokens_per_s", "target tok/s"),
               ("src_tgt_tokens_per_s", "source+target tok/s"), ("step_ms", "ms/step"),
               ("over_abs_step_time", "step time / abs"), ("mfu", "MFU")]
    table = markdown_table(rows, columns)
    hw = hardware(device)
    print("\n" + table)
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    payload = {"command": command_line(), "hardware": hw, "settings": settings, "rows": rows,
               "peak_flops": peak, "cpu_tuning": tuned, "vocab_size": corpus.tokenizer.vocab_size,
               "padding_fraction": sampler.padding_fraction()}
    if args.out:
        write_json(args.out, payload)
    if args.md:
        args.md.parent.mkdir(parents=True, exist_ok=True)
        args.md.write_text(
            f"# Training throughput ({device.type})\n\n"
            f"Workload: {text_dir} ({len(ids)} pairs, word vocabulary of {corpus.tokenizer.vocab_size}), batches of "
            f"at most {args.max_padded_tokens} padded source + target tokens ({100 * sampler.padding_fraction():.1f}% "
            f"padding), {args.precision}, {hw['torch_threads']} threads, k = {args.k}. Each mode ran the same "
            f"{args.steps} batches, timed paired step by step (the order of the modes rotating) after "
            f"{args.warmup} warm-up steps{' and one untimed pass over the timed batches' if shape_warmup else ''}. "
            f"MFU = counted "
            f"model FLOPs per token x tokens/s / the measured matmul peak ({peak / 1e9:.0f} GFLOP/s).\n\n"
            f"- command: `{command_line()}`\n- hardware: {hw.get('gpu', hw['cpu'])}, torch {hw['torch']}\n"
            f"- date: {hw['date']} (git {hw['git']})\n\n{table}\n")


if __name__ == "__main__":
    main()
