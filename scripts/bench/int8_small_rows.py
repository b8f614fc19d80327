#!/usr/bin/env python
"""Where int8 loses one sentence at a time (issue 70 §4): each part of an int8 linear map with dynamic activation
scales, as relmt/export/quantize.py's (torchao's Int8DynamicActivationInt8WeightConfig) computes it, timed alone
at a step's few rows (one sentence, beam 4: 4 rows) and at 32 sentences (128 rows), beside the float32 product.

For each linear shape of the bench_peers rel model (d_model 256, FFN 1024, a 3,855-piece vocabulary):
- float32: F.linear (oneDNN/MKL, the weight as it is);
- quantize x: each row's absolute maximum, its scale, round, clamp, cast to int8;
- _int_mm: the int8 x int8 -> int32 product alone (aten._int_mm, what the compiled graphs call);
- rescale: int32 -> float32 times the row and channel scales;
- int8 in all: the three above;
- weight-only int8: aten._weight_int8pack_mm (float32 rows times int8 weights with a scale per channel).
Medians over --repeats blocks of --calls calls, in microseconds per call, one process, --threads threads.

With --checkpoint and --src, then the compiled graphs themselves: engine=aoti float32 and int8 decode --sentences
sentences one at a time (beam 4, every hypothesis forced to 20 tokens, as bench_ct2_threads' regime) under torch's
profiler, which sees the operators the compiled code calls through the dispatcher (the GEMMs: oneDNN's prepacked
products, `_int_mm`) and not inductor's own loops; the rest of a sentence's time is those loops and Python.

    python scripts/bench/int8_small_rows.py --checkpoint /tmp/relmt-peers/r1/relmt-rel/checkpoints/last.pt \\
        --src /tmp/relmt-peers/corpus/test.src \\
        --json docs/results/engines/int8_small_rows.json --md docs/results/engines/int8_small_rows.md
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

SHAPES = {"attention projection (256 -> 256)": (256, 256), "FFN in (256 -> 1024)": (256, 1024),
          "FFN out (1024 -> 256)": (1024, 256), "output layer (256 -> 3855)": (256, 3855)}


def parts(x: torch.Tensor, w: torch.Tensor) -> dict:
    """The functions to time for input rows x (M, K) and float32 weight w (N, K)."""
    w_scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127  # (N,) per output channel, symmetric
    w8 = (w / w_scale[:, None]).round().clamp(-128, 127).to(torch.int8)
    w8t = w8.t()  # (K, N), as the graphs pass it to _int_mm
    x_scale = x.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127
    x8 = (x / x_scale).round().clamp(-128, 127).to(torch.int8)
    acc = torch._int_mm(x8, w8t)

    def quantize():
        s = x.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127
        return (x / s).round().clamp(-128, 127).to(torch.int8), s

    def rescale():
        return acc.float() * x_scale * w_scale

    def whole():
        q, s = quantize()
        return torch._int_mm(q, w8t).float() * s * w_scale

    return {"float32": lambda: F.linear(x, w), "quantize x": quantize, "_int_mm": lambda: torch._int_mm(x8, w8t),
            "rescale": rescale, "int8 in all": whole,
            "weight-only int8": lambda: torch.ops.aten._weight_int8pack_mm(x, w8, w_scale)}


def timed(fn, calls: int, repeats: int) -> float:
    for _ in range(20):
        fn()
    blocks = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        blocks.append((time.perf_counter() - t) / calls)
    return statistics.median(blocks) * 1e6


def profile_engine(checkpoint: str, src: Path, quantization: str, n: int) -> dict:
    """Milliseconds per sentence, one at a time on engine=aoti: in all, and in each profiled operator (self time)."""
    from torch.profiler import ProfilerActivity, profile

    from relmt.decode.translator import Translator

    translator = Translator.from_checkpoint(checkpoint, engine="aoti", quantization=quantization)
    fixed = dict(beam=4, lenpen=0.6, min_len=20, max_len_a=0.0, max_len_b=20)  # bench_peers' regime
    sentences = [s for s in src.read_text(encoding="utf-8").splitlines() if s.strip()][:n]
    for s in sentences[:3]:
        translator.translate([s], **fixed)
    start = time.perf_counter()
    for s in sentences:
        translator.translate([s], **fixed)
    plain = (time.perf_counter() - start) / n * 1e3
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for s in sentences:
            translator.translate([s], **fixed)
    ops = {e.key: e.self_cpu_time_total / 1e3 / n for e in prof.key_averages()}
    top = dict(sorted(ops.items(), key=lambda kv: -kv[1])[:8])
    return {"quantization": quantization, "ms_per_sentence": plain, "profiled_ms_per_sentence": sum(ops.values()),
            "top_ops_ms_per_sentence": top}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[4, 128])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--calls", type=int, default=500)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--checkpoint", help="also profile engine=aoti float32 and int8 one sentence at a time")
    ap.add_argument("--src", type=Path)
    ap.add_argument("--sentences", type=int, default=40)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--md", type=Path)
    opts = ap.parse_args()
    from relmt.bench import command_line, hardware

    torch.set_num_threads(opts.threads)
    torch.manual_seed(0)
    rows = []
    with torch.no_grad():
        for name, (k, n) in SHAPES.items():
            w = torch.randn(n, k) / k ** 0.5
            for m in opts.rows:
                x = torch.randn(m, k)
                row = {"shape": name, "rows": m} | {part: timed(fn, opts.calls, opts.repeats)
                                                    for part, fn in parts(x, w).items()}
                rows.append(row)
                print(json.dumps(row), flush=True)
    hw = hardware()
    cols = [c for c in rows[0] if c not in ("shape", "rows")]
    lines = ["# An int8 linear map's parts at few rows and at many (issue 70 §4)", "",
             "Microseconds per call (median of blocks); scripts/bench/int8_small_rows.py's docstring says what each "
             "column times.", "", f"- command: `{command_line()}`",
             f"- hardware: {hw['cpu']}, {hw['cpu_count']} cores, {opts.threads} thread(s), torch {hw['torch']}",
             f"- date: {hw['date']} (git {hw['git']})", "",
             "| linear map | rows | " + " | ".join(cols) + " |", "|---" * (2 + len(cols)) + "|"]
    lines += [f"| {r['shape']} | {r['rows']} | " + " | ".join(f"{r[c]:.1f}" for c in cols) + " |" for r in rows]
    engines = [profile_engine(opts.checkpoint, opts.src, q, opts.sentences) for q in ("float32", "int8")] \
        if opts.checkpoint else []
    if engines:
        lines += ["", f"## The compiled graphs, one sentence at a time ({opts.sentences} sentences, beam 4, 20 tokens)",
                  "", f"engine=aoti on `{opts.checkpoint}`; milliseconds per sentence; the operators torch's profiler "
                  "sees (self time), the rest being inductor's own loops and Python.", ""]
        for e in engines:
            lines += [f"- {e['quantization']}: {e['ms_per_sentence']:.2f} ms a sentence unprofiled; profiled, by "
                      "operator: " + ", ".join(f"`{k}` {v:.2f}" for k, v in e["top_ops_ms_per_sentence"].items())]
    text = "\n".join(lines) + "\n"
    print(text)
    if opts.json:
        opts.json.write_text(json.dumps({"command": command_line(), "hardware": hw, "threads": opts.threads,
                                         "rows": rows, "engines": engines}, indent=2) + "\n")
    if opts.md:
        opts.md.write_text(text)


if __name__ == "__main__":
    main()
