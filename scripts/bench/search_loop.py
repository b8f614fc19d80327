#!/usr/bin/env python
"""The whole beam search in one compiled call (issue 76 §1): relmt.export.graphs.LoopGraph, SearchGraph's step inside
torch's while_loop, exported and compiled with AOTInductor, against engine=aoti's search of one call per step. Run it
alone on the machine.

    python scripts/bench/search_loop.py --checkpoint runs/deploy_toy/checkpoints/best.pt \\
        --out docs/results/engines/search_loop.json --md docs/results/engines/search_loop.md

One sentence at a time (the toy test set), beam 4, length penalty 0.2 (power), 1 to --slots tokens, one thread:
1. the loop compiles, and gives engine=aoti's hypotheses and scores (to 1e-5) for every sentence;
2. sentences/s of engine=aoti's search (its compiled encoder, then one search-graph call per step) and of the loop
   (the same encoder, then one call), at each number of slots T, the loop's buffers' length (the step limit);
3. what a carried buffer costs: a while_loop that writes one slot of a (3, 4, T, 32) buffer per iteration, compiled
   the same way, timed at several T (AOTInductor copies the carried tensors at every iteration);
4. the per-step path's host cost: its time outside the compiled calls, per search-graph call;
5. the floor: an empty compiled call (a 0-d tensor plus one) through engine=aoti's call path
   (relmt.export.aoti.flat_call), in microseconds;
6. with --packed, the loop compiled again with its body's linear weights packed for oneDNN (scripts/bench/
   loop_weights.py), as freezing packs the per-step graph's but not a while_loop body's: hypotheses and speed.
Timings are interleaved over --repeats rounds; the best round counts.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from relmt.bench import command_line, hardware, markdown_table, page_head, write_json  # noqa: E402
from relmt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID  # noqa: E402
from relmt.data.toy import generate  # noqa: E402
from relmt.decode.beam import beam_search, finished_hypotheses, max_lengths  # noqa: E402
from relmt.decode.translator import Translator  # noqa: E402
from relmt.export.aoti import SMALL_CONFIGS, compile_graph, flat_call  # noqa: E402
from relmt.export.graphs import LoopGraph, loop_examples, loop_start  # noqa: E402

BEAM, LENPEN = 4, 0.2


def loop_inputs(aoti, src: torch.Tensor, slots: int) -> tuple:
    """The loop's inputs for one batch: engine=aoti's encoder output and empty buffers of `slots` slots."""
    keep, cross_k, cross_v = aoti.run_encoder(src)
    return loop_start(keep, cross_k, cross_v, BEAM, slots, max_lengths(keep, 0.0, slots), PAD_ID, 1, LENPEN, True,
                      True, False)


def loop_search(aoti, run, src: torch.Tensor, slots: int) -> list:
    pool_scores, pool_tokens, steps = run(*loop_inputs(aoti, src, slots))
    return finished_hypotheses(pool_scores, pool_tokens[:, :, :int(steps)], (EOS_ID, PAD_ID))


def step_search(aoti, src: torch.Tensor, slots: int) -> list:
    return beam_search(aoti, src, BEAM, BOS_ID, EOS_ID, lenpen=LENPEN, max_len_a=0.0, max_len_b=slots, nbest=BEAM,
                       min_len=1, length_norm="power")


def host_cost(aoti, sources: list, slots: int) -> dict:
    """engine=aoti's search split: the seconds inside its compiled calls (encoder and search graph) and the rest, the
    host's work around them (Python's search loop, the calls' argument handling), per search-graph call."""
    inside, calls = [0.0], [0]
    search, encoder = aoti.run_search, aoti.run_encoder

    def timed(fn, count):
        def call(*inputs):
            start = time.perf_counter()
            out = fn(*inputs)
            inside[0] += time.perf_counter() - start
            calls[0] += count
            return out
        return call

    aoti.run_search, aoti.run_encoder = timed(search, 1), timed(encoder, 0)
    try:
        start = time.perf_counter()
        for src in sources:
            step_search(aoti, src, slots)
        total = time.perf_counter() - start
    finally:
        aoti.run_search, aoti.run_encoder = search, encoder
    return {"steps": calls[0], "compiled_ms_per_step": 1e3 * inside[0] / calls[0],
            "host_us_per_step": 1e6 * (total - inside[0]) / calls[0]}


def carry_cost(tmp: Path, sizes: list[int]) -> list[dict]:
    """Microseconds per iteration of a compiled while_loop that writes one slot of its carried buffer."""
    from torch._higher_order_ops.while_loop import while_loop

    class Carry(torch.nn.Module):
        def forward(self, x, buffer, t, end):
            def body(x, buffer, t):
                x = torch.tanh(x)  # a carried value may not be an input returned as it is
                return x, buffer.index_copy(2, t.reshape(1), x.view(3, 4, 1, 32)), t + 1

            return while_loop(lambda x, buffer, t: t < end, body, (x, buffer, t))

    x = torch.randn(12, 32)
    T = torch.export.Dim("T", min=2, max=1 << 20)
    path = tmp / "carry.pt2"
    compile_graph(Carry(), (x, torch.zeros(3, 4, 20, 32), torch.tensor(0), torch.tensor(8)),
                    (None, {2: T}, None, None), path)
    run, rows = flat_call(path), []
    for size in sizes:
        buffer, iterations = torch.zeros(3, 4, size, 32), 16
        run(x, buffer, torch.tensor(0), torch.tensor(iterations))
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(20):
                run(x, buffer, torch.tensor(0), torch.tensor(iterations))
            best = min(best, (time.perf_counter() - start) / 20 / iterations)
        rows.append({"slots": size, "buffer_kib": buffer.numel() * 4 / 1024, "us_per_iteration": best * 1e6})
    return rows


def empty_call(tmp: Path) -> float:
    """Microseconds of one call of an empty compiled graph through flat_call (the best of 5 rounds of 2,000)."""
    class Empty(torch.nn.Module):
        def forward(self, x):
            return (x + 1,)

    path = tmp / "empty.pt2"
    compile_graph(Empty(), (torch.tensor(0.0),), None, path)
    run, x, best = flat_call(path), torch.tensor(0.0), float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(2000):
            run(x)
        best = min(best, (time.perf_counter() - start) / 2000)
    return best * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", type=Path, default=ROOT / "runs/deploy_toy/checkpoints/best.pt")
    ap.add_argument("--sentences", type=int, default=40)
    ap.add_argument("--slots", default="12,40,160", help="the loop's slot counts T (each also the step limit)")
    ap.add_argument("--carry-slots", default="16,256,4096")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--small", action="store_true", help="compile the loop as search_small.pt2 is (inductor's C++ GEMM "
                    "template, autotuned at a few rows), not as search.pt2")
    ap.add_argument("--packed", action="store_true", help="also the loop with its body's linear weights packed for "
                    "oneDNN (scripts/bench/loop_weights.py), as freezing packs the per-step graph's")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--md", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(1)
    slot_counts = [int(s) for s in args.slots.split(",")]

    eager = Translator.from_checkpoint(args.checkpoint, device="cpu", engine="torch").model.float().eval()
    translator = Translator.from_checkpoint(args.checkpoint, device="cpu", engine="aoti")
    aoti, tok = translator.model, translator.tokenizer
    test = [src for src, _ in generate(seed=1, n_train=0, n_valid=0, n_test=args.sentences, n_test_long=0)["test"]]
    sources = [torch.tensor([ids + [EOS_ID]]) for ids in tok.encode(test)]
    with tempfile.TemporaryDirectory(prefix="search-loop-") as tmp, torch.no_grad():
        tmp = Path(tmp)
        example, dims = loop_examples(eager)
        compile_seconds = compile_graph(LoopGraph(eager).eval(), example, dims, tmp / "loop.pt2",
                                          SMALL_CONFIGS if args.small else None)
        run = flat_call(tmp / "loop.pt2")
        loops = {"loop": run}
        if args.packed:
            from loop_weights import packed_loop_weights

            with packed_loop_weights() as configs:
                compile_graph(LoopGraph(eager).eval(), example, dims, tmp / "packed.pt2",
                              {**(SMALL_CONFIGS if args.small else {}), **configs})
            loops["packed"] = flat_call(tmp / "packed.pt2")
        rows = []
        for slots in slot_counts:
            same = dict.fromkeys(loops, 0)
            for src in sources:
                theirs = step_search(aoti, src, slots)[0]
                for name, loop in loops.items():
                    mine = loop_search(aoti, loop, src, slots)[0]
                    same[name] += [h.tokens for h in mine] == [h.tokens for h in theirs] and all(
                        abs(a.score - b.score) <= 1e-5 for a, b in zip(mine, theirs))
            best = {"per step": float("inf"), **dict.fromkeys(loops, float("inf"))}
            for _ in range(args.repeats):
                for name, fn in (("per step", lambda s, n=slots: step_search(aoti, s, n)),
                                 *((name, lambda s, n=slots, r=r: loop_search(aoti, r, s, n))
                                   for name, r in loops.items())):
                    start = time.perf_counter()
                    for src in sources:
                        fn(src)
                    best[name] = min(best[name], time.perf_counter() - start)
            rows.append({**host_cost(aoti, sources, slots), "slots": slots,
                         "same": " and ".join(f"{n} of {len(sources)}" for n in same.values()),
                         "per_step_sent_s": len(sources) / best["per step"], "loop_sent_s": len(sources) / best["loop"],
                         "loop_over_per_step": best["per step"] / best["loop"],
                         **({"packed_sent_s": len(sources) / best["packed"], "packed_over_loop": best["loop"] /
                             best["packed"]} if "packed" in loops else {})})
        carry = carry_cost(tmp, [int(s) for s in args.carry_slots.split(",")])
        floor = empty_call(tmp)

    hw = hardware()
    table = markdown_table(rows, [("slots", "slots T (step limit)"), ("same", "same hypotheses and scores"),
                                  ("per_step_sent_s", "engine=aoti, a call per step: sentences/s"),
                                  ("loop_sent_s", "the loop, one call: sentences/s"),
                                  ("loop_over_per_step", "loop ÷ per step"),
                                  *([("packed_sent_s", "the loop, weights packed: sentences/s"),
                                     ("packed_over_loop", "packed ÷ loop")] if args.packed else []),
                                  ("compiled_ms_per_step", "per step: ms inside compiled calls, per step"),
                                  ("host_us_per_step", "per step: µs of host work, per step")])
    carry_table = markdown_table(carry, [("slots", "slots T"), ("buffer_kib", "carried buffer, KiB"),
                                         ("us_per_iteration", "µs per iteration")])
    print(table, carry_table, f"empty call: {floor:.1f} µs; the loop compiled in {compile_seconds:.0f} s", sep="\n\n")
    payload = {"command": command_line(), "hardware": hw, "checkpoint": str(args.checkpoint), "beam": BEAM,
               "lenpen": LENPEN, "sentences": len(sources), "loop_compile_s": compile_seconds, "rows": rows,
               "carry": carry, "empty_call_us": floor}
    if args.out:
        write_json(args.out, payload)
    packed_note = (" (and with --packed, the loop again with its body's linear weights packed for oneDNN: "
                   "freezing packs only the weights of the graph that multiplies by them, and a while_loop's body "
                   "gets them as operands; scripts/bench/loop_weights.py)") if args.packed else ""
    if args.md:
        args.md.write_text(
            page_head("The whole search in one compiled call (issue 76 §1)", hw, payload["command"]) +
            f"- model: {args.checkpoint}; {len(sources)} toy test sentences one at a time, "
            f"beam {BEAM}, length penalty {LENPEN} (power), one thread; best of {args.repeats} interleaved rounds\n\n"
            f"The loop (relmt.export.graphs.LoopGraph: SearchGraph's step inside torch's while_loop, compiled by "
            f"AOTInductor in {compile_seconds:.0f} s) against engine=aoti's search, both after engine=aoti's "
            f"encoder{packed_note}:\n\n{table}\n\nWhat a carried buffer costs: a compiled while_loop writing one "
            f"slot of a (3, 4, T, 32) float32 buffer per iteration:\n\n{carry_table}\n\nThe floor, an empty compiled "
            f"call through engine=aoti's call path (relmt.export.aoti.flat_call): {floor:.1f} µs.\n")


if __name__ == "__main__":
    main()
