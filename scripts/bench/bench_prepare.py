#!/usr/bin/env python
"""Time `relmt-prepare` on a text corpus: from scratch (sentencepiece training included), and the
cached rerun; measure the encoding rate and project the WMT14 en-de (4.5M pairs) preparation.

Each run is the real command line in a fresh process (Python start-up and imports included),
with an empty cache directory for the scratch runs. With --spm-corpus, sentencepiece training at
the paper's 32,768 pieces is also timed on that folder's train split, to project WMT's
sentencepiece step (which samples 4M sentences) linearly in the number of sentences.

    python scripts/bench/bench_prepare.py --dir ../shared/data/multi30k --src en --tgt de \
        --spm-corpus ../shared/data/europarl20k_ende --out docs/results/performance/data.json \
        --md docs/results/performance/data.md
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from relmt.bench import command_line, hardware, markdown_table, write_json
from relmt.data.sources import read_lines
from relmt.data.tokenizer import train_tokenizer

WMT14_EN_DE_PAIRS = 4_508_785  # wmt/wmt14 de-en train (the Hugging Face dataset card)
WMT14_SPM_SENTENCES = 4_000_000  # spm_input_sentence_size in configs/data/wmt14_en_de.yaml


def time_spm(folder: Path, src: str, tgt: str, vocab_size: int) -> dict:
    sentences = [s for lang in (src, tgt) for s in read_lines(folder / f"train.{lang}") if s.strip()]
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        train_tokenizer(sentences, Path(tmp) / "spm.model", vocab_size, "bpe")
        seconds = time.perf_counter() - t0
    return {"corpus": str(folder), "sentences": len(sentences), "vocab_size": vocab_size, "seconds": seconds,
            "wmt14_projected_min": seconds * WMT14_SPM_SENTENCES / len(sentences) / 60}


def prepare_cli(overrides: list[str]) -> tuple[float, str]:
    exe = Path(sys.executable).parent / "relmt-prepare"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-c", "from relmt.cli.prepare import main; main()"]
    t0 = time.perf_counter()
    done = subprocess.run(cmd + overrides, capture_output=True, text=True, check=True)
    return time.perf_counter() - t0, done.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", required=True, help="folder of {split}.{lang} files")
    ap.add_argument("--src", default="en")
    ap.add_argument("--tgt", default="de")
    ap.add_argument("--vocab-size", type=int, default=8000)
    ap.add_argument("--num-proc", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--spm-corpus", type=Path, help="folder with train.{src,tgt}: time spm at 32,768 pieces")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--md", type=Path)
    args = ap.parse_args()

    rows = []
    for num_proc in args.num_proc:
        cache = Path(tempfile.mkdtemp(prefix="relmt-bench-prepare-"))
        try:
            overrides = ["data=text", f"data.dir={args.dir}", f"data.src={args.src}", f"data.tgt={args.tgt}",
                         f"data.vocab_size={args.vocab_size}", f"data.num_proc={num_proc}",
                         f"data.cache_dir={cache}"]
            scratch, summary = prepare_cli(overrides)
            cached, _ = prepare_cli(overrides)
            meta = json.loads(next(cache.glob("*/meta.json")).read_text())
        finally:
            shutil.rmtree(cache, ignore_errors=True)
        rate = meta["pairs_total"] / meta["seconds_encode"]
        rows.append({
            "num_proc": num_proc, "pairs": meta["pairs_total"], "scratch_s": scratch, "cached_s": cached,
            "load_s": meta["seconds_load"], "spm_s": meta["seconds_spm"], "encode_s": meta["seconds_encode"],
            "save_s": meta["seconds_save"], "pairs_per_s": rate,
            "wmt14_encode_min": WMT14_EN_DE_PAIRS / rate / 60,
        })
        print(summary)
        print(f"num_proc={num_proc}: scratch {scratch:.1f}s, cached rerun {cached:.1f}s, "
              f"encoding {rate:,.0f} pairs/s", flush=True)

    spm = time_spm(args.spm_corpus, args.src, args.tgt, 32768) if args.spm_corpus else None
    if spm:
        print(f"sentencepiece, 32768 pieces, {spm['sentences']} sentences: {spm['seconds']:.1f}s")
    columns = [("num_proc", "num_proc"), ("pairs", "pairs"), ("scratch_s", "from scratch (s)"),
               ("cached_s", "cached rerun (s)"), ("load_s", "read (s)"), ("spm_s", "sentencepiece (s)"),
               ("encode_s", "encode (s)"), ("save_s", "save (s)"), ("pairs_per_s", "encoding pairs/s"),
               ("wmt14_encode_min", "WMT14 en-de encoding, projected (min)")]
    table = markdown_table(rows, columns)
    hw = hardware()
    print("\n" + table)
    if args.out:
        settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
        write_json(args.out, {"command": command_line(), "hardware": hw, "settings": settings, "rows": rows,
                              "spm_32k": spm})
    if args.md:
        args.md.parent.mkdir(parents=True, exist_ok=True)
        args.md.write_text(
            "# Data preparation speed\n\n"
            f"`relmt-prepare data=text data.dir={args.dir} data.src={args.src} data.tgt={args.tgt}` run as a "
            "fresh process, first with an empty cache (sentencepiece training, encoding every split with "
            "`datasets.map`, saving Arrow), then again on the cache. Wall times include Python start-up "
            "and imports. The encoding rate is all pairs over the `map` time; the WMT14 en-de figure "
            f"projects it linearly to {WMT14_EN_DE_PAIRS:,} pairs.\n\n"
            f"- command: `{command_line()}`\n- hardware: {hw['cpu']}, {hw['cpu_count']} cores\n"
            f"- date: {hw['date']} (git {hw['git']})\n\n{table}\n" + spm_text(spm))


def spm_text(spm: dict | None) -> str:
    if not spm:
        return ""
    total = spm["wmt14_projected_min"]
    return (f"\nSentencepiece BPE at 32,768 pieces on {spm['corpus']} ({spm['sentences']:,} sentences, both "
            f"sides): {spm['seconds']:.1f} s. WMT14 en-de samples {WMT14_SPM_SENTENCES:,} sentences "
            f"(`spm_input_sentence_size`); assuming time linear in sentences, that step takes about "
            f"{total:.0f} min on top of the encoding above; take it as a lower bound, since a larger "
            "corpus has more distinct words for the BPE merges to scan.\n")


if __name__ == "__main__":
    main()
