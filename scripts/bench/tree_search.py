#!/usr/bin/env python
"""Issue 76 §2 in the real search graph, before it is built into relmt: a search step that reads the self-attention
keys and values where they were written, through an ancestor table, against today's step that copies them. Run it
alone on the machine.

    python scripts/bench/tree_search.py --out docs/results/engines/tree_search.json \\
        --md docs/results/engines/tree_search.md

scripts/bench/tree_cache.py asked the question of the attention alone. Here engine=aoti's search graph for many
rows (search.pt2: relmt/export/graphs.py's SearchGraph, compiled as relmt/export/aoti.py compiles it) is compiled
beside a variant of it (`TreeSearch`, this script's) from the same checkpoint:
- today: each layer's cache comes in as (N, H, t, D), and the step gathers it by `order` and appends the new slot,
  returning the (N, H, t + 1, D) copy (relmt/model/cache.py: `extend`);
- in place: each layer's cache comes in as a buffer of more slots, every (row, slot) written once, with the ancestor
  table A (N, T): A[n, s] is the buffer row that holds hypothesis n's slot s. The step reads
  buffer[A[order[n], s], :, s] for its t slots and appends the new slot in its reductions (the same `extend`, given
  the table instead of `order`), and returns the new slot's keys and values (N, H, 1, D) and the table's rows for
  its hypotheses (N, t + 1); the caller writes the new slot into the buffers (here: not timed, two index copies);
- in place, split: the same, with the one-query attention (MultiHeadAttention._relative, Shaw §3.3) summing over
  the past slots and the new one apart (`split_relative`), so that no (N, H, t + 1, D) concatenation is left for
  the compiler to realize.
Each is called on the same step of --sentences sentences at beam 4 over --source source tokens, at each of --slots
slots so far, the hypotheses of a random ancestry; today's cache is the buffers read through the table, so the two
steps must agree (tokens, rows and done equal; scores, keys and values to 1e-5). The two interleaved over --repeats
rounds of --calls calls, at the process's threads; the best round counts.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
from pathlib import Path

import torch
from torch import Tensor, nn

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from relmt.bench import best_per_call, command_line, hardware, markdown_table, page_head, write_json  # noqa: E402
from relmt.data.tokenizer import BOS_ID, EOS_ID  # noqa: E402
from relmt.decode.beam import Beams, Rules, beam_step  # noqa: E402
from relmt.decode.translator import Translator  # noqa: E402
from relmt.export.aoti import compile_graph, flat_call  # noqa: E402
from relmt.export.graphs import SearchGraph, search_examples, shape_of  # noqa: E402
from relmt.model import attention, transformer  # noqa: E402
from relmt.model import cache as cache_module  # noqa: E402
from relmt.model.cache import DecoderCache, LayerCache  # noqa: E402
from relmt.runtime import tune_cpu  # noqa: E402


def sibling(name: str):
    """Another script of this folder, as a module (they are not a package)."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


cache_copies = sibling("cache_copies")  # the step state, and the comparison of two steps
read_through = sibling("tree_cache").gathered  # (N, H, t, D): buffer[table[n, s], :, s]


PARTS: dict[int, tuple[Tensor, Tensor]] = {}  # id of an extended cache -> (the past read through, the new slot)


def tree_extend(past: Tensor, new: Tensor, order: Tensor | None) -> Tensor:
    """relmt/model/cache.py's `extend`, and given a table (N, t) instead of the rows (N,): past read through it. Its
    two parts are kept by the result's id for `split_relative` (export traces in Python: ids hold)."""
    if order is not None and order.dim() == 2:
        past = read_through(past, order)
        out = torch.cat((past, new), dim=2)
        PARTS[id(out)] = past, new
        return out
    return cache_module.extend(past, new, order)


ORIGINAL_RELATIVE = attention.MultiHeadAttention._relative


def split_relative(self, q, k, v, keep, index, q_offset, bias, p):
    """MultiHeadAttention._relative at one query row over a cache that `tree_extend` made: the past slots and the
    new one each in their own sums, so that nothing concatenates the keys or values (only the t + 1 scores)."""
    if id(k) not in PARTS or id(v) not in PARTS or q.shape[2] != 1:
        return ORIGINAL_RELATIVE(self, q, k, v, keep, index, q_offset, bias, p)
    (k_past, k_new), (v_past, v_new) = PARTS[id(k)], PARTS[id(v)]
    rel, t = self.rel, k_past.shape[2]
    scores = torch.cat(((q * k_past).sum(-1), (q * k_new).sum(-1)), dim=-1)[:, :, None, :]  # (N, H, 1, t + 1)
    if rel.w_k is not None:
        scores = scores + rel.key_logits(q, index, q_offset)
    if bias is not None:
        scores = scores + bias
    if keep is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    attn = torch.softmax(scores, dim=-1)
    weights = attn[:, :, 0, :]  # (N, H, t + 1)
    z = (weights[..., :t, None] * v_past).sum(-2)[:, :, None, :] + weights[..., t:, None] * v_new
    return z + rel.value_term(attn, index, q_offset)


class TreeSearch(nn.Module):
    """SearchGraph's step over buffers read through an ancestor table (the module's docstring): its forward with
    StepGraph's written out, the table given to decode_step where StepGraph gives `order`. Inputs as SearchGraph's,
    each layer's cache a buffer (R, H, T, D) with T >= t, and `ancestors` (R', T) that `order` indexes; outputs as
    SearchGraph's with each layer's new slot (N, H, 1, D) for its cache, then the table (N, t + 1)."""

    def __init__(self, model, split: bool = False) -> None:
        super().__init__()
        self.model, self.pad_id, self.split = model, model.pad_id, split

    def forward(self, history, keep, cross_k, cross_v, self_k, self_v, order, starts, alive, pool_scores,
                pool_tokens, limit, min_len, lenpen, power, t2t, early_stop, ancestors):
        b, k = alive.shape
        t = history.shape[2] - 1
        torch._check(self_k[0].shape[2] >= t)
        torch._check(ancestors.shape[1] >= t)
        table = ancestors.index_select(0, order.reshape(-1)).narrow(1, 0, t)  # (N, t)
        layers = tuple(LayerCache(x.narrow(2, 0, t), y.narrow(2, 0, t), cross_k[i], cross_v[i])
                       for i, (x, y) in enumerate(zip(self_k, self_v)))
        transformer.extend = tree_extend
        if self.split:
            attention.MultiHeadAttention._relative = split_relative
        try:
            logits, cache = self.model.decode_step(history[:, :, -1].reshape(-1), keep[:, :, None], keep,
                                                   DecoderCache(layers, table), step=t, starts=starts.reshape(-1))
        finally:
            transformer.extend = cache_module.extend
            attention.MultiHeadAttention._relative = ORIGINAL_RELATIVE
            PARTS.clear()
        rules = Rules(EOS_ID, torch.tensor([self.pad_id, BOS_ID]), min_len, lenpen, power, t2t, early_stop)
        steps = t - starts[:, 0]
        beams, rows, done = beam_step(logits, Beams(history.reshape(b * k, -1), alive, pool_scores, pool_tokens,
                                                    limit), rules, self.pad_id, steps)
        new = [lc.self_k[:, :, t:] for lc in cache.layers] + [lc.self_v[:, :, t:] for lc in cache.layers]
        own = torch.arange(b * k, device=table.device)[:, None]
        return (beams.tokens.view(b, k, -1), beams.alive, beams.pool_scores, beams.pool_tokens, rows, *new, done,
                torch.cat((table, own), dim=1))


VARIANTS = ("in place", "in place, split")


def tree_examples(model) -> tuple[tuple, dict]:
    """TreeSearch's inputs to trace with (SearchGraph's at many rows, and a table), and its dynamic dimensions."""
    example, dims = search_examples(model, "many")
    self_k = example[4]
    rows, slots = self_k[0].shape[0], self_k[0].shape[2]
    table = torch.randint(0, rows, (rows, slots))
    dims = dict(dims)
    dims["ancestors"] = {0: dims["self_k"][0][0], 1: dims["self_k"][0][2]}
    return (*example, table), dims


def step_pair(model, sentences: int, slots: int, source: int) -> tuple[tuple, tuple]:
    """The same step both ways: today's inputs (the cache gathered) and TreeSearch's (buffers and a table)."""
    today = list(cache_copies.step_state(model, sentences, slots, source, True))
    shape = shape_of(model)
    layers = shape["layers"]
    n = sentences * 4
    g = torch.Generator().manual_seed(slots + 1)
    table = torch.arange(n)[:, None].repeat(1, slots + 8)
    for s in range(1, slots):  # a random ancestry: every slot before s followed a random row at s
        table[:, :s] = table[torch.randint(0, n, (n,), generator=g), :s]
    buffers = [torch.randn(n, shape["heads"], slots + 8, shape["d_head"], generator=g) for _ in range(2 * layers)]
    # today's cache: stored row r holds what the table's row r reads, and both steps then follow `order`
    gathered = [read_through(b[:, :, :slots], table[:, :slots]) for b in buffers]
    today[4:4 + 2 * layers] = gathered
    tree = list(today)
    tree[4:4 + 2 * layers] = buffers
    return tuple(today), (*tree, table)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", type=Path, default=Path("/tmp/relmt-peers/r1/relmt-rel/checkpoints/last.pt"))
    ap.add_argument("--sentences", type=int, default=32)
    ap.add_argument("--slots", type=int, nargs="+", default=[12, 24, 40, 64])
    ap.add_argument("--source", type=int, default=22)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--md", type=Path)
    args = ap.parse_args()
    tune_cpu()
    model = Translator.from_checkpoint(args.checkpoint, device="cpu", engine="torch").model.float().eval()
    layers = len(model.decoder_layers)
    rows, all_same, worst = [], True, 0.0
    with tempfile.TemporaryDirectory(prefix="tree-search-") as tmp, torch.no_grad():
        tmp = Path(tmp)
        compile_graph(SearchGraph(model).eval(), *search_examples(model, "many"), tmp / "today.pt2")
        compile_graph(TreeSearch(model).eval(), *tree_examples(model), tmp / "tree.pt2")
        compile_graph(TreeSearch(model, split=True).eval(), *tree_examples(model), tmp / "split.pt2")
        runs = {"today": flat_call(tmp / "today.pt2"), "in place": flat_call(tmp / "tree.pt2"),
                "in place, split": flat_call(tmp / "split.pt2")}
        for slots in args.slots:
            today, tree = step_pair(model, args.sentences, slots, args.source)
            a = runs["today"](*today)
            # today's outputs: the state, the (N, H, t + 1, D) caches, done; the tree's: the new slots, done, table
            last = [x[:, :, -1:] for x in a[5:5 + 2 * layers]]
            same = True
            for name in VARIANTS:
                ok, diff = cache_copies.same_step((*a[:5], *last, a[-1]), runs[name](*tree)[:-1])
                same, worst = same and ok, max(worst, diff)
            all_same = all_same and same
            best = best_per_call({name: (lambda run=run, x=(today if name == "today" else tree): run(*x))
                                  for name, run in runs.items()}, args.repeats, args.calls, warmup=3)
            row = {"slots": slots, "today_ms": 1e3 * best["today"], "same": same}
            for name in VARIANTS:
                row[f"{name}_ms"], row[f"{name}_ratio"] = 1e3 * best[name], best[name] / best["today"]
            rows.append(row)
            print(row, flush=True)
    hw = hardware()
    table = markdown_table(rows, [("slots", "slots so far"), ("today_ms", "today (copied): ms per step")]
                           + [(f"{n}_ms", f"{n}: ms per step") for n in VARIANTS]
                           + [(f"{n}_ratio", f"{n} ÷ today") for n in VARIANTS])
    print(table, f"same outputs: {all_same} (largest float difference {worst:.2g})", sep="\n\n")
    payload = {"command": command_line(), "hardware": hw, "checkpoint": str(args.checkpoint),
               "sentences": args.sentences, "source": args.source, "threads": torch.get_num_threads(),
               "same_outputs": all_same, "max_float_difference": worst, "rows": rows}
    if args.out:
        write_json(args.out, payload)
    if args.md:
        args.md.write_text(
            page_head("A search step over its cache in place, in the compiled search graph (issue 76 §2)", hw,
                      payload["command"])
            + f"- model: {args.checkpoint}; {args.sentences} sentences at beam 4 over {args.source} source tokens; "
            f"{torch.get_num_threads()} threads; best of {args.repeats} interleaved rounds of {args.calls} calls\n\n"
            + __doc__.split("\n\n", 2)[2].strip() + f"\n\n{table}\n\nThe two give the same step (tokens, rows and "
            f"done equal; scores, keys and values to 1e-5): {'yes' if all_same else 'no'} (the largest difference: "
            f"{worst:.2g}).\n")


if __name__ == "__main__":
    main()
