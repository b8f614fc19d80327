#!/usr/bin/env python
"""One sentence's step at beam 4 is 4 rows: what torch's libraries do with a step's linear maps there, float32 and
int8, beside what the machine's memory and arithmetic allow (issue 76 §1 and §3). Run it alone on the machine.

    python scripts/bench/small_rows_kernels.py --out docs/results/engines/small_rows_kernels.json \\
        --md docs/results/engines/small_rows_kernels.md

The linear maps of one decoder step of the bench_peers rel model (3 layers, d_model 256, FFN 1024, a 3,855-piece
vocabulary; the self-attention's W^Q, W^K and W^V as one map, W^Q of cross-attention, both output maps, the FFN,
the tied output layer), each timed alone at 4 rows and summed over a step, per way of computing them:
- float32, oneDNN prepacked: `mkldnn._linear_pointwise` on a weight reordered once, what engine=aoti's graphs call;
- float32, MKL packed: `mkl._mkl_linear` on a weight packed once (inductor's other prepacked float32 product);
- int8 u8s8, as compiled: `_int_mm` of the activations shifted to uint8 and the weight's transpose as a view,
  which is what engine=aoti quantization=int8 runs (torchao's CPU path on a VNNI machine without AMX);
- int8 u8s8, weight contiguous: the same product with the transposed weight stored contiguous;
- int8, oneDNN prepacked: `onednn.qlinear_pointwise` on a weight packed once (per-tensor activation scale);
- int8, fbgemm dynamic: `quantized.linear_dynamic` (torch.ao's dynamic quantized Linear, fbgemm, packed once).
The int8 ways time the product alone (and fbgemm's its own activation quantization); engine=aoti fuses each row's
quantization into the loop before it.

Beside them, two floors for the float32 step: its weights' bytes over the memory bandwidth measured here (a sum
over a buffer of the same size, which stays in the last-level cache), and its FLOPs over the float32 GEMM rate
measured here at 1024^3 (what the cores reach on a large product). Microseconds: the best of --repeats rounds of
--calls calls, at each of --threads.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from relmt.bench import command_line, hardware, markdown_table, page_head, write_json  # noqa: E402

D, FFN, VOCAB, LAYERS, ROWS = 256, 1024, 3855, 3, 4
# (name, in, out, maps per step)
SHAPES = [("self-attention W^QKV", D, 3 * D, LAYERS), ("attention output maps, cross W^Q", D, D, 3 * LAYERS),
          ("FFN in", D, FFN, LAYERS), ("FFN out", FFN, D, LAYERS), ("output layer", D, VOCAB, 1)]


def best_us(fn, repeats: int, calls: int) -> float:
    for _ in range(max(calls // 10, 3)):
        fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    return best * 1e6


def ways(k: int, n: int) -> dict:
    """Each way's call for a (ROWS, k) x (k, n) product, on the same random weight."""
    g = torch.Generator().manual_seed(k * n)
    x, w, bias = torch.randn(ROWS, k, generator=g), torch.randn(n, k, generator=g), torch.zeros(n)
    onednn = torch.ops.mkldnn._reorder_linear_weight(w, ROWS)
    mkl = torch.ops.mkl._mkl_reorder_linear_weight(w, ROWS)
    scale = w.abs().amax(1) / 127
    wq = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
    xu = torch.randint(0, 256, (ROWS, k), dtype=torch.uint8, generator=g)
    wq_t = wq.t().contiguous()
    x_scale, x_zero = torch.tensor(float(x.abs().max() / 127)), torch.tensor(128, dtype=torch.int32)
    qlinear = torch.ops.onednn.qlinear_prepack(wq, [ROWS, k])
    zeros = torch.zeros(n, dtype=torch.int32)
    torch.backends.quantized.engine = "fbgemm"
    dynamic = torch.ao.nn.quantized.dynamic.Linear(k, n)
    dynamic.set_weight_bias(torch.quantize_per_channel(w, scale.double(), torch.zeros(n, dtype=torch.long), 0,
                                                       torch.qint8), bias)
    return {
        "float32, oneDNN prepacked": lambda: torch.ops.mkldnn._linear_pointwise(x, onednn, None, "none", [], ""),
        "float32, MKL packed": lambda: torch.ops.mkl._mkl_linear(x, mkl, w, bias, ROWS),
        "int8 u8s8, as compiled": lambda: torch._int_mm(xu, wq.t()),
        "int8 u8s8, weight contiguous": lambda: torch._int_mm(xu, wq_t),
        "int8, oneDNN prepacked": lambda: torch.ops.onednn.qlinear_pointwise.tensor(
            xu, x_scale, x_zero, qlinear, scale, zeros, None, 1.0, 0, torch.float32, "none", [], ""),
        "int8, fbgemm dynamic": lambda: dynamic(x),
    }


def floors(repeats: int, calls: int) -> dict:
    """The float32 step's floors at this thread count: bytes / bandwidth, FLOPs / GEMM rate (microseconds)."""
    params = sum(k * n * c for _, k, n, c in SHAPES)
    buf = torch.randn(params)
    read_us = best_us(buf.sum, repeats, calls)
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    gemm_us = best_us(lambda: a @ b, repeats, max(calls // 20, 5))
    flops_per_s = 2 * 1024 ** 3 / (gemm_us * 1e-6)
    return {"weight_bytes": 4 * params, "bandwidth_gb_s": 4 * params / read_us / 1e3, "bytes_floor_us": read_us,
            "gemm_gflop_s": flops_per_s / 1e9, "flops_floor_us": 2 * ROWS * params / flops_per_s * 1e6}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--md", type=Path)
    opts = ap.parse_args()
    rows, steps = [], []
    for threads in opts.threads:
        torch.set_num_threads(threads)
        step: dict = {"threads": threads}
        for name, k, n, count in SHAPES:
            row = {"threads": threads, "map": f"{name} ({k} -> {n})", "per step": count}
            for way, fn in ways(k, n).items():
                row[way] = best_us(fn, opts.repeats, opts.calls)
                step[way] = step.get(way, 0.0) + count * row[way]
            rows.append(row)
            print(row, flush=True)
        step |= floors(opts.repeats, opts.calls)
        steps.append(step)
        print(step, flush=True)
    names = list(ways(8, 8))
    per_map = markdown_table(rows, [("threads", "threads"), ("map", "linear map"), ("per step", "per step")]
                             + [(w, f"{w}: µs") for w in names])
    per_step = markdown_table(steps, [("threads", "threads")] + [(w, f"{w}: µs") for w in names]
                              + [("bytes_floor_us", "float32 weights' bytes ÷ bandwidth: µs"),
                                 ("flops_floor_us", "float32 FLOPs ÷ GEMM rate: µs"),
                                 ("bandwidth_gb_s", "bandwidth, GB/s"), ("gemm_gflop_s", "GEMM, GFLOP/s")])
    hw = hardware()
    md = (page_head("A one-sentence step's linear maps at 4 rows: torch's libraries and the machine's floors "
                    "(issue 76 §1, §3)", hw, command_line())
          + f"- best of {opts.repeats} rounds of {opts.calls} calls\n\n" + __doc__.split("\n\n", 2)[2].strip()
          + "\n\nA step's linear maps, summed:\n\n" + per_step + "\n\nEach map (µs per call):\n\n" + per_map + "\n")
    print(md)
    if opts.out:
        write_json(opts.out, {"command": command_line(), "hardware": hw, "steps": steps, "maps": rows})
    if opts.md:
        opts.md.write_text(md)


if __name__ == "__main__":
    main()
