#!/usr/bin/env python
"""Beam-search decoding speed: sentences/s and target tokens/s per position mode (--positions: abs and
rel by default; rope, alibi, t5, both, none too).

Decodes N source sentences (the toy corpus's test split by default, or a text folder's split)
with beam 4 through `Translator` (batching, search, detokenization: what relmt-translate does).
Two regimes:
- forced: every output is exactly --forced-length tokens (EOS suppressed until then, and the
  step limit set there), so abs and rel models do identical work even untrained;
- free: the usual limit a*|x|+b with EOS allowed; only meaningful for trained models
  (--checkpoint-abs / --checkpoint-rel).
Without checkpoints, abs and rel models of the same shape are built untrained from one seed.
--per-step records the time of each decoder step (summed over batches) against the step number.
--ctranslate2 adds columns for each model exported to CTranslate2 (relmt.export.ctranslate2) in
float32 and int8, decoded by ctranslate2.Translator.translate_batch with the same beam, length
penalty alpha, forced length (min = max decoding length), source-token batches (batch_type=tokens)
and thread count, sentencepiece encoding and decoding included. A model with per-head relative
tables cannot be exported: --share-heads builds the untrained rel model with one table per layer.

    python scripts/bench/bench_decode.py --out docs/results/performance/decode_cpu.json \
        --md docs/results/performance/decode_cpu.md
    python scripts/bench/bench_decode.py --share-heads --ctranslate2 --md docs/results/performance/decode_ct2_cpu.md
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

from relmt.bench import command_line, hardware, markdown_table, write_json
from relmt.config import DataConfig, DecodeConfig, ModelConfig, PosKind, Source, SpmModel
from relmt.data.dataset import prepare
from relmt.data.tokenizer import PAD_ID
from relmt.decode.translator import Translator
from relmt.model.transformer import build_model
from relmt.runtime import resolve_device, tune_cpu


def load_translators(args: argparse.Namespace, device: torch.device) -> tuple[dict[str, Translator], list[str]]:
    data = DataConfig(name="bench", source=Source.text, dir=args.text_dir, src=args.src_lang, tgt=args.tgt_lang,
                      splits={"train": "train", "valid": args.split, args.split: args.split},
                      vocab_size=args.vocab_size, spm_model_type=SpmModel(args.spm_model_type),
                      cache_dir=args.cache_dir) if args.text_dir else DataConfig(cache_dir=args.cache_dir)
    corpus = prepare(data)
    sentences = corpus.texts(args.split, "src")[: args.n]
    translators = {}
    for kind in args.positions:
        ckpt = getattr(args, f"checkpoint_{kind}", None)
        if ckpt:
            translators[kind] = Translator.from_checkpoint(ckpt, device=str(device))
            continue
        torch.manual_seed(args.seed)
        cfg = ModelConfig(d_model=args.d_model, n_heads=args.heads, d_ff=args.d_ff, encoder_layers=args.layers,
                          decoder_layers=args.layers, positions=PosKind(kind), max_relative_position=args.k,
                          relative_share_heads=args.share_heads)
        model = build_model(cfg, corpus.tokenizer.vocab_size, PAD_ID).to(device)
        translators[kind] = Translator(model, corpus.tokenizer, DecodeConfig(), device)
    return translators, sentences


class StepTimer:
    """Wraps model.decode_step to add up, per step number, its wall time and the hypotheses
    (beam rows) it advanced."""

    def __init__(self, model: torch.nn.Module, device: torch.device) -> None:
        self.model, self.device, self.inner = model, device, model.decode_step
        self.seconds: dict[int, float] = defaultdict(float)
        self.rows: dict[int, int] = defaultdict(int)

    def __enter__(self) -> StepTimer:
        def timed(tokens, *a, **kw):
            t0 = time.perf_counter()
            out = self.inner(tokens, *a, **kw)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            step = kw.get("step", a[3] if len(a) > 3 else 0)
            self.seconds[step] += time.perf_counter() - t0
            self.rows[step] += tokens.shape[0]
            return out

        self.model.decode_step = timed
        return self

    def __exit__(self, *exc) -> None:
        del self.model.decode_step

    def summary(self) -> dict[str, dict[int, float]]:
        steps = sorted(self.seconds)
        return {"seconds": {t: self.seconds[t] for t in steps}, "rows": {t: self.rows[t] for t in steps},
                "us_per_token": {t: 1e6 * self.seconds[t] / self.rows[t] for t in steps}}


CT2_TYPES = ("float32", "int8")


def export_ctranslate2(translators: dict[str, Translator], directory: Path, max_positions: int,
                       ) -> dict[tuple[str, str], Path | str]:
    """Each model exported to CTranslate2 in float32 and int8: (kind, type) -> its directory, or the
    reason it cannot be exported."""
    from relmt.errors import UserError
    from relmt.export.ctranslate2 import RelmtConverter

    out: dict[tuple[str, str], Path | str] = {}
    for kind, translator in translators.items():
        for ct2_type in CT2_TYPES:
            path = directory / f"{kind}_{ct2_type}"
            try:
                RelmtConverter(translator.model, translator.tokenizer, max_positions).convert(
                    str(path), quantization=ct2_type)
                out[kind, ct2_type] = path
            except UserError as e:
                out[kind, ct2_type] = str(e)
    return out


def ct2_decode(ct2, translator: Translator, sentences: list[str], beam: int, lenpen: float, max_source_tokens: int,
               min_len: int, max_len: int) -> int:
    """What Translator.translate does, with CTranslate2: encode, beam-search, decode to text. Returns
    the number of output tokens. CT2 divides scores by |y|^alpha (relmt: GNMT); same cost."""
    sp = translator.tokenizer.sp
    results = ct2.translate_batch(sp.encode(sentences, out_type=str), beam_size=beam, length_penalty=lenpen,
                                  max_batch_size=max_source_tokens, batch_type="tokens",
                                  min_decoding_length=min_len, max_decoding_length=max_len)
    hyps = [r.hypotheses[0] for r in results]
    sp.decode(hyps)
    return sum(map(len, hyps))


def time_ct2(path: Path, translator: Translator, sentences: list[str], args: argparse.Namespace,
             device: torch.device, min_len: int, max_len: int) -> tuple[float, int]:
    """Median seconds over args.repeats (after a warm-up) and output tokens of one exported model."""
    import ctranslate2

    ct2 = ctranslate2.Translator(str(path), device="cuda" if device.type == "cuda" else "cpu",
                                 intra_threads=torch.get_num_threads())

    def run(batch: list[str]) -> int:
        return ct2_decode(ct2, translator, batch, args.beam, translator.decode.lenpen, args.max_source_tokens,
                          min_len, max_len)

    run(sentences[:8])  # warm-up
    times, tokens = [], 0
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        tokens = run(sentences)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), tokens


def free_limit(translator: Translator, sentences: list[str]) -> int:
    """The longest step limit floor(a * |x| + b) of relmt's free-running search over `sentences`
    (|x| counts EOS); CT2 takes one max_decoding_length for all."""
    a, b = translator.decode.max_len_a, translator.decode.max_len_b
    return max(int(a * (len(x) + 1) + b) for x in translator.tokenizer.encode(sentences))


def plot_per_step(per_step: dict[str, dict], path: Path) -> None:
    """Decoder time per output token (one hypothesis advanced by one position) against the step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # Free-running batches shrink as sentences finish, so their late steps time small batches, not
    # the growing prefix: plot the forced regime when there is one.
    forced = {k: v for k, v in per_step.items() if k.startswith("forced/")}
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for name, stats in (forced or per_step).items():
        steps = sorted(stats["us_per_token"])
        ax.plot([t + 1 for t in steps], [stats["us_per_token"][t] for t in steps], marker=".", label=name)
    ax.set_xlabel("output position (decoder step)")
    ax.set_ylabel("decoder time per token (µs)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--text-dir", help="a folder of {split}.{lang} files (default: the toy corpus)")
    ap.add_argument("--src-lang", default="src")
    ap.add_argument("--tgt-lang", default="tgt")
    ap.add_argument("--split", default="test")
    ap.add_argument("--vocab-size", type=int, default=8000)
    ap.add_argument("--spm-model-type", default="bpe")
    ap.add_argument("--cache-dir", default="data/cache")
    ap.add_argument("--n", type=int, default=500, help="source sentences")
    ap.add_argument("--positions", nargs="+", default=["abs", "rel"], choices=[p.value for p in PosKind],
                    help="untrained models of these position modes (abs and rel may come from checkpoints)")
    ap.add_argument("--checkpoint-abs")
    ap.add_argument("--checkpoint-rel")
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--d-ff", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--share-heads", action="store_true",
                    help="untrained rel model: one a^K/a^V table per layer for all heads (exportable to CTranslate2)")
    ap.add_argument("--ctranslate2", action="store_true",
                    help="also time each model exported to CTranslate2, float32 and int8 (needs ctranslate2)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--max-source-tokens", type=int, default=8000,
                    help="source tokens per batch (decode.max_source_tokens)")
    ap.add_argument("--max-sentences", type=int, default=0, help="sentences per batch (decode.max_sentences; 0: any)")
    ap.add_argument("--forced-length", type=int, default=20)
    ap.add_argument("--regimes", nargs="+", default=["forced"], choices=["forced", "free"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--per-step", action="store_true", help="record decoder time per step number")
    ap.add_argument("--plot", type=Path, help="with --per-step: draw time per output token against the step (PNG)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--no-tune-cpu", action="store_true",
                    help="leave malloc and denormals at their defaults (relmt.runtime.tune_cpu is not called)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--md", type=Path)
    args = ap.parse_args()
    device = resolve_device(args.device)
    tuned = {} if args.no_tune_cpu else tune_cpu()
    translators, sentences = load_translators(args, device)
    ct2_models: dict[tuple[str, str], Path | str] = {}
    ct2_dir = tempfile.TemporaryDirectory(prefix="bench-ct2-") if args.ctranslate2 else None
    if ct2_dir is not None:  # the absolute-encoding tables must cover every source and output position
        longest = max(len(x) + 1 for x in next(iter(translators.values())).tokenizer.encode(sentences))
        reach = max([longest, args.forced_length] + [free_limit(t, sentences) for t in translators.values()])
        ct2_models = export_ctranslate2(translators, Path(ct2_dir.name), max(2048, reach + 1))

    rows, per_step = [], {}
    for regime in args.regimes:
        decode = {"beam": args.beam, "max_source_tokens": args.max_source_tokens, "nbest": 1,
                  "max_sentences": args.max_sentences}
        if regime == "forced":
            decode.update(max_len_a=0.0, max_len_b=args.forced_length, min_len=args.forced_length)
        for kind, translator in translators.items():
            translator.translate(sentences[:8], **decode)  # warm-up
            times, outputs = [], []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                outputs = translator.hypotheses(sentences, **decode)  # what translate() does, minus
                translator.tokenizer.decode([h[0].tokens for h in outputs if h])  # keeping the ids
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                times.append(time.perf_counter() - t0)
            seconds = statistics.median(times)
            tokens = sum(len(h[0].tokens) for h in outputs if h)
            rows.append({"regime": regime, "positions": kind, "sentences": len(sentences), "seconds": seconds,
                         "sentences_per_s": len(sentences) / seconds, "tgt_tokens_per_s": tokens / seconds,
                         "avg_output_tokens": tokens / len(sentences)})
            if args.per_step:
                with StepTimer(translator.model, device) as timer:
                    translator.hypotheses(sentences, **decode)
                per_step[f"{regime}/{kind}"] = timer.summary()
            print(f"{regime:6s} {kind}: {rows[-1]['sentences_per_s']:.1f} sent/s, "
                  f"{rows[-1]['tgt_tokens_per_s']:.0f} tgt tok/s ({seconds:.2f}s)", flush=True)
            for ct2_type in CT2_TYPES if args.ctranslate2 else ():
                path = ct2_models[kind, ct2_type]
                if isinstance(path, str):
                    print(f"{regime:6s} {kind}: CTranslate2 {ct2_type}: not exported: {path}", flush=True)
                    continue
                lengths = ((args.forced_length, args.forced_length) if regime == "forced"
                           else (0, free_limit(translator, sentences)))
                ct2_seconds, ct2_tokens = time_ct2(path, translator, sentences, args, device, *lengths)
                rows[-1].update({f"ct2_{ct2_type}_seconds": ct2_seconds,
                                 f"ct2_{ct2_type}_sentences_per_s": len(sentences) / ct2_seconds,
                                 f"ct2_{ct2_type}_tgt_tokens_per_s": ct2_tokens / ct2_seconds,
                                 f"ct2_{ct2_type}_avg_output_tokens": ct2_tokens / len(sentences)})
                print(f"{regime:6s} {kind}: CTranslate2 {ct2_type}: {len(sentences) / ct2_seconds:.1f} sent/s, "
                      f"{ct2_tokens / ct2_seconds:.0f} tgt tok/s ({ct2_seconds:.2f}s)", flush=True)
        by_kind = {r["positions"]: r for r in rows if r["regime"] == regime}
        if {"abs", "rel"} <= set(by_kind):
            by_kind["rel"]["rel_over_abs_time"] = by_kind["rel"]["seconds"] / by_kind["abs"]["seconds"]

    columns = [("regime", "regime"), ("positions", "positions"), ("sentences", "sentences"),
               ("sentences_per_s", "sentences/s"), ("tgt_tokens_per_s", "target tokens/s"),
               ("avg_output_tokens", "avg output tokens"), ("seconds", "seconds"),
               ("rel_over_abs_time", "rel/abs time")]
    if args.ctranslate2:
        columns += [(f"ct2_{t}_sentences_per_s", f"CTranslate2 {t} sentences/s") for t in CT2_TYPES]
    table = markdown_table(rows, columns)
    if ct2_dir is not None:
        ct2_dir.cleanup()
    hw = hardware(device)
    print("\n" + table)
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    if args.plot and per_step:
        plot_per_step(per_step, args.plot)
    if args.out:
        write_json(args.out, {"command": command_line(), "hardware": hw, "settings": settings, "rows": rows,
                              "per_step_seconds": per_step, "cpu_tuning": tuned})
    if args.md:
        models = ("trained checkpoints" if args.checkpoint_abs or args.checkpoint_rel else
                  f"untrained models of one shape ({args.layers}+{args.layers} layers, d_model {args.d_model}, "
                  f"{args.heads} heads, FFN {args.d_ff}; rel: k = {args.k}, "
                  f"{'a^K and a^V shared by all heads' if args.share_heads else 'per-head a^K and a^V'})")
        ct2_text = ("" if not args.ctranslate2 else
                    " CTranslate2 columns: the same models exported with `relmt.export.ctranslate2` (float32 and "
                    "int8 weights), decoded by `ctranslate2.Translator.translate_batch` with the same beam, length "
                    "penalty alpha (CT2's |y|^alpha, not GNMT's), forced length and source-token batches "
                    f"(batch_type=tokens), intra_threads={torch.get_num_threads()}, sentencepiece included; "
                    "`free` decodes up to the longest sentence's step limit. An empty cell: the model has "
                    "per-head relative tables, which CTranslate2 cannot hold.")
        args.md.parent.mkdir(parents=True, exist_ok=True)
        args.md.write_text(
            f"# Beam-{args.beam} decoding speed ({device.type})\n\n"
            f"{len(sentences)} source sentences ({args.text_dir or 'toy corpus'}, split {args.split}) translated "
            f"with `Translator` (length-sorted batches of at most {args.max_source_tokens} source tokens, beam "
            f"{args.beam}, detokenized output), {models}, fp32. `forced`: every output has exactly "
            f"{args.forced_length} tokens. Median of {args.repeats} runs after a warm-up.{ct2_text}\n\n"
            f"- command: `{command_line()}`\n- hardware: {hw.get('gpu', hw['cpu'])}, {hw['torch_threads']} torch "
            f"threads, torch {hw['torch']}\n- date: {hw['date']} (git {hw['git']})\n\n{table}\n")


if __name__ == "__main__":
    main()
