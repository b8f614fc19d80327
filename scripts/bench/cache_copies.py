#!/usr/bin/env python
"""What a compiled search step at 32 sentences costs as its cache grows, before and after GRAPHS_VERSION 6 (issue 76
§2). Run it alone on the machine.

    python scripts/bench/cache_copies.py --checkpoint /tmp/relmt-peers/r1/relmt-rel/checkpoints/last.pt \\
        --out docs/results/engines/cache_copies.json --md docs/results/engines/cache_copies.md

A running search in relmt-serve spans every slot since its oldest sentence began, so its step costs what the
self-attention cache's passes cost at that span. engine=aoti's search graph for many rows (search.pt2) is compiled
three ways from the same checkpoint, and each is called on the step state of --sentences sentences at beam 4 over
--source source tokens, at each of --slots slots so far; the three interleaved over --repeats rounds of --calls
calls, at the process's threads (torch's default: the cores); the best round counts:
- before: as GRAPHS_VERSION 5 had it: the cache in and out stacked (L, N, H, t, D), traced at few rows
  (relmt.export.graphs.EXAMPLE_SIZES["few"]);
- traced at many rows: the same graph traced at EXAMPLE_SIZES["many"], so that inductor splits the cache's loops
  over the threads (at few rows it had compiled them to run on one);
- now: and the cache in and out one tensor per layer, as relmt exports: no stacked copy of every layer's keys and
  values at the end of the step.
The steps' outputs are compared (the same tokens, rows and done; scores, keys and values to 1e-5).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from relmt.bench import best_per_call, command_line, hardware, markdown_table, page_head, write_json  # noqa: E402
from relmt.data.tokenizer import BOS_ID, PAD_ID  # noqa: E402
from relmt.decode.translator import Translator  # noqa: E402
from relmt.export.aoti import compile_graph, flat_call  # noqa: E402
from relmt.export.graphs import SearchGraph, search_examples, shape_of  # noqa: E402
from relmt.runtime import tune_cpu  # noqa: E402


class Stacked(torch.nn.Module):
    """SearchGraph with the cache in and out stacked (L, N, H, t, D), as GRAPHS_VERSION 5 exported it."""

    def __init__(self, model) -> None:
        super().__init__()
        self.search, self.layers = SearchGraph(model), len(model.decoder_layers)

    def forward(self, history, keep, cross_k, cross_v, self_k, self_v, order, starts, alive, pool_scores, pool_tokens,
                limit, min_len, lenpen, power, t2t, early_stop):
        *head, done = self.search(history, keep, cross_k, cross_v, list(self_k.unbind(0)), list(self_v.unbind(0)),
                                  order, starts, alive, pool_scores, pool_tokens, limit, min_len, lenpen, power, t2t,
                                  early_stop)
        cache = head[5:]
        return (*head[:5], torch.stack(cache[: self.layers]), torch.stack(cache[self.layers:]), done)


def stacked_examples(model, rows: str) -> tuple[tuple, dict]:
    example, dims = search_examples(model, rows)
    example = (*example[:4], torch.stack(example[4]), torch.stack(example[5]), *example[6:])
    per_layer = dims["self_k"][0]
    dims = dims | {name: {0: None, 1: per_layer[0], 3: per_layer[2]} for name in ("self_k", "self_v")}
    return example, dims


def compile_variant(model, path: Path, name: str) -> float:
    if name == "now":
        module, (example, dims) = SearchGraph(model), search_examples(model, "many")
    else:
        module, (example, dims) = Stacked(model), stacked_examples(model, "few" if name == "before" else "many")
    return compile_graph(module.eval(), example, dims, path)


def step_state(model, sentences: int, slots: int, source: int, layers_apart: bool) -> tuple:
    """The search step's flat inputs: `sentences` sentences at beam 4, `slots` slots so far, hypotheses reordered."""
    shape = shape_of(model)
    layers, heads, d_head = shape["layers"], shape["heads"], shape["d_head"]
    g = torch.Generator().manual_seed(slots)
    b, k = sentences, 4
    history = torch.randint(PAD_ID + 4, shape["vocab"], (b, k, slots + 1), generator=g)
    history[:, :, 0] = BOS_ID
    cache = [torch.randn(layers, b * k, heads, slots, d_head, generator=g) for _ in range(2)]
    if layers_apart:
        cache = [x.clone() for c in cache for x in c.unbind(0)]
    settings = search_examples(model)[0][12:]
    return (history, torch.ones(b, source, dtype=torch.bool),
            *(torch.randn(layers, b, heads, source, d_head, generator=g) for _ in range(2)), *cache,
            torch.randperm(b * k, generator=g).view(b, k), torch.zeros(b, k, dtype=torch.long),
            torch.randn(b, k, generator=g), torch.full((b, k), -1e9), torch.full((b, k, slots), PAD_ID),
            torch.full((b,), slots + 40), *settings)


def stacked_outputs(out: tuple, layers: int) -> tuple:
    """A step's outputs with the cache stacked (L, N, H, t + 1, D), as `Stacked` gives them."""
    if len(out) == 8:
        return out
    return (*out[:5], torch.stack(out[5:5 + layers]), torch.stack(out[5 + layers:5 + 2 * layers]), out[-1])


def same_step(a: tuple, b: tuple) -> tuple[bool, float]:
    """Whether two steps' stacked outputs agree: ids equal, floats within 1e-5; and the largest float difference."""
    ids = all(torch.equal(x, y) for x, y in zip(a, b) if not x.is_floating_point())
    diff = max(float((x - y).abs().max()) for x, y in zip(a, b) if x.is_floating_point() and x.numel())
    return ids and diff <= 1e-5, diff


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", type=Path, default=Path("/tmp/relmt-peers/r1/relmt-rel/checkpoints/last.pt"))
    ap.add_argument("--sentences", type=int, default=32)
    ap.add_argument("--slots", type=int, nargs="+", default=[1, 12, 24, 40])
    ap.add_argument("--source", type=int, default=22)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--md", type=Path)
    args = ap.parse_args()
    tune_cpu()  # relmt-serve's and relmt-translate's CPU settings
    model = Translator.from_checkpoint(args.checkpoint, device="cpu", engine="torch").model.float().eval()
    layers = len(model.decoder_layers)
    names = ("before", "many rows", "now")
    rows, all_same, worst = [], True, 0.0
    with tempfile.TemporaryDirectory(prefix="cache-copies-") as tmp, torch.no_grad():
        tmp = Path(tmp)
        seconds = {name: compile_variant(model, tmp / f"{i}.pt2", name) for i, name in enumerate(names)}
        runs = {name: flat_call(tmp / f"{i}.pt2") for i, name in enumerate(names)}
        for slots in args.slots:
            stacked = step_state(model, args.sentences, slots, args.source, False)
            apart = step_state(model, args.sentences, slots, args.source, True)
            inputs = {"before": stacked, "many rows": stacked, "now": apart}
            outs = {name: stacked_outputs(run(*inputs[name]), layers) for name, run in runs.items()}
            for name in ("many rows", "now"):
                same, diff = same_step(outs["before"], outs[name])
                all_same, worst = all_same and same, max(worst, diff)
            best = best_per_call({name: (lambda run=run, x=inputs[name]: run(*x)) for name, run in runs.items()},
                                 args.repeats, args.calls, warmup=3)
            row = {"slots": slots, **{f"{n}_ms": 1e3 * best[n] for n in names},
                   "many_over_before": best["many rows"] / best["before"],
                   "now_over_before": best["now"] / best["before"]}
            rows.append(row)
            print(row, flush=True)
    hw = hardware()
    table = markdown_table(rows, [("slots", "slots so far"), ("before_ms", "before: ms per step"),
                                  ("many rows_ms", "traced at many rows: ms"),
                                  ("now_ms", "and the cache per layer (now): ms"),
                                  ("many_over_before", "many rows ÷ before"), ("now_over_before", "now ÷ before")])
    print(table, f"same outputs: {all_same} (largest float difference {worst:.2g})", sep="\n\n")
    payload = {"command": command_line(), "hardware": hw, "checkpoint": str(args.checkpoint),
               "sentences": args.sentences, "source": args.source, "threads": torch.get_num_threads(),
               "compile_s": seconds, "same_outputs": all_same, "max_float_difference": worst, "rows": rows}
    if args.out:
        write_json(args.out, payload)
    if args.md:
        args.md.write_text(
            page_head("A compiled search step at 32 sentences as its cache grows (issue 76 §2)", hw, payload["command"])
            + f"- model: {args.checkpoint}; {args.sentences} sentences' step at beam 4 over {args.source} source "
            f"tokens, the hypotheses reordered; search.pt2 (the graph for many rows) compiled as "
            f"engine=aoti compiles it; "
            f"{torch.get_num_threads()} threads; best of {args.repeats} interleaved rounds of {args.calls} calls\n\n"
            "A running search in relmt-serve spans every slot since its oldest sentence began, so its step costs "
            "what the cache's passes cost at that span; offline, a batch's steps average half its longest. Before: "
            "GRAPHS_VERSION 5 (the cache in and out stacked (L, N, H, t, D), traced at few rows). Traced at many "
            "rows: inductor decides at compile time from the traced sizes whether to split a loop over the threads, "
            "and at few rows it had left every pass over the cache on one thread. Now: and the cache in and out one "
            "tensor per layer (GRAPHS_VERSION 6), so that the step no longer copies every layer's keys and values "
            "into one stacked output.\n\n"
            f"{table}\n\nThe three give the same step (tokens, rows and done equal; scores, keys and values to 1e-5): "
            f"{'yes' if all_same else 'no'} (the largest difference: {worst:.2g}).\n")


if __name__ == "__main__":
    main()
