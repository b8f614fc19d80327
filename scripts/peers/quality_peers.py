#!/usr/bin/env python
"""OpenNMT-py 3.5.1 trained and decoded like relmt's Multi30k recipe (issue 30 §1): the same raw text, the
same sentencepiece model (relmt-prepare's, given to OpenNMT-py as pre-encoded pieces), the recipe's
architecture, learning-rate curve, label smoothing, updates, checkpoint rule and beam search, one thread per
run. Each run leaves a directory with its config, train.log, translations/ (detokenized by the same
sentencepiece model) and metrics.json with relmt-score's figures per test set, ready to keep in git.

    python scripts/peers/quality_peers.py --venv /tmp/relmt-peers/onmt --data ../shared/data/multi30k \\
        --out runs/quality_peers --run onmt_abs_s1 --run onmt_rel_s1

A run is named onmt_{abs,rel}_s{SEED}. scripts/peers/quality_peers.sh installs OpenNMT-py and runs the queue;
the matching relmt runs are docs/results/reproduction/multi30k/runs/t1_{abs,rel}_s{1,2,3}.
"""

import argparse
import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import sentencepiece as spm

ROOT = Path(__file__).resolve().parents[2]
SPLITS = {"test": "test", "test_2017_flickr": "test_2017_flickr", "test_2017_mscoco": "test_2017_mscoco"}
D_MODEL, WARMUP, PEAK_LR = 128, 1000, 0.005  # configs/model/mmt_tiny.yaml, configs/train/multi30k_cpu.yaml
# relmt's inverse_sqrt (peak PEAK_LR at WARMUP) and Noam have one shape; Noam's peak is
# learning_rate · d_model^-0.5 · warmup^-0.5, so this constant puts both peaks at PEAK_LR.
NOAM_LR = PEAK_LR * math.sqrt(D_MODEL * WARMUP)
AVERAGE_BSZ = re.compile(r"Average bsz:\s*(\d+)/\s*(\d+)/\s*(\d+)")  # source/target tokens, sentences per update


def prepare(data: Path, overrides: list[str]) -> Path:
    """relmt's data cache of the recipe (experiment=multi30k_cpu): the folder holding spm.model."""
    text = subprocess.run([str(ROOT / ".venv/bin/relmt-prepare"), "experiment=multi30k_cpu", f"data.dir={data}",
                           *overrides], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    return ROOT / re.search(r"^cache: (\S+)", text, re.M).group(1)


def escape(piece: str) -> str:
    """A piece OpenNMT-py can read from space-separated text: the model's whitespace pieces (U+00A0, tab)
    become <U+XXXX>, and `unescape` turns them back before detokenizing."""
    return f"<U+{ord(piece):04X}>" if piece.isspace() else piece


def unescape(piece: str) -> str:
    return chr(int(piece[3:-1], 16)) if re.fullmatch(r"<U\+[0-9A-F]{4}>", piece) else piece


def encode(sp: spm.SentencePieceProcessor, src: Path, dst: Path) -> None:
    lines = src.read_bytes().decode("utf-8").split("\n")
    lines = lines[:-1] if lines and lines[-1] == "" else lines
    dst.write_text("".join(" ".join(map(escape, sp.encode(line, out_type=str))) + "\n" for line in lines),
                   encoding="utf-8")


def config(pieces: Path, run: Path, positions: str, seed: int, steps: int, batch_tokens: int, vocab: int) -> str:
    """The OpenNMT-py config of the recipe: mmt_tiny (4+4 layers, 128, FFN 256, 4 heads, all embeddings
    shared, pre-norm, dropouts 0.1), Adam (0.9, 0.98), label smoothing 0.1, no clipping, the last checkpoint."""
    rel = ("position_encoding: false\nmax_relative_positions: 16\n" if positions == "rel"
           else "position_encoding: true\n")
    return f"""src_vocab: {pieces}/vocab
tgt_vocab: {pieces}/vocab
share_vocab: true
src_vocab_size: {vocab}
tgt_vocab_size: {vocab}
n_sample: 0
overwrite: true
seed: {seed}
report_every: 100
data:
  corpus_1: {{path_src: {pieces}/train.en, path_tgt: {pieces}/train.de}}
  valid: {{path_src: {pieces}/valid.en, path_tgt: {pieces}/valid.de}}
save_model: {run}/model
save_checkpoint_steps: {steps}
train_steps: {steps}
valid_steps: {steps}
world_size: 1
gpu_ranks: []
num_workers: 0
batch_type: tokens
batch_size: {batch_tokens}
valid_batch_size: 4096
optim: adam
adam_beta1: 0.9
adam_beta2: 0.98
learning_rate: {NOAM_LR:.6f}
decay_method: noam
warmup_steps: {WARMUP}
label_smoothing: 0.1
max_grad_norm: 0
param_init: 0
param_init_glorot: true
encoder_type: transformer
decoder_type: transformer
enc_layers: 4
dec_layers: 4
hidden_size: {D_MODEL}
word_vec_size: {D_MODEL}
transformer_ff: 256
heads: 4
dropout: [0.1]
attention_dropout: [0.1]
add_qkvbias: true
add_ffnbias: true
share_embeddings: true
share_decoder_embeddings: true
{rel}"""


def onmt(venv: Path, threads: int, entry: str, args: list, log: Path) -> float:
    """Run an OpenNMT-py entry point with relmt's CPU settings (scripts/peers/ftz.py); its seconds."""
    start = time.perf_counter()
    with log.open("a") as out:
        # OpenNMT-py 3.5 checkpoints hold an argparse.Namespace, which torch >= 2.6 loads only so
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}
        subprocess.run([str(venv / "bin/python"), str(ROOT / "scripts/peers/ftz.py"), "--threads", str(threads),
                        entry, *map(str, args)], stdout=out, stderr=subprocess.STDOUT, check=True, env=env)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--venv", type=Path, required=True, help="OpenNMT-py 3.5.1's virtual environment")
    parser.add_argument("--data", type=Path, required=True, help="Multi30k raw text {split}.{en,de}")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--run", action="append", required=True, help="onmt_{abs,rel}_s{SEED}; repeatable")
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--batch-tokens", type=int, default=3150, help="OpenNMT-py's batch_size in tokens, set "
                        "so that the target tokens per update match relmt's (see metrics.json's tgt_tokens)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--prepare", nargs="*", default=[], metavar="KEY=VALUE",
                        help="more relmt-prepare overrides (the tests' tiny corpus: data.vocab_size=...)")
    opts = parser.parse_args(argv)
    cache = prepare(opts.data.resolve(), opts.prepare)
    sp = spm.SentencePieceProcessor(model_file=str(cache / "spm.model"))
    # the pieces depend on the data cache only; written once, so that runs side by side share them
    pieces = opts.out / f"pieces-{cache.name}"
    if not (pieces / "done").is_file():
        pieces.mkdir(parents=True, exist_ok=True)
        (pieces / "vocab").write_text("".join(f"{escape(sp.id_to_piece(i))}\t1\n" for i in range(sp.get_piece_size())
                                              if not sp.is_control(i) and not sp.is_unknown(i)), encoding="utf-8")
        for split in ("train", "valid", *SPLITS.values()):
            for lang in ("en", "de"):
                encode(sp, opts.data / f"{split}.{lang}", pieces / f"{split}.{lang}")
        (pieces / "done").write_text("")
    for name in opts.run:
        m = re.fullmatch(r"onmt_(abs|rel)_s(\d+)", name)
        if m is None:
            parser.error(f"--run {name}: give onmt_abs_sSEED or onmt_rel_sSEED")
        run = opts.out / name
        if (run / "metrics.json").is_file():
            print(f"done already: {name}")
            continue
        run.mkdir(parents=True, exist_ok=True)
        (run / "config.yaml").write_text(config(pieces.resolve(), run.resolve(), m.group(1), int(m.group(2)),
                                                opts.steps, opts.batch_tokens, sp.get_piece_size()))
        log = run / "train.log"
        log.write_text("")
        train_seconds = onmt(opts.venv, opts.threads, "onmt.bin.train:main", ["-config", run / "config.yaml"], log)
        src_tokens, tgt_tokens, sentences = map(int, AVERAGE_BSZ.findall(log.read_text())[-1])
        result = {"status": "completed", "toolkit": "OpenNMT-py 3.5.1", "positions": m.group(1),
                  "seed": int(m.group(2)), "steps": opts.steps, "train_seconds": train_seconds,
                  "threads": opts.threads, "batch_tokens": opts.batch_tokens,
                  "tgt_tokens": tgt_tokens, "src_tokens": src_tokens, "sentences": sentences,  # per update
                  "test": {}}
        (run / "translations").mkdir(exist_ok=True)
        for split, corpus in SPLITS.items():
            hyp = run / "translations" / f"{split}.pieces"
            # beam 4, GNMT length penalty α 0.6 (Wu et al. 2016) as relmt's decode=beam4; max_length_ratio 0
            # lifts OpenNMT-py's cap of 1.25 × the source, leaving max_length 250 (relmt: |x| + 50)
            result.setdefault("test_seconds", 0.0)
            result["test_seconds"] += onmt(opts.venv, opts.threads, "onmt.bin.translate:main",
                                           ["-model", run / f"model_step_{opts.steps}.pt", "-src",
                                            pieces / f"{corpus}.en", "-output", hyp, "-beam_size", 4,
                                            "-length_penalty", "wu", "-alpha", 0.6, "-max_length", 250,
                                            "-max_length_ratio", 0, "-batch_size", 64, "-batch_type", "sents"],
                                           run / "translate.log")
            text = run / "translations" / f"{split}.de"
            lines = hyp.read_text(encoding="utf-8").split("\n")[:-1]
            text.write_text("".join(sp.decode([unescape(p) for p in line.split()]) + "\n" for line in lines),
                            encoding="utf-8")
            score = run / f"{split}.score.json"
            subprocess.run([str(ROOT / ".venv/bin/relmt-score"), f"hyp={text}", f"ref={opts.data / f'{corpus}.de'}",
                            f"src={opts.data / f'{corpus}.en'}", "lang=de", f"out={score}"], check=True,
                           capture_output=True)
            result["test"][split] = json.loads(score.read_text())
            hyp.unlink()
        (run / "metrics.json").write_text(json.dumps(result, indent=2) + "\n")
        for checkpoint in run.glob("model_step_*.pt"):  # large; the translations and scores are what is kept
            checkpoint.unlink()
        print(f"{name}: test {result['test']['test']['sacrebleu']['score']:.2f} sacreBLEU, "
              f"{result['tgt_tokens']:.0f} target tokens per update")
    return 0


if __name__ == "__main__":
    sys.exit(main())
