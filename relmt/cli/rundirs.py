"""The run-directory bookkeeping of `relmt-train`: what a refused command must leave as it found it
(remember, restore, remove), and the commands that resume an interrupted run or sweep, quoted for a
POSIX shell."""

from __future__ import annotations

import os


def run_dir_label(path: str) -> str:
    """The run directory as recorded in config.yaml and metrics.json: relative to the working directory
    when it lies below it (Hydra hands an absolute path), so that committed run artifacts name no
    machine's paths. Hydra does not change the working directory (hydra.job.chdir=false)."""
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


# What Hydra writes into a run directory before the task starts (rank 0; the job's log is train.log)
HYDRA_RUN_FILES = {".hydra", "train.log"}


# What the existing run directories named on the command line held before Hydra wrote into them: each
# .hydra/*.yaml's bytes and train.log's size, so that a refused command changes nothing there.
_BEFORE: dict = {}


def remember_run_dirs(argv: list[str]) -> None:
    """Note what hydra.run.dir (or each job directory of hydra.sweep.dir) holds, if it exists."""
    from pathlib import Path

    for arg in argv:
        key, _, value = arg.partition("=")
        if key not in ("hydra.run.dir", "hydra.sweep.dir") or not Path(value.strip("'\"")).is_dir():
            continue
        root = Path(value.strip("'\""))
        for run in [root, *(p for p in root.iterdir() if p.is_dir() and key == "hydra.sweep.dir")]:
            _BEFORE[run.resolve()] = {"log": (run / "train.log").stat().st_size if (run / "train.log").is_file()
                                      else None, "hydra": {f.name: f.read_bytes() for f in (run / ".hydra").glob("*")
                                                           if f.is_file()}}


def restore_run_dir(path: str) -> None:
    """Put back what Hydra wrote into an existing run directory for a command that was then refused:
    train.log cut to its old length (or removed), .hydra/ as it was."""
    from pathlib import Path

    run = Path(path)
    before = _BEFORE.get(run.resolve())
    if before is None:
        return
    log = run / "train.log"
    if before["log"] is None:
        log.unlink(missing_ok=True)
    elif log.is_file():
        os.truncate(log, before["log"])
    hydra = run / ".hydra"
    for f in hydra.glob("*") if hydra.is_dir() else []:
        if f.name not in before["hydra"]:
            f.unlink()
    for name, data in before["hydra"].items():
        (hydra / name).write_bytes(data)
    if hydra.is_dir() and not any(hydra.iterdir()):
        hydra.rmdir()


def remove_unstarted_run_dir(path: str) -> None:
    """Remove a run directory that holds nothing but what Hydra wrote before the command was
    refused, and the empty folders above it up to the working directory, so that a refused command
    leaves no new run directory behind. A directory holding
    anything else (a run's checkpoints or logs, a user's files) is left as it is."""
    import shutil
    from pathlib import Path

    run = Path(path)
    if (run / ".hydra").is_dir() and {p.name for p in run.iterdir()} <= HYDRA_RUN_FILES:
        shutil.rmtree(run, ignore_errors=True)
        # and the folders Hydra made for it (runs/<date>/), when nothing else is in them
        for parent in run.parents if not run.is_absolute() else []:
            if parent == Path(".") or any(parent.iterdir()):
                break
            parent.rmdir()


def shell_word(word: str) -> str:
    """`word` as one POSIX shell word: bare when it needs no quoting, else in double quotes when
    nothing in it is special there, else shlex's single quotes."""
    import shlex

    if shlex.quote(word) == word:
        return word
    return f'"{word}"' if not set(word) & set('"$`\\!') else shlex.quote(word)


def hydra_value(value: str) -> str:
    """A string as a Hydra override value: quoted when it holds characters Hydra's grammar reads
    (= , [ ] { } ( ) quotes spaces), as a sweep job's directory name does (model.positions=abs,...)."""
    import re

    if re.fullmatch(r"[\w./:@+-]+", value):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def resume_command(task_overrides: list[str], run_dir: str) -> str:
    """The command that continues a run: its own overrides, train.resume=true and its directory, each
    quoted so that it works pasted into a POSIX shell."""
    args = [o for o in task_overrides if not o.startswith(("train.resume=", "hydra.run.dir="))]
    return " ".join(["relmt-train", *map(shell_word, args), "train.resume=true",
                     shell_word(f"hydra.run.dir={hydra_value(run_dir)}")])


# Overrides that the resume commands set themselves (or that Hydra adds for -m)
RESUME_SETS = ("train.resume=", "hydra.run.dir=", "hydra.sweep.dir=", "hydra.mode=")


def sweep_resume_command(overrides: list[str], sweep_dir: str) -> str:
    """The command that requeues a whole -m sweep (README, Exit status): its overrides as given,
    train.resume=true and its directory. Its completed jobs are skipped, the others resume or start."""
    args = [o for o in overrides if not o.startswith(RESUME_SETS)]
    return " ".join(["relmt-train", "-m", *map(shell_word, args), "train.resume=true",
                     shell_word(f"hydra.sweep.dir={hydra_value(sweep_dir)}")])


def sweep_overrides(hydra) -> list[str]:
    """The overrides a sweep was launched with, the task's (model.positions=abs,rel) and then Hydra's
    own (hydra/launcher=parallel), from the multirun.yaml that Hydra writes into the sweep directory:
    a job's HydraConfig holds only its own point of the sweep, which is the fallback."""
    from pathlib import Path

    import yaml

    try:
        saved = yaml.safe_load((Path(str(hydra.sweep.dir)) / "multirun.yaml").read_text())["hydra"]["overrides"]
        given = [*saved["task"], *saved["hydra"]]
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        given = [*hydra.overrides.task, *hydra.overrides.hydra]
    return [str(o) for o in given if not str(o).startswith(RESUME_SETS)]


def sweep_subdir(*, _root_) -> str:
    """configs/config.yaml's hydra.sweep.subdir, `${relmt_sweep_subdir:}`: a sweep job's directory named after its
    values of the swept keys only (`model.positions=rel,seed=2`, relmt.report.runs.sweep_dirname), where Hydra's
    override_dirname names it after every override. A job's config holds only its own point of the sweep; which
    keys sweep says the sweep's multirun.yaml, which Hydra writes before it launches a job."""
    from pathlib import Path

    import yaml

    from relmt.report.runs import sweep_dirname

    hydra = _root_.hydra
    try:
        given = yaml.safe_load((Path(str(hydra.sweep.dir)) / "multirun.yaml").read_text())["hydra"]["overrides"]["task"]
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        given = None  # another sweeper or launcher: Hydra's own name
    return sweep_dirname([str(o) for o in hydra.overrides.task], given,
                         list(hydra.job.config.override_dirname.exclude_keys))


def register_resolvers() -> None:
    """The OmegaConf resolvers that configs/config.yaml names (relmt_sweep_subdir); registered by relmt-train before
    Hydra runs, and by a sweep job's process when it imports the task (the joblib launcher's workers)."""
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("relmt_sweep_subdir"):
        OmegaConf.register_new_resolver("relmt_sweep_subdir", sweep_subdir)


def resume_hint(hydra, out_dir: str) -> str:
    """What an interrupted job prints: for a job of a -m sweep, the sweep requeued; else the run
    resumed. `hydra` is the job's HydraConfig, None when _train_job is called as a function."""
    from hydra.types import RunMode

    if hydra is not None and hydra.mode == RunMode.MULTIRUN:
        return sweep_resume_command(sweep_overrides(hydra), run_dir_label(str(hydra.sweep.dir)))
    return resume_command(list(hydra.overrides.task) if hydra is not None else [], out_dir)
