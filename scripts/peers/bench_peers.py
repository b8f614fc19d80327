#!/usr/bin/env python
"""relmt beside OpenNMT-py, eole, HF Marian and CTranslate2, measured side by side in one run
(issue 14). scripts/peers/bench_peers.sh installs the peers and calls this; run it alone on the machine.

Every toolkit gets the same workload: the peer corpus (../shared/bench/make_peer_corpus.py, seed
1234, word level), 3+3 layers, d_model 256, 4 heads, FFN 1024, dropout 0.1, shared embeddings,
relative k = 16 (tables shared across heads, as OpenNMT-py and eole have them), token batches of
about 4,096 per side (8,192 padded source + target tokens), Adam with Noam's schedule, label
smoothing 0.1, --threads intra-op threads, no loader workers, flush-to-zero set before the thread
pool starts (scripts/peers/ftz.py; relmt sets it itself).

- Training: target (non-pad) tokens per second over updates 11..--steps, from the log lines of
  each toolkit's own training command (relmt-train, onmt_train, eole train; Marian has no
  training command, so scripts/peers/marian.py is the plain loop of transformers' examples). Time
  is the span between the log lines of update 10 and update --steps; target tokens are counted by
  the toolkit (relmt: metrics.jsonl; OpenNMT-py and eole: the mean target tokens per update of each
  report; Marian: its log).
- Decoding: beam 4, length penalty 0.6, the test sentences, every hypothesis forced to --length
  tokens (min = max length; the mean output length is reported as a check). Batches of 32
  sentences (every toolkit, sorted by length), one sentence at a time (latency, the first
  --latency-n sentences), and one batch of all sentences. Models are the ones trained above
  (--steps updates); CTranslate2 decodes the converted OpenNMT-py models and relmt's own export.
- Between stages: the FLOP/s of a 1024^3 fp32 matmul on --threads threads, since the host's speed
  drifts. The queue runs --repeats times, interleaved; tables give medians (and the range).

    python scripts/peers/bench_peers.py --scratch /tmp/relmt-peers --peers onmt eole marian \
        --json docs/results/performance/perf_cpu.json --md docs/results/performance/perf_cpu.md
    python scripts/peers/bench_peers.py --scratch /tmp/x --peers --steps 20 --decode-n 40   # relmt only (smoke)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PEER_SEED = 1234
TIMESTAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})")


def log_time(line: str) -> float | None:
    """Seconds since the epoch of a log line that starts '[YYYY-mm-dd HH:MM:SS,mmm' (every toolkit's
    Python logging format here), else None."""
    m = TIMESTAMP.match(line)
    return datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp() if m else None


# ---------------------------------------------------------------------------------------------------
# Training logs -> (update, time, target tokens since the previous log line)

def relmt_marks(run: Path) -> list[tuple[int, float, int]]:
    times = {}
    for line in (run / "train.log").read_text().splitlines():
        m = re.search(r"\] - step (\d+) \| loss", line)
        if m and (t := log_time(line)) is not None:
            times[int(m.group(1))] = t
    marks = []
    for line in (run / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec.get("tag") == "train" and rec["step"] in times:
            marks.append((rec["step"], times[rec["step"]], int(rec["tgt_tokens"])))
    return marks


ONMT_STEP = re.compile(r"Step\s+(\d+)(?:/\s*\d+)?;.*?bsz:\s*(\d+)/\s*(\d+)/")


def onmt_marks(log: Path, every: int) -> list[tuple[int, float, int]]:
    """OpenNMT-py and eole report the mean (source/target/sentences) per update over each report
    interval of `every` updates."""
    marks = []
    for line in log.read_text().splitlines():
        m = ONMT_STEP.search(line)
        if m and (t := log_time(line)) is not None:
            marks.append((int(m.group(1)), t, int(m.group(3)) * every))
    return marks


def marian_marks(log: Path) -> list[tuple[int, float, int]]:
    marks = []
    for line in log.read_text().splitlines():
        m = re.search(r"step (\d+) \| loss [\d.]+ \| (\d+) tgt tokens", line)
        if m and (t := log_time(line)) is not None:
            marks.append((int(m.group(1)), t, int(m.group(2))))
    return marks


def throughput(marks: list[tuple[int, float, int]], first: int, last: int) -> float:
    """Target tokens per second over updates first+1..last: the tokens logged after the line of
    update `first`, up to and including that of `last`, over the time between those two lines."""
    by_step = {s: (t, n) for s, t, n in marks}
    if first not in by_step or last not in by_step:
        raise SystemExit(f"the training log has no line for update {first} or {last}: {sorted(by_step)}")
    tokens = sum(n for s, _, n in marks if first < s <= last)
    return tokens / (by_step[last][0] - by_step[first][0])


# ---------------------------------------------------------------------------------------------------

@dataclass
class Bench:
    scratch: Path
    corpus: Path
    threads: int
    steps: int
    log_every: int
    length: int
    decode_n: int
    latency_n: int
    relmt_bin: Path
    results: list[dict] = field(default_factory=list)
    done: dict[tuple, dict] = field(default_factory=dict)  # --resume: rows measured by an earlier call

    @property
    def log_path(self) -> Path:
        """Every measured row, appended as it is measured, so that --resume can skip it."""
        return self.scratch / "results.jsonl"

    def earlier(self, **key) -> dict | None:
        """The row of an earlier call for this stage, system, positions, (regime) and repeat, kept
        in the results again; None when it must be measured."""
        row = self.done.get(tuple(sorted(key.items())))
        if row is not None:
            self.results.append(row)
            print(f"  measured earlier: {json.dumps(row)}", flush=True)
        return row

    def venv(self, name: str) -> Path:
        return self.scratch / name / "bin"

    def run(self, cmd: list[str | Path], log: Path, env: dict | None = None) -> str:
        log.parent.mkdir(parents=True, exist_ok=True)
        full_env = {**os.environ, "OMP_NUM_THREADS": str(self.threads), "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1",
                    "PYTHONWARNINGS": "ignore", **(env or {})}
        with log.open("w") as f:
            proc = subprocess.run([str(c) for c in cmd], stdout=f, stderr=subprocess.STDOUT, env=full_env, cwd=ROOT)
        text = log.read_text()
        if proc.returncode:
            tail = "\n".join(text.splitlines()[-15:])
            raise SystemExit(f"{' '.join(map(str, cmd))} failed ({proc.returncode}); log {log}:\n{tail}")
        return text

    def calibrate(self, stage: str) -> float:
        out = subprocess.run([sys.executable, __file__, "gemm", "--threads", str(self.threads)], capture_output=True,
                             text=True, check=True).stdout
        gflops = float(out.split()[-1])
        print(f"  calibration before {stage}: {gflops:.1f} GFLOP/s", flush=True)
        return gflops

    def record(self, **row) -> None:
        self.results.append(row)
        with self.log_path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print("  " + json.dumps(row), flush=True)

    # ---- training ---------------------------------------------------------------------------------

    def train(self, system: str, pos: str, rep: int) -> Path:
        out = self.scratch / f"r{rep}" / f"{system}-{pos}"
        model = out / {"relmt": "checkpoints/last.pt", "relmt-mkl": "checkpoints/last.pt",
                       "onmt": f"model_step_{self.steps}.pt"}.get(system, "model")
        if model.exists() and self.earlier(stage="train", system=system, positions=pos, repeat=rep):
            return model
        shutil.rmtree(out, ignore_errors=True)  # an earlier run's files (this run does not resume it)
        gemm = self.calibrate(f"{system}/{pos} training")
        if system in ("relmt", "relmt-mkl"):
            # relmt-mkl: torch's default CPU GEMM (MKL) for the linear maps instead of oneDNN (relmt/model/linear.py)
            # rel-heads: the paper's base setting, one table per head (relmt's default; CTranslate2 cannot hold it)
            self.run([self.relmt_bin / "relmt-train", f"hydra.run.dir={out}", "model=small",
                      f"model.positions={pos.removesuffix('-heads')}",
                      f"model.relative_share_heads={str(pos != 'rel-heads').lower()}", "data=text", "data.name=peer",
                      f"data.dir={self.corpus}",
                      "data.src=src", "data.tgt=tgt", "data.spm_model_type=word", "~data.splits.test",
                      "train.max_padded_tokens=8192", f"train.max_steps={self.steps}",
                      f"train.log_every={self.log_every}", f"train.eval_every={self.steps}",
                      f"train.save_every={self.steps}", "train.valid_bleu=false", f"threads={self.threads}",
                      "train.progress=false", f"seed={PEER_SEED}"], out / "bench.log",
                     {"RELMT_CPU_GEMM": "mkl" if system == "relmt-mkl" else "auto"})
            marks = relmt_marks(out)
        elif system in ("onmt", "eole"):
            config = out / "config.yaml"
            config.parent.mkdir(parents=True, exist_ok=True)
            config.write_text(peer_config(system, pos, self.corpus, out, self.steps, self.log_every))
            entry = ["onmt.bin.train:main", "-config", config] if system == "onmt" else \
                ["eole.bin.main:main", "train", "-config", config]
            self.run([self.venv(system) / "python", ROOT / "scripts/peers/ftz.py", "--threads", self.threads, *entry],
                     out / "train.log")
            marks = onmt_marks(out / "train.log", self.log_every)
        else:  # marian
            self.run([self.venv("marian") / "python", ROOT / "scripts/peers/marian.py", "--threads", self.threads,
                      "train", "--corpus", self.corpus, "--out", out / "model", "--steps", self.steps,
                      "--log-every", self.log_every, "--seed", PEER_SEED], out / "train.log")
            marks = marian_marks(out / "train.log")
        self.record(stage="train", system=system, positions=pos, repeat=rep, gemm_gflops=gemm,
                    tokens_per_s=throughput(marks, self.log_every, self.steps))
        return model

    # ---- decoding ---------------------------------------------------------------------------------

    def decode(self, system: str, pos: str, model: Path, rep: int) -> None:
        src = self.corpus / "test.src"
        wanted = (("batch32", 32, self.decode_n), ("latency", 1, self.latency_n),
                  ("large", self.decode_n, self.decode_n))
        regimes = [(regime, batch, n) for regime, batch, n in wanted
                   if not self.earlier(stage="decode", system=system, positions=pos, regime=regime, repeat=rep)]
        if not regimes:
            return
        gemm = self.calibrate(f"{system}/{pos} decoding")
        for regime, batch, n in regimes:
            out = self.scratch / f"r{rep}" / "decode" / f"{system}-{pos}-{regime}.txt"
            seconds = self.decode_once(system, model, src, out, batch, n)
            hyps = out.read_text(encoding="utf-8").splitlines()[:n]
            self.record(stage="decode", system=system, positions=pos, regime=regime, batch=batch, repeat=rep,
                        gemm_gflops=gemm, sentences=n, seconds=seconds, sentences_per_s=n / seconds,
                        mean_output_tokens=statistics.fmean(len(h.split()) for h in hyps))

    def decode_once(self, system: str, model: Path, src: Path, out: Path, batch: int, n: int) -> float:
        log = out.with_suffix(".log")
        common = ["--src", src, "--out", out, "--n", n, "--batch", batch, "--length", self.length]
        if system in RELMT:
            engine = {"relmt-compiled": ["--compile"], "relmt-onnx": ["--engine", "onnx"],
                      "relmt-aoti": ["--engine", "aoti"]}.get(system, [])
            text = self.run([sys.executable, __file__, "relmt-decode", "--checkpoint", model, "--threads", self.threads,
                             *engine, *common], log)
        elif system.startswith("ct2"):  # ct2 (OpenNMT-py's model) or ct2-relmt; compute type after the colon
            compute = system.split(":")[1]
            python = self.venv("onmt") / "python" if system.startswith("ct2:") else sys.executable
            spm = [] if system.startswith("ct2:") else ["--spm", model / "sentencepiece.model"]  # relmt's pieces
            text = self.run([python, ROOT / "scripts/peers/ct2_decode.py", "--model", model, "--compute-type", compute,
                             "--threads", self.threads, *spm, *common], log)
        elif system == "marian":
            text = self.run([self.venv("marian") / "python", ROOT / "scripts/peers/marian.py", "--threads",
                             self.threads, "decode", "--model", model, *common], log)
        else:  # onmt, eole: their own translate commands, timed by their -report_time
            head = out.with_suffix(".src")
            head.write_text("\n".join(src.read_text(encoding="utf-8").splitlines()[:n]) + "\n", encoding="utf-8")
            # max_length counts the EOS-free output, and min_length keeps EOS out before it;
            # max_length_ratio 0 lifts OpenNMT-py's cap of 1.25 x the longest source + 5 tokens
            args = ["-src", head, "-output", out, "-beam_size", 4, "-length_penalty", "wu", "-alpha", 0.6,
                    "-min_length", self.length, "-max_length", self.length, "-max_length_ratio", 0,
                    "-batch_size", batch,
                    "-batch_type", "sents", "-report_time"]
            entry = ["onmt.bin.translate:main", "-model", model] if system == "onmt" else \
                ["eole.bin.main:main", "predict", "-model_path", model]
            text = self.run([self.venv(system) / "python", ROOT / "scripts/peers/ftz.py", "--threads", self.threads,
                             *entry, *args], log)
            avg_ms = float(re.findall(r"Average translation time \(ms\): ([\d.]+)", text)[-1])
            return avg_ms * n / 1000
        return float(re.findall(r"^SECONDS ([\d.]+)", text, re.M)[-1])


def peer_config(system: str, pos: str, corpus: Path, out: Path, steps: int, every: int) -> str:
    """The OpenNMT-py 3.5 or eole 0.6 training config of the shared workload."""
    vocab = f"""src_vocab: {corpus}/vocab.shared
tgt_vocab: {corpus}/vocab.shared
share_vocab: true
src_vocab_size: 10000
tgt_vocab_size: 10000
n_sample: 0
overwrite: true
seed: {PEER_SEED}
report_every: {every}
data:
  corpus_1: {{path_src: {corpus}/train.src, path_tgt: {corpus}/train.tgt}}
  valid: {{path_src: {corpus}/valid.src, path_tgt: {corpus}/valid.tgt}}
"""
    train = f"""save_checkpoint_steps: {steps}
train_steps: {steps}
valid_steps: {10 * steps}
world_size: 1
gpu_ranks: []
num_workers: 0
batch_type: tokens
batch_size: 4096
valid_batch_size: 4096
optim: adam
adam_beta1: 0.9
adam_beta2: 0.98
learning_rate: 2.0
decay_method: noam
warmup_steps: 4000
label_smoothing: 0.1
max_grad_norm: 0
dropout: [0.1]
attention_dropout: [0.1]
"""
    if system == "onmt":
        positions = "position_encoding: true\n" if pos == "abs" else \
            "position_encoding: false\nmax_relative_positions: 16\n"
        return vocab + train + f"""save_model: {out}/model
param_init: 0
param_init_glorot: true
encoder_type: transformer
decoder_type: transformer
enc_layers: 3
dec_layers: 3
hidden_size: 256
word_vec_size: 256
transformer_ff: 1024
heads: 4
share_embeddings: true
share_decoder_embeddings: true
""" + positions
    positions = "position_encoding_type: SinusoidalInterleaved" if pos == "abs" else \
        "position_encoding_type: Relative\n    n_positions: 16"
    indented = "".join(f"  {line}\n" for line in train.splitlines())
    return vocab + "training:\n" + f"  model_path: {out}/model\n  param_init_method: xavier_uniform\n" + indented + \
        f"""model:
  architecture: transformer
  layers: 3
  hidden_size: 256
  heads: 4
  transformer_ff: 1024
  share_embeddings: true
  share_decoder_embeddings: true
  embeddings:
    word_vec_size: 256
    {positions}
"""


# ---------------------------------------------------------------------------------------------------
# Sub-commands run in fresh processes: the calibration GEMM and relmt's decoding.

def gemm(threads: int) -> None:
    import torch

    torch.set_flush_denormal(True)
    torch.set_num_threads(threads)
    n = 1024
    a, b = torch.randn(n, n), torch.randn(n, n)
    for _ in range(3):
        a @ b
    reps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < 1.0:
        a @ b
        reps += 1
    print(f"GFLOPS {2 * n ** 3 * reps / (time.perf_counter() - t0) / 1e9:.3f}")


def relmt_decode(opts: argparse.Namespace) -> None:
    import torch

    from relmt.decode.translator import Translator
    from relmt.runtime import tune_cpu

    torch.set_num_threads(opts.threads)
    tune_cpu()  # relmt-translate's CPU settings (the Translator API leaves them to its caller)
    # engine=onnx and aoti export on first use, beside the checkpoint: before the warm-up, and not timed
    translator = Translator.from_checkpoint(opts.checkpoint, device="cpu", compile=opts.compile, engine=opts.engine,
                                            quantization=opts.quantization)
    lines = opts.src.read_text(encoding="utf-8").splitlines()[: opts.n or None]
    # every hypothesis has exactly --length tokens: EOS is suppressed before it, and the step limit
    # max_len_a * |x| + max_len_b ends the search there
    settings = dict(beam=4, lenpen=0.6, min_len=opts.length, max_len_a=0.0, max_len_b=opts.length,
                    max_sentences=opts.batch, max_source_tokens=10 ** 9)
    # warm-up, as CTranslate2 and the peers load before timing; with --compile, two batches compile the
    # graphs for this batch size (steps 0, 1 and later ones; dynamic shapes serve the rest)
    t0 = time.perf_counter()
    translator.translate(lines[: 2 * opts.batch if opts.compile else 2], **settings)
    print(f"WARMUP_SECONDS {time.perf_counter() - t0:.6f}")
    t0 = time.perf_counter()
    hyps = translator.translate(lines, **settings)
    seconds = time.perf_counter() - t0
    opts.out.write_text("\n".join(hyps) + "\n", encoding="utf-8")
    print(f"SECONDS {seconds:.6f}")


# ---------------------------------------------------------------------------------------------------

def median_range(values: list[float]) -> tuple[float, float, float]:
    return statistics.median(values), min(values), max(values)


def summarise(results: list[dict]) -> dict:
    """Medians over the repeats: training tok/s by (system, positions); decoding sentences/s by
    (system, positions, regime)."""
    train: dict[str, list[float]] = {}
    decode: dict[str, list[float]] = {}
    lengths: dict[str, list[float]] = {}
    for r in results:
        if r["stage"] == "train":
            train.setdefault(f"{r['system']}/{r['positions']}", []).append(r["tokens_per_s"])
        else:
            key = f"{r['system']}/{r['positions']}/{r['regime']}"
            decode.setdefault(key, []).append(r["sentences_per_s"])
            lengths.setdefault(key, []).append(r["mean_output_tokens"])
    return {"train": {k: median_range(v) for k, v in train.items()},
            "decode": {k: median_range(v) for k, v in decode.items()},
            "output_tokens": {k: statistics.fmean(v) for k, v in lengths.items()},
            "gemm_gflops": median_range([r["gemm_gflops"] for r in results])}


NAMES = {"relmt": "**relmt**", "relmt-mkl": "**relmt** (`RELMT_CPU_GEMM=mkl`: MKL, torch's default CPU GEMM)",
         "onmt": "OpenNMT-py 3.5.1", "eole": "eole 0.6.4", "marian": "HF transformers Marian",
         "ct2:float32": "CTranslate2 4.8.5 float32 (OpenNMT-py's model)",
         "ct2:int8": "CTranslate2 4.8.5 int8 (OpenNMT-py's model)",
         "ct2-relmt:float32": "CTranslate2 4.8.5 float32 (relmt-export)",
         "ct2-relmt:int8": "CTranslate2 4.8.5 int8 (relmt-export)",
         "relmt-compiled": "**relmt** (`compile=true`)", "relmt-onnx": "**relmt** (`engine=onnx`)",
         "relmt-aoti": "**relmt** (`engine=aoti`)"}
RELMT = ("relmt", "relmt-compiled", "relmt-onnx", "relmt-aoti")  # relmt's decoders: its engines


def fmt(cell: tuple[float, float, float] | None, digits: int = 0) -> str:
    if cell is None:
        return "–"
    med, lo, hi = cell
    text = f"{med:,.{digits}f}"
    return text if hi - lo < 10 ** -digits else f"{text} ({lo:,.{digits}f}–{hi:,.{digits}f})"


def goals(summary: dict) -> list[tuple[str, str, str, str]]:
    """(goal, target, measured, met) rows from the medians; a goal whose figures were not measured says so."""
    train, decode = summary["train"], summary["decode"]

    def med(table: dict, key: str) -> float | None:
        return table[key][0] if key in table else None

    rows = []
    rel = med(train, "relmt/rel")
    peers = [v for k, (v, _, _) in train.items() if k.endswith("/rel") and not k.startswith("relmt")]
    if rel and peers:
        rows.append(("training, relmt rel / best relative peer", "≥ 1.3", f"{rel / max(peers):.2f}",
                     "yes" if rel / max(peers) >= 1.3 else "no"))
    if rel and (marian := med(train, "marian/abs")):
        rows.append(("training, relmt rel / HF Marian abs", "≥ 1.2", f"{rel / marian:.2f}",
                     "yes" if rel / marian >= 1.2 else "no"))
    if rel and (abs_ := med(train, "relmt/abs")):
        rows.append(("training step time, relmt rel / abs", "≤ 1.05", f"{abs_ / rel:.3f}",
                     "yes" if abs_ / rel <= 1.05 else "no"))
    for regime, what in (("batch32", "decoding at 32 per batch, sentences/s"),
                         ("latency", "one sentence at a time, sentences/s")):
        ours = {name: v for name in RELMT if (v := med(decode, f"{name}/rel/{regime}"))}
        mine = max(ours.values(), default=None)
        ct2 = [v for k, (v, _, _) in decode.items()
               if k.startswith("ct2") and ":float32/rel/" in k and k.endswith(regime)]
        if mine and ct2:
            best = max(ct2)
            which = NAMES[max(ours, key=ours.get)].replace("**", "")
            rows.append((f"{what}: {which} rel / best CTranslate2 float32 rel", "≥ 1.0", f"{mine / best:.2f}",
                         "yes" if mine >= best else "no"))
            target = 0.8 if regime == "batch32" else 0.5  # issue 33
            rows.append((f"(issue 33) {what}: fastest relmt engine rel / best CTranslate2 float32 rel",
                         f"≥ {target}", f"{mine / best:.2f}", "yes" if mine / best >= target else "no"))
        heads = {name: v for name in RELMT if (v := med(decode, f"{name}/rel-heads/{regime}"))}
        if heads and mine:
            ratio = max(heads.values()) / mine
            rows.append((f"(issue 33) {what}: per-head rel / shared-table rel, fastest relmt engine of each",
                         "≥ 0.9", f"{ratio:.2f}", "yes" if ratio >= 0.9 else "no"))
    return rows


def markdown(payload: dict) -> str:
    s, hw = payload["summary"], payload["hardware"]
    systems = list(dict.fromkeys(r["system"] for r in payload["results"]))
    decoded = bool(s["decode"])
    lines = ["# CPU performance beside the peers, measured side by side", "",
             "Every figure below comes from one run of `scripts/peers/bench_peers.sh` on one machine, "
             "all toolkits on the "
             "same workload: the peer corpus (`../shared/bench/make_peer_corpus.py`, seed 1234, word level), 3+3 "
             "layers, d_model 256, 4 heads, FFN 1024, dropout 0.1, shared embeddings, relative k = 16 (one table "
             "shared across heads), batches of about 4,096 tokens per side, Adam, label smoothing 0.1, "
             f"{payload['settings']['threads']} intra-op threads, no loader workers, flush-to-zero for everyone.", "",
             f"- command: `{payload['command']}`",
             f"- hardware: {hw['cpu']}, {hw['cpu_count']} cores; calibration GEMM (1024³ fp32) "
             f"{fmt(s['gemm_gflops'], 1)} GFLOP/s over the stages (median, range)",
             f"- date: {hw['date']} (git {hw['git']})",
             f"- repeats: {payload['settings']['repeats']}, interleaved; each cell is the median (range)", "",
             "## Side by side", "",
             f"Training: target tokens/s over updates {payload['settings']['log_every'] + 1}–"
             f"{payload['settings']['steps']}, from each toolkit's own training log. " + (
                 f"Decoding: beam 4, length penalty 0.6, {payload['settings']['decode_n']} test sentences, every "
                 f"hypothesis forced to {payload['settings']['length']} tokens; sentences/s at 32 per batch, one "
                 f"at a time (first {payload['settings']['latency_n']}), and all in one batch." if decoded else
                 "No decoding in this run (`--no-decode`): [perf_cpu.md](perf_cpu.md) has it."), "",
             "| system | train tok/s, abs | train tok/s, rel |" + (" decode@32, rel | decode@32, abs | 1 at a time, "
                                                                 "rel | one batch, rel | decode@32, rel per-head | "
                                                                 "1 at a time, rel per-head |" if decoded else ""),
             "|---|---:|---:|" + "---:|" * (6 if decoded else 0)]
    for name in systems:
        def t(pos: str, name: str = name) -> str:
            return fmt(s["train"].get(f"{name}/{pos}"))

        def d(pos: str, regime: str, name: str = name) -> str:
            return fmt(s["decode"].get(f"{name}/{pos}/{regime}"), 1)

        lines.append(f"| {NAMES.get(name, name)} | {t('abs')} | {t('rel')} |" + (
            f" {d('rel', 'batch32')} | {d('abs', 'batch32')} | {d('rel', 'latency')} | {d('rel', 'large')} | "
            f"{d('rel-heads', 'batch32')} | {d('rel-heads', 'latency')} |" if decoded else ""))
    length = payload["settings"]["length"]
    off = {k: v for k, v in s["output_tokens"].items() if abs(v - length) > 1e-9}
    check = f"every decoder gave every hypothesis exactly {length} tokens." if not off else \
        "mean output tokens off the forced length: " + ", ".join(f"{k} {v:.2f}" for k, v in off.items()) + "."
    lines += ["", "Forced-length check: " + check] if decoded else []
    lines += ["", "## Goals (issue 14)", "", "| goal | target | measured | met |", "|---|---|---|---|"]
    lines += [f"| {g} | {t} | {m} | {ok} |" for g, t, m, ok in goals(s)]
    lines += ["", "Raw figures, one line per stage and repeat with its calibration GEMM: "
              f"[{Path(payload['json']).name}]({Path(payload['json']).name}).", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)  # relmt-decode's --n is no abbreviation of --no-compiled
    sub = parser.add_subparsers(dest="command")
    g = sub.add_parser("gemm")
    g.add_argument("--threads", type=int, default=2)
    d = sub.add_parser("relmt-decode")
    for name, kind in (("--checkpoint", Path), ("--src", Path), ("--out", Path)):
        d.add_argument(name, type=kind, required=True)
    for name, default in (("--threads", 2), ("--n", 0), ("--batch", 32), ("--length", 20)):
        d.add_argument(name, type=int, default=default)
    d.add_argument("--compile", action="store_true")
    d.add_argument("--engine", default="torch", choices=["torch", "onnx", "aoti"])
    d.add_argument("--quantization", default="float32", choices=["float32", "int8"], help="engine=aoti's weights")
    parser.add_argument("--scratch", type=Path, default=Path(os.environ.get("SCRATCH", "/tmp/relmt-peers")))
    parser.add_argument("--generator", type=Path, default=ROOT.parent / "shared/bench/make_peer_corpus.py",
                        help="the peer corpus generator (default: ../shared/bench, this project's machines)")
    parser.add_argument("--peers", nargs="*", default=["onmt", "eole", "marian"], choices=["onmt", "eole", "marian"])
    parser.add_argument("--compiled", action=argparse.BooleanOptionalAction, default=True,
                        help="also decode with relmt's compiled decoder step (relmt-translate compile=true)")
    parser.add_argument("--onnx", action=argparse.BooleanOptionalAction, default=True,
                        help="also decode with relmt's ONNX Runtime engine (relmt-translate engine=onnx)")
    parser.add_argument("--aoti", action=argparse.BooleanOptionalAction, default=True,
                        help="also decode with relmt's AOTInductor engine (relmt-translate engine=aoti)")
    parser.add_argument("--per-head", action=argparse.BooleanOptionalAction, default=True,
                        help="also train and decode relmt rel with one table per head (rel-heads), which "
                             "CTranslate2 cannot hold")
    parser.add_argument("--ct2-relmt", action=argparse.BooleanOptionalAction, default=True,
                        help="also decode relmt's models exported by relmt-export with CTranslate2")
    parser.add_argument("--decode", action=argparse.BooleanOptionalAction, default=True,
                        help="decode with the trained models (--no-decode: the training rows only)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--resume", action="store_true",
                        help="keep the rows of SCRATCH/results.jsonl (an earlier, cut-off call with the same settings) "
                             "and measure only what is missing; without it the file starts afresh")
    parser.add_argument("--relmt-mkl", action="store_true",
                        help="train relmt a second time with RELMT_CPU_GEMM=mkl (torch's default CPU GEMM), beside "
                             "its default (oneDNN for the linear maps), in the same run")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=110)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--length", type=int, default=20)
    parser.add_argument("--decode-n", type=int, default=500)
    parser.add_argument("--latency-n", type=int, default=100)
    parser.add_argument("--json", type=Path, default=ROOT / "docs/results/performance/perf_cpu.json")
    parser.add_argument("--md", type=Path, default=ROOT / "docs/results/performance/perf_cpu.md")
    opts = parser.parse_args()
    if opts.command == "gemm":
        return gemm(opts.threads)
    if opts.command == "relmt-decode":
        return relmt_decode(opts)

    sys.path.insert(0, str(ROOT))
    from relmt.bench import command_line, hardware

    corpus = opts.scratch / "corpus"
    if not (corpus / "train.src").is_file():
        subprocess.run([sys.executable, opts.generator, corpus, "--seed", str(PEER_SEED)], check=True)
    bench = Bench(opts.scratch, corpus, opts.threads, opts.steps, opts.log_every, opts.length, opts.decode_n,
                  opts.latency_n, Path(sys.executable).parent)
    if opts.resume and bench.log_path.is_file():
        for line in bench.log_path.read_text().splitlines():
            row = json.loads(line)
            bench.done[tuple(sorted((k, row[k]) for k in ("stage", "system", "positions", "regime", "repeat")
                                    if k in row))] = row
    elif bench.log_path.exists():
        bench.log_path.unlink()
    trainers = [("relmt", "abs"), ("relmt", "rel")] + [("relmt", "rel-heads")] * opts.per_head + [
        ("relmt-mkl", pos) for pos in ("abs", "rel") if opts.relmt_mkl] + [
        (p, pos) for p in opts.peers for pos in ("abs", "rel") if not (p == "marian" and pos == "rel")]
    models: dict[tuple[str, str], Path] = {}
    for rep in range(1, opts.repeats + 1):
        print(f"== training, repeat {rep}", flush=True)
        for system, pos in trainers:
            models.setdefault((system, pos), bench.train(system, pos, rep))
    decoders = []
    for (system, pos), model in models.items() if opts.decode else ():
        if system not in ("eole", "relmt-mkl"):  # relmt-mkl: the linear maps' library in training only
            decoders.append((system, pos, model))
        if system == "onmt":
            for compute in ("float32", "int8"):
                decoders.append((f"ct2:{compute}", pos, convert_onmt(bench, model, pos)))
        if system == "relmt" and opts.compiled:
            decoders.append(("relmt-compiled", pos, model))
        if system == "relmt" and opts.onnx:
            decoders.append(("relmt-onnx", pos, model))
        if system == "relmt" and opts.aoti:
            decoders.append(("relmt-aoti", pos, model))
        if system == "relmt" and opts.ct2_relmt and pos != "rel-heads":  # refused: one table per head
            for compute in ("float32", "int8"):
                decoders.append((f"ct2-relmt:{compute}", pos, export_relmt(bench, model, pos)))
    for rep in range(1, opts.repeats + 1):
        print(f"== decoding, repeat {rep}", flush=True)
        for system, pos, model in decoders:
            bench.decode(system, pos, model, rep)
    payload = {"command": command_line(), "hardware": hardware(), "settings": vars(opts) | {"command": None},
               "results": bench.results, "summary": summarise(bench.results), "json": relative(opts.json)}
    payload["settings"] = {k: relative(v) if isinstance(v, Path) else v for k, v in payload["settings"].items()}
    opts.json.parent.mkdir(parents=True, exist_ok=True)
    opts.json.write_text(json.dumps(payload, indent=2) + "\n")
    opts.md.write_text(markdown(payload))
    print(opts.md.read_text())


def relative(path: Path) -> str:
    """A path as recorded in the results: relative to the repository when inside it, so that committed
    files name no machine's paths."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def convert_onmt(bench: Bench, model: Path, pos: str) -> Path:
    """OpenNMT-py's checkpoint as a CTranslate2 model: the attention option `scaled-dot-flash` renamed
    to `scaled-dot` (the same math) so that the converter accepts it."""
    out = bench.scratch / f"ct2-onmt-{pos}"
    if not (out / "model.bin").is_file():
        fixed = model.with_name("model_ct2.pt")
        bench.run([bench.venv("onmt") / "python", "-c",
                   "import sys, torch; ck = torch.load(sys.argv[1], map_location='cpu', weights_only=False); "
                   "ck['opt'].self_attn_type = 'scaled-dot'; torch.save(ck, sys.argv[2])", model, fixed],
                  out.with_suffix(".fix.log"))
        bench.run([bench.venv("onmt") / "ct2-opennmt-py-converter", "--model_path", fixed, "--output_dir", out,
                   "--unsafe_deserialization", "--force"], out.with_suffix(".log"))
    return out


def export_relmt(bench: Bench, model: Path, pos: str) -> Path:
    out = bench.scratch / f"ct2-relmt-{pos}"
    if not (out / "model.bin").is_file():
        bench.run([bench.relmt_bin / "relmt-export", f"checkpoint={model}", "format=ctranslate2", f"output={out}"],
                  out.with_suffix(".log"))
    return out


if __name__ == "__main__":
    main()
