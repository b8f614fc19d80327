#!/usr/bin/env python
"""Issue 76 §2's question, asked of a decoder step's self-attention before it is built: does a preallocated cache
written in place, the beams' reordering kept as an ancestor table, cost less per step than the copy a search step
makes today? Run it alone on the machine.

    python scripts/bench/tree_cache.py --out docs/results/engines/tree_cache.json \\
        --md docs/results/engines/tree_cache.md

A beam search step reorders its hypotheses (each continues a parent row, `order`). Today's search graph
(relmt/export/graphs.py) gathers every layer's keys and values by `order` and appends the new slot: a copy of the
whole span, every step, which is what makes relmt-serve's step grow with its span (docs/results/engines/
cache_copies.md). The alternative: each (row, slot) is written once, in place, into buffers of the longest span,
and an ancestor table A (N, t + 1) says which row holds hypothesis n's slot s (A = A[order] with the new slot
appended: integers only); attention then reads K[A[n, s], :, s] where it reads K[n, :, s] today.

Each variant is a step of --layers decoder layers' single-query self-attention (softmax(q k^T / sqrt(d)) v over
the span), each layer with a cache of its own, the new caches of a copy alive until the step ends, compiled by
inductor (torch.compile, the code generator behind AOTInductor), at N rows (sentences x beam 4), H heads
of D dimensions and --slots slots so far:
- copy: K[order] and the new slot concatenated, then q k^T and p v as batched products;
- copy, fused: the same copy, and the products written as sums (q * K).sum(-1) and (p * V).sum(-2), which inductor
  writes as reduction loops. This is what engine=aoti's search graph runs today: AOTInductor already lowers the
  step's (1, D) x (D, t) products so (in a one-off check, not kept as a script, a search graph traced with the
  products and one traced with the sums compiled to the same kernels and gave bit-identical steps);
- in place, gathered: the buffers written at slot t in place, and K[A], V[A] gathered for batched products;
- in place, fused: in place, and the sums, so that the reduction loops read the buffers through A.
The question of §2 is the last column: in place, fused ÷ copy, fused. Each variant's output is compared with the
copy's. Seconds per step: the best of --repeats interleaved rounds of --calls calls, at the process's threads.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from relmt.bench import best_per_call, hardware, markdown_table, page_head, write_json  # noqa: E402
from relmt.runtime import tune_cpu  # noqa: E402


def attend(q, keys, values, fused: bool):
    """softmax(q k^T / sqrt(d)) v for one query per row: batched products, or (fused) sums that inductor writes as
    reduction loops reading keys and values where they lie."""
    if fused:
        s = (q * keys).sum(-1, keepdim=True).transpose(-1, -2) / math.sqrt(q.shape[-1])
        p = torch.softmax(s, dim=-1)
        return (p.transpose(-1, -2) * values).sum(-2, keepdim=True)
    p = torch.softmax(q @ keys.transpose(-1, -2) / math.sqrt(q.shape[-1]), dim=-1)
    return p @ values


NAMES = ("copy", "copy, fused", "in place, gathered", "in place, fused")


def copy_step(q, k_new, v_new, keys, values, order, fused: bool = False):
    """Today's step: the cache reordered and grown by a copy, then attention."""
    keys = torch.cat([keys[order], k_new], dim=2)
    values = torch.cat([values[order], v_new], dim=2)
    return attend(q, keys, values, fused), keys, values


def ancestors(a, order, t: int):
    """The ancestor table after a step: each row's parent's rows, and its own row at slot t."""
    rows = torch.arange(a.shape[0], device=a.device)
    return torch.cat([a[order], rows[:, None]], dim=1)


def gathered(buf, a):
    """(N, H, t+1, D): buf's slot s of row a[n, s], for each n and s."""
    heads = torch.arange(buf.shape[1], device=buf.device)[None, :, None]
    slots = torch.arange(a.shape[1], device=buf.device)[None, None, :]
    return buf[a[:, None, :], heads, slots]


def inplace_step(q, k_new, v_new, kbuf, vbuf, a, order, t: int, fused: bool):
    """The in-place step: slot t written into the buffers, the ancestors advanced, attention through them."""
    kbuf[:, :, t] = k_new[:, :, 0]
    vbuf[:, :, t] = v_new[:, :, 0]
    a = ancestors(a, order, t)
    return attend(q, gathered(kbuf, a), gathered(vbuf, a), fused), a


def case(rows: int, heads: int, dim: int, slots: int, layers: int, repeats: int, calls: int) -> dict:
    g = torch.Generator().manual_seed(0)
    q, k_new, v_new = (torch.randn(rows, heads, 1, dim, generator=g) for _ in range(3))
    order = torch.randint(0, rows, (rows,), generator=g)
    # the same history both ways: a random ancestry over `slots` slots, written into each layer's buffers
    longest = slots + 8
    a = torch.arange(rows)[:, None].repeat(1, slots)
    for s in range(1, slots):
        a[:, :s] = a[torch.randint(0, rows, (rows,), generator=g), :s]
    kbuf, vbuf = ([torch.randn(rows, heads, longest, dim, generator=g) for _ in range(layers)] for _ in range(2))
    keys = [gathered(b[:, :, :slots], a) for b in kbuf]
    values = [gathered(b[:, :, :slots], a) for b in vbuf]
    torch._dynamo.reset()  # a case's compiles are its own (dynamo stops compiling past its cache_size_limit)
    copy = torch.compile(copy_step, dynamic=False)
    inplace = torch.compile(inplace_step, dynamic=False)
    out, *_ = copy(q, k_new, v_new, keys[0], values[0], order)
    result = {"rows": rows, "heads": heads, "dim": dim, "slots": slots, "layers": layers}
    # a step runs every layer, and each layer's new cache (copy) lives until the step ends, as in a search graph
    fns = {"copy": lambda: [copy(q, k_new, v_new, keys[i], values[i], order) for i in range(layers)]}
    got, *_ = copy(q, k_new, v_new, keys[0], values[0], order, True)
    result["copy, fused: max difference"] = float((got - out).abs().max())
    fns["copy, fused"] = lambda: [copy(q, k_new, v_new, keys[i], values[i], order, True) for i in range(layers)]
    for fused in (False, True):
        name = "in place, fused" if fused else "in place, gathered"
        got, _ = inplace(q, k_new, v_new, kbuf[0], vbuf[0], a, order, slots, fused)
        result[f"{name}: max difference"] = float((got - out).abs().max())
        fns[name] = (lambda fused=fused: [inplace(q, k_new, v_new, kbuf[i], vbuf[i], a, order, slots, fused)
                                          for i in range(layers)])
    seconds = best_per_call(fns, repeats=repeats, calls=calls, warmup=2)
    for name, s in seconds.items():
        result[f"{name}: us"] = s * 1e6
    for name in NAMES[1:]:
        result[f"{name} ÷ copy"] = seconds[name] / seconds["copy"]
    result["in place ÷ today"] = seconds["in place, fused"] / seconds["copy, fused"]
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[4, 128])
    ap.add_argument("--slots", type=int, nargs="+", default=[10, 20, 40])
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--md", type=Path)
    opts = ap.parse_args()
    tune_cpu()
    rows = []
    for n in opts.rows:
        for t in opts.slots:
            rows.append(case(n, opts.heads, opts.dim, t, opts.layers, opts.repeats, opts.calls))
            print(rows[-1], flush=True)
    hw = hardware()
    payload = {"hardware": hw, "threads": torch.get_num_threads(), "rows": rows}
    names = NAMES
    columns = [("rows", "rows (sentences x 4)"), ("slots", "slots so far")]
    columns += [(f"{n}: us", f"{n}: µs per step") for n in names]
    columns += [(f"{n} ÷ copy", f"{n} ÷ copy") for n in names[1:]]
    columns += [("in place ÷ today", "in place, fused ÷ copy, fused (today)")]
    columns += [(f"{n}: max difference", f"{n}: largest difference from copy") for n in names[1:]]
    md = (page_head("A search step's self-attention cache: copied each step, or written in place (issue 76 §2)", hw)
          + f"- threads: {torch.get_num_threads()}; {opts.layers} layers of {opts.heads} heads of {opts.dim} (the "
          f"bench_peers rel model's 3 decoder layers, d_model 256); best of {opts.repeats} interleaved rounds of "
          f"{opts.calls} calls\n\n"
          + "\n\n".join(__doc__.split("\n\n")[2:4]) + "\n\n" + markdown_table(rows, columns) + "\n")
    print(md)
    if opts.out:
        write_json(opts.out, payload)
    if opts.md:
        opts.md.write_text(md)


if __name__ == "__main__":
    main()
