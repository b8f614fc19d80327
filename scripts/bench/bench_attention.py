#!/usr/bin/env python
"""One self-attention layer, forward + backward: time and peak memory against sequence length.

Variants, all with the base model's shape (d_model 512, 8 heads, d_head 64) and k = 16:
- abs:   plain attention (absolute encodings live in the embeddings), fused SDPA;
- rel:   relmt's relative attention (Shaw §3.3 via 2k+1 labels: gather for a^K, scatter-add
         of the weights for a^V; no (n, n, d) tensor);
- naive: the version common in tutorials, which materialises a^K and a^V as (n, n, d_head)
         tensors and contracts them with einsum;
- rope, alibi, t5 (issue 31): the layer with its stack's PositionTerms (rotated q and k through
         SDPA; a float bias through SDPA), computed in the timed step as the stack computes them
         once per pass.
The token budget is fixed, so the batch is budget // n.

    python scripts/bench/bench_attention.py --out docs/results/performance/attention_cpu.json \
        --md docs/results/performance/attention_cpu.md
    python scripts/bench/bench_attention.py --quick --out /tmp/a.json     # n <= 256, under a minute on CPU
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from relmt.bench import (
    command_line,
    hardware,
    markdown_table,
    peak_memory_bytes,
    time_interleaved,
    write_json,
)
from relmt.model.attention import MultiHeadAttention
from relmt.model.positions import NO_TERMS, ALiBi, RelativePositions, Rotary, T5Bias, relative_index


class NaiveRelativeAttention(nn.Module):
    """Tutorial-style Shaw attention: a_ij materialised as (n, n, d_head), then einsum."""

    def __init__(self, d_model: int, n_heads: int, k: int, dropout: float) -> None:
        super().__init__()
        self.h, self.d, self.k, self.dropout = n_heads, d_model // n_heads, k, dropout
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.rel_k = nn.Embedding(2 * k + 1, self.d)
        self.rel_v = nn.Embedding(2 * k + 1, self.d)

    def forward(self, x: Tensor) -> Tensor:
        b, n, _ = x.shape
        q, k, v = (t.view(b, n, self.h, self.d).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        idx = relative_index(n, n, self.k, device=x.device)
        a_k, a_v = self.rel_k(idx), self.rel_v(idx)  # (n, n, d) each
        scores = (q @ k.transpose(-1, -2) + torch.einsum("bhid,ijd->bhij", q, a_k)) / math.sqrt(self.d)
        attn = F.dropout(scores.softmax(-1), self.dropout, self.training)
        z = attn @ v + torch.einsum("bhij,ijd->bhid", attn, a_v)
        return self.out(z.transpose(1, 2).reshape(b, n, -1))


class RelmtLayer(nn.Module):
    """relmt's attention as a self-attention layer (abs when rel and positions are None)."""

    def __init__(self, d_model: int, n_heads: int, k: int | None, dropout: float,
                 positions: nn.Module | None = None) -> None:
        super().__init__()
        rel = None if k is None else RelativePositions(n_heads, d_model // n_heads, k)
        self.attn = MultiHeadAttention(d_model, n_heads, dropout, rel)
        self.positions = positions

    def terms(self, x: Tensor):
        n = x.shape[1]
        return NO_TERMS if self.positions is None else self.positions.terms(n, n, 0, x.device, x.dtype)

    def forward(self, x: Tensor) -> Tensor:
        terms = self.terms(x)
        return self.attn(x, *self.attn.project_kv(x, terms), terms=terms)


@torch.no_grad()
def forward_only(layer: nn.Module, x: Tensor) -> None:
    """The layer in eval mode under no_grad (inference), with a padding mask of the batch's shape."""
    layer.eval()
    attn, terms = layer.attn, layer.terms(x)
    mask = torch.ones(x.shape[0], 1, 1, x.shape[1], dtype=torch.bool, device=x.device)
    attn(x, *attn.project_kv(x, terms), mask=mask, terms=terms)
    layer.train()


def build(variant: str, args: argparse.Namespace) -> nn.Module:
    if variant == "naive":
        return NaiveRelativeAttention(args.d_model, args.heads, args.k, args.dropout)
    positions = {"rope": lambda: Rotary(args.d_model // args.heads), "alibi": lambda: ALiBi(args.heads),
                 "t5": lambda: T5Bias(args.heads, args.d_model, bidirectional=True)}.get(variant, lambda: None)()
    return RelmtLayer(args.d_model, args.heads, args.k if variant == "rel" else None, args.dropout, positions)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", type=int, nargs="+", default=[32, 64, 128, 256, 512, 1024])
    ap.add_argument("--quick", action="store_true", help="only n <= 256 (under a minute on CPU)")
    ap.add_argument("--tokens", type=int, default=4096, help="token budget per batch (batch = tokens // n)")
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--min-seconds", type=float, default=1.0, help="keep timing each case at least this long")
    ap.add_argument("--memory-only", action="store_true",
                    help="peak memory only, no timing (memory does not depend on what else the machine runs)")
    ap.add_argument("--variants", nargs="+", default=["abs", "rel", "naive", "rope", "alibi", "t5"],
                    choices=["abs", "rel", "naive", "rope", "alibi", "t5"])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", type=Path, help="write JSON here")
    ap.add_argument("--md", type=Path, help="write a markdown report here")
    args = ap.parse_args()
    device = torch.device(args.device)
    lengths = [n for n in args.lengths if not args.quick or n <= 256]

    variants = args.variants
    rows = []
    for n in lengths:
        batch = max(1, args.tokens // n)
        row = {"n": n, "batch": batch}
        steps = {}
        for variant in variants:
            torch.manual_seed(0)
            layer = build(variant, args).to(device).train()
            x = torch.randn(batch, n, args.d_model, device=device, requires_grad=True)

            def step(layer=layer, x=x) -> None:
                layer(x).sum().backward()
                layer.zero_grad(set_to_none=True)
                x.grad = None

            row[f"{variant}_mb"] = peak_memory_bytes(step, device) / 2**20
            steps[variant] = step
            if variant != "naive":  # decoding a long source: the encoder's forward pass alone
                row[f"{variant}_forward_mb"] = peak_memory_bytes(lambda layer=layer, x=x: forward_only(layer, x),
                                                                 device) / 2**20
            if variant != "abs" and "abs" in variants:
                row[f"{variant}_over_abs_mem"] = row[f"{variant}_mb"] / row["abs_mb"]
        if "naive" in variants and "rel" in variants:
            row["naive_over_rel_mem"] = row["naive_mb"] / row["rel_mb"]
        rows.append(row)
        memory = " ".join(f"{v} {row[f'{v}_mb']:.0f}" for v in variants)
        if args.memory_only:
            print(f"n={n:5d} batch={batch:4d}  peak MB {memory}", flush=True)
            continue
        times = time_interleaved(steps, device, repeats=args.repeats, min_seconds=args.min_seconds)
        row.update({f"{variant}_ms": 1000 * t for variant, t in times.items()})
        del steps
        if "abs" in variants:
            row.update({f"{v}_over_abs": row[f"{v}_ms"] / row["abs_ms"] for v in variants if v != "abs"})
        print(f"n={n:5d} batch={batch:4d}  " + "  ".join(f"{v} {row[f'{v}_ms']:8.1f} ms" for v in variants)
              + f"  |  peak MB {memory}", flush=True)

    others = [v for v in variants if v != "abs"]
    timing = [(f"{v}_ms", f"{v} ms") for v in variants] + [(f"{v}_over_abs", f"{v}/abs time") for v in others]
    columns = [("n", "n"), ("batch", "batch"), *([] if args.memory_only else timing),
               *((f"{v}_mb", f"{v} peak MiB") for v in variants),
               *((f"{v}_over_abs_mem", f"{v}/abs memory") for v in others),
               *([("naive_over_rel_mem", "naive/rel memory")] if "naive" in variants and "rel" in variants else []),
               *((f"{v}_forward_mb", f"{v} forward-only peak MiB") for v in variants if v != "naive")]
    table = markdown_table(rows, columns)
    hw = hardware(device)
    print("\n" + table)
    settings = {k: v for k, v in vars(args).items() if k not in ("out", "md")}
    if args.out:
        write_json(args.out, {"command": command_line(), "hardware": hw, "settings": settings, "rows": rows})
    if args.md:
        where = hw.get("gpu", hw["cpu"])
        args.md.parent.mkdir(parents=True, exist_ok=True)
        args.md.write_text(
            f"# Attention layer benchmark ({device.type})\n\n"
            f"One self-attention layer, forward + backward, fp32, d_model {args.d_model}, "
            f"{args.heads} heads, k = {args.k}, dropout {args.dropout}, {args.tokens} tokens per batch. "
            f"Time is the median of at least {args.repeats} runs (and {args.min_seconds} s) per variant "
            "after 2 warm-up runs, with the variants timed round-robin. Peak memory counts every tensor "
            "allocated during one "
            "forward + backward (relmt.bench.PeakMemory on CPU, the CUDA allocator's peak on GPU); the "
            "forward-only columns count one forward pass in eval mode under no_grad, with a padding mask, "
            "as when a long source is encoded for decoding.\n\n"
            f"- command: `{command_line()}`\n- hardware: {where}, {hw['torch_threads']} torch threads, "
            f"torch {hw['torch']}\n- date: {hw['date']} (git {hw['git']})\n\n{table}\n")


if __name__ == "__main__":
    main()
