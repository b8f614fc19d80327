#!/usr/bin/env python
"""What each performance change bought: the same CPU measurement run on the code of several commits.

For every commit, the code is checked out into a temporary git worktree and a fixed probe runs
against it (in a fresh process, with that worktree first on the path). The probe uses only APIs
that all these commits share (build_model, label_smoothed_nll, beam_search), and calls
relmt.runtime.tune_cpu where the commit has it, and relmt.decode.search.output_weight (the output
weight padded for the CPU GEMM, which older commits' models padded themselves) likewise. Its
workload is the peer corpus read as words (a shared word vocabulary by frequency, no
sentencepiece, so the vocabulary equals the peers'):
- training: forward, label-smoothed loss, backward and an Adam step on the same length-sorted
  batches of at most --max-tokens padded source + target tokens, small model, abs and rel (k = 16)
  alternating step by step, warm-up steps excluded;
- decoding: beam 4 over the 500 test sentences with the output forced to 20 tokens, untrained
  models, batches of at most 8000 source tokens, median of --repeats runs.

    python scripts/bench/perf_history.py 4588411 7fdfa90 ab3191b HEAD --corpus data/cache/peer-corpus \
        --out docs/results/performance/perf_log.json --md docs/results/performance/perf_log.md
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from relmt.bench import command_line, hardware, markdown_table, write_json

PROBE = r'''
import json, statistics, sys, time
from collections import Counter
import torch
corpus = sys.argv[1]
max_tokens, steps, warmup, repeats = map(int, sys.argv[2:6])
try:
    from relmt.runtime import tune_cpu
    tune_cpu()
except ImportError:
    pass
from relmt.config import ModelConfig, PosKind
from relmt.decode.beam import beam_search
try:  # since issue 13 the decoding front-end, not the model, pads the output weight for the CPU GEMM
    from relmt.decode.search import output_weight
except ImportError:
    output_weight = None
from relmt.model.transformer import build_model
from relmt.train.loss import label_smoothed_nll

PAD, BOS, EOS = 0, 2, 3
read = lambda name: [line.split() for line in open(f"{corpus}/{name}", encoding="utf-8")]
src, tgt, test = read("train.src"), read("train.tgt"), read("test.src")
counts = Counter(w for side in (src, tgt) for s in side for w in s)
vocab = {w: i + 4 for i, (w, _) in enumerate(counts.most_common())}
V = len(vocab) + 4
ids = lambda s: [vocab.get(w, 1) for w in s]
order = sorted(range(len(src)), key=lambda i: (len(src[i]), len(tgt[i])))
batches, cur = [], []
for i in order:
    width = max([len(src[j]) + 1 for j in cur + [i]]) + max([len(tgt[j]) + 1 for j in cur + [i]])
    if cur and width * (len(cur) + 1) > max_tokens:
        batches.append(cur); cur = []
    cur.append(i)
batches.append(cur)
g = torch.Generator().manual_seed(1)
picked = [batches[int(k)] for k in torch.randint(len(batches), (warmup + steps,), generator=g)]

def tensors(index):
    s = max(len(src[i]) for i in index) + 1
    t = max(len(tgt[i]) for i in index) + 1
    x = torch.full((len(index), s), PAD)
    y_in, y_out = torch.full((len(index), t), PAD), torch.full((len(index), t), PAD)
    for r, i in enumerate(index):
        a, b = ids(src[i]) + [EOS], ids(tgt[i])
        x[r, :len(a)] = torch.tensor(a); y_in[r, :len(b) + 1] = torch.tensor([BOS] + b)
        y_out[r, :len(b) + 1] = torch.tensor(b + [EOS])
    return x, y_in, y_out

data = [tensors(b) for b in picked]

def model(kind):
    torch.manual_seed(1)
    cfg = ModelConfig(d_model=256, n_heads=4, d_ff=1024, encoder_layers=3, decoder_layers=3,
                      positions=PosKind(kind), max_relative_position=16, share_embeddings=True)
    return build_model(cfg, V, PAD)

out = {"vocab": V, "train_ms": {}, "train_tgt_tokens_per_s": {}, "decode_sentences_per_s": {}}
models = {k: model(k).train() for k in ("abs", "rel")}
opts = {k: torch.optim.Adam(m.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9) for k, m in models.items()}
secs = {k: 0.0 for k in models}
n_tgt = 0
for step, (x, y_in, y_out) in enumerate(data):
    for k, m in models.items():
        t0 = time.perf_counter()
        loss, _ = label_smoothed_nll(m(x, y_in), y_out, 0.1)
        loss.backward()
        opts[k].step(); opts[k].zero_grad(set_to_none=True)
        if step >= warmup:
            secs[k] += time.perf_counter() - t0
    if step >= warmup:
        n_tgt += int((y_out != PAD).sum())
for k in models:
    out["train_ms"][k] = 1000 * secs[k] / steps
    out["train_tgt_tokens_per_s"][k] = n_tgt / secs[k]

sents = sorted(range(len(test)), key=lambda i: -len(test[i]))
dec_batches, start = [], 0
while start < len(sents):
    size = max(1, 8000 // (len(test[sents[start]]) + 1))
    dec_batches.append(sents[start:start + size]); start += size
def src_tensor(index):
    w = max(len(test[i]) for i in index) + 1
    x = torch.full((len(index), w), PAD)
    for r, i in enumerate(index):
        a = ids(test[i]) + [EOS]; x[r, :len(a)] = torch.tensor(a)
    return x
dec_src = [src_tensor(b) for b in dec_batches]
for k, m in models.items():
    m.eval()
    pad = {"out_weight": output_weight(m, torch.device("cpu"))} if output_weight else {}
    run = lambda: [beam_search(m, x, 4, BOS, EOS, 0.6, max_len_a=0.0, max_len_b=20, min_len=20, **pad)
                   for x in dec_src]
    run()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter(); run(); times.append(time.perf_counter() - t0)
    out["decode_sentences_per_s"][k] = len(test) / statistics.median(times)
print("PROBE" + json.dumps(out))
'''


def git(*args: str, cwd: Path | None = None) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def probe(commit: str, args: argparse.Namespace, root: Path) -> dict:
    sha = git("rev-parse", "--short", commit, cwd=root)
    with tempfile.TemporaryDirectory(prefix=f"relmt-{sha}-") as tmp:
        tree = Path(tmp) / "tree"
        git("worktree", "add", "--detach", str(tree), sha, cwd=root)
        try:
            env = {**os.environ, "PYTHONPATH": str(tree)}
            result = subprocess.run([sys.executable, "-c", PROBE, str(args.corpus.resolve()), str(args.max_tokens),
                                     str(args.steps), str(args.warmup), str(args.repeats)],
                                    cwd=tree, env=env, check=True, capture_output=True, text=True)
        finally:
            git("worktree", "remove", "--force", str(tree), cwd=root)
    line = next(x for x in result.stdout.splitlines() if x.startswith("PROBE"))
    return {"commit": sha, "subject": git("log", "-1", "--format=%s", sha, cwd=root), **json.loads(line[5:])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("commits", nargs="*")
    ap.add_argument("--from-json", type=Path, help="re-render --md from a JSON this script wrote, probing nothing")
    ap.add_argument("--corpus", type=Path, default=Path("data/cache/peer-corpus"),
                    help="the peer corpus folder (scripts/bench/bench_train.py --peer-corpus writes it here)")
    ap.add_argument("--max-tokens", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--md", type=Path)
    args = ap.parse_args()
    root = Path(git("rev-parse", "--show-toplevel"))
    rows, command, hw = [], command_line(), hardware()
    if args.from_json:
        saved = json.loads(args.from_json.read_text())
        rows, command, hw = saved["rows"], saved["command"], saved["hardware"]
    elif not args.commits:
        ap.error("give COMMITS or --from-json")
    for commit in args.commits if not args.from_json else []:
        r = probe(commit, args, root)
        rows.append({"commit": r["commit"], "subject": r["subject"], "abs_ms": r["train_ms"]["abs"],
                     "rel_ms": r["train_ms"]["rel"], "rel_over_abs": r["train_ms"]["rel"] / r["train_ms"]["abs"],
                     "rel_tgt_tok_s": r["train_tgt_tokens_per_s"]["rel"], "dec_abs": r["decode_sentences_per_s"]["abs"],
                     "dec_rel": r["decode_sentences_per_s"]["rel"], "vocab": r["vocab"]})
        print(f"{r['commit']}: train rel {rows[-1]['rel_tgt_tok_s']:.0f} tgt tok/s, decode rel "
              f"{rows[-1]['dec_rel']:.1f} sent/s", flush=True)
    for prev, r in zip(rows, rows[1:]):
        r["train_speedup"] = prev["rel_ms"] / r["rel_ms"]
        r["decode_speedup"] = r["dec_rel"] / prev["dec_rel"]
    columns = [("commit", "commit"), ("subject", "change"), ("abs_ms", "train ms/step abs"),
               ("rel_ms", "train ms/step rel"), ("rel_over_abs", "rel/abs"), ("rel_tgt_tok_s", "train rel tgt tok/s"),
               ("train_speedup", "train rel speed-up"), ("dec_abs", "decode abs sent/s"),
               ("dec_rel", "decode rel sent/s"), ("decode_speedup", "decode rel speed-up")]
    table = markdown_table(rows, columns)
    print("\n" + table)
    if args.out:
        write_json(args.out, {"command": command, "hardware": hw, "settings": vars(args) | {
            "corpus": str(args.corpus), "out": str(args.out), "md": str(args.md)}, "rows": rows})
    if args.md:
        args.md.parent.mkdir(parents=True, exist_ok=True)
        # the issue-14 levers section at the end is scripts/bench/perf_levers.py's: kept as it is
        old = args.md.read_text() if args.md.is_file() else ""
        levers = old[old.index("\n## Issue 14 levers"):] if "\n## Issue 14 levers" in old else ""
        args.md.write_text(
            "# Performance log: what each change bought (CPU)\n\n"
            "Each row is the code of one commit, measured by the same probe in a fresh process (see "
            "`scripts/bench/perf_history.py`): small model on the peer corpus read as words (vocabulary "
            f"{rows[0]['vocab']:,}), training steps of at most {args.max_tokens:,} padded source + target tokens "
            f"({args.steps} timed after {args.warmup} warm-up, abs and rel alternating), and beam-4 decoding of "
            f"500 test sentences forced to 20 tokens (median of {args.repeats}). Speed-ups are against the row "
            "above. The final, full measurement is [perf_cpu.md](perf_cpu.md).\n\n"
            f"- command: `{command}`\n- hardware: {hw['cpu']}, {hw['torch_threads']} threads, torch "
            f"{hw['torch']}\n- date: {hw['date']}\n\n{table}\n\n{notes(rows)}{levers}")


NOISE = """The rows were measured one after another on a shared 2-core virtual machine, so differences of a
few per cent between rows may be run-to-run noise rather than the change"""
# what each measured commit changed and what led to it, by its short hash: the page lists those of its rows
CHANGES = {
    "4588411": """- **train_step** (baseline): the trainer's update as one function, so the benchmark times the
  trainer's own code.""",
    "7fdfa90": """- **CPU dropout and the written-out loss backward**: `bernoulli_` (the mask generator behind
  `nn.Dropout`) was the largest cost after the matmuls. `relmt/dropout.py` takes four 16-bit
  lanes from each 64-bit draw instead of one draw per element. The label-smoothed loss gets its
  closed-form gradient instead of autograd through log_softmax, gather and mean
  (`relmt/train/loss.py`).""",
    "ab3191b": """- **runtime.tune_cpu**: every fresh large tensor (logits, FFN activations) paid for page faults,
  because glibc returns big blocks to the OS on free and maps them anew. Keeping freed memory in
  the heap (`mallopt`) removes that; denormal flushing is on as well (`relmt/runtime.py`). The
  issue's lead (flushing denormals) is not measured on its own in this table; the profile pointed
  at the allocator, not at denormals, for these freshly initialised models.""",
    "2314c66": """- **decoding**: the cache reorder (`index_select`) was the largest cost of beam search. The
  source keys and values are now kept once per sentence and shared by its beams, the remaining
  self-attention reorder is fused into the next step's append, and the output projection runs
  on a weight padded to a multiple of 16 rows (an odd vocabulary such as 3,859 made that GEMM
  much slower). The padding also speeds up training's output layer slightly.""",
    "8a69b0c": """- **8a69b0c** (baseline): the code before the float-mask dropout.""",
    "2104106": """- **CPU dropout, the mask as a float product**: each operator of a training step timed on its own
  (the dispatch mode of `scripts/bench/train_floor.py`) put the dropout's `torch.where` (forward and
  backward) and its comparison of the int16 lanes against a per-lane threshold (a broadcast) first after
  the matrix products and the random draws. The draws now fill the whole int64 range, so that every
  lane holds 16 random bits and is compared with one scalar, and the mask is applied as one product with
  a float tensor of 0 and the scale, which autograd reuses for the gradient. Given a mask, outputs and
  gradients are bit for bit those of `torch.where(keep, x * scale, 0)` (tests/test_dropout.py); the
  masks themselves are new draws at the same rate, so runs are not bitwise those of earlier commits.""",
}
# a row whose training figure the change could barely move: said beside the noise
ASIDE = {"2314c66": "that commit changed decoding, and training only by the padded\noutput weight"}


def notes(rows: list[dict]) -> str:
    """The noise caveat and the section on what each row's commit changed."""
    last = rows[-1]["commit"][:7]
    aside = f" (the last row's\ntraining figure among them: {ASIDE[last]})" if last in ASIDE else ""
    changes = [CHANGES[r["commit"][:7]] for r in rows if r["commit"][:7] in CHANGES]
    section = ("\n\n## What each change is, and what led to it\n\nA profile of one training step (`torch.profiler`, "
               "sorted by self time) and of a beam-4 decoding\nrun pointed at each change; the changes are kept "
               "because the table shows they pay.\n\n" + "\n".join(changes)) if changes else ""
    return f"{NOISE}{aside}.{section}\n"


if __name__ == "__main__":
    main()
