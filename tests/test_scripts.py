"""The benchmark and report scripts run (tiny settings; their figures are not checked here)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).parents[1]
RUN_QUEUE = ROOT / "scripts" / "reproduce" / "run_queue.sh"


def script_path(name: str) -> Path:
    """scripts/<group>/<name> (issue 45 grouped scripts/ by job: bench, peers, reproduce, gpu)."""
    return next((ROOT / "scripts").glob(f"*/{name}"))


def run_script(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(script_path(name)), *args], capture_output=True,
                          text=True, check=True, cwd=ROOT)


def test_bench_attention_runs(tmp_path):
    out, md = tmp_path / "a.json", tmp_path / "a.md"
    run_script("bench_attention.py", "--lengths", "8", "16", "--tokens", "64", "--d-model", "32",
               "--heads", "2", "--k", "2", "--repeats", "1", "--min-seconds", "0", "--out", str(out),
               "--md", str(md))
    rows = json.loads(out.read_text())["rows"]
    assert [r["n"] for r in rows] == [8, 16]
    for r in rows:
        assert r["abs_ms"] > 0 and r["rel_ms"] > 0 and r["naive_ms"] > 0
        assert r["rel_mb"] > 0 and r["naive_mb"] > 0
    assert re.search(r"^\| n +\| batch +\|", md.read_text(), re.M)


def test_markdown_table_keeps_its_number_format():
    from relmt.bench import markdown_table

    table = markdown_table([{"a": 0.012345, "b": 1234.4, "c": None}, {"a": 7, "b": "x|y"}],
                           [("a", "small"), ("b", "big"), ("c", "none")]).splitlines()
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in table]
    assert cells[0] == ["small", "big", "none"] and set(table[1]) <= set("|-")
    assert cells[2] == ["0.0123", "1,234", ""]  # 3 significant digits below 100, else whole numbers
    assert table[3].startswith("| 7 ") and "x|y" in table[3]


def test_bench_prepare_runs(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    words = "alpha beta gamma delta epsilon zeta eta theta".split()
    for split, n in (("train", 40), ("valid", 5), ("test", 5)):
        for lang, shift in (("en", 0), ("de", 3)):
            lines = [" ".join(words[(i + shift + j) % 8] for j in range(1 + i % 5)) for i in range(n)]
            (corpus / f"{split}.{lang}").write_text("\n".join(lines) + "\n")
    out, md = tmp_path / "d.json", tmp_path / "d.md"
    run_script("bench_prepare.py", "--dir", str(corpus), "--vocab-size", "30", "--num-proc", "1",
               "--spm-corpus", str(corpus), "--out", str(out), "--md", str(md))
    payload = json.loads(out.read_text())
    (row,) = payload["rows"]
    assert row["pairs"] == 50 and row["scratch_s"] > 0 and row["cached_s"] > 0
    assert payload["spm_32k"]["sentences"] == 80
    assert "cached rerun" in md.read_text()


def test_bench_decode_runs(tmp_path):
    out = tmp_path / "d.json"
    run_script("bench_decode.py", "--n", "6", "--repeats", "1", "--d-model", "16", "--heads", "2", "--d-ff", "32",
               "--layers", "1", "--forced-length", "5", "--per-step", "--cache-dir", str(tmp_path / "cache"),
               "--share-heads", "--ctranslate2", "--out", str(out))
    payload = json.loads(out.read_text())
    assert {r["positions"] for r in payload["rows"]} == {"abs", "rel"}
    assert all(r["avg_output_tokens"] == 5 for r in payload["rows"])
    # the exported CTranslate2 models, float32 and int8, decode the same forced length
    assert all(r[f"ct2_{t}_avg_output_tokens"] == 5 and r[f"ct2_{t}_sentences_per_s"] > 0
               for r in payload["rows"] for t in ("float32", "int8"))
    steps = payload["per_step_seconds"]["forced/rel"]
    assert len(steps["seconds"]) == 5 and all(rows == 6 * 4 for rows in steps["rows"].values())


def word_corpus(folder: Path, langs=("src", "tgt"), sizes=(("train", 60), ("valid", 6), ("test", 6))) -> Path:
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa".split()
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in sizes:
        for lang, shift in zip(langs, (0, 3)):
            lines = [" ".join(words[(i + shift + j) % 10] for j in range(2 + i % 6)) for i in range(n)]
            (folder / f"{split}.{lang}").write_text("\n".join(lines) + "\n")
    return folder


def test_bench_train_and_perf_report_run(tmp_path):
    corpus = word_corpus(tmp_path / "corpus")
    train_json = tmp_path / "t.json"
    run_script("bench_train.py", "--text-dir", str(corpus), "--sizes", "tiny", "--steps", "2", "--warmup", "1",
               "--max-padded-tokens", "256", "--peak-n", "64", "--cache-dir", str(tmp_path / "cache"),
               "--shape-warmup", "on", "--out", str(train_json), "--md", str(tmp_path / "t.md"))
    train = json.loads(train_json.read_text())
    assert [r["positions"] for r in train["rows"]] == ["abs", "rel", "both"]
    for r in train["rows"]:
        assert r["tgt_tokens_per_s"] > 0 and r["src_tgt_tokens_per_s"] > r["tgt_tokens_per_s"]
        assert r["flops_per_token"] > 0 and 0 < r["mfu"]
    assert train["rows"][0]["over_abs_step_time"] == 1.0
    assert train["vocab_size"] == 10 + 4 and train["cpu_tuning"]["flush_denormal"] is True
    assert "step time / abs" in (tmp_path / "t.md").read_text()
    assert "one untimed pass over the timed batches" in (tmp_path / "t.md").read_text()

    decode_json = tmp_path / "d.json"
    run_script("bench_decode.py", "--text-dir", str(corpus), "--spm-model-type", "word", "--n", "6",
               "--repeats", "1", "--d-model", "16", "--heads", "2", "--d-ff", "32", "--layers", "1",
               "--forced-length", "4", "--per-step", "--plot", str(tmp_path / "steps.png"),
               "--cache-dir", str(tmp_path / "cache"), "--out", str(decode_json))
    assert (tmp_path / "steps.png").stat().st_size > 0
    report = tmp_path / "perf.md"
    run_script("perf_report.py", "--train", str(train_json), "--decode", str(decode_json), "--out", str(report))
    text = report.read_text()
    for goal in ("training, rel, target tokens/s", "rel / abs", "beam-4 decoding", "flat", "MFU"):
        assert goal in text
    rel = next(r for r in train["rows"] if r["positions"] == "rel")
    assert f"{rel['tgt_tokens_per_s']:,.0f}" in text  # the measured figure, read from the JSON


def test_perf_history_probes_a_commit(tmp_path):
    corpus = word_corpus(tmp_path / "peer", sizes=(("train", 60), ("test", 5)))
    out = tmp_path / "h.json"
    run_script("perf_history.py", "HEAD", "--corpus", str(corpus), "--steps", "1", "--warmup", "0",
               "--repeats", "1", "--max-tokens", "128", "--out", str(out), "--md", str(tmp_path / "h.md"))
    (row,) = json.loads(out.read_text())["rows"]
    assert row["abs_ms"] > 0 and row["rel_ms"] > 0 and row["dec_rel"] > 0 and row["vocab"] == 14
    text = (tmp_path / "h.md").read_text()
    assert "run-to-run noise" in text and "What each change is" not in text  # HEAD is no commit it describes


def test_perf_history_describes_only_the_commits_of_its_rows():
    from tests.scripts_import import load_script

    history = load_script("perf_history")
    text = history.notes([{"commit": "8a69b0c"}, {"commit": "2104106"}])
    assert "**8a69b0c** (baseline)" in text and "the mask as a float product" in text
    assert "runtime.tune_cpu" not in text and "the last row's" not in text
    old = history.notes([{"commit": c} for c in ("4588411", "7fdfa90", "ab3191b", "2314c66")])
    assert "the padded\noutput weight)." in old and "float product" not in old and "**runtime.tune_cpu**" in old


def test_split_corpus_holds_out_by_the_fixed_rule(tmp_path):
    src = tmp_path / "corpus"
    src.mkdir()
    (src / "train.en").write_text("".join(f"e{i}\n" for i in range(45)))
    (src / "train.de").write_text("".join(f"d{i}\n" for i in range(45)))
    run_script("split_corpus.py", str(src), str(tmp_path / "out"), "--src", "en", "--tgt", "de", "--every", "20")
    lines = {f.name: f.read_text().splitlines() for f in (tmp_path / "out").iterdir()}
    assert lines["test.en"] == ["e0", "e20", "e40"] and lines["valid.en"] == ["e10", "e30"]
    assert lines["test.de"] == ["d0", "d20", "d40"] and len(lines["train.de"]) == 40
    assert lines["train.en"][:3] == ["e1", "e2", "e3"]


@pytest.mark.slow
def test_run_queue_runs_resumes_and_keeps_the_artifacts(tmp_path):
    """Two tiny toy runs, two at a time; a finished run is kept for git and skipped when run again."""
    queue = tmp_path / "q.txt"
    queue.write_text(
        f"# a test queue\nout: {tmp_path / 'runs'}\nkeep: {tmp_path / 'kept'}\n"
        f"common: model=tiny data.toy.n_train=300 data.toy.n_valid=20 data.toy.n_test=20 data.toy.n_test_long=20 "
        f"data.cache_dir={tmp_path / 'cache'} train.max_steps=3 train.eval_every=3 train.save_every=3 "
        "train.log_every=1 decode.max_len_b=5\n\n"
        "a_s1 seed=1\nb_s2 seed=2 model.positions=abs\n")
    script = str(RUN_QUEUE)
    env = {"BIN": str(Path(sys.executable).parent), "PATH": "/usr/bin:/bin"}
    first = subprocess.run(["bash", script, str(queue)], capture_output=True, text=True, cwd=ROOT, env=env)
    assert first.returncode == 0, first.stderr
    for name in ("a_s1", "b_s2"):
        kept = tmp_path / "kept" / name
        assert {p.name for p in kept.iterdir()} >= {"metrics.json", "config.yaml", "train.log", "metrics.jsonl",
                                                    "translations"}
        assert json.loads((kept / "metrics.json").read_text())["status"] == "completed"
    positions = {name: yaml.safe_load((tmp_path / "kept" / name / "config.yaml").read_text())["model"]["positions"]
                 for name in ("a_s1", "b_s2")}
    assert positions == {"a_s1": "rel", "b_s2": "abs"}  # each run's own overrides after the common ones
    again = subprocess.run(["bash", script, str(queue), "b_s2"], capture_output=True, text=True, cwd=ROOT, env=env)
    assert again.returncode == 0 and "done already: b_s2" in again.stdout and "a_s1" not in again.stdout


def test_run_queue_prepares_the_data_named_by_each_run(tmp_path):
    """A queue whose runs name their own data (scripts/reproduce/queues/length.txt): the cache is prepared
    for each run's data.dir, not for the common overrides alone (which name no folder here)."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    words = ["the cat sits", "a dog runs", "the bird sings", "two cats sleep", "one dog barks"]
    for split, n in (("train", 30), ("valid", 3), ("test", 3)):
        for lang in ("en", "de"):
            (corpus / f"{split}.{lang}").write_text("".join(words[i % 5] + "\n" for i in range(n)))
    queue = tmp_path / "q.txt"
    queue.write_text(
        f"out: {tmp_path / 'runs'}\nkeep: {tmp_path / 'kept'}\nthreads: 2\n"
        f"common: model=tiny data=text data.vocab_size=20 data.spm_model_type=word "
        f"data.cache_dir={tmp_path / 'cache'} train.max_steps=2 train.eval_every=2 train.save_every=2 "
        "decode.max_len_b=5\n"
        f"c_s1 data.dir={corpus} seed=1\n")
    env = {"BIN": str(Path(sys.executable).parent), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(["bash", str(RUN_QUEUE), str(queue)], capture_output=True,
                          text=True, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "kept" / "c_s1" / "metrics.json").read_text())["status"] == "completed"
    config = yaml.safe_load((tmp_path / "kept" / "c_s1" / "config.yaml").read_text())
    assert config["threads"] == 2  # the queue's threads: line


def test_run_queue_names_a_bad_threads_line(tmp_path):
    queue = tmp_path / "q.txt"
    queue.write_text(f"out: {tmp_path / 'runs'}\nkeep: {tmp_path / 'kept'}\nthreads: two\na_s1 seed=1\n")
    env = {"BIN": str(Path(sys.executable).parent), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(["bash", str(RUN_QUEUE), str(queue)], capture_output=True,
                          text=True, cwd=ROOT, env=env)
    assert done.returncode == 2 and f"{queue}: 'threads:' must be a positive integer, got 'two'" in done.stderr
    assert not (tmp_path / "runs" / "a_s1").exists()


def test_run_queue_passes_over_a_run_another_queue_is_running(tmp_path):
    """Two lanes may drain one queue: a run whose lock another live process holds is skipped, not run twice."""
    import fcntl

    queue = tmp_path / "q.txt"
    queue.write_text(f"out: {tmp_path / 'runs'}\nkeep: {tmp_path / 'kept'}\ncommon: model=tiny data.toy.n_train=50 "
                     f"data.toy.n_valid=5 data.toy.n_test=5 data.toy.n_test_long=5 data.cache_dir={tmp_path / 'cache'}"
                     "\na_s1 seed=1\n")
    (tmp_path / "runs").mkdir()
    env = {"BIN": str(Path(sys.executable).parent), "PATH": "/usr/bin:/bin"}
    with open(tmp_path / "runs" / "a_s1.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the other lane, training a_s1
        done = subprocess.run(["bash", str(RUN_QUEUE), str(queue)], capture_output=True,
                              text=True, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr
    assert "skipped a_s1: another queue is running it" in done.stdout and "start a_s1" not in done.stdout
    assert not (tmp_path / "runs" / "a_s1").exists()


def test_toy_corpus_writes_the_splits_the_toy_runs_translate(tmp_path):
    from relmt.data.toy import generate

    run_script("toy_corpus.py", str(tmp_path), "--n-train", "5", "--n-valid", "3", "--n-test", "4",
               "--n-test-long", "2")
    splits = generate(seed=1, n_train=5, n_valid=3, n_test=4, n_test_long=2)
    for split, pairs in splits.items():
        assert (tmp_path / f"{split}.src").read_text().splitlines() == [s for s, _ in pairs]
        assert (tmp_path / f"{split}.tgt").read_text().splitlines() == [t for _, t in pairs]


@pytest.mark.exhaustive  # 6 minutes on 2 cores (2026-11-27): outside make test's 15, in make test-exhaustive
def test_bench_peers_relmt_part_runs_and_forces_the_length(tmp_path):
    """scripts/peers/bench_peers.py with no peers: relmt-train end to end (throughput from its own log),
    relmt's decoding and relmt-export + CTranslate2 at 32 per batch, one at a time and one batch."""
    import random

    corpus = tmp_path / "scratch" / "corpus"
    corpus.mkdir(parents=True)
    rng = random.Random(0)
    words = [f"w{i}" for i in range(40)]
    for split, n in (("train", 300), ("valid", 8), ("test", 6)):
        src = [" ".join(rng.choices(words, k=rng.randint(3, 9))) for _ in range(n)]
        (corpus / f"{split}.src").write_text("\n".join(src) + "\n")
        (corpus / f"{split}.tgt").write_text("\n".join(" ".join(reversed(s.split())) for s in src) + "\n")
    out, md = tmp_path / "p.json", tmp_path / "p.md"
    run_script("bench_peers.py", "--scratch", str(tmp_path / "scratch"), "--generator", str(tmp_path / "absent.py"),
               "--peers", "--steps", "20", "--log-every", "10", "--decode-n", "6", "--latency-n", "2",
               "--length", "7", "--repeats", "1", "--threads", "1", "--json", str(out), "--md", str(md),
               "--no-compiled", "--no-aoti", "--relmt-mkl")  # compiling costs a minute per model
    # (tests/test_compiled.py and tests/test_engines.py cover compile=true and engine=aoti)
    payload = json.loads(out.read_text())
    train = [r for r in payload["results"] if r["stage"] == "train"]
    assert {(r["system"], r["positions"]) for r in train} == {("relmt", p) for p in ("abs", "rel", "rel-heads")} | {
        ("relmt-mkl", p) for p in ("abs", "rel")}
    for system, gemm in (("relmt", "onednn"), ("relmt-mkl", "mkl")):  # RELMT_CPU_GEMM reached relmt-train
        log = (tmp_path / "scratch" / "r1" / f"{system}-rel" / "bench.log").read_text()
        assert f"linear maps on the CPU: {gemm} in float32 training" in log, system
    assert all(r["tokens_per_s"] > 0 and r["gemm_gflops"] > 0 for r in train)
    decode = [r for r in payload["results"] if r["stage"] == "decode"]
    assert {r["system"] for r in decode} == {"relmt", "relmt-onnx", "ct2-relmt:float32", "ct2-relmt:int8"}  # no mkl
    # per-head tables decode with relmt's engines, and are not offered to CTranslate2
    assert {r["system"] for r in decode if r["positions"] == "rel-heads"} == {"relmt", "relmt-onnx"}
    assert {r["regime"] for r in decode} == {"batch32", "latency", "large"}
    assert all(r["mean_output_tokens"] == 7 for r in decode)  # every hypothesis forced to --length
    text = md.read_text()
    assert "| **relmt** |" in text and "training step time, relmt rel / abs" in text
    assert "| **relmt** (`engine=onnx`) |" in text and "(issue 33) one sentence at a time" in text


def test_train_floor_records_every_gemm_and_the_peer_ceiling(tmp_path):
    """scripts/bench/train_floor.py: the step's GEMMs are recorded and replayed (mm, addmm and bmm of the
    forward and backward), the other operators ranked, and the ceiling against a peer page computed from it."""
    import random

    text = tmp_path / "text"
    text.mkdir()
    rng = random.Random(0)
    words = [f"w{i}" for i in range(30)]
    for split, n in (("train", 60), ("valid", 4)):
        src = [" ".join(rng.choices(words, k=rng.randint(3, 8))) for _ in range(n)]
        (text / f"{split}.src").write_text("\n".join(src) + "\n")
        (text / f"{split}.tgt").write_text("\n".join(" ".join(reversed(s.split())) for s in src) + "\n")
    peers = tmp_path / "peers.json"
    peers.write_text(json.dumps({"summary": {"train": {"relmt/rel": [2600.0, 2600.0, 2600.0],
                                                       "onmt/rel": [2000.0, 2000.0, 2000.0],
                                                       "eole/rel": [1000.0, 1000.0, 1000.0]}}}))
    out, md = tmp_path / "f.json", tmp_path / "f.md"
    run_script("train_floor.py", "--text-dir", str(text), "--cache-dir", str(tmp_path / "cache"), "--threads", "1",
               "--warmup", "1", "--steps", "2", "--profile-steps", "1", "--positions", "rel", "--size", "tiny",
               "--peers", str(peers), "--out", str(out), "--md", str(md))
    payload = json.loads(out.read_text())
    row, mkl = payload["rows"]  # each library for the linear maps: oneDNN (relmt's default), then MKL
    assert (row["positions"], row["cpu_gemm"], mkl["positions"], mkl["cpu_gemm"]) == ("rel", "onednn", "rel", "mkl")
    for r in (row, mkl):
        assert r["gemm_floor_ms"] > 0 and r["step_ms"] > 0
        assert r["ceiling"] == pytest.approx(r["step_ms"] / r["gemm_floor_ms"])
        assert r["ops"] and not {o["op"] for o in r["ops"]} & {"aten::mm", "aten::addmm", "aten::bmm",
                                                                "mkldnn::_linear_pointwise"}
    assert payload["peers"]["peer"] == "onmt" and payload["peers"]["ratio"] == pytest.approx(1.3)
    assert f"it would be at most {1.3 * row['ceiling']:.2f}" in md.read_text()
    again = tmp_path / "again.md"
    run_script("train_floor.py", "--from-json", str(out), "--md", str(again))
    assert again.read_text() == md.read_text()


def test_bench_peers_page_without_decoding_has_the_training_columns_only():
    """--no-decode: the page keeps the training table and its goals, and claims nothing about decoding."""
    from tests.scripts_import import load_script

    bench = load_script("bench_peers")
    results = [{"stage": "train", "system": system, "positions": pos, "repeat": 1, "gemm_gflops": 200.0,
                "tokens_per_s": tps} for system, pos, tps in (("relmt", "abs", 4000.0), ("relmt", "rel", 3900.0),
                                                              ("relmt-mkl", "rel", 3300.0), ("onmt", "rel", 3000.0))]
    payload = {"command": "c", "hardware": {"cpu": "x", "cpu_count": 2, "date": "d", "git": "g"},
               "settings": {"threads": 2, "repeats": 1, "log_every": 10, "steps": 110, "decode_n": 500,
                            "length": 20, "latency_n": 100},
               "results": results, "summary": bench.summarise(results), "json": "p.json"}
    text = bench.markdown(payload)
    assert "| system | train tok/s, abs | train tok/s, rel |\n|---|---:|---:|\n" in text
    assert "| **relmt** | 4,000 | 3,900 |\n" in text and "| OpenNMT-py 3.5.1 | – | 3,000 |\n" in text
    assert "| **relmt** (`RELMT_CPU_GEMM=mkl`: MKL, torch's default CPU GEMM) | – | 3,300 |\n" in text
    # relmt's own MKL row is no peer: the ratio is against OpenNMT-py
    assert "| training, relmt rel / best relative peer | ≥ 1.3 | 1.30 | yes |" in text
    assert "decode@32" not in text and "Forced-length" not in text and "`--no-decode`" in text


def test_bench_decode_levers_runs(tmp_path):
    """speed (the levers that need no compiling; tests/test_compiled.py covers that), profile, bleu and
    processes, on an untrained tiny checkpoint."""
    from tests.tiny_checkpoints import SENTENCES, toy_tokenizer, write_checkpoint

    ckpt = write_checkpoint(tmp_path, "m.pt", toy_tokenizer(tmp_path), seed=1)
    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    src.write_text("\n".join(SENTENCES * 2) + "\n")
    ref.write_text("\n".join(reversed(SENTENCES * 2)) + "\n")
    common = ["--checkpoint", str(ckpt), "--src", str(src), "--threads", "1", "--length", "4"]
    out = tmp_path / "speed.json"
    run_script("bench_decode_levers.py", "speed", *common, "--n", "6", "--n1", "2", "--batch", "3", "--repeats", "1",
               "--variants", "eager", "int8_dynamic", "prealloc_cache", "--out", str(out))
    rows = {r["variant"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["eager"]["3/batch vs eager"] == 1.0 and rows["prealloc_cache"]["3/batch same as eager"]
    assert all(r["1 at a time"] > 0 for r in rows.values())
    run_script("bench_decode_levers.py", "profile", *common, "--n", "6", "--n1", "2", "--batch", "3",
               "--out", str(out))
    mode = json.loads(out.read_text())["modes"]["1 at a time"]
    assert mode["steps"] == 2 * 4  # 2 sentences one at a time, 4 steps each
    assert abs(mode["share_decode_step"] + mode["share_encode"] + mode["share_search"] - 1) < 1e-9
    run_script("bench_decode_levers.py", "bleu", *common, "--ref", str(ref), "--variants", "eager", "int8_dynamic",
               "--out", str(out))
    assert [r["variant"] for r in json.loads(out.read_text())["rows"]] == ["eager", "int8_dynamic"]
    run_script("bench_decode_levers.py", "processes", *common, "--n", "4", "--batch", "2", "--repeats", "1",
               "--out", str(out))
    assert json.loads(out.read_text())["ratio"] > 0


def test_perf_levers_rewrites_only_its_section_from_the_committed_measurements(tmp_path):
    log = tmp_path / "perf_log.md"
    committed = (ROOT / "docs/results/performance/perf_log.md").read_text()
    head = committed.split("\n## Issue 14 levers")[0]
    log.write_text(head + "\n\n## Issue 14 levers\n\nstale text\n")
    run_script("perf_levers.py", "--log", str(log))
    text = log.read_text()
    assert text.startswith(head) and "stale text" not in text
    section = text[len(head):]
    for lever in ("prealloc_cache", "compile_freezing", "int8_dynamic", "per-step Python overhead",
                  "1-thread processes", "training step", "in place", "oneDNN"):
        assert lever in section
    assert section.count("\n| ") == 1 + 10  # the header and one row per lever


def test_reproduction_reports_title_the_progress_of_each_queue(tmp_path):
    """scripts/reproduce/reproduction_reports.py: one report per queue with a finished run, titled with how many
    of the queue's runs are in; a queue without one leaves its report alone."""
    from tests.report_runs import SPLITS, config, hypotheses, scores, write_refs, write_run

    refs = write_refs(tmp_path / "refs")
    queues = tmp_path / "queues"
    queues.mkdir()
    for name in ("multi30k_tables", "length", "toy_converged", "multi30k_wu", "multi30k_recipe", "positions",
                 "positions_length"):
        runs = "".join(f"{p}_s1 model.positions={p} seed=1\n" for p in ("abs", "rel", "both"))
        kept = tmp_path / "kept" / name
        (queues / f"{name}.txt").write_text(f"out: {tmp_path / 'runs' / name}\nkeep: {kept}\n{runs}")
    for positions in ("abs", "rel"):  # 2 of the 3 Multi30k runs
        hyps = {s: hypotheses(s, positions, 1, refs[s]) for s in SPLITS}
        write_run(tmp_path / "kept" / "multi30k_tables" / f"{positions}_s1", config(1, positions),
                  {s: scores(hyps[s], refs[s]) for s in SPLITS}, {"bleu": 30.0}, translations=hyps)
    out = run_script("reproduction_reports.py", "--queues", str(queues), "--out", str(tmp_path / "out"),
                     "--multi30k", str(tmp_path / "refs"), "--toy-text", str(tmp_path / "toy_text"),
                     "--bootstrap-samples", "50").stdout
    assert "multi30k: 2 of 3 runs" in out and "length: no finished run" in out and "toy: no finished run" in out
    assert "multi30k_wu: no finished run" in out and "multi30k_recipe: no finished run" in out
    assert "positions: no finished run" in out and "positions_length: no finished run" in out
    md = (tmp_path / "out" / "reproduction" / "multi30k.md").read_text()
    assert md.startswith("# Shaw et al. on Multi30k EN→DE, 2 CPU cores (in progress: 2 of 3 runs)\n")
    assert "### Significance: all seeds at once, and seed by seed" in md and "50 resamples" in md
    assert not (tmp_path / "out" / "reproduction" / "length.md").exists() and not (tmp_path / "toy_text").exists()
    claims = (tmp_path / "out" / "reproduction" / "claims.md").read_text()
    assert "From: [multi30k.md](multi30k.md) (2 of 3 runs)." in claims
    assert "| [multi30k](multi30k.md) | rel ≥ abs | multi30k_text | test | **" in claims
    # --only: the named reports alone; the others' pages stay as they are and claims.md says so
    before = md
    again = run_script("reproduction_reports.py", "--queues", str(queues), "--out", str(tmp_path / "out"),
                       "--multi30k", str(tmp_path / "refs"), "--only", "positions", "length").stdout
    assert "positions: no finished run" in again and "multi30k:" not in again
    assert (tmp_path / "out" / "reproduction" / "multi30k.md").read_text() == before
    claims = (tmp_path / "out" / "reproduction" / "claims.md").read_text()
    assert "From: [multi30k.md](multi30k.md) (as committed)." in claims
    script = ROOT / "scripts" / "reproduce" / "reproduction_reports.py"
    bad = subprocess.run([sys.executable, str(script), "--queues", str(queues),
                          "--only", "positons"], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and "no report named positons" in bad.stderr


def test_claims_table_escapes_pipes_in_its_cells(tmp_path):
    """claims.md: a measured name such as "|difference|" must not split a markdown table cell."""
    from tests.scripts_import import load_script

    module = load_script("reproduction_reports")
    doc = {"groups": [{"data": "toy", "claims": [{"name": "a^K alone is about as good as both", "split": "test",
                                                  "verdict": "held", "measured": {"|difference|": 0.02}}]}]}
    (tmp_path / "reproduction").mkdir()
    (tmp_path / "reproduction" / "toy.json").write_text(json.dumps(doc))
    claims = module.write_claims(tmp_path, ["toy"], {}).read_text()
    assert ("| [toy](toy.md) | a^K alone is about as good as both | toy | test | **held** | \\|difference\\| 0.02 |"
            in claims.splitlines())


def test_gpu_report_reads_cut_off_pytest_output():
    """A suite stopped by its timeout has no summary: the report counts its progress marks instead, and
    takes the per-mode errors test_cuda.py prints."""
    from tests.scripts_import import load_script

    report = load_script("gpu_report")
    cut = "bringing up nodes...\n\n" + "." * 70 + "F. [ 50%]\n" + "..F.E\n"
    assert report.suite(cut) == {"passed": 74, "failed": 2, "errors": 1,
                                 "summary": "cut off by its timeout before pytest's summary"}
    verbose = ("[gw0] [ 10%] PASSED tests/test_a.py::test_x \n[gw1] [ 20%] FAILED tests/test_b.py::test_y[rel] \n"
               "[gw0] [ 30%] PASSED tests/test_a.py::test_z \n")
    assert report.suite(verbose) == {"passed": 2, "failed": 1, "errors": 0,
                                     "failed_tests": ["tests/test_b.py::test_y[rel]"],
                                     "summary": "cut off by its timeout before pytest's summary"}
    printed = '.abs {"logits": 0.005, "grads": 0.02}\nt5 {"logits": 0.004, "grads": 0.03, "x.table": 0.04}\n' \
              "=== 37 passed in 46.36s ===\n"
    assert report.cuda_tests(printed) == {"summary": "=== 37 passed in 46.36s ===", "bf16_errors": {
        "abs": {"logits": 0.005, "grads": 0.02}, "t5": {"logits": 0.004, "grads": 0.03, "x.table": 0.04}}}


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the resident memory from /proc")
def test_onednn_memory_trains_each_variant_and_reports_its_memory(tmp_path):
    """scripts/bench/onednn_memory.py on a tiny Multi30k-shaped folder: three relmt-train runs (caches bounded,
    unbounded, MKL), each with its environment, its speed and its resident memory sampled while it trained."""
    corpus = tmp_path / "m30k"
    corpus.mkdir()
    words = ["the cat sits", "a dog runs on grass", "the bird sings", "two cats sleep", "one dog barks loudly"]
    for split, n in (("train", 200), ("valid", 6)):
        for lang in ("en", "de"):
            (corpus / f"{split}.{lang}").write_text("".join(f"{words[i % 5]} {i % 7}\n" for i in range(n)))
    out, md = tmp_path / "m.json", tmp_path / "m.md"
    run_script("onednn_memory.py", "--data", str(corpus), "--steps", "4", "--log-every", "1", "--out", str(out),
               "--md", str(md), "--set", "data.vocab_size=40", "data.spm_model_type=word",
               f"data.cache_dir={tmp_path / 'cache'}", "train.max_padded_tokens=256", "train.warmup_steps=2")
    rows = json.loads(out.read_text())["rows"]
    assert [r["env"] for r in rows] == [{}, dict.fromkeys(("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY"),
                                                          "1024"), {"RELMT_CPU_GEMM": "mkl"}]
    assert all(r["tokens_per_s"] > 0 and r["peak_rss_mib"] > 50 and r["first_logged_update"] >= 1 for r in rows)
    assert "| MKL (RELMT_CPU_GEMM=mkl) " in md.read_text() and "data.vocab_size=40" in md.read_text()


@pytest.mark.exhaustive  # 2.5 minutes on 2 cores: make test-exhaustive (the engines' tests cover search_small)
def test_aoti_small_rows_times_each_search_graph_and_the_switch(tmp_path):
    """scripts/bench/aoti_small_rows.py on a tiny trained checkpoint: engine=aoti decodes at each batch size with
    search.pt2 alone, search_small.pt2 alone and relmt's switch at SMALL_ROWS, all with the same translations."""
    from tests.tiny_checkpoints import SENTENCES, train_tiny

    checkpoint = train_tiny(tmp_path / "run")
    src = tmp_path / "src.txt"
    src.write_text("\n".join(SENTENCES * 2) + "\n")
    out, md = tmp_path / "s.json", tmp_path / "s.md"
    run_script("aoti_small_rows.py", "--checkpoint", str(checkpoint), "--src", str(src), "--batches", "1", "4",
               "--sentences", "4", "--length", "3", "--repeats", "1", "--out", str(out), "--md", str(md))
    doc = json.loads(out.read_text())
    assert list(doc["small_rows"].values()) == [0, 1 << 30, 4] and doc["identical_translations"] is True
    assert all(v > 0 for by in doc["medians"].values() for v in by.values())
    assert "| switch at 4 rows ÷ search.pt2 alone |" in md.read_text()
