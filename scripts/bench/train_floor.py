#!/usr/bin/env python
"""Where a CPU training step's time goes, and the floor that its matrix products put under it.

On the peer workload (the small model, 3+3 layers, d_model 256, on the peer corpus, batches of 8,192
padded source + target tokens, as scripts/bench/bench_train.py --peer-corpus builds them), for each
positions mode:
- the step: relmt.train.step.train_step (forward, label-smoothed loss, backward, Adam), timed over
  --steps batches after --warmup;
- the GEMM floor: every matrix product (aten mm, addmm, bmm; oneDNN's linear) of one step, recorded with its shapes
  and strides and replayed alone on the same threads, summed, and scaled by target tokens from the
  --profile-steps batches to the timed batches' mean. No fusion of the other operators can take a
  step below it;
- the rest by operator: each aten operator of --profile-steps steps timed in a dispatch mode (which
  adds a few microseconds per call; the table gives shares, the step time comes from the plain steps).
Each with every --cpu-gemm library for the linear maps (RELMT_CPU_GEMM, relmt/model/linear.py: oneDNN, relmt's
default, and MKL, torch's).

With --peers JSON (a page of scripts/peers/bench_peers.py, same host and session), the page also
gives the most that relmt's rel training could reach against the best relative peer there if every
operator but the matrix products cost nothing: that page's ratio x (step / GEMM floor).

    python scripts/bench/train_floor.py --peer-corpus ../shared/bench/make_peer_corpus.py \
        --peers docs/results/performance/perf_cpu_train.json \
        --out docs/results/performance/train_floor_cpu.json --md docs/results/performance/train_floor_cpu.md
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import Counter
from pathlib import Path

import bench_train as bt
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from relmt.bench import command_line, hardware, write_json
from relmt.model.linear import bound_onednn_caches, use_cpu_gemm
from relmt.report.aggregate import md_table

PEERS = {"onmt": "OpenNMT-py 3.5.1", "eole": "eole 0.6.4"}  # bench_peers.py's names of the relative peers
# the matrix products: torch's (MKL's), and oneDNN's where relmt/model/linear.py sends CPU training's linear maps
GEMMS = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default,
         torch.ops.mkldnn._linear_pointwise.default)


class Recorder(TorchDispatchMode):
    """Every GEMM call's arguments (shapes and strides), and every operator's time and count."""

    def __init__(self) -> None:
        super().__init__()
        self.gemms: list[tuple] = []
        self.seconds: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in GEMMS:
            self.gemms.append((func, [(tuple(a.shape), a.stride()) if isinstance(a, torch.Tensor) else a
                                      for a in args], kwargs or {}))
        t0 = time.perf_counter()
        out = func(*args, **(kwargs or {}))
        self.seconds[func.name()] += time.perf_counter() - t0
        self.calls[func.name()] += 1
        return out


def replay(gemms: list[tuple], repeats: int = 3) -> float:
    """Seconds of the recorded GEMMs, each run alone on fresh tensors of its shapes and strides (median of
    `repeats` after one untimed call)."""
    total = 0.0
    for func, args, kwargs in gemms:
        tensors = [torch.empty_strided(*a).normal_() if isinstance(a, tuple) else a for a in args]
        func(*tensors, **kwargs)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            func(*tensors, **kwargs)
            times.append(time.perf_counter() - t0)
        total += statistics.median(times)
    return total


def measure(kind: str, args: argparse.Namespace, vocab: int, batches: list, gemm: str) -> dict:
    with use_cpu_gemm(gemm):
        return {"positions": kind, "cpu_gemm": gemm, **measure_steps(kind, args, vocab, batches)}


def measure_steps(kind: str, args: argparse.Namespace, vocab: int, batches: list) -> dict:
    torch.manual_seed(1)
    preset = bt.compose([f"model={args.size}"]).model
    cfg = bt.ModelConfig(**{**preset.__dict__, "positions": bt.PosKind(kind), "max_relative_position": args.k})
    model = bt.build_model(cfg, vocab, bt.PAD_ID).train()
    optimizer = bt.build_optimizer(model, bt.TrainConfig())
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    dist = bt.Dist(0, 1, torch.device("cpu"))

    def step(batch) -> None:
        bt.train_step(model, model, optimizer, scaler, [batch], 1e-4, 0.1, None, dist)

    for batch in batches[:args.warmup]:
        step(batch)
    timed = batches[args.warmup:args.warmup + args.steps]
    t0 = time.perf_counter()
    for batch in timed:
        step(batch)
    step_s = (time.perf_counter() - t0) / len(timed)
    profiled = timed[:args.profile_steps]
    floor, seconds, calls = [], Counter(), Counter()
    for batch in profiled:
        rec = Recorder()
        with rec:
            step(batch)
        floor.append(replay(rec.gemms))
        seconds.update(rec.seconds)
        calls.update(rec.calls)
    n = len(profiled)
    # the floor of a profiled step, scaled to the timed batches' mean size by target tokens
    tokens = statistics.fmean(b.n_tgt_tokens for b in timed)
    gemm_s = statistics.fmean(floor) * tokens / statistics.fmean(b.n_tgt_tokens for b in profiled)
    total = sum(seconds.values())
    ops = [{"op": op, "calls_per_step": calls[op] / n, "share": s / total}
           for op, s in seconds.most_common() if op not in {g.name() for g in GEMMS}][:args.top]
    return {"step_ms": 1000 * step_s, "tgt_tokens_per_s": tokens / step_s,
            "gemm_floor_ms": 1000 * gemm_s, "other_ms": 1000 * (step_s - gemm_s),
            "gemm_share": gemm_s / step_s, "ceiling": step_s / gemm_s,
            "gemm_dispatch_share": sum(seconds[g.name()] for g in GEMMS) / total, "ops": ops}


def peers_ratio(path: Path) -> dict | None:
    """relmt rel ÷ the best relative peer, from a bench_peers.py page's JSON."""
    train = json.loads(path.read_text())["summary"]["train"]
    peers = {k.split("/")[0]: v[0] for k, v in train.items() if k.endswith("/rel") and not k.startswith("relmt")}
    if "relmt/rel" not in train or not peers:
        return None
    best = max(peers, key=peers.get)
    return {"page": str(path), "peer": best, "relmt_rel": train["relmt/rel"][0], "peer_rel": peers[best],
            "ratio": train["relmt/rel"][0] / peers[best]}


def report(payload: dict) -> str:
    rows = [[r["positions"], r.get("cpu_gemm", "mkl"), f"{r['step_ms']:,.0f}", f"{r['tgt_tokens_per_s']:,.0f}",
             f"{r['gemm_floor_ms']:,.0f}",
             f"{r['other_ms']:,.0f}", f"{100 * r['gemm_share']:.0f}%", f"{r['ceiling']:.2f}"] for r in payload["rows"]]
    lines = ["# A CPU training step: its GEMM floor and the rest", "",
             f"{payload['workload']}. Model preset {payload['settings']['size']}, fp32, "
             f"{payload['settings']['threads']} threads, k = {payload['settings']['k']}; each step is "
             "relmt.train.step.train_step (forward, label-smoothed loss, backward, Adam). The GEMM floor is every "
             "matrix product of a step (aten mm, addmm, bmm; oneDNN's linear), recorded with its shapes and strides "
             "and replayed alone on fresh tensors, summed (per timed batch: scaled by target tokens from the profiled "
             "ones): no fusion of the other operators can take a step below it. "
             "\"at most\" is step ÷ floor, the speed-up if every other operator cost nothing.", "",
             f"- command: `{payload['command']}`",
             f"- hardware: {payload['hardware']['cpu']}, {payload['hardware']['cpu_count']} cores, "
             f"torch {payload['hardware']['torch']}",
             f"- date: {payload['hardware']['date']} (git {payload['hardware']['git']})", "",
             md_table(["positions", "linear maps by", "ms/step", "target tok/s", "GEMM floor, ms", "the rest, ms",
                       "GEMM share", "at most"], rows)]
    for r in payload["rows"]:
        ops = [[o["op"], f"{o['calls_per_step']:.0f}", f"{100 * o['share']:.1f}%"] for o in r["ops"]]
        lines += ["", f"**{r['positions']}, {r.get('cpu_gemm', 'mkl')}**: the other operators by their share of "
                      f"the dispatched time (the GEMMs are {100 * r['gemm_dispatch_share']:.0f}% of it)", "",
                  md_table(["operator", "calls per step", "share"], ops)]
    if (p := payload.get("peers")) and (rel := next((r for r in payload["rows"] if r["positions"] == "rel"), None)):
        # the peer page's relmt row trained with relmt's default library: this page's first rel row
        need = rel["step_ms"] * p["ratio"] / 1.3  # the step that would give 1.3 against the peer
        lines += ["", "## Against the best relative peer", "",
                  f"[{Path(p['page']).name}]({Path(p['page']).name}) measured relmt rel at {p['relmt_rel']:,.0f} "
                  f"target tok/s against {PEERS.get(p['peer'], p['peer'])} at {p['peer_rel']:,.0f}: {p['ratio']:.2f}. "
                  "With every operator "
                  f"but the matrix products free, it would be at most {p['ratio'] * rel['ceiling']:.2f}. "
                  + ("That meets the goal of 1.3." if p["ratio"] >= 1.3 else
                     f"The goal of 1.3 needs a step of {need:,.0f} ms here, so the rest, now "
                     f"{rel['other_ms']:,.0f} ms, would have to fall to {need - rel['gemm_floor_ms']:,.0f} ms "
                     f"({100 * (need - rel['gemm_floor_ms']) / rel['other_ms']:.0f}% of today's).")]
    return "\n".join(lines) + "\n"


def main() -> None:
    bound_onednn_caches()  # before the first oneDNN call, as relmt-train does (relmt/model/linear.py)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peer-corpus", type=Path, default=bt.ROOT.parent / "shared/bench/make_peer_corpus.py",
                    help="make_peer_corpus.py (default ../shared/bench, this project's machines)")
    ap.add_argument("--text-dir", type=Path, help="or: a folder of {split}.src / {split}.tgt files")
    ap.add_argument("--cache-dir", default="data/cache")
    ap.add_argument("--size", default="small", help="model preset (configs/model; default small, the peers' model)")
    ap.add_argument("--positions", nargs="+", default=["abs", "rel"])
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--cpu-gemm", nargs="+", default=["onednn", "mkl"], choices=["onednn", "mkl"],
                    help="the libraries for the linear maps, each measured (relmt/model/linear.py)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--profile-steps", type=int, default=3)
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--peers", type=Path, help="a bench_peers.py JSON of the same session")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--md", type=Path)
    ap.add_argument("--from-json", type=Path, help="re-render --md from a JSON this script wrote, measuring nothing")
    args = ap.parse_args()
    if args.from_json:
        args.md.write_text(report(json.loads(args.from_json.read_text())))
        return
    torch.set_num_threads(args.threads)
    bt.tune_cpu()
    data = argparse.Namespace(peer_corpus=None if args.text_dir else args.peer_corpus, text_dir=args.text_dir,
                              cache_dir=args.cache_dir, src_lang="src", tgt_lang="tgt", vocab_size=8000,
                              spm_model_type="word", pad_to_multiple=0, warmup=args.warmup, steps=args.steps)
    ids, vocab, described = bt.workload(data)
    batches, _ = bt.make_batches(ids, 8192, data, torch.device("cpu"))
    rows = []
    for kind, gemm in [(kind, gemm) for kind in args.positions for gemm in args.cpu_gemm]:
        rows.append(measure(kind, args, vocab, batches, gemm))
        r = rows[-1]
        print(f"{kind}, {gemm}: {r['step_ms']:.0f} ms/step, GEMM floor {r['gemm_floor_ms']:.0f} ms "
              f"({100 * r['gemm_share']:.0f}%), at most {r['ceiling']:.2f}x", flush=True)
    payload = {"command": command_line(), "hardware": hardware(), "settings": {
        k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}, "workload": described, "rows": rows,
        "peers": peers_ratio(args.peers) if args.peers else None}
    text = report(payload)
    print(text)
    if args.out:
        write_json(args.out, payload)
    if args.md:
        args.md.write_text(text)


if __name__ == "__main__":
    main()
