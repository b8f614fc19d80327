#!/usr/bin/env python
"""The whole beam search in one compiled call (issue 76 §1): relmt.export.graphs.LoopGraph, SearchGraph's step inside
torch's while_loop, as engine=aoti compiles it (loop.pt2, relmt/export/aoti_loop.py: the loop body's weights as its
constants), against engine=aoti's search of one call per step. Run it alone on the machine.

    python scripts/bench/search_loop.py --checkpoint runs/deploy_toy/checkpoints/best.pt \\
        --out docs/results/engines/search_loop.json --md docs/results/engines/search_loop.md

One sentence at a time (the toy test set, or --src), beam 4, length penalty 0.2 (power), 1 to T tokens, on --threads:
1. sentences/s of engine=aoti's search of one call per step (its loop turned off), of its loop.pt2 called once
   with buffers of T slots (GraphModel.whole_search, what beam_search runs where the engine `loops`), and of the
   loop compiled as before relmt/export/aoti_loop.py (the body's weights its operands, multiplied by ATen's addmm),
   called once, all after engine=aoti's encoder, at each step limit T: every search's hypotheses and scores (to
   1e-5) against the per-step search's;
2. what a carried buffer costs: a while_loop that writes one slot of a (3, 4, T, 32) buffer per iteration, compiled
   the same way, timed at several T (AOTInductor copies the carried tensors at every iteration);
3. the per-step path's host cost: its time outside the compiled calls, per search-graph call;
4. the floor: an empty compiled call (a 0-d tensor plus one) through engine=aoti's call path
   (relmt.export.aoti.flat_call), in microseconds;
5. what the operand weights cost: the loop body's 19 products at 4 rows (one sentence, beam 4) by ATen's addmm
   on plain weights, against oneDNN's prepacked product (what freezing gives a graph's constant weights).
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
from relmt.export.aoti import SMALL_CONFIGS, SMALL_ROWS, compile_graph, flat_call  # noqa: E402
from relmt.export.graphs import LOOP_STATE, LoopGraph, loop_examples, loop_start  # noqa: E402

BEAM, LENPEN = 4, 0.2


def loop_inputs(aoti, src: torch.Tensor, slots: int) -> tuple:
    """The loop's inputs for one batch: engine=aoti's encoder output and empty buffers of `slots` slots."""
    keep, cross_k, cross_v = aoti.run_encoder(src)
    return loop_start(keep, cross_k, cross_v, BEAM, slots, max_lengths(keep, 0.0, slots), PAD_ID, 1, LENPEN, True,
                      True, False)


def loop_search(aoti, run, src: torch.Tensor, slots: int) -> list:
    """A search in one call of a compiled loop `run`, with buffers of `slots` slots (the step limit)."""
    out = dict(zip(LOOP_STATE, run(*loop_inputs(aoti, src, slots))))
    return finished_hypotheses(out["pool_scores"], out["pool_tokens"][:, :, :int(out["t"])], (EOS_ID, PAD_ID))


def step_search(aoti, src: torch.Tensor, slots: int) -> list:
    """engine=aoti's beam search with a call per step (its loop turned off: loop_rows 0)."""
    run, aoti.run_loop = aoti.run_loop, None
    try:
        return beam_search(aoti, src, BEAM, BOS_ID, EOS_ID, lenpen=LENPEN, max_len_a=0.0, max_len_b=slots,
                           nbest=BEAM, min_len=1, length_norm="power")
    finally:
        aoti.run_loop = run


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


def operand_gemms(layers: int, d_model: int, d_ff: int, vocab: int, repeats: int) -> dict:
    """Microseconds of the loop body's 19 products at 4 rows by ATen's addmm on plain weights (what a while_loop body
    multiplies by operand weights) and by oneDNN's prepacked product (what freezing gives constant weights): each
    decoder layer's W^Q|W^K|W^V, output, cross-attention query and output, and two feed-forward maps, then the
    output layer, of this model's sizes."""
    shapes = [(3 * d_model, d_model), (d_model, d_model), (d_model, d_model), (d_model, d_model), (d_ff, d_model),
              (d_model, d_ff)] * layers + [(vocab, d_model)]
    weights = [torch.randn(o, i) * 0.05 for o, i in shapes]
    rows = [torch.randn(SMALL_ROWS, i) for _, i in shapes]
    packed = [torch.ops.mkldnn._reorder_linear_weight(w, SMALL_ROWS) for w in weights]
    products = {"addmm": lambda: [torch.nn.functional.linear(x, w) for x, w in zip(rows, weights)],
                "packed": lambda: [torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")
                                   for x, w in zip(rows, packed)]}
    best = dict.fromkeys(products, float("inf"))
    for _ in range(repeats):
        for name, fn in products.items():
            fn()
            start = time.perf_counter()
            for _ in range(50):
                fn()
            best[name] = min(best[name], (time.perf_counter() - start) / 50)
    return {"products": len(shapes), "addmm_us": best["addmm"] * 1e6, "packed_us": best["packed"] * 1e6,
            "addmm_over_packed": best["addmm"] / best["packed"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", type=Path, default=ROOT / "runs/deploy_toy/checkpoints/best.pt")
    ap.add_argument("--src", type=Path, help="source sentences, one a line (default: the toy test set)")
    ap.add_argument("--sentences", type=int, default=40)
    ap.add_argument("--slots", default="12,40,160", help="the step limits T (the one-call loops' buffers' length)")
    ap.add_argument("--carry-slots", default="16,256,4096")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--md", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    slot_counts = [int(s) for s in args.slots.split(",")]

    eager = Translator.from_checkpoint(args.checkpoint, device="cpu", engine="torch").model.float().eval()
    translator = Translator.from_checkpoint(args.checkpoint, device="cpu", engine="aoti")
    aoti, tok = translator.model, translator.tokenizer
    if aoti.run_loop is None:
        raise SystemExit(f"{args.checkpoint}: its engine=aoti export has no loop.pt2 (made before it): remove it")
    engine_loop = aoti.run_loop
    if args.src:
        test = args.src.read_text(encoding="utf-8").splitlines()[: args.sentences]
    else:
        test = [src for src, _ in generate(seed=1, n_train=0, n_valid=0, n_test=args.sentences, n_test_long=0)["test"]]
    sources = [torch.tensor([ids + [EOS_ID]]) for ids in tok.encode(test)]
    with tempfile.TemporaryDirectory(prefix="search-loop-") as tmp, torch.no_grad():
        tmp = Path(tmp)
        example, dims = loop_examples(eager)
        compile_seconds = compile_graph(LoopGraph(eager).eval(), example, dims, tmp / "operands.pt2", SMALL_CONFIGS)
        operands = flat_call(tmp / "operands.pt2")
        searches = {"per step": lambda s, n: step_search(aoti, s, n),
                    "one call": lambda s, n: loop_search(aoti, engine_loop, s, n),
                    "operands": lambda s, n: loop_search(aoti, operands, s, n)}
        rows = []
        for slots in slot_counts:
            same = dict.fromkeys(searches, 0)
            for src in sources:
                theirs = step_search(aoti, src, slots)[0]
                for name, fn in searches.items():
                    mine = fn(src, slots)[0]
                    same[name] += [h.tokens for h in mine] == [h.tokens for h in theirs] and all(
                        abs(a.score - b.score) <= 1e-5 for a, b in zip(mine, theirs))
            best = dict.fromkeys(searches, float("inf"))
            for _ in range(args.repeats):
                for name, fn in searches.items():
                    start = time.perf_counter()
                    for src in sources:
                        fn(src, slots)
                    best[name] = min(best[name], time.perf_counter() - start)
            rows.append({**host_cost(aoti, sources, slots), "slots": slots,
                         "same": " / ".join(f"{same[n]}" for n in searches if n != "per step") + f" of {len(sources)}",
                         **{f"{n.replace(' ', '_')}_sent_s": len(sources) / best[n] for n in searches},
                         **{f"{n.replace(' ', '_')}_over_per_step": best["per step"] / best[n]
                            for n in searches if n != "per step"}})
        carry = carry_cost(tmp, [int(s) for s in args.carry_slots.split(",")])
        floor = empty_call(tmp)
    first = eager.decoder_layers[0]
    gemms = operand_gemms(len(eager.decoder_layers), eager.tgt_embed.embedding_dim, first.ffn.fc1.out_features,
                          eager.tgt_embed.num_embeddings, args.repeats)

    hw = hardware()
    table = markdown_table(rows, [("slots", "step limit T"),
                                  ("same", "same hypotheses and scores: one call / operands"),
                                  ("per_step_sent_s", "a call per step: sentences/s"),
                                  ("one_call_sent_s", "loop.pt2, one call of T slots: sentences/s"),
                                  ("one_call_over_per_step", "one call ÷ per step"),
                                  ("operands_sent_s", "the loop with operand weights, one call: sentences/s"),
                                  ("operands_over_per_step", "operands ÷ per step"),
                                  ("compiled_ms_per_step", "per step: ms inside compiled calls, per step"),
                                  ("host_us_per_step", "per step: µs of host work, per step")])
    carry_table = markdown_table(carry, [("slots", "slots T"), ("buffer_kib", "carried buffer, KiB"),
                                         ("us_per_iteration", "µs per iteration")])
    print(table, carry_table, f"empty call: {floor:.1f} µs; the operand loop compiled in {compile_seconds:.0f} s",
          gemms, sep="\n\n")
    payload = {"command": command_line(), "hardware": hw, "checkpoint": str(args.checkpoint), "beam": BEAM,
               "lenpen": LENPEN, "sentences": len(sources), "threads": args.threads,
               "operand_loop_compile_s": compile_seconds, "rows": rows, "carry": carry, "empty_call_us": floor,
               "operand_gemms": gemms}
    if args.out:
        write_json(args.out, payload)
    which = f"sentences of {args.src}" if args.src else "toy test sentences"
    if args.md:
        args.md.write_text(
            page_head("The whole search in one compiled call (issue 76 §1)", hw, payload["command"]) +
            f"- model: {args.checkpoint}; {len(sources)} {which} "
            f"one at a time, beam {BEAM}, length penalty {LENPEN} (power), step limit T, {args.threads} "
            f"thread(s); best of {args.repeats} interleaved rounds\n\n"
            "engine=aoti's search with a call per step (its loop turned off); the whole search in one call of "
            "loop.pt2 with buffers of T slots (relmt.export.graphs.LoopGraph, SearchGraph's step inside torch's "
            "while_loop, compiled with the loop body's weights as its constants: relmt/export/aoti_loop.py; what "
            "beam_search runs where the engine `loops`); and the loop compiled as before aoti_loop.py, the body's "
            f"weights its operands (ATen's addmm), called once. All after engine=aoti's encoder.\n\n{table}\n\n"
            f"What the operand weights cost: the body's "
            f"{gemms['products']} products at {SMALL_ROWS} rows take {gemms['addmm_us']:.0f} µs by ATen's addmm on "
            f"plain weights and {gemms['packed_us']:.0f} µs by oneDNN's prepacked product "
            f"({gemms['addmm_over_packed']:.2f}x).\n\nWhat a carried buffer costs: a compiled while_loop writing one "
            f"slot of a (3, 4, T, 32) float32 buffer per iteration:\n\n{carry_table}\n\nThe floor, an empty "
            f"compiled call through engine=aoti's call path (relmt.export.aoti.flat_call): {floor:.1f} µs.\n")


if __name__ == "__main__":
    main()
