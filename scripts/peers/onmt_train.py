#!/usr/bin/env python
"""OpenNMT-py 3.5.1 on the WMT-like workload of scripts/bench/bench_train.py (its --onmt option runs this):
the same training pairs, the same sentencepiece pieces (written out as text, so OpenNMT-py reads them
without a tokenizer of its own), the same layer sizes, k and batch budget; its own `onmt_train` in a child
process, stopped once it has logged update --steps. Prints and writes (--json) target tokens/s over
updates --warmup+1..--steps, timed from its log lines as scripts/peers/bench_peers.py times it on the CPU.

- Positions: abs is its sinusoidal encoding; rel is Shaw's relative positions with
  max_relative_positions = k (OpenNMT-py shares one table across heads and between keys and values, and
  falls back from SDPA to its written-out attention for it).
- Precision: on CUDA, fp16 autocast with a GradScaler (`model_dtype: fp16` with `optim: adam`): OpenNMT-py
  3.5 has no bf16, and its other fp16 paths need apex. fp32 on the CPU (smoke runs).
- Batches: `batch_type: tokens` caps padded tokens per side, so --batch-tokens is half of relmt's
  max_padded_tokens (which counts source + target); its own bucketing sorts by length as relmt's does.
- OpenNMT-py imports every data transform at start-up; four of them import packages the benchmark never
  uses (spacy, fasttext, rapidfuzz, pyahocorasick). Where those are not installed, scripts/peers/onmt_stubs
  stands in for them, so that only OpenNMT-py, configargparse and pyonmttok need to travel as wheels.

    python scripts/peers/onmt_train.py --data data/bench/wmt_like --size base --positions rel \\
        --batch-tokens 26000 --steps 50 --warmup 20 --device cuda --json /tmp/onmt-base-rel.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[2]
SPECIALS = 4  # relmt's ids 0-3: pad, unk, bos, eos (relmt.data.tokenizer); OpenNMT-py adds its own
# onmt_train in-process: stubs for unused transforms' imports go last on the path (an installed package
# wins), and torch.cuda.amp's deprecated names are kept for OpenNMT-py 3.5 wherever a torch drops them.
RUNNER = """import functools, sys, torch
sys.path.append({stubs!r})
amp = torch.cuda.amp
if not hasattr(amp, "autocast"):
    amp.autocast = functools.partial(torch.autocast, "cuda")
if not hasattr(amp, "GradScaler"):
    amp.GradScaler = functools.partial(torch.amp.GradScaler, "cuda")
from onmt.bin.train import main
sys.argv[0] = "onmt_train"
main()
"""
STEP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO\] Step\s+(\d+)(?:/\s*\d+)?;.*?"
                  r"bsz:\s*([\d.]+)/\s*([\d.]+)/")


def write_text(data: Path, out: Path, valid: int = 100) -> Path:
    """The prepared ids (bench_train.py --prepare-only) as space-separated pieces, once: train.{src,tgt},
    valid.{src,tgt} (its first pairs; never validated on) and vocab.shared (piece, count per line)."""
    if (out / "vocab.shared").is_file():
        return out
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(data / "spm.model"))
    pieces = np.array([sp.id_to_piece(i) for i in range(sp.get_piece_size())], dtype=object)
    arrays = {name: np.load(data / f"{name}.npy").astype(np.int64) for name in
              ("src", "src_offsets", "tgt", "tgt_offsets")}
    out.mkdir(parents=True, exist_ok=True)
    for side in ("src", "tgt"):
        ids, offsets = arrays[side], arrays[f"{side}_offsets"]
        lines = []
        for a, b in zip(offsets[:-1], offsets[1:]):
            sentence = ids[a:b]
            lines.append(" ".join(pieces[sentence[sentence >= SPECIALS]]))  # relmt's source ends in EOS
        (out / f"train.{side}").write_text("\n".join(lines) + "\n", encoding="utf-8")
        (out / f"valid.{side}").write_text("\n".join(lines[:valid]) + "\n", encoding="utf-8")
    counts = np.bincount(np.concatenate([arrays["src"], arrays["tgt"]]), minlength=len(pieces))
    ranked = sorted(range(SPECIALS, len(pieces)), key=lambda i: (-counts[i], i))
    (out / "vocab.shared").write_text("".join(f"{pieces[i]}\t{counts[i]}\n" for i in ranked), encoding="utf-8")
    return out


def config(text: Path, run: Path, size: str, positions: str, k: int, batch_tokens: int, steps: int, every: int,
           device: str, num_workers: int, pairs: int) -> str:
    """The onmt_train YAML: relmt's preset `size` (configs/model) in OpenNMT-py's terms, Shaw §4.1's
    optimiser (Adam 0.9/0.98, Noam with scale 2 and 4000 warm-up steps, label smoothing 0.1)."""
    m = yaml.safe_load((ROOT / "configs/model" / f"{size}.yaml").read_text())
    cuda = device == "cuda"
    settings = {
        "src_vocab": str(text / "vocab.shared"), "tgt_vocab": str(text / "vocab.shared"), "share_vocab": True,
        "src_vocab_size": 100000, "tgt_vocab_size": 100000, "vocab_size_multiple": 8,
        "data": {"corpus_1": {"path_src": str(text / "train.src"), "path_tgt": str(text / "train.tgt")},
                 "valid": {"path_src": str(text / "valid.src"), "path_tgt": str(text / "valid.tgt")}},
        "overwrite": True, "seed": 1234, "report_every": every, "save_model": str(run / "model"),
        # never reached: the run is stopped after update `steps`, before it validates or saves
        "train_steps": steps + 1000, "valid_steps": 100 * steps, "save_checkpoint_steps": 100 * steps,
        "world_size": 1, "gpu_ranks": [0] if cuda else [], "num_workers": num_workers,
        "model_dtype": "fp16" if cuda else "fp32",
        # a bucket of one epoch's pairs, sorted by length and cut into batches, as relmt's sampler does; its
        # default of 262,144 pairs would read this corpus 11 times before the first batch
        "batch_type": "tokens", "batch_size": batch_tokens, "valid_batch_size": 4096, "bucket_size": pairs,
        "optim": "adam", "adam_beta1": 0.9, "adam_beta2": 0.98, "learning_rate": 2.0, "decay_method": "noam",
        "warmup_steps": 4000, "label_smoothing": 0.1, "max_grad_norm": 0, "param_init": 0,
        "param_init_glorot": True,
        "encoder_type": "transformer", "decoder_type": "transformer", "enc_layers": m["encoder_layers"],
        "dec_layers": m["decoder_layers"], "hidden_size": m["d_model"], "word_vec_size": m["d_model"],
        "transformer_ff": m["d_ff"], "heads": m["n_heads"], "dropout": [m["dropout"]],
        "attention_dropout": [m["attention_dropout"]], "share_embeddings": True, "share_decoder_embeddings": True,
        "position_encoding": positions == "abs", "max_relative_positions": k if positions == "rel" else 0,
    }
    return yaml.safe_dump(settings, sort_keys=False)


def run_onmt(cfg: Path, log: Path, steps: int, timeout: float) -> None:
    """onmt_train -config cfg, its output to `log`, stopped (with its loader workers) after the log line of
    update `steps`, or at `timeout` seconds."""
    stubs = str(Path(__file__).resolve().parent / "onmt_stubs")
    proc = subprocess.Popen([sys.executable, "-c", RUNNER.format(stubs=stubs), "-config", str(cfg)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)

    def stop() -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    watchdog = threading.Timer(timeout, stop)
    watchdog.start()
    try:
        with log.open("w") as f:
            for line in proc.stdout:
                f.write(line)
                f.flush()
                m = STEP.match(line)
                if m and int(m.group(2)) >= steps:
                    break
    finally:
        watchdog.cancel()
        stop()
        proc.wait()


def throughput(log: Path, first: int, last: int, every: int) -> dict:
    """Target and source tokens per second over updates first+1..last: the tokens of the log lines after
    update `first`'s, up to and including `last`'s (each line gives the mean per update of its `every`
    updates), over the time between those two lines."""
    marks = {}
    for line in log.read_text().splitlines():
        if m := STEP.match(line):
            t = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            marks[int(m.group(2))] = (t, float(m.group(3)) * every, float(m.group(4)) * every)
    if first not in marks or last not in marks:
        raise SystemExit(f"{log}: no log line for update {first} or {last} (lines for {sorted(marks)})")
    src = sum(s for step, (_, s, _) in marks.items() if first < step <= last)
    tgt = sum(t for step, (_, _, t) in marks.items() if first < step <= last)
    seconds = marks[last][0] - marks[first][0]
    return {"tgt_tokens_per_s": tgt / seconds, "src_tgt_tokens_per_s": (src + tgt) / seconds,
            "step_ms": 1000 * seconds / (last - first), "steps": last - first}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True, help="bench_train.py's prepared folder")
    ap.add_argument("--size", default="base", help="a preset of configs/model")
    ap.add_argument("--positions", choices=["abs", "rel"], default="rel")
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--batch-tokens", type=int, default=26000, help="padded tokens per side and batch")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=20, help="updates before the timing starts")
    ap.add_argument("--every", type=int, default=10, help="OpenNMT-py's report_every")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--num-workers", type=int, default=2, help="OpenNMT-py's data loader processes (its default)")
    ap.add_argument("--timeout", type=float, default=150)
    ap.add_argument("--work", type=Path, default=Path("/tmp/relmt-onmt"))
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.warmup % args.every or args.steps % args.every or args.steps <= args.warmup:
        ap.error("--warmup and --steps must be multiples of --every, and --steps > --warmup")
    text = write_text(args.data, args.work / "text")
    run = args.work / f"{args.size}-{args.positions}"
    run.mkdir(parents=True, exist_ok=True)
    cfg = run / "config.yaml"
    pairs = sum(1 for _ in (text / "train.src").open(encoding="utf-8"))
    cfg.write_text(config(text, run, args.size, args.positions, args.k, args.batch_tokens, args.steps, args.every,
                          args.device, args.num_workers, pairs))
    t0 = time.perf_counter()
    run_onmt(cfg, run / "train.log", args.steps, args.timeout)
    result = {"size": args.size, "positions": args.positions,
              "precision": "fp16 amp" if args.device == "cuda" else "fp32",
              **throughput(run / "train.log", args.warmup, args.steps, args.every),
              "wall_s": time.perf_counter() - t0, "log": str(run / "train.log")}
    print(json.dumps(result))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
