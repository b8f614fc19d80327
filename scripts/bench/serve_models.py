#!/usr/bin/env python
"""The two models that scripts/bench/bench_serve.py serves side by side (issue 44 §6): relmt's and
OpenNMT-py's, rel, trained on the peer corpus with scripts/peers/bench_peers.sh's settings (the same
corpus, sizes, batch and steps), so that relmt-serve and onmt_server decode the same workload.

    python scripts/bench/serve_models.py                  # both; each skipped once its model exists
    python scripts/bench/serve_models.py --threads 2      # on a quiet machine

- The corpus: $SCRATCH/corpus (default /tmp/relmt-peers), generated with --generator (default
  ../shared/bench/make_peer_corpus.py, present on this project's machines only) when missing.
- relmt: `relmt-train model=small model.positions=rel ...` into runs/serve/peer_rel_<steps>.
- OpenNMT-py 3.5.1: installed by scripts/peers/install.sh into $SCRATCH/onmt, trained with
  bench_peers.py's config into $SCRATCH/serve/onmt-rel.
Prints the two model paths, for bench_serve.py's --checkpoint and --onmt-model.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts/peers"))

from bench_peers import PEER_SEED, peer_config  # noqa: E402


def run(cmd: list, log: Path) -> None:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        done = subprocess.run([str(c) for c in cmd], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    if done.returncode:
        raise SystemExit(f"{' '.join(map(str, cmd))} failed ({done.returncode}); log {log}:\n"
                         + log.read_text(errors="replace")[-3000:])


def main(argv: list[str] | None = None) -> tuple[Path, Path]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scratch", type=Path, default=Path(os.environ.get("SCRATCH", "/tmp/relmt-peers")))
    parser.add_argument("--generator", type=Path, default=ROOT.parent / "shared/bench/make_peer_corpus.py")
    parser.add_argument("--steps", type=int, default=110, help="updates of each model (bench_peers.py's default)")
    parser.add_argument("--threads", type=int, default=1)
    opts = parser.parse_args(argv)
    corpus = opts.scratch / "corpus"
    if not (corpus / "train.src").is_file():
        subprocess.run([sys.executable, opts.generator, corpus, "--seed", str(PEER_SEED)], check=True)

    relmt = ROOT / f"runs/serve/peer_rel_{opts.steps}"
    if not (relmt / "checkpoints/last.pt").is_file():
        run([Path(sys.executable).parent / "relmt-train", f"hydra.run.dir={relmt}", "model=small",
             "model.positions=rel", "model.relative_share_heads=true", "data=text", "data.name=peer",
             f"data.dir={corpus}", "data.src=src", "data.tgt=tgt", "data.spm_model_type=word", "~data.splits.test",
             "train.max_padded_tokens=8192", f"train.max_steps={opts.steps}", "train.log_every=10",
             f"train.eval_every={opts.steps}", f"train.save_every={opts.steps}", "train.valid_bleu=false",
             f"threads={opts.threads}", "train.progress=false", f"seed={PEER_SEED}"], relmt / "serve.log")

    out = opts.scratch / "serve/onmt-rel"
    onmt = out / f"model_step_{opts.steps}.pt"
    if not onmt.is_file():
        subprocess.run(["bash", "-c", "source scripts/peers/install.sh && install_peer onmt"], cwd=ROOT, check=True,
                       env={**os.environ, "SCRATCH": str(opts.scratch)})
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.yaml").write_text(peer_config("onmt", "rel", corpus, out, opts.steps, 10))
        run([opts.scratch / "onmt/bin/python", ROOT / "scripts/peers/ftz.py", "--threads", opts.threads,
             "onmt.bin.train:main", "-config", out / "config.yaml"], out / "train.log")
    print(f"relmt: {relmt / 'checkpoints/last.pt'}\nonmt: {onmt}")
    return relmt / "checkpoints/last.pt", onmt


if __name__ == "__main__":
    main()
