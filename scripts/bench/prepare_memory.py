#!/usr/bin/env python
"""Peak memory and wall time of `relmt-prepare data=text` by corpus size (issue 74 §5): plain-text corpora are
streamed into Arrow, so peak memory should not grow with the number of pairs, and time should grow linearly.

For each N in --pairs, the script writes a corpus of N training pairs by repeating the pairs of
--shared-data/--corpus (default ../shared/data/europarl20k_ende, train.{en,de}) line by line, with valid and test
splits of --eval-pairs pairs taken from its head, then runs `relmt-prepare data=text data.dir=... data.src=en
data.tgt=de` in a fresh process with an empty cache, and measures:

- peak RSS, largest process: ru_maxrss of the run (os.wait4: the command's own process or, if larger, the
  largest of the worker processes it waited for, data.num_proc); counts file pages it has mapped and touched;
- peak RSS, process tree: the sum of VmRSS over the command and all its descendants, sampled every
  --sample-seconds (pages shared between them are counted once per process, so an upper bound);
- wall time, and the build's own phases from the cache's meta.json.

The goal: peak RSS at the largest N at most --goal-ratio (1.2) times that at the smallest, and time linear (the
seconds per million pairs about constant). Each corpus and cache is deleted before the next N. Needs disk for the
largest corpus, the build's Arrow copy of it and its cache (about 1.3 GB per million pairs of Europarl). 1M and 10M
pairs should take roughly 3 and 20 minutes on 2 cores (100k took 10 s); run it on a quiet machine:

    python scripts/bench/prepare_memory.py --out docs/results/performance/prepare_memory.json \
        --md docs/results/performance/prepare_memory.md
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from relmt.bench import command_line, hardware, markdown_table, write_json

MIB = 1 << 20


def write_corpus(source: Path, src: str, tgt: str, folder: Path, pairs: int, eval_pairs: int) -> None:
    """folder/train.{src,tgt}: `pairs` lines, the source's lines repeated in order (both sides in step, so the
    pairs stay aligned); valid and test: the source's first `eval_pairs` lines. Written in blocks: the
    corpus is never in memory."""
    folder.mkdir(parents=True, exist_ok=True)
    for lang in (src, tgt):
        lines = (source / f"train.{lang}").read_bytes().splitlines(keepends=True)
        if not lines:
            raise SystemExit(f"{source / f'train.{lang}'} is empty")
        if not lines[-1].endswith(b"\n"):
            lines[-1] += b"\n"
        block = b"".join(lines)
        with (folder / f"train.{lang}").open("wb") as f:
            for _ in range(pairs // len(lines)):
                f.write(block)
            f.write(b"".join(lines[:pairs % len(lines)]))
        head = b"".join(lines[:eval_pairs])
        for split in ("valid", "test"):
            (folder / f"{split}.{lang}").write_bytes(head)


def descendants(pid: int) -> list[int]:
    """pid and every process below it (from /proc/*/stat's parent ids)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])  # the command name may hold spaces and ')'
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def rss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class TreeSampler(threading.Thread):
    """Samples the summed VmRSS of a process and its descendants until stopped; keeps the peak and how many
    processes the tree held at most."""

    def __init__(self, pid: int, interval: float) -> None:
        super().__init__(daemon=True)
        self.pid, self.interval = pid, interval
        self.peak = self.processes = 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            tree = descendants(self.pid)
            self.peak = max(self.peak, sum(rss_bytes(p) for p in tree))
            self.processes = max(self.processes, len(tree))
            self.done.wait(self.interval)


def prepare_command() -> list[str]:
    exe = Path(sys.executable).parent / "relmt-prepare"
    return [str(exe)] if exe.exists() else [sys.executable, "-c", "from relmt.cli.prepare import main; main()"]


def measure(overrides: list[str], log: Path, interval: float) -> dict:
    """Run relmt-prepare with `overrides`; wall time, ru_maxrss (os.wait4) and the sampled tree peak."""
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    with log.open("w") as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(prepare_command() + overrides, stdout=out, stderr=subprocess.STDOUT, env=env)
        sampler = TreeSampler(proc.pid, interval)
        sampler.start()
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        sampler.done.set()
        sampler.join()
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped by wait4: tell Popen
    if proc.returncode != 0:
        raise SystemExit(f"relmt-prepare failed ({proc.returncode}):\n{log.read_text()[-4000:]}")
    return {"wall_s": wall, "peak_rss_mib": usage.ru_maxrss * 1024 / MIB, "tree_rss_mib": sampler.peak / MIB,
            "processes": sampler.processes}


def run_one(args: argparse.Namespace, pairs: int, work: Path) -> dict:
    corpus, cache = work / f"corpus-{pairs}", work / f"cache-{pairs}"
    try:
        t0 = time.perf_counter()
        write_corpus(args.shared_data / args.corpus, args.src, args.tgt, corpus, pairs, args.eval_pairs)
        written = time.perf_counter() - t0
        size = sum(f.stat().st_size for f in corpus.glob("train.*"))
        overrides = ["data=text", f"data.dir={corpus}", f"data.src={args.src}", f"data.tgt={args.tgt}",
                     f"data.cache_dir={cache}", f"data.vocab_size={args.vocab_size}", f"data.num_proc={args.num_proc}",
                     *args.set]
        row = {"pairs": pairs, "train_mib": size / MIB, "corpus_write_s": written,
               **measure(overrides, work / f"prepare-{pairs}.log", args.sample_seconds)}
        meta = json.loads(next(cache.glob("*/meta.json")).read_text())
        row.update(load_s=meta["seconds_load"], spm_s=meta["seconds_spm"], encode_s=meta["seconds_encode"],
                   save_s=meta["seconds_save"], kept=meta["splits"]["train"]["kept"])
        row["s_per_million"] = row["wall_s"] / pairs * 1e6
        return row
    finally:
        shutil.rmtree(corpus, ignore_errors=True)
        shutil.rmtree(cache, ignore_errors=True)


def verdict(rows: list[dict], goal: float) -> dict:
    """Peak memory and time of the largest corpus against the smallest's."""
    small, large = min(rows, key=lambda r: r["pairs"]), max(rows, key=lambda r: r["pairs"])
    scale = large["pairs"] / small["pairs"]
    out = {"smallest": small["pairs"], "largest": large["pairs"], "goal_ratio": goal,
           "peak_rss_ratio": large["peak_rss_mib"] / small["peak_rss_mib"],
           "tree_rss_ratio": large["tree_rss_mib"] / small["tree_rss_mib"],
           "time_ratio": large["wall_s"] / small["wall_s"], "pairs_ratio": scale}
    out["memory_goal_met"] = out["peak_rss_ratio"] <= goal and out["tree_rss_ratio"] <= goal
    return out


COLUMNS = [("pairs", "training pairs"), ("train_mib", "train files (MiB)"), ("wall_s", "wall (s)"),
           ("s_per_million", "s per 1M pairs"), ("peak_rss_mib", "peak RSS, largest process (MiB)"),
           ("tree_rss_mib", "peak RSS, process tree (MiB)"), ("processes", "processes"), ("load_s", "read (s)"),
           ("spm_s", "sentencepiece (s)"), ("encode_s", "encode (s)"), ("save_s", "save (s)")]


def markdown(args: argparse.Namespace, rows: list[dict], v: dict, hw: dict) -> str:
    met = "met" if v["memory_goal_met"] else "NOT met"
    overrides = "".join(f" {o}" for o in args.set)
    return (
        "# relmt-prepare's peak memory by corpus size\n\n"
        f"`relmt-prepare data=text data.src={args.src} data.tgt={args.tgt} data.vocab_size={args.vocab_size} "
        f"data.num_proc={args.num_proc}{overrides}` on corpora of N training pairs, {args.corpus}'s pairs "
        f"repeated (valid and test: its first {args.eval_pairs} pairs), each in a fresh process with an empty "
        "cache. Peak RSS of the largest process is ru_maxrss (it counts the file pages a process maps and "
        "reads); the process tree's is the sum of VmRSS over the command and its workers, sampled every "
        f"{args.sample_seconds} s. Wall time includes Python start-up and imports. sentencepiece samples "
        "`data.spm_input_sentence_size` sentences (2M by default): up to that many sentences (1M pairs) its "
        "sample, and so memory, grows with the corpus; beyond, neither does.\n\n"
        f"- command: `{command_line()}`\n- hardware: {hw['cpu']}, {hw['cpu_count']} cores\n"
        f"- date: {hw['date']} (git {hw['git']})\n\n{markdown_table(rows, COLUMNS)}\n\n"
        f"At {v['largest']:,} pairs ({v['pairs_ratio']:g}x {v['smallest']:,}) peak RSS is "
        f"{v['peak_rss_ratio']:.2f}x (largest process) and {v['tree_rss_ratio']:.2f}x (process tree) that at "
        f"{v['smallest']:,}; the goal, at most {v['goal_ratio']:g}x, is {met}. Wall time is "
        f"{v['time_ratio']:.2f}x.\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shared-data", type=Path, default=Path("../shared/data"))
    ap.add_argument("--corpus", default="europarl20k_ende", help="a folder of --shared-data with train.{src,tgt}")
    ap.add_argument("--src", default="en")
    ap.add_argument("--tgt", default="de")
    ap.add_argument("--pairs", type=int, nargs="+", default=[1_000_000, 10_000_000])
    ap.add_argument("--eval-pairs", type=int, default=1000, help="pairs in the valid and the test split")
    ap.add_argument("--vocab-size", type=int, default=8000)
    ap.add_argument("--num-proc", type=int, default=1)
    ap.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE",
                    help="more relmt-prepare overrides, e.g. data.spm_input_sentence_size=100000 (sentencepiece "
                         "samples 2M sentences by default: below 1M pairs its sample, and memory, grow with the "
                         "corpus)")
    ap.add_argument("--sample-seconds", type=float, default=0.1)
    ap.add_argument("--goal-ratio", type=float, default=1.2)
    ap.add_argument("--work", type=Path, help="where corpora and caches are written (default: a temporary folder)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--md", type=Path)
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="relmt-prepare-memory-", dir=args.work))
    rows = []
    try:
        for pairs in args.pairs:
            row = run_one(args, pairs, work)
            rows.append(row)
            print(f"{pairs:,} pairs: {row['wall_s']:.1f}s, peak RSS {row['peak_rss_mib']:.0f} MiB (largest "
                  f"process), {row['tree_rss_mib']:.0f} MiB (tree of {row['processes']})", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    v = verdict(rows, args.goal_ratio)
    hw = hardware()
    page = markdown(args, rows, v, hw)
    print("\n" + page)
    if args.out:
        settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
        write_json(args.out, {"command": command_line(), "hardware": hw, "settings": settings, "rows": rows,
                              "verdict": v})
    if args.md:
        args.md.parent.mkdir(parents=True, exist_ok=True)
        args.md.write_text(page)


if __name__ == "__main__":
    main()
