"""`relmt-train` as a user runs it: artifacts, bad overrides, signals, kill -9, torchrun DDP."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from relmt import checkpoint
from relmt.cli.common import EXIT_INTERRUPTED, guarded
from relmt.cli.train import _train_job
from relmt.config import compose

RELMT_TRAIN = str(Path(sys.executable).parent / "relmt-train")
TINY = ["model=tiny", "train=debug", "data.toy.n_train=400", "data.toy.n_valid=30", "data.toy.n_test=20",
        "data.toy.n_test_long=20"]


def cli(tmp_path: Path, run: str, *overrides: str, **kw) -> subprocess.CompletedProcess:
    args = [RELMT_TRAIN, *TINY, f"data.cache_dir={tmp_path / 'cache'}", f"hydra.run.dir={tmp_path / run}",
            *overrides]
    return subprocess.run(args, capture_output=True, text=True, timeout=300, **kw)


def torchrun(tmp_path: Path, run: str, *overrides: str) -> subprocess.CompletedProcess:
    """relmt-train as `cli` runs it, on two gloo ranks under torchrun, one thread each, over the loopback interface
    (gloo otherwise takes the address the host name resolves to, which a sandbox may not route). A rank that waits
    in a collective gives up after train.dist_timeout_minutes=3 with gloo's message naming it, and a run that
    still does not end fails with the tail of its log: a hang says where it hangs (one did once in CI, silently)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", PYTHONFAULTHANDLER="1")
    args = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", RELMT_TRAIN,
            *TINY, f"data.cache_dir={tmp_path / 'cache'}", f"hydra.run.dir={tmp_path / run}",
            "train.dist_timeout_minutes=3", *overrides]
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=420, env=env)
    except subprocess.TimeoutExpired as e:
        tails = [(x.decode(errors="replace") if isinstance(x, bytes) else x or "")[-3000:]
                 for x in (e.stdout, e.stderr)]
        pytest.fail(f"torchrun did not end in 420 s\nstdout tail:\n{tails[0]}\nstderr tail:\n{tails[1]}")


def start(tmp_path: Path, run: str, *overrides: str) -> subprocess.Popen:
    args = [RELMT_TRAIN, *TINY, f"data.cache_dir={tmp_path / 'cache'}", f"hydra.run.dir={tmp_path / run}",
            "train.valid_bleu=false", *overrides]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(predicate, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc.poll() is not None:
            raise AssertionError(f"training exited early: {proc.communicate()}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("timed out")
        time.sleep(0.05)


def logged_steps(run: Path) -> list[int]:
    path = run / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line)["step"] for line in path.read_text().splitlines()
            if line.endswith("}") and '"tag": "train"' in line]


def test_cli_run_writes_the_run_directory_and_prints_bleu(tmp_path):
    done = cli(tmp_path, "run")
    assert done.returncode == 0, done.stderr
    run = tmp_path / "run"
    for name in ("config.yaml", "train.log", ".hydra/overrides.yaml", "metrics.json", "tb",
                 "checkpoints/last.pt", "checkpoints/best.pt"):
        assert (run / name).exists(), name
    resolved = yaml.safe_load((run / "config.yaml").read_text())  # the resolved config, under today's names
    assert resolved["model"]["positions"] == "rel"
    assert resolved["train"]["max_padded_tokens"] == 512 and resolved["train"]["peak_lr"] == 0.002
    assert resolved["train"]["test_checkpoint"] == "best" and not {"lr", "max_tokens"} & resolved["train"].keys()
    assert "step 6 | valid loss" in (run / "train.log").read_text()
    assert f"run directory: {run}" in done.stdout
    assert "test: BLEU" in done.stdout and "test_long: BLEU" in done.stdout


@pytest.mark.parametrize("override,message", [
    ("model.positions=relative", "model.positions=relative: not a valid value (did you mean rel?); the values are "
                                 "abs, rel, both, none, rope, alibi, t5"),
    ("train.nonsense=3", "train.nonsense: no such key in train"),
    ("train.max_step=100", "train.max_step: no such key in train (did you mean train.max_steps?)"),
    ("trian.max_steps=100", "trian.max_steps: no such key (did you mean train.max_steps?)"),
    ("train.max_steps=-1", "train.max_steps: must be >= 0"),
    ("model.max_relative_position=-2", "model.max_relative_position: k must be >= 0"),
    ("data=nope", "data=nope: no such config; the data configs (configs/data/) are europarl_split, "
                  "mix_m30k_europarl, multi30k,"),
    ("data.corpora.0.wieght=2", "data.corpora.0.wieght: no such key in data.corpora.0 (did you mean "
                                "data.corpora.0.weight?)"),
    ("data.corpora.1.weight=heavy", "data.corpora.1.weight=heavy: must be a number"),
    ("model=tinny", "model=tinny: no such config (did you mean tiny?); the model configs (configs/model/) are base,"),
    ("train.lr=0.1", "train.lr was renamed: use train.noam_scale under lr_schedule=noam, train.peak_lr under"),
    ("train.max_tokens=512", "train.max_tokens was renamed: use train.max_padded_tokens"),
    ("train.num_threads=1", "train.num_threads was renamed: use threads (one name for every command"),
    ("threads=-1", "threads: must be >= 0"),
    # OmegaConf's own words, with exit 1, were "Value '6/8' of type 'str' could not be converted to Integer"
    ("train.update_freq=6/8", "train.update_freq=6/8: must be an integer"),
    ("decode.lenpen=high", "decode.lenpen=high: must be a number"),
    ("train.valid_bleu=maybe", "train.valid_bleu=maybe: must be true or false"),
])
def test_bad_overrides_fail_with_a_clear_message(tmp_path, override, message):
    """Bad input exits 2 (the README's status), with one message naming the nearest valid key, config or
    value, printed once; Hydra's advice for a typo, +key=, would add a key relmt never reads."""
    done = cli(tmp_path, "bad", override)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and done.stderr.count(message) == 1
    assert "Traceback" not in done.stderr and "+train" not in done.stderr


def test_a_refused_command_changes_nothing_in_an_existing_run_and_says_it_once(tmp_path):
    """A command refused before training starts (a bad data.dir, a run that exists without resume, beam=0)
    leaves train.log, .hydra/ and config.yaml as they were, and prints its error once."""
    run = tmp_path / "run"
    assert cli(tmp_path, "run").returncode == 0
    files = ["train.log", "config.yaml", *(f".hydra/{f.name}" for f in (run / ".hydra").iterdir())]
    before = {name: (run / name).read_bytes() for name in files}
    for overrides, message in ((["data=text", "data.dir=/no/such/dir", "train.resume=true"], "cannot resume with"),
                               (["seed=7"], "already holds a run"), (["decode.beam=0"], "decode.beam: must be >= 1")):
        done = cli(tmp_path, "run", *overrides)
        assert done.returncode == 2
        assert done.stderr.count(message) == 1, done.stderr
        assert {name: (run / name).read_bytes() for name in files} == before, overrides
    assert not (tmp_path / "fresh").exists() and cli(tmp_path, "fresh", "decode.beam=0").returncode == 2
    assert not (tmp_path / "fresh").exists()  # a new run directory is not left behind


def test_progress_and_an_eta_show_after_ten_updates(tmp_path):
    """A run whose first log_every is far off says how fast it goes after 10 updates, with an ETA."""
    done = cli(tmp_path, "run", "train.max_steps=12", "train.log_every=50", "train.eval_every=12",
               "train.valid_bleu=false")
    assert done.returncode == 0, done.stderr
    lines = (tmp_path / "run" / "train.log").read_text().splitlines()
    early = [line for line in lines if "step 10 | first 10 updates:" in line]
    assert len(early) == 1 and re.search(r"\d+ tgt tok/s, [\d.]+ s per update \| ETA \d+s$", early[0]), early


def test_an_interrupted_sweep_requeued_resumes_starts_and_skips_its_jobs(tmp_path):
    """SIGINT in the first job of a two-job sweep exits 3 and prints the command that requeues the sweep,
    which works pasted into a shell; the sweep requeued with train.resume=true resumes the first job, starts
    the second (which never started) from scratch, and requeued once more skips both."""
    sweep = tmp_path / "sweep"
    base = [RELMT_TRAIN, "-m", *TINY, f"data.cache_dir={tmp_path / 'cache'}", f"hydra.sweep.dir={sweep}",
            "train.max_steps=40", "train.valid_bleu=false", "model.positions=abs,rel"]

    def jobs() -> list[Path]:
        return sorted(p for p in sweep.iterdir() if p.is_dir()) if sweep.is_dir() else []

    proc = subprocess.Popen(base, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: bool(jobs()) and len(logged_steps(jobs()[0])) >= 8, proc)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == EXIT_INTERRUPTED, err
    assert len(jobs()) == 1
    hint = next(line for line in err.splitlines() if "resume with: " in line).split("resume with: ")[1]
    # the sweep requeued (issue 42 §5), with the overrides as given, not the job's own point
    assert hint.startswith("relmt-train -m ") and "model.positions=abs,rel" in hint, hint
    assert hint.endswith(f"train.resume=true hydra.sweep.dir={sweep}") and "hydra.run.dir" not in hint, hint

    done = subprocess.run([*base, "train.resume=true"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    first, second = jobs()
    assert "resumed from" in (first / "train.log").read_text()
    assert "no checkpoint in" in (second / "train.log").read_text()
    assert "so the run starts from scratch" in (second / "train.log").read_text()
    for job in (first, second):
        metrics = json.loads((job / "metrics.json").read_text())
        assert metrics["status"] == "completed" and metrics["steps"] == 40

    again = subprocess.run([*base, "train.resume=true"], capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    for job in (first, second):
        assert (job / "train.log").read_text().count("already completed (metrics.json)") == 1
    pasted = subprocess.run(["bash", "-c", hint.replace("relmt-train", RELMT_TRAIN, 1)], capture_output=True,
                            text=True, timeout=300)
    assert pasted.returncode == 0, pasted.stderr
    for job in (first, second):
        assert (job / "train.log").read_text().count("already completed (metrics.json)") == 2


def test_resume_without_the_run_directory_says_how_to_give_it(tmp_path):
    done = subprocess.run([RELMT_TRAIN, *TINY, f"data.cache_dir={tmp_path / 'cache'}", "train.resume=true"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 2
    assert "train.resume=true needs the run's directory, and none was given" in done.stderr
    assert "add hydra.run.dir=<the run's directory>" in done.stderr and not (tmp_path / "runs").exists()


def test_eta_and_durations():
    from relmt.train.loop import duration, eta

    assert (duration(9.4), duration(250), duration(7500)) == ("9s", "4m10s", "2h05m")
    assert eta(110, 100, 1000, 20.0) == " | ETA 29m40s"  # 2 s per update, 890 to go
    assert eta(10, 0, 0, 5.0) == "" and eta(100, 100, 1000, 0.0) == ""


def test_sweep_overrides_are_checked_value_by_value():
    from relmt.cli.train import check_overrides

    assert check_overrides(["-m", "model.positions=abs,rel,rope", "model=tiny,toy", "data.splits.extra=x",
                            "train.patience=null", "hydra.sweep.dir=x", "+foo=1", "train.update_freq=1,2",
                            "decode.lenpen=1e-1,2", "train.max_steps=range(1,3)", "train.valid_bleu=false",
                            "train.warmup_steps=${train.eval_every}"]) == []
    assert check_overrides(["-m", "train.update_freq=1,6/8"]) == ["train.update_freq=6/8: must be an integer"]
    assert check_overrides(["model.positions=abs,relativ", "model=tiny,tinny"]) == [
        "model.positions=relativ: not a valid value (did you mean rel?); the values are abs, rel, both, none, rope, "
        "alibi, t5",
        "model=tinny: no such config (did you mean tiny?); the model configs (configs/model/) are base, big, mmt_tiny, "
        "small, tiny, toy"]


# --- issue 74 §4.5: sweep directories and the report's run cells named after the swept keys only ------------

def test_a_sweep_job_directory_is_named_after_the_swept_overrides_only():
    """Hydra's override_dirname names a job after every override (170 characters for a sweep of two
    values); the job's point on the swept keys (a,b / range / choice / glob / interval) is what tells
    the jobs apart. Excluded keys stay out; a sweep of nothing keeps Hydra's name."""
    from relmt.report.runs import sweep_dirname, swept_keys

    given = ["model=tiny", "train=debug", "data.cache_dir=/tmp/c", "data.toy.n_train=400", "train.max_steps=1",
             "model.positions=abs,rel", "seed=range(1,3)", "decode.lenpen=choice(0.6,1.0)", "data.dir='a,b'",
             "train.freeze=[x,y]", "+model.extra=glob(*)", "train.peak_lr=interval(0.001,0.01)",
             "train.resume=true,false"]
    assert swept_keys(given) == {"model.positions", "seed", "decode.lenpen", "model.extra", "train.peak_lr",
                                 "train.resume"}
    job = ["model=tiny", "train=debug", "data.cache_dir=/tmp/c", "data.toy.n_train=400", "train.max_steps=1",
           "model.positions=rel", "seed=2", "decode.lenpen=0.6", "data.dir='a,b'", "train.freeze=[x,y]",
           "+model.extra=a", "train.peak_lr=0.005", "train.resume=true"]
    exclude = ["train.resume", "train.overwrite", "train.progress", "data.cache_dir", "data.num_proc"]
    assert sweep_dirname(job, given, exclude) == ("+model.extra=a,decode.lenpen=0.6,model.positions=rel,seed=2,"
                                                  "train.peak_lr=0.005")
    assert sweep_dirname(["model.positions=rel", "seed=2", "train.max_steps=1"], ["model.positions=abs,rel",
                         "seed=1,2", "train.max_steps=1"], exclude) == "model.positions=rel,seed=2"
    # nothing swept (relmt-train -m seed=1), or the sweep's overrides unknown: Hydra's override_dirname
    assert sweep_dirname(["train.max_steps=1", "data.cache_dir=/c"], ["train.max_steps=1", "data.cache_dir=/c"],
                         exclude) == "train.max_steps=1"
    assert sweep_dirname(["seed=2", "model=tiny"], None, exclude) == "model=tiny,seed=2"


@pytest.mark.slow
def test_a_sweeps_job_directories_and_report_cells_name_the_swept_keys(tmp_path, capsys):
    """relmt-train -m with many overrides and one swept key: each job directory is `model.positions=abs` and
    `model.positions=rel` (configs/config.yaml's hydra.sweep.subdir), and relmt-report names their rows so, also
    for a sweep made before issue 74, whose job directories carry every override."""
    from relmt.cli.report import main as report

    sweep = tmp_path / "sweep"
    done = subprocess.run([RELMT_TRAIN, "-m", *TINY, "data.toy.n_test=4", "data.toy.n_test_long=4",
                           f"data.cache_dir={tmp_path / 'cache'}", f"hydra.sweep.dir={sweep}", "train.max_steps=1",
                           "train.valid_bleu=false", "threads=1", "model.positions=abs,rel"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir()) == ["model.positions=abs", "model.positions=rel"]
    for job in ("abs", "rel"):
        metrics = json.loads((sweep / f"model.positions={job}" / "metrics.json").read_text())
        assert metrics["status"] == "completed"
    # a sweep of before: its job directory named after every override (Hydra's override_dirname)
    old = yaml.safe_load((sweep / "model.positions=abs/.hydra/hydra.yaml").read_text())["hydra"]["job"]
    assert len(old["override_dirname"]) > 100, old["override_dirname"]
    (sweep / "model.positions=abs").rename(sweep / old["override_dirname"])
    assert report([str(sweep), f"out={tmp_path / 'report'}", "name=sweep", "kind=runs"]) == 0
    capsys.readouterr()
    table = (tmp_path / "report/sweep.md").read_text()
    assert "| model.positions=abs |" in table and "| model.positions=rel |" in table, table
    assert "train.max_steps=1" not in table, table


def test_sigterm_finishes_the_step_saves_and_exits_with_the_interrupted_status(tmp_path):
    proc = start(tmp_path, "run", "train.max_steps=100000", "train.save_every=100000", "train.eval_every=100000")
    run = tmp_path / "run"
    wait_for(lambda: len(logged_steps(run)) >= 3, proc)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == EXIT_INTERRUPTED == 3, err  # non-zero: a scheduler requeues the job
    ck = checkpoint.load(run / "checkpoints/last.pt")
    assert ck["step"] == max(logged_steps(run))  # nothing after the last finished update is lost
    assert json.loads((run / "metrics.json").read_text())["status"] == "interrupted"
    assert "stopped by SIGTERM" in (run / "train.log").read_text()
    assert "train.resume=true" in (run / "train.log").read_text()


def test_kill_9_then_resume_loses_at_most_one_save_interval(tmp_path):
    save_every = 5
    proc = start(tmp_path, "run", "train.max_steps=60", f"train.save_every={save_every}",
                 "train.eval_every=100000")
    run = tmp_path / "run"
    wait_for(lambda: (run / "checkpoints/step_10.pt").exists(), proc)
    proc.kill()  # SIGKILL: no handler runs
    proc.wait()
    killed_at = max(logged_steps(run))
    saved = checkpoint.load(run / "checkpoints/last.pt")["step"]
    assert killed_at - saved < save_every
    done = cli(tmp_path, "run", "train.max_steps=60", f"train.save_every={save_every}", "train.eval_every=100000",
               "train.valid_bleu=false", "train.resume=true")
    assert done.returncode == 0, done.stderr
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["status"] == "completed" and metrics["steps"] == 60
    assert f"resumed from {run / 'checkpoints/last.pt'} at step {saved}" in (run / "train.log").read_text()
    assert logged_steps(run) == list(range(1, 61))  # the steps after the last save are logged once


def job_config(tmp_path: Path):
    from omegaconf import OmegaConf

    cfg = compose([*TINY, f"data.cache_dir={tmp_path / 'cache'}"])
    cfg.out_dir = str(tmp_path)
    return OmegaConf.structured(cfg)


@pytest.mark.parametrize("outcome", ["second signal", "first signal"])
def test_an_interrupted_run_exits_with_the_interrupted_status(tmp_path, monkeypatch, capsys, outcome):
    def interrupted_train(cfg):
        if outcome == "second signal":
            raise KeyboardInterrupt("a second signal (SIGINT): stopped at once, without saving")
        return {"status": "interrupted", "best": {"value": None}}

    monkeypatch.setattr("relmt.train.loop.train", interrupted_train)
    with pytest.raises(SystemExit) as exited:
        try:
            _train_job(job_config(tmp_path))
        except KeyboardInterrupt:  # would stop the whole pytest session
            pytest.fail("KeyboardInterrupt escaped _train_job")
    assert exited.value.code == EXIT_INTERRUPTED
    if outcome == "second signal":
        assert "relmt-train: interrupted: a second signal (SIGINT)" in capsys.readouterr().err


def test_ctrl_c_in_other_commands_exits_with_the_interrupted_status(capsys):
    def command(argv):
        raise KeyboardInterrupt

    try:
        code = guarded("relmt-average", command, [])
    except KeyboardInterrupt:  # would stop the whole pytest session
        pytest.fail("KeyboardInterrupt escaped guarded")
    assert code == EXIT_INTERRUPTED
    assert capsys.readouterr().err == "relmt-average: interrupted\n"


@pytest.mark.slow
def test_ddp_two_gloo_ranks_match_one_process_with_the_same_global_batch(tmp_path):
    common = ["model.dropout=0", "model.attention_dropout=0", "model.activation_dropout=0", "train.max_steps=6",
              "train.valid_bleu=false", "train.device=cpu"]
    single = cli(tmp_path, "single", *common, "train.update_freq=2")
    assert single.returncode == 0, single.stderr
    ddp = torchrun(tmp_path, "ddp", *common)
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    metrics = json.loads((tmp_path / "ddp/metrics.json").read_text())
    assert metrics["ddp_params_in_sync"] is True
    a = checkpoint.load(tmp_path / "single/checkpoints/last.pt")["model"]
    b = checkpoint.load(tmp_path / "ddp/checkpoints/last.pt")["model"]
    for key in a:
        # Adam divides by sqrt(v) + 1e-9, so rounding-level gradients (rarely seen embedding rows)
        # move by up to lr x rounding ratio; 1e-4 still catches any real difference in the update.
        torch.testing.assert_close(a[key], b[key], rtol=1e-4, atol=1e-4, msg=key)
    losses = [[json.loads(line) for line in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]
              for run in ("single", "ddp")]
    la = [r["loss"] for r in losses[0] if r["tag"] == "train"]
    lb = [r["loss"] for r in losses[1] if r["tag"] == "train"]
    assert la == pytest.approx(lb, rel=1e-4)


@pytest.mark.slow
def test_ddp_with_two_corpora_and_sampled_pieces_trains_every_rank_on_rank_0s_pieces(tmp_path):
    """Subword regularisation under DDP: rank 0 samples an epoch's pieces and stores them, and rank 1 reads them
    (sentencepiece would sample other pieces in its own process). Given the pieces a one-process run stored, the
    two ranks equal that run with the same global batch; the mix is counted over both ranks."""
    corpora = ("data.source=corpora", "data.spm_model_type=bpe", "data.vocab_size=300", "data.spm_alpha=0.2",
               "data.corpora=[{name: a, source: toy, toy: {seed: 1, n_train: 300, n_valid: 20, n_test: 0, "
               "n_test_long: 0}, weight: 3}, {name: b, source: toy, toy: {seed: 2, n_train: 100, n_valid: 10, "
               "n_test: 0, n_test_long: 0}, weight: 1}]")
    common = ["model.dropout=0", "model.attention_dropout=0", "model.activation_dropout=0", "train.max_steps=4",
              "train.valid_bleu=false", "train.device=cpu", "train.log_every=2", *corpora]
    single = cli(tmp_path, "single", *common, "train.update_freq=2")
    assert single.returncode == 0, single.stderr
    assert (tmp_path / "single/pieces/epoch_0.npz").is_file()  # 4 updates of 2 batches: within epoch 0
    shutil.copytree(tmp_path / "single/pieces", tmp_path / "ddp/pieces")
    ddp = torchrun(tmp_path, "ddp", *common)
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    metrics = json.loads((tmp_path / "ddp/metrics.json").read_text())
    assert metrics["ddp_params_in_sync"] is True
    assert metrics["mix"] == json.loads((tmp_path / "single/metrics.json").read_text())["mix"]  # summed over ranks
    a = checkpoint.load(tmp_path / "single/checkpoints/last.pt")["model"]
    b = checkpoint.load(tmp_path / "ddp/checkpoints/last.pt")["model"]
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-4, atol=1e-4, msg=key)


def test_run_directories_below_the_working_directory_are_recorded_relative(tmp_path, monkeypatch):
    """Committed run artifacts (config.yaml's out_dir, metrics.json's run_dir) name no machine's paths."""
    from relmt.cli.rundirs import run_dir_label

    monkeypatch.chdir(tmp_path)
    assert run_dir_label(str(tmp_path / "runs" / "a")) == os.path.join("runs", "a")
    elsewhere = str(tmp_path.parent / "other")
    assert run_dir_label(elsewhere) == elsewhere


def test_a_corpus_past_the_lists_end_exits_2_with_how_to_add_one(tmp_path):
    """Issue 69 §2.14: data.corpora.2.weight=3 on a two-corpus preset exited 1 with OmegaConf's "dict is not a
    subclass of CorpusConfig"; it is a user error, and the message says how to add a corpus."""
    done = cli(tmp_path, "run", "data=mix_m30k_europarl", "data.corpora.2.weight=3")
    assert done.returncode == 2, done.stderr
    assert "write the list in a data YAML of your own" in done.stderr
