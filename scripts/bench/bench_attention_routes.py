#!/usr/bin/env python
"""One self-attention layer, forward + backward, by attention route (relmt/model/routes.py): time, peak
memory and the bytes autograd keeps for backward, against sequence length.

A case is MODE:ROUTE[@MIB]:
- MODE: abs (plain attention through SDPA; no route applies), rel (Shaw §3: a^K and a^V, k = 16),
  keys (a^K only), t5, alibi;
- ROUTE: reference (the written-out route), chunked (blocks of query rows recomputed in backward; @MIB
  sets the block budget, relmt.model.chunked.BLOCK_BYTES, default 64), flex (FlexAttention: CUDA for
  training; attention dropout through its hashed mask, one pass more); a suffix +scatter sums per label
  with scatter_add on every device (relmt/model/labels.py; CUDA's default avoids its atomics), to time the
  two on one GPU.
The base model's shape (d_model 512, 8 heads), a fixed token budget (batch = tokens // n).

Peak memory counts every tensor allocated in one forward + backward (relmt.bench.PeakMemory on the CPU,
the allocator's peak on CUDA); "saved" is the bytes of the distinct storages autograd keeps for backward
(torch.autograd.graph.saved_tensors_hooks), which is deterministic; the forward-only column is one
forward pass in eval mode under no_grad, with a padding mask, as when a long source is encoded.

    OMP_NUM_THREADS=1 python scripts/bench/bench_attention_routes.py \\
        --out docs/results/performance/attention_routes_cpu.json --md docs/results/performance/attention_routes_cpu.md
    python scripts/bench/bench_attention_routes.py --device cuda --dropout 0 \\
        --cases abs rel:reference rel:chunked rel:flex t5:reference t5:flex --out $OUT/attention_routes_gpu.json
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from torch import Tensor, nn

from relmt.bench import command_line, hardware, markdown_table, peak_memory_bytes, time_interleaved, write_json
from relmt.model import chunked, labels, routes
from relmt.model.attention import MultiHeadAttention
from relmt.model.positions import NO_TERMS, ALiBi, RelativePositions, T5Bias

DEFAULT_CASES = ["abs", "rel:reference", "rel:chunked", "t5:reference", "t5:chunked"]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


class Layer(nn.Module):
    """A self-attention layer with its stack's positions (alibi, t5) computed in the timed step."""

    def __init__(self, mode: str, d_model: int, heads: int, k: int, dropout: float) -> None:
        super().__init__()
        d_head = d_model // heads
        rel = {"rel": lambda: RelativePositions(heads, d_head, k),
               "keys": lambda: RelativePositions(heads, d_head, k, values=False)}.get(mode, lambda: None)()
        self.attn = MultiHeadAttention(d_model, heads, dropout, rel)
        self.positions = {"t5": lambda: T5Bias(heads, d_model, bidirectional=True),
                          "alibi": lambda: ALiBi(heads)}.get(mode, lambda: None)()

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        n = x.shape[1]
        terms = NO_TERMS if self.positions is None else self.positions.terms(n, n, 0, x.device, x.dtype)
        return self.attn(x, *self.attn.project_kv(x, terms), mask=mask, terms=terms)


def saved_bytes(fn) -> int:
    """Bytes of the distinct storages autograd saves for backward while fn() runs."""
    seen: dict[tuple, int] = {}

    def pack(t: Tensor) -> Tensor:
        s = t.untyped_storage()
        seen[(s.device.type, s.data_ptr())] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())


def cpu_times(steps: dict, repeats: int) -> dict[str, float]:
    """Median CPU time (time.process_time) of each step, round-robin: on a shared machine the time this
    process computed, which other processes' load disturbs less than wall time."""
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            t0 = time.process_time()
            step()
            times[name].append(time.process_time() - t0)
    return {name: statistics.median(t) for name, t in times.items()}


def parse(case: str) -> tuple[str, str, int | None, bool]:
    """MODE:ROUTE[+scatter][@MIB] -> (mode, route, MIB or None, whether sums per label use scatter_add)."""
    mode, _, rest = case.partition(":")
    route, _, mib = (rest or "reference").partition("@")
    route, _, how = route.partition("+")
    return mode, route, int(mib) if mib else None, how == "scatter"


def measure(case: str, n: int, args: argparse.Namespace, device: torch.device) -> tuple[dict, object]:
    mode, route, mib, scatter = parse(case)
    batch = max(1, args.tokens // n)
    torch.manual_seed(0)
    layer = Layer(mode, args.d_model, args.heads, args.k, args.dropout).to(device).train()
    x = torch.randn(batch, n, args.d_model, device=device, requires_grad=True)
    mask = torch.ones(batch, 1, 1, n, dtype=torch.bool, device=device)
    budget = mib * 2**20 if mib else chunked.BLOCK_BYTES

    amp = args.precision != "fp32"

    def run(fn):
        old, sums = chunked.BLOCK_BYTES, labels.atomic_free
        chunked.BLOCK_BYTES = budget
        if scatter:
            labels.atomic_free = lambda t: False
        try:
            with routes.use_route(route), torch.autocast(device.type, dtype=DTYPES[args.precision], enabled=amp):
                return fn()
        finally:
            chunked.BLOCK_BYTES, labels.atomic_free = old, sums

    def step() -> None:
        def go():
            layer(x).sum().backward()
            layer.zero_grad(set_to_none=True)
            x.grad = None
        run(go)

    @torch.no_grad()
    def forward_only() -> None:
        layer.eval()
        run(lambda: layer(x, mask))
        layer.train()

    row = {"case": case, "n": n, "batch": batch,
           "peak_mib": peak_memory_bytes(step, device) / 2**20,
           "saved_mib": saved_bytes(lambda: run(lambda: layer(x))) / 2**20,
           "forward_mib": peak_memory_bytes(forward_only, device) / 2**20}
    if route == "chunked":
        row["block_rows"] = chunked.block_rows(batch, args.heads, n, n, x.element_size(), budget)
    return row, step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", type=int, nargs="+", default=[128, 512, 1024])
    ap.add_argument("--tokens", type=int, default=4096, help="token budget per batch (batch = tokens // n)")
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--dropout", type=float, default=0.1, help="attention dropout (flex needs 0)")
    ap.add_argument("--cases", nargs="+", default=DEFAULT_CASES, help="MODE:ROUTE[@MIB], see above")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--min-seconds", type=float, default=1.0, help="keep timing each case at least this long")
    ap.add_argument("--precision", choices=list(DTYPES), default="fp32", help="bf16: under autocast")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", type=Path, help="write JSON here")
    ap.add_argument("--md", type=Path, help="write a markdown report here")
    args = ap.parse_args()
    device = torch.device(args.device)

    rows: list[dict] = []
    for n in args.lengths:
        # written after each case's memory and after each length's times: a run cut off by its time box
        # keeps what finished (on 2026-11-27 the GPU's 60 s box ended inside n = 128, before any time)
        rows += measure_length(n, args, device, save=lambda partial, done=rows: write(done + partial, args, device))
        write(rows, args, device)
    print("\n" + markdown_table(rows, columns(rows, device)))


def measure_length(n: int, args: argparse.Namespace, device: torch.device, save=None) -> list[dict]:
    """Every case at length n; a case that fails (a kernel the device lacks) is reported with its error.
    save(rows), where given, is called with the memory rows so far after each case, before any timing."""
    measured, failed = [], []
    for case in args.cases:
        try:
            measured.append(measure(case, n, args, device))
            r, base = measured[-1][0], next((r for r, _ in measured if r["case"] == "abs"), None)
            if base is not None:
                r["peak_over_abs"] = r["peak_mib"] / base["peak_mib"]
        except Exception as e:  # noqa: BLE001 -- a benchmark reports what broke and goes on
            error = f"{type(e).__name__}: {e}"
            failed.append({"case": case, "n": n, "batch": max(1, args.tokens // n), "error": error})
            print(f"n={n:5d} {case:>16}  failed: {failed[-1]['error'][:300]}", flush=True)
        if save is not None:
            save([r for r, _ in measured] + failed)
    steps = {r["case"]: step for r, step in measured}
    for case, step in list(steps.items()):  # a case whose step fails now (a kernel that compiles late) is dropped,
        try:  # not the length's other timings (2026-11-28: n = 1024 lost them all)
            step()
        except Exception as e:  # noqa: BLE001
            del steps[case]
            measured = [(r, f) for r, f in measured if r["case"] != case]
            failed.append({"case": case, "n": n, "batch": max(1, args.tokens // n),
                           "error": f"{type(e).__name__}: {e}"})
    times = time_interleaved(steps, device, repeats=args.repeats, min_seconds=args.min_seconds) if steps else {}
    cpu = cpu_times(steps, args.repeats) if device.type == "cpu" and steps else {}
    q = torch.zeros(max(1, args.tokens // n), args.heads, n, args.d_model // args.heads, device=device,
                    dtype=DTYPES[args.precision])
    auto = routes.choose(q, n, args.dropout)  # what RELMT_ATTENTION=auto takes for a relative layer here
    base = next((r for r, _ in measured if r["case"] == "abs"), None)
    rows = []
    for r, _ in measured:
        r["ms"] = 1000 * times[r["case"]]
        r["auto"] = auto
        if cpu:
            r["cpu_ms"] = 1000 * cpu[r["case"]]
        if base is not None:
            r["time_over_abs"] = (cpu or times)[r["case"]] / (cpu or times)["abs"]
            r["peak_over_abs"] = r["peak_mib"] / base["peak_mib"]
        rows.append(r)
        print(f"n={n:5d} batch={r['batch']:4d} {r['case']:>16}  {r['ms']:9.1f} ms  peak {r['peak_mib']:8.1f} MiB"
              f"  saved {r['saved_mib']:8.1f} MiB  forward {r['forward_mib']:8.1f} MiB", flush=True)
    return rows + failed


def columns(rows: list[dict], device: torch.device) -> list[tuple[str, str]]:
    errors = [("error", "error")] if any("error" in r for r in rows) else []
    return [("n", "n"), ("batch", "batch"), ("case", "mode:route"), ("ms", "ms"),
            *([("cpu_ms", "CPU ms")] if device.type == "cpu" else []), ("time_over_abs", "time/abs"),
            ("peak_mib", "peak MiB"), ("peak_over_abs", "peak/abs"), ("saved_mib", "saved for backward MiB"),
            ("forward_mib", "forward-only peak MiB"), ("block_rows", "block rows"), ("auto", "auto picks"), *errors]


def write(rows: list[dict], args: argparse.Namespace, device: torch.device) -> None:
    hw = hardware(device)
    settings = {k: v for k, v in vars(args).items() if k not in ("out", "md")}
    if args.out:
        write_json(args.out, {"command": command_line(), "hardware": hw, "settings": settings, "rows": rows})
    if args.md:
        where = hw.get("gpu", hw["cpu"])
        args.md.parent.mkdir(parents=True, exist_ok=True)
        args.md.write_text(
            f"# Attention routes, one layer ({device.type})\n\n"
            f"One self-attention layer, forward + backward, {args.precision}, d_model {args.d_model}, "
            f"{args.heads} heads, k = {args.k}, attention dropout {args.dropout}, {args.tokens} tokens per batch, "
            "by route (relmt/model/routes.py; the cases are described in scripts/bench/bench_attention_routes.py). "
            "Time "
            f"is the median of at least {args.repeats} runs (and {args.min_seconds} s) per case after 2 warm-up "
            "runs, the cases of one length timed round-robin; on the CPU, \"CPU ms\" is the median process CPU "
            f"time of {args.repeats} more runs, which other processes' load disturbs less than wall time, and "
            "time/abs is taken from it. \"auto picks\" is the route RELMT_ATTENTION=auto takes for relative and "
            "biased self-attention at that shape. Peak memory counts every tensor allocated during one "
            "forward + backward (relmt.bench.PeakMemory on the CPU, the allocator's peak on CUDA); \"saved for "
            "backward\" is what autograd keeps between the two passes (saved_tensors_hooks, deterministic); the "
            "forward-only column is one forward pass in eval mode under no_grad, with a padding mask.\n\n"
            f"- command: `{command_line()}`\n- hardware: {where}, {hw['torch_threads']} torch threads, "
            f"torch {hw['torch']}\n- date: {hw['date']} (git {hw['git']})\n\n"
            f"{markdown_table(rows, columns(rows, device))}\n")


if __name__ == "__main__":
    main()
