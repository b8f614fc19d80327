#!/usr/bin/env python
"""The output layer and loss with the whole logits or chunked (train.output_loss; issue 58): peak memory of a
training step and target tokens/s, each in a process of its own.

On the CPU no allocator counts tensors, so each variant trains in a fresh process and its peak is the process's
high-water mark (ru_maxrss) less its resident memory before the first step: the model, Adam and the batches are
already there, and relmt.runtime.tune_cpu keeps freed memory in the heap, so the high-water mark is the step's
peak. On CUDA it is torch.cuda.max_memory_allocated over the steps, and --largest also finds, per variant, the
largest batch (max_padded_tokens, growing by 1.25x from the first one) whose steps fit the GPU.

The workload is bench_train.py's WMT-like text (real en-de pairs from ../shared/data, a 32k BPE vocabulary, the
data prepared once into data/bench/wmt_like by `python scripts/bench/bench_train.py --prepare-only`), batched
as the trainer batches it. Variants run interleaved, --repeats times; the table gives medians.

    python scripts/bench/loss_memory.py --out docs/results/performance/loss_memory_cpu.json \\
        --md docs/results/performance/loss_memory_cpu.md
    python scripts/bench/loss_memory.py --device cuda --size big --positions rel --tgt-tokens 25000 --largest
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402
from bench_train import ROOT, budget_for, load_wmt_like, make_batches, prepare_wmt_like  # noqa: E402

from relmt.bench import command_line, hardware, markdown_table, sync, write_json  # noqa: E402
from relmt.config import ModelConfig, PosKind, Precision, TrainConfig, compose  # noqa: E402
from relmt.data.tokenizer import PAD_ID  # noqa: E402
from relmt.model.linear import bound_onednn_caches  # noqa: E402
from relmt.model.transformer import build_model  # noqa: E402
from relmt.runtime import autocast_dtype, resolve_device, tune_cpu  # noqa: E402
from relmt.train.distributed import Dist  # noqa: E402
from relmt.train.optim import build_optimizer  # noqa: E402
from relmt.train.step import train_step  # noqa: E402

VARIANTS = ("whole", "chunked")


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def child(args: argparse.Namespace) -> dict:
    """One variant in this process: warm-up and timed steps; its figures as a dict."""
    device = resolve_device(args.device)
    bound_onednn_caches()
    tune_cpu()
    if args.threads:
        torch.set_num_threads(args.threads)
    ids, vocab, _ = load_wmt_like(prepare_wmt_like(args.shared_data, args.data, 32000, Path(args.cache_dir)))
    budget = args.max_padded_tokens or budget_for(ids, args.tgt_tokens)
    batches, sampler = make_batches(ids, budget, args, device)
    torch.manual_seed(1)
    preset = compose([f"model={args.size}"]).model
    model = build_model(ModelConfig(**{**preset.__dict__, "positions": PosKind(args.positions)}), vocab,
                        PAD_ID).to(device).train()
    optimizer = build_optimizer(model, TrainConfig())
    amp = autocast_dtype(Precision(args.precision), device)
    scaler = torch.amp.GradScaler(device.type, enabled=amp == torch.float16)
    dist = Dist(0, 1, device)
    before = rss_mib()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        resident = torch.cuda.memory_allocated(device)
    seconds = 0.0
    for i, batch in enumerate(batches):
        sync(device)
        t0 = time.perf_counter()
        train_step(model, model, optimizer, scaler, [batch], 1e-4, 0.1, amp, dist,
                   chunked_loss=args.child == "chunked")
        sync(device)
        if i >= args.warmup:
            seconds += time.perf_counter() - t0
    timed = batches[args.warmup:]
    peak = (torch.cuda.max_memory_allocated(device) - resident) / 2 ** 20 if device.type == "cuda" else \
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - before
    return {"loss": args.child, "max_padded_tokens": budget, "vocab": vocab,
            "tgt_tokens_per_batch": statistics.fmean(b.n_tgt_tokens for b in timed),
            "tgt_tokens_per_s": sum(b.n_tgt_tokens for b in timed) / seconds, "step_peak_mib": peak,
            "padding": sampler.padding_fraction()}


def run_child(args: argparse.Namespace, variant: str, budget: int | None = None) -> dict | None:
    cmd = [sys.executable, __file__, "--child", variant, *sys.argv[1:]]
    if budget:
        cmd += ["--max-padded-tokens", str(budget)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        if "OutOfMemoryError" in done.stderr or "out of memory" in done.stderr:
            return None
        raise SystemExit(f"{variant} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=ROOT / "data/bench/wmt_like")
    ap.add_argument("--shared-data", type=Path, default=ROOT.parent / "shared/data")
    ap.add_argument("--cache-dir", default="data/cache")
    ap.add_argument("--size", default="small", help="a model preset of configs/model")
    ap.add_argument("--positions", default="rel")
    ap.add_argument("--tgt-tokens", type=int, default=4000, help="target tokens per batch (bench_train's budget rule)")
    ap.add_argument("--max-padded-tokens", type=int, default=0, help="or the trainer's budget itself")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--pad-to-multiple", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--precision", default="auto")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--largest", action="store_true", help="CUDA: the largest batch that fits, per variant")
    ap.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    ap.add_argument("--out", default="")
    ap.add_argument("--md", default="")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return

    runs = [r | {"repeat": k} for k in range(args.repeats) for v in VARIANTS if (r := run_child(args, v))]
    summary = []
    for v in VARIANTS:
        mine = [r for r in runs if r["loss"] == v]
        summary.append({**mine[0], "tgt_tokens_per_s": statistics.median(r["tgt_tokens_per_s"] for r in mine),
                        "step_peak_mib": statistics.median(r["step_peak_mib"] for r in mine), "runs": len(mine)})
    for s in summary:
        s["tok_s_vs_whole"] = s["tgt_tokens_per_s"] / summary[0]["tgt_tokens_per_s"]
        s["peak_vs_whole"] = s["step_peak_mib"] / summary[0]["step_peak_mib"]
    if args.largest:
        for s in summary:
            budget, fits = s["max_padded_tokens"], s["max_padded_tokens"]
            while run_child(args, s["loss"], budget := int(budget * 1.25)) is not None:
                fits = budget
                print(f"{s['loss']}: {fits} padded tokens fit", flush=True)
            s["largest_max_padded_tokens"] = fits
        whole, chunked = summary
        chunked["largest_vs_whole"] = chunked["largest_max_padded_tokens"] / whole["largest_max_padded_tokens"]
    columns = [("loss", "output layer and loss"), ("tgt_tokens_per_batch", "target tokens a batch"),
               ("tgt_tokens_per_s", "target tok/s (median)"), ("tok_s_vs_whole", "tok/s / whole"),
               ("step_peak_mib", "step peak MiB (median)"), ("peak_vs_whole", "peak / whole"), ("runs", "repeats")]
    if args.largest:
        columns += [("largest_max_padded_tokens", "largest max_padded_tokens"), ("largest_vs_whole", "/ whole")]
    table = markdown_table(summary, columns)
    print(table)
    hw = hardware(resolve_device(args.device))
    payload = {"command": command_line(), "hardware": hw, "summary": summary, "runs": runs}
    if args.out:
        write_json(args.out, payload)
    if args.md:
        s = summary[0]
        Path(args.md).write_text(
            "# The output layer and loss: whole logits or chunked (train.output_loss)\n\n"
            f"`{command_line()}`\n\n{hw['date']}; {hw['cpu']}, {hw['cpu_count']} cores; torch {hw['torch']}; "
            f"device {args.device}.\n\n"
            f"Model `{args.size}`, positions {args.positions}, a {s['vocab']}-piece vocabulary, batches of at most "
            f"{s['max_padded_tokens']} padded tokens ({s['tgt_tokens_per_batch']:.0f} target tokens each, "
            f"{100 * s['padding']:.1f}% padding), {args.warmup} warm-up and {args.steps} timed updates of the "
            "trainer's train_step, each variant in a process of its own, interleaved. The step peak is the "
            "process's high-water mark less its resident memory before the first step (CPU), or "
            "max_memory_allocated less the resident tensors (CUDA).\n\n" + table + "\n")


if __name__ == "__main__":
    main()
