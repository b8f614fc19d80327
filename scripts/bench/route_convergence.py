#!/usr/bin/env python
"""Convergence, not just speed (issue 58): the same model trained from the same initialisation on the same
batches through two attention routes (RELMT_ATTENTION), and one route twice, with the per-update loss curves.

Each run builds the model with torch seed 1, takes the trainer's first --updates batches of the WMT-like text
(bench_train.py's workload; `--text-dir` for another folder), and runs the trainer's own train_step with the
noam schedule (warm-up --warmup updates) in the run's precision (bf16 autocast on CUDA). Dropout masks come
from torch's RNG, reseeded identically for every run, so the routes differ only in their arithmetic: the flex
route's attention dropout is hashed, not drawn, so with --dropout on it trains another dropout realisation
and its curve is compared in distribution rather than update by update; the default is --dropout 0.

The table gives the mean loss over the last --window updates of each run, its ratio to the first route's
(the goal: within 1%), the largest per-update difference, and whether the repeat of the first route gave
bit-identical losses (determinism: FlexAttention's backward adds the gradients of captured tables, Shaw's
q·a^K and T5's buckets, with atomics on CUDA).

    python scripts/bench/route_convergence.py --device cuda --routes flex reference --updates 300 \\
        --out docs/results/gpu/route_convergence.json --md docs/results/gpu/route_convergence.md
    python scripts/bench/route_convergence.py --device cpu --routes chunked reference --size tiny --updates 20 \\
        --tgt-tokens 600     # a CPU smoke run (flex trains on CUDA only)
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402
from bench_train import ROOT, budget_for, workload  # noqa: E402

from relmt.bench import command_line, hardware, markdown_table, write_json  # noqa: E402
from relmt.config import ModelConfig, PosKind, Precision, TrainConfig, compose  # noqa: E402
from relmt.data.batching import BatchSampler, collate  # noqa: E402
from relmt.data.tokenizer import PAD_ID  # noqa: E402
from relmt.model import routes  # noqa: E402
from relmt.model.linear import bound_onednn_caches  # noqa: E402
from relmt.model.transformer import build_model  # noqa: E402
from relmt.runtime import autocast_dtype, resolve_device  # noqa: E402
from relmt.train.distributed import Dist  # noqa: E402
from relmt.train.optim import build_optimizer, learning_rate  # noqa: E402
from relmt.train.step import train_step  # noqa: E402


def curve(route: str, args: argparse.Namespace, batches: list, vocab: int, device: torch.device) -> list[float]:
    """Loss per target token of each update, training through `route` from torch seed 1."""
    torch.manual_seed(1)
    preset = compose([f"model={args.size}"]).model
    drop = {"dropout": args.dropout, "attention_dropout": args.dropout, "activation_dropout": args.dropout}
    cfg = ModelConfig(**{**preset.__dict__, "positions": PosKind(args.positions), **drop})
    model = build_model(cfg, vocab, PAD_ID).to(device).train()
    tcfg = TrainConfig(warmup_steps=args.warmup)
    optimizer = build_optimizer(model, tcfg)
    amp = autocast_dtype(Precision(args.precision), device)
    scaler = torch.amp.GradScaler(device.type, enabled=amp == torch.float16)
    dist, losses = Dist(0, 1, device), []
    with routes.use_route(route):
        for step, batch in enumerate(batches, start=1):
            loss, _, n_tgt, _, _ = train_step(model, model, optimizer, scaler, [batch],
                                              learning_rate(tcfg, cfg.d_model, step), 0.1, amp, dist)
            losses.append(loss / n_tgt)
    return losses


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=ROOT / "data/bench/wmt_like")
    ap.add_argument("--shared-data", type=Path, default=ROOT.parent / "shared/data")
    ap.add_argument("--text-dir", type=Path)
    ap.add_argument("--peer-corpus", type=Path)
    ap.add_argument("--src-lang", default="src")
    ap.add_argument("--tgt-lang", default="tgt")
    ap.add_argument("--vocab-size", type=int, default=32000)
    ap.add_argument("--spm-model-type", default="bpe")
    ap.add_argument("--cache-dir", default="data/cache")
    ap.add_argument("--size", default="base")
    ap.add_argument("--positions", default="rel")
    ap.add_argument("--routes", nargs=2, default=["flex", "reference"], choices=routes.ROUTES[1:])
    ap.add_argument("--updates", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=100, help="noam warm-up updates")
    ap.add_argument("--window", type=int, default=50, help="the last updates whose mean loss is compared")
    ap.add_argument("--tgt-tokens", type=int, default=25000)
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--precision", default="auto")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--out", default="")
    ap.add_argument("--md", default="")
    args = ap.parse_args()
    bound_onednn_caches()
    device = resolve_device(args.device)
    ids, vocab, described = workload(args)
    sampler = BatchSampler(ids, budget_for(ids, args.tgt_tokens), seed=1)
    order = sampler.epoch(0)
    batches = [collate(ids, order[i % len(order)]).to(device) for i in range(args.updates)]

    first, second = args.routes
    hw = hardware(device)
    curves: dict[str, list[float]] = {}
    errors: dict[str, str] = {}
    for name, route in ((first, first), (second, second), (f"{first} again", first)):
        if name == f"{first} again" and first in errors:  # its determinism needs a first run
            errors[name] = errors[first]
            continue
        try:  # a route that fails (flex did not compile on torch 2.11) costs the other its curve no more
            curves[name] = curve(route, args, batches, vocab, device)
        except Exception as e:  # noqa: BLE001: the failure is the finding, written down
            errors[name] = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}"
            print(f"{name}: failed: {errors[name]}", flush=True)
        report(args, hw, described, curves, errors)


def report(args: argparse.Namespace, hw: dict, described: str, curves: dict[str, list[float]],
           errors: dict[str, str]) -> None:
    """The JSON and the page from the curves so far (written after each route: a late failure loses nothing)."""
    window = min(args.window, args.updates)
    ref = next(iter(curves), None)  # the first route that trained
    base = statistics.fmean(curves[ref][-window:]) if ref else None
    rows = [{"run": name, "mean_loss_last": statistics.fmean(c[-window:]),
             "over_first": statistics.fmean(c[-window:]) / base,
             "max_update_diff": max(abs(a - b) for a, b in zip(c, curves[ref])),
             "identical_to_first": c == curves[ref]} for name, c in curves.items()]
    rows += [{"run": name, "error": why} for name, why in errors.items()]
    table = markdown_table(rows, [("run", "route"), ("mean_loss_last", f"mean loss, last {window} updates"),
                                  ("over_first", f"/ {ref}"), ("max_update_diff", f"largest |diff| to {ref}"),
                                  ("identical_to_first", "bit-identical"), ("error", "failed")])
    steps = sorted({*range(0, args.updates, max(args.updates // 12, 1)), args.updates - 1})
    curve_rows = [{"update": s + 1, **{name: c[s] for name, c in curves.items()}} for s in steps]
    curve_table = markdown_table(curve_rows, [("update", "update")] + [(n, n) for n in curves])
    print(table + "\n\n" + curve_table)
    payload = {"command": command_line(), "hardware": hw, "workload": described, "rows": rows, "curves": curves,
               "errors": errors}
    if args.out:
        write_json(args.out, payload)
    if args.md:
        first, second = args.routes
        Path(args.md).write_text(
            f"# Convergence through the attention routes: {first} and {second}\n\n`{command_line()}`\n\n"
            f"{hw['date']}; {hw.get('gpu') or hw['cpu']}; torch {hw['torch']}.\n\n"
            f"Workload: {described}. Model `{args.size}`, positions {args.positions}, {args.updates} updates of "
            f"about {args.tgt_tokens} target tokens from torch seed 1, noam warm-up {args.warmup}, dropout "
            f"{args.dropout}, precision {args.precision}.\n\n{table}\n\nLoss per target token by update:\n\n"
            f"{curve_table}\n")

if __name__ == "__main__":
    main()
