"""A CPU estimate of a GPU training step: every aten op of one forward and backward, its FLOPs and bytes, and its
roofline time at a GPU's peaks (issue 68 §3; an H200: about 790 bf16 TFLOP/s and 4.3 TB/s).

The step runs under the device lane (tests/fake_cuda.py) with shapes alone (data="meta"), so relmt takes its
CUDA branches (the label sums without atomics, bf16 autocast, the route auto picks there) and nothing is computed:
a base model's step at 25k target tokens takes seconds. Each op's time is max(FLOPs / peak FLOP/s, bytes / peak
bandwidth): FLOPs from torch.utils.flop_counter's formulas (matrix products, attention), bytes the op's distinct
input and output elements; views are free. Fused attention (scaled_dot_product_attention) is counted as one
kernel, forward and backward, that reads q, k, v (and a bias) and writes its output: FlashAttention's traffic, not
the math fallback's. What a roofline leaves out: launch overheads, kernels that miss their peak (small or skinny
products, a scan's serial depth), the CPU side, and fusion. The ratio rel / abs is the figure to set beside a
GPU's measurement (docs/results/gpu/).

    python scripts/gpu/roofline.py --positions abs rel both --out docs/results/gpu/roofline.json \
        --md docs/results/gpu/roofline.md
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import flop_registry

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from relmt.config import ModelConfig, PosKind  # noqa: E402
from relmt.data.tokenizer import PAD_ID  # noqa: E402
from relmt.host import host  # noqa: E402
from relmt.model.transformer import build_model  # noqa: E402
from relmt.train.loss import label_smoothed_nll  # noqa: E402
from tests.fake_cuda import LaneTensor, fake_cuda  # noqa: E402

aten = torch.ops.aten
FREE = {aten.view, aten._unsafe_view, aten.permute, aten.expand, aten.slice, aten.t, aten.transpose,
        aten.unsqueeze, aten.squeeze, aten.detach, aten.alias, aten.select, aten.split, aten.split_with_sizes,
        aten.as_strided, aten.unbind, aten.diagonal, aten.lift_fresh, aten._reshape_alias, aten.reshape}


def distinct_bytes(t: torch.Tensor) -> int:
    """The bytes an op touches of t: its elements, a broadcast (stride-0) dimension counted once."""
    if isinstance(t, LaneTensor):
        t = t.inner
    n = 1
    for size, stride in zip(t.shape, t.stride()):
        n *= size if stride != 0 else 1
    return n * t.element_size()


class FusedAttention(torch.autograd.Function):
    """scaled_dot_product_attention as one kernel each way, for counting: shapes only."""

    @staticmethod
    def forward(ctx, q, k, v, bias):
        ctx.save_for_backward(q, k, v, bias)
        record("sdpa_fused_fwd", 4 * q.numel() * k.shape[-2], [q, k, v, bias], q.shape, q.dtype)
        return torch.empty_like(q)

    @staticmethod
    def backward(ctx, grad):
        q, k, v, bias = ctx.saved_tensors
        record("sdpa_fused_bwd", 10 * q.numel() * k.shape[-2], [q, k, v, bias, grad], (3, *q.shape), q.dtype)
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), None


# "a base bf16 step": the shape and the peaks the estimate takes by default (tests/test_gpu_costs.py holds rel / abs
# there to its ceiling in scripts/gpu/ceilings.json)
BASE_STEP = {"batch": 900, "src_len": 45, "tgt_len": 45, "vocab": 32000, "k": 16}
PEAKS = {"tflops": 790.0, "tbps": 4.3}  # an H200's bf16 dense FLOP/s (10^12) and memory bandwidth (TB/s)

OPS: list[dict] = []


def record(name: str, flops: float, inputs: list, out_shape, dtype) -> None:
    nbytes = sum(distinct_bytes(t) for t in inputs if isinstance(t, torch.Tensor) and t.numel() > 1)
    out = 1
    for s in out_shape:
        out *= s
    OPS.append({"op": name, "flops": float(flops), "bytes": nbytes + out * dtype.itemsize})


def sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kwargs):
    bias = attn_mask if attn_mask is not None else q.new_zeros(())
    return FusedAttention.apply(q, k, v, bias)


def on_op(func, args, kwargs, out) -> None:
    packet = func.overloadpacket
    if packet in FREE:
        return
    flat_in = [t for t in torch.utils._pytree.tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
    flat_out = [t for t in torch.utils._pytree.tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
    flops = 0
    if packet in flop_registry:
        if func in (aten.bmm.dtype, aten.mm.dtype):  # the output dtype is not a shape: the products' FLOPs alone
            args, kwargs = args[:2], {}
        flops = flop_registry[packet](*args, **kwargs, out_val=out)
    nbytes = sum(distinct_bytes(t) for t in flat_in + flat_out)
    OPS.append({"op": str(packet).removeprefix("aten."), "flops": float(flops), "bytes": nbytes})


def step_ops(positions: str, batch: int, src_len: int, tgt_len: int, vocab: int, k: int) -> list[dict]:
    """The ops of one bf16 training step (forward, label-smoothed loss, backward) of the base model on 'CUDA'."""
    OPS.clear()
    cfg = ModelConfig(d_model=512, n_heads=8, d_ff=2048, encoder_layers=6, decoder_layers=6,
                      positions=PosKind(positions), max_relative_position=k)
    g = torch.Generator().manual_seed(0)
    lengths = [torch.randint(max(2, n // 3), n + 1, (batch,), generator=g) for n in (src_len, tgt_len)]
    src, tgt = (torch.where(torch.arange(n) < lens[:, None], 5, PAD_ID) for n, lens in zip((src_len, tgt_len), lengths))
    with fake_cuda(data="meta") as lane:
        model = build_model(cfg, vocab, PAD_ID).to("meta").cuda().train()  # the weights' shapes, on the lane
        src, tgt = src.cuda(), tgt.cuda()
        real_sdpa, F.scaled_dot_product_attention = F.scaled_dot_product_attention, sdpa
        lane.on_op = on_op
        try:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = model(src, tgt)
            loss, _ = label_smoothed_nll(logits, tgt, 0.1)
            loss.backward()
        finally:
            F.scaled_dot_product_attention = real_sdpa
            lane.on_op = None
    return list(OPS)


def roofline(ops: list[dict], flops_peak: float, bandwidth: float) -> dict:
    per_op: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0.0, 0])
    total = 0.0
    for o in ops:
        t = max(o["flops"] / flops_peak, o["bytes"] / bandwidth)
        total += t
        row = per_op[o["op"]]
        row[0] += t
        row[1] += o["flops"]
        row[2] += o["bytes"]
        row[3] += 1
    top = sorted(per_op.items(), key=lambda kv: -kv[1][0])
    return {"ms": total * 1e3, "flops": sum(o["flops"] for o in ops), "bytes": sum(o["bytes"] for o in ops),
            "ops": len(ops), "by_op": [{"op": name, "ms": v[0] * 1e3, "gflop": v[1] / 1e9, "mb": v[2] / 1e6,
                                        "calls": v[3]} for name, v in top]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--positions", nargs="+", default=["abs", "rel", "both", "rope", "alibi", "t5"])
    ap.add_argument("--batch", type=int, default=BASE_STEP["batch"], help="sentences per batch")
    ap.add_argument("--src-len", type=int, default=BASE_STEP["src_len"], help="padded source length")
    ap.add_argument("--tgt-len", type=int, default=BASE_STEP["tgt_len"], help="padded target length")
    ap.add_argument("--vocab", type=int, default=BASE_STEP["vocab"])
    ap.add_argument("--k", type=int, default=BASE_STEP["k"], help="max_relative_position")
    ap.add_argument("--tflops", type=float, default=PEAKS["tflops"], help="peak bf16 dense TFLOP/s (H200: about 790)")
    ap.add_argument("--tbps", type=float, default=PEAKS["tbps"], help="peak memory bandwidth TB/s (H200: about 4.3)")
    ap.add_argument("--label", default="", help="a name for this estimate (e.g. 'after', the git revision)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--md", type=Path)
    args = ap.parse_args()
    results = {}
    for positions in args.positions:
        t0 = time.perf_counter()
        ops = step_ops(positions, args.batch, args.src_len, args.tgt_len, args.vocab, args.k)
        results[positions] = roofline(ops, args.tflops * 1e12, args.tbps * 1e12)
        print(f"{positions:6s} {results[positions]['ms']:8.2f} ms (roofline), {len(ops)} ops, "
              f"{time.perf_counter() - t0:.1f} s to trace", flush=True)
    base = results.get("abs", {}).get("ms")
    for r in results.values():
        r["ratio_to_abs"] = r["ms"] / base if base else None
    info = {"command": "python " + " ".join(sys.argv), "host": host(), "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "label": args.label,
            "shape": {"batch": args.batch, "src_len": args.src_len, "tgt_len": args.tgt_len, "vocab": args.vocab,
                      "k": args.k, "model": "base (6+6 layers, d_model 512, 8 heads, d_ff 2048)", "precision": "bf16"},
            "peaks": {"tflops": args.tflops, "tbps": args.tbps}, "results": results}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(info, indent=1) + "\n")
    if args.md:
        args.md.write_text(markdown(info))
    for name, r in results.items():
        print(name, f"{r['ms']:.2f} ms", f"ratio {r['ratio_to_abs']:.2f}" if r["ratio_to_abs"] else "")


def markdown(info: dict) -> str:
    s = info["shape"]
    lines = [f"# Roofline estimate of a training step at {info['peaks']['tflops']:g} TFLOP/s and "
             f"{info['peaks']['tbps']:g} TB/s{' (' + info['label'] + ')' if info['label'] else ''}", "",
             f"Base model, bf16, {s['batch']} sentences padded to {s['src_len']} source and {s['tgt_len']} target "
             f"tokens, vocabulary {s['vocab']}, k = {s['k']}: one forward and backward traced on the CPU under the "
             "device lane with shapes alone (scripts/gpu/roofline.py's docstring says what a roofline leaves out).",
             "", f"- command: `{info['command']}`", f"- traced on: {info['host'].get('cpu', '?')}, torch "
             f"{info['torch']}", f"- date: {info['date']}", "",
             "| positions | roofline ms | ÷ abs | GFLOP | GB moved | ops |", "|---|---|---|---|---|---|"]
    for name, r in info["results"].items():
        ratio = f"{r['ratio_to_abs']:.2f}" if r["ratio_to_abs"] else ""
        lines.append(f"| {name} | {r['ms']:.2f} | {ratio} | {r['flops'] / 1e9:,.0f} | {r['bytes'] / 1e9:.1f} | "
                     f"{r['ops']} |")
    for name, r in info["results"].items():
        lines += ["", f"## {name}: the ten costliest ops", "", "| op | roofline ms | GFLOP | MB | calls |",
                  "|---|---|---|---|---|"]
        lines += [f"| {o['op']} | {o['ms']:.3f} | {o['gflop']:,.1f} | {o['mb']:,.0f} | {o['calls']} |"
                  for o in r["by_op"][:10]]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
