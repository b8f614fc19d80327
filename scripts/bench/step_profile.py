#!/usr/bin/env python
"""Where a compiled search step spends its time at one sentence (issue 76 §3), and what the step's two changes of
GRAPHS_VERSION 5 bought. Run it alone on the machine.

    python scripts/bench/step_profile.py --checkpoint /tmp/relmt-peers/r1/relmt-rel/checkpoints/last.pt \\
        --out docs/results/engines/step_profile.json --md docs/results/engines/step_profile.md

engine=aoti's small-rows search graph (search_small.pt2: relmt/export/aoti.py's settings, SMALL_CONFIGS) is
compiled three ways from the same checkpoint, and each is called on one sentence's step state (beam 4, --slots
slots so far, --source source tokens), the three interleaved over --repeats rounds of --calls calls, each at 1 and
2 threads; the best round counts:
- before: the step as GRAPHS_VERSION 4 traced it: the decoder step's attention through
  `scaled_dot_product_attention` (whose CPU kernel costs tens of microseconds at one query per hypothesis), and
  the live candidates picked by a stable sort;
- written: softmax(q k^T) v written out (relmt.model.attention: `written`);
- now: written, and the live candidates picked by topk (relmt.decode.beam.live_and_finishing), as relmt exports.
Then `now` again, compiled with inductor's kernel profiling (cpp.enable_kernel_profile), under torch's profiler:
each operator's share of a step (the profiling itself slows the step; the shares are what it is for).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from relmt.bench import best_per_call, command_line, hardware, markdown_table, page_head, write_json  # noqa: E402
from relmt.data.tokenizer import BOS_ID, PAD_ID  # noqa: E402
from relmt.decode import beam  # noqa: E402
from relmt.decode.translator import Translator  # noqa: E402
from relmt.export.aoti import SMALL_CONFIGS, compile_graph, flat_call  # noqa: E402
from relmt.export.graphs import SearchGraph, search_examples, shape_of  # noqa: E402
from relmt.model.attention import MultiHeadAttention  # noqa: E402


def sorted_live(cand, token, last, eos_id, t2t):
    """live_and_finishing as GRAPHS_VERSION 4 had it: the K live candidates by a stable sort."""
    k = cand.shape[1] // 2
    rank = torch.arange(2 * k, device=cand.device)
    is_eos = token == eos_id
    keep = torch.sort(is_eos.int() * 2 * k + rank, dim=1).indices[:, :k]
    finishing = beam.pick(t2t, lambda: is_eos | (last & torch.zeros_like(is_eos).scatter_(1, keep, True)),
                          lambda: (is_eos | last) & (rank < k))
    return keep, finishing & torch.isfinite(cand)


@contextlib.contextmanager
def variant(name: str):
    """The step's code as `name` traces it (module attributes patched for the export, then put back)."""
    forward, live = MultiHeadAttention.forward, beam.live_and_finishing
    if name == "before":
        MultiHeadAttention.forward = lambda self, *a, written=False, **kw: forward(self, *a, **kw)
    if name in ("before", "written"):
        beam.live_and_finishing = sorted_live
    try:
        yield
    finally:
        MultiHeadAttention.forward, beam.live_and_finishing = forward, live


def compile_step(model, path: Path, name: str, profile: bool = False, small: bool = True) -> float:
    """search_small.pt2 as relmt/export/aoti.py compiles it (small=False: search.pt2, which an int8 export runs at
    every size), from the step as `name` traces it; its seconds."""
    with variant(name):  # the patches shape what is traced; compiling reads the traced program alone
        return compile_graph(SearchGraph(model).eval(), *search_examples(model), path,
                             {**(SMALL_CONFIGS if small else {}), **({"cpp.enable_kernel_profile": True} if profile
                                                                      else {})})


def step_inputs(model, slots: int, source: int) -> tuple:
    """One sentence's search-step inputs at beam 4, `slots` steps in, over `source` source tokens."""
    shape = shape_of(model)
    layers, heads, d_head = shape["layers"], shape["heads"], shape["d_head"]
    g = torch.Generator().manual_seed(0)
    b, k = 1, 4
    history = torch.full((b, k, slots + 1), PAD_ID + 4)
    history[:, :, 0] = BOS_ID
    settings = search_examples(model)[0][12:]
    return (history, torch.ones(b, source, dtype=torch.bool),
            *(torch.randn(layers, b, heads, source, d_head, generator=g) for _ in range(2)),
            *(torch.randn(b * k, heads, slots, d_head, generator=g) for _ in range(2 * layers)),
            torch.arange(b * k).view(b, k), torch.zeros(b, k, dtype=torch.long), torch.zeros(b, k),
            torch.full((b, k), -1e9), torch.full((b, k, slots), PAD_ID), torch.tensor([slots + 20]), *settings)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", type=Path, default=Path("/tmp/relmt-peers/r1/relmt-rel/checkpoints/last.pt"))
    ap.add_argument("--slots", type=int, default=10)
    ap.add_argument("--source", type=int, default=20)
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--top", type=int, default=12, help="operators listed in the profile")
    ap.add_argument("--quantization", choices=("float32", "int8"), default="float32",
                    help="int8: engine=aoti quantization=int8's graph (relmt/export/quantize.py), search.pt2")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--md", type=Path)
    args = ap.parse_args()
    model = Translator.from_checkpoint(args.checkpoint, device="cpu", engine="torch").model.float().eval()
    small = args.quantization == "float32"
    if not small:
        from relmt.export.quantize import int8_copy

        model = int8_copy(model)
    inputs = step_inputs(model, args.slots, args.source)
    names = ("before", "written", "now")
    with tempfile.TemporaryDirectory(prefix="step-profile-") as tmp, torch.no_grad():
        tmp = Path(tmp)
        seconds = {name: compile_step(model, tmp / f"{name}.pt2", name, small=small) for name in names}
        runs = {name: flat_call(tmp / f"{name}.pt2") for name in names}
        pairs = list(zip(runs["before"](*inputs), runs["now"](*inputs)))
        same_ids = all(torch.equal(a, b) for a, b in pairs if not a.is_floating_point())
        float_diff = max(float((a - b).abs().max()) for a, b in pairs if a.is_floating_point() and a.numel())
        same = same_ids and float_diff <= 1e-5
        rows = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            best = best_per_call({name: (lambda run=run: run(*inputs)) for name, run in runs.items()}, args.repeats,
                                 args.calls, warmup=20)
            rows.append({"threads": threads, **{f"{n}_us": 1e6 * best[n] for n in names},
                         "now_over_before": best["now"] / best["before"]})
        compile_step(model, tmp / "profiled.pt2", "now", profile=True, small=small)
        profiled, steps = flat_call(tmp / "profiled.pt2"), 50
        for _ in range(20):
            profiled(*inputs)
        with torch.profiler.profile() as prof:
            for _ in range(steps):
                profiled(*inputs)
    events = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    total = sum(e.self_cpu_time_total for e in events)
    ops = [{"operator": e.key[:80], "calls_per_step": e.count / steps, "share": e.self_cpu_time_total / total}
           for e in events[:args.top]]
    hw = hardware()
    table = markdown_table(rows, [("threads", "threads"), ("before_us", "before: µs per step"),
                                  ("written_us", "written attention: µs"), ("now_us", "and topk (now): µs"),
                                  ("now_over_before", "now ÷ before")])
    for op in ops:
        op["share"] = f"{100 * op['share']:.1f}%"
    op_table = markdown_table(ops, [("operator", "operator (self time)"), ("calls_per_step", "calls per step"),
                                    ("share", "share of the profiled step")])
    print(table, op_table, f"same outputs before and now: {same}", sep="\n\n")
    payload = {"command": command_line(), "hardware": hw, "checkpoint": str(args.checkpoint), "slots": args.slots,
               "source": args.source, "quantization": args.quantization, "compile_s": seconds,
               "same_outputs": same, "same_ids": same_ids, "max_float_difference": float_diff, "rows": rows,
               "profile": ops}
    if args.out:
        write_json(args.out, payload)
    if args.md:
        gemms = ("aoti_torch_cpu__linear_pointwise* are oneDNN's GEMMs" if small else
                 "aoti_torch_cpu__int_mm_out is the int8 GEMM, the fused loops with amax/amin quantize its rows")
        args.md.write_text(
            page_head("A compiled search step at one sentence: where its time goes (issue 76 §3)" +
                      ("" if small else ", int8"), hw,
                      payload["command"]) +
            f"- model: {args.checkpoint}; one sentence's step at beam 4, {args.slots} slots in, {args.source} "
            f"source tokens; {'search_small.pt2' if small else 'search.pt2 of quantization=int8'} compiled as "
            f"engine=aoti compiles it; best of {args.repeats} "
            f"interleaved rounds of {args.calls} calls\n\n"
            "Before: the step of GRAPHS_VERSION 4 (the decoder step's attention through "
            "scaled_dot_product_attention, the live candidates by a stable sort). Written: softmax(q k^T) v "
            "written out. Now: and the live candidates by topk, as relmt exports today. Each package autotunes its "
            "GEMMs as it compiles, so two packages of one graph can differ by a few percent.\n\n"
            f"{table}\n\nBefore and now give the same step (tokens, rows and done equal; scores, keys and values to "
            f"1e-5): {'yes' if same else 'no'} (tokens, rows and done equal: {'yes' if same_ids else 'no'}; the "
            f"largest difference of a score, key or value: {float_diff:.2g})."
            f"\n\nWhere the step's time goes now (inductor's kernel profiling under torch's profiler, {steps} "
            f"steps at {torch.get_num_threads()} threads; the profiling slows the step, so only the shares "
            f"count; {gemms}):\n\n{op_table}\n")


if __name__ == "__main__":
    main()
