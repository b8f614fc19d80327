"""Shaw's sums per label (relmt/model/labels.py's sum_labels: a^V's buckets and the gradient of q·a^K's gather)
timed each way at training's shapes, for the GPU call of issue 68 §3:

- product: relmt's CUDA sums: the band by a gather, both tails by one batched product with their masks;
- masked: the band alike, each tail by a masked sum (torch.where, then sum): the same reads, no matrix units;
- scans: the tails by prefix and suffix sums (cumsum, flip), relmt's CUDA sums until 2026-11-28 (113 ms of rel's
  471 ms step on an H200);
- scatter_add: torch's scatter_add, the CPU's sums (atomics on CUDA, which queue on a clipped tail).

Each variant is checked against scatter_add in float64 first; the JSON is rewritten after every shape.

    python scripts/bench/bench_label_sums.py --device cuda --out label_sums.json --md label_sums.md
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from relmt.bench import command_line, hardware, markdown_table, time_interleaved, write_json  # noqa: E402
from relmt.model import labels  # noqa: E402
from relmt.model.positions import relative_index  # noqa: E402


def band(x: torch.Tensor, k: int, q_offset: int) -> tuple[torch.Tensor, torch.Tensor]:
    n, m = x.shape[-2:]
    i = torch.arange(q_offset, q_offset + n, device=x.device)[:, None]
    j = i + torch.arange(-k + 1, k, device=x.device)
    return x.gather(-1, j.clamp(0, m - 1).expand(*x.shape[:-1], 2 * k - 1)).masked_fill((j < 0) | (j >= m), 0), i


def masked(x: torch.Tensor, k: int, q_offset: int) -> torch.Tensor:
    b, i = band(x, k, q_offset)
    d = torch.arange(x.shape[-1], device=x.device) - i
    acc = torch.promote_types(x.dtype, torch.float32)
    lower = torch.where(d <= -k, x, 0).sum(-1, keepdim=True, dtype=acc).to(x.dtype)
    upper = torch.where(d >= k, x, 0).sum(-1, keepdim=True, dtype=acc).to(x.dtype)
    return torch.cat((lower, b, upper), dim=-1)


def scans(x: torch.Tensor, k: int, q_offset: int) -> torch.Tensor:
    m = x.shape[-1]
    b, i = band(x, k, q_offset)
    lead = x.shape[:-1]
    acc = torch.promote_types(x.dtype, torch.float32)
    last, first = i - k, i + k
    lower = x.cumsum(-1, dtype=acc).gather(-1, last.clamp(0, m - 1).expand(*lead, 1)).masked_fill(last < 0, 0)
    upper = x.flip(-1).cumsum(-1, dtype=acc).gather(-1, (m - 1 - first.clamp(0, m - 1)).expand(*lead, 1))
    return torch.cat((lower.to(x.dtype), b, upper.masked_fill(first > m - 1, 0).to(x.dtype)), dim=-1)


def scatter(x: torch.Tensor, k: int, q_offset: int) -> torch.Tensor:
    index = relative_index(x.shape[-2], x.shape[-1], k, q_offset, x.device)
    return x.new_zeros(*x.shape[:-1], 2 * k + 1).scatter_add_(-1, index.expand_as(x), x)


VARIANTS = {"product": labels._sum_without_atomics, "masked": masked, "scans": scans, "scatter_add": scatter}
SHAPES = {"base": (900, 8, 45, 45), "long": (4, 8, 1024, 1024)}  # (B, H, n, m): 25k-token batches, and n = 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), help=f"names ({', '.join(SHAPES)}) or BxHxNxM")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--md", type=Path)
    args = ap.parse_args()
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    x = torch.randn(2, 3, 9, 11, dtype=torch.float64, device=device)
    for name, fn in VARIANTS.items():
        torch.testing.assert_close(fn(x, 3, 2), scatter(x, 3, 2), rtol=1e-12, atol=1e-12, msg=name)
    rows: list[dict] = []
    for shape in args.shapes:
        dims = SHAPES.get(shape) or tuple(int(d) for d in shape.split("x"))
        x = torch.randn(dims, dtype=dtype, device=device)
        steps = {name: (lambda fn=fn, x=x: fn(x, args.k, 0)) for name, fn in VARIANTS.items()}
        times = time_interleaved(steps, device, repeats=args.repeats)
        for name, t in times.items():
            rows.append({"shape": shape, "bhnm": "x".join(map(str, dims)), "variant": name, "ms": 1e3 * t,
                         "over_product": t / times["product"]})
            print(f"{shape:5s} {name:12s} {1e3 * t:8.3f} ms", flush=True)
        columns = [("shape", "shape"), ("bhnm", "B x H x n x m"), ("variant", "variant"), ("ms", "ms"),
                   ("over_product", "time / product")]
        info = {"command": command_line(), "hardware": hardware(device), "dtype": args.dtype, "k": args.k,
                "rows": rows}
        if args.out:
            write_json(args.out, info)
        if args.md:
            args.md.write_text(f"# Sums per label ({device.type}, {args.dtype}, k = {args.k})\n\n"
                               f"- command: `{info['command']}`\n- hardware: {info['hardware']}\n\n"
                               + markdown_table(rows, columns) + "\n")


if __name__ == "__main__":
    main()
