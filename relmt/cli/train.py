"""`relmt-train`: the Hydra entry point (runs and -m sweeps), its checks of the command line before
Hydra sees it, and the task that turns the composed config into a training run."""

from __future__ import annotations

import logging
import os
import re
import sys

from relmt.cli.common import EXIT_INTERRUPTED, EXIT_USER_ERROR, closest, format_error
from relmt.cli.rundirs import (
    register_resolvers,
    remember_run_dirs,
    remove_unstarted_run_dir,
    restore_run_dir,
    resume_hint,
    run_dir_label,
)
from relmt.errors import UserError

register_resolvers()  # here, not only in main: a joblib sweep job's process imports this module, not main's


def log_to_file(level: int, message: str) -> None:
    """`message` into the run's train.log only: the terminal gets it once, from the caller's print."""
    logger = logging.getLogger("relmt")
    record = logger.makeRecord(logger.name, level, __file__, 0, message, None, None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)


def _train_job(dcfg) -> float | None:
    """The Hydra task: typed config in, metrics out. Returns the best validation figure, so that
    Hydra sweepers can optimise it. Exits EXIT_USER_ERROR on bad input and EXIT_INTERRUPTED when a
    signal stopped the run (which also ends a sweep: the user asked to stop). The loop writes
    config.yaml once it accepts the run, so a refused command leaves the run directory as it was."""
    import datasets
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from relmt.config import to_config
    from relmt.train.loop import train as train_loop

    datasets.disable_progress_bars()
    hydra = HydraConfig.get() if HydraConfig.initialized() else None  # None: called as a function (tests)
    out_dir = dcfg.out_dir or run_dir_label(hydra.runtime.output_dir)
    try:
        cfg = to_config(dcfg)
        cfg.out_dir = out_dir
        if cfg.train.resume and hydra is not None and hydra.mode == RunMode.RUN and not any(
                o.startswith("hydra.run.dir=") for o in hydra.overrides.hydra):
            raise UserError(f"train.resume=true needs the run's directory, and none was given (Hydra made a new "
                            f"one, {out_dir}): add hydra.run.dir=<the run's directory>, e.g. "
                            "hydra.run.dir=runs/2026-11-22/10-00-00")
        metrics = train_loop(cfg)
    except (UserError, ValueError) as e:
        log_to_file(logging.ERROR, format_error(e))
        print(f"relmt-train: error: {format_error(e)}", file=sys.stderr)
        if int(os.environ.get("RANK", "0")) == 0:
            logging.shutdown()  # train.log closed before it is cut back
            restore_run_dir(out_dir)
            remove_unstarted_run_dir(out_dir)
        sys.exit(EXIT_USER_ERROR)
    except KeyboardInterrupt as e:  # a second SIGINT/SIGTERM, or Ctrl-C before the loop started
        message = f"relmt-train: interrupted: {str(e) or 'Ctrl-C'}; the checkpoints saved so far are kept"
        log_to_file(logging.WARNING, message)
        print(message, file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)
    if metrics["status"] == "interrupted":
        message = f"relmt-train: interrupted; resume with: {resume_hint(hydra, out_dir)}"
        log_to_file(logging.WARNING, message)
        print(message, file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)
    if metrics["status"] == "completed" and int(os.environ.get("RANK", "0")) == 0:
        print(f"run directory: {metrics['run_dir']}")
        for split, result in metrics.get("test", {}).items():
            print(f"{split}: BLEU {result['bleu']:.2f} ({result['sentences']} sentences; {result['signature']})")
    return metrics["best"]["value"]


def sweep_values(value: str) -> list[str]:
    """The values of a Hydra override: `a,b` sweeps both; a list ([1,2]), a quoted string or a sweep
    function (range(...)) is taken as one value."""
    if value[:1] in "[{'\"" or "(" in value:
        return [value]
    return value.split(",")


def check_overrides(argv: list[str]) -> list[str]:
    """What is wrong with the command line's key=value overrides, as messages naming the nearest valid
    key, config or value: a key that is not in relmt.config's schema, a config group option with no
    configs/<group>/<name>.yaml, or a value that is not one of a field's enum values. Hydra reports
    these with status 1, and for a key typo advises `+key=`, which adds a key relmt would not read."""
    import dataclasses
    import enum
    import types
    import typing

    from relmt.config import Config, config_dir

    groups = {d.name: sorted(f.stem for f in d.glob("*.yaml")) for d in config_dir().iterdir()
              if d.is_dir() and d.name != "hydra"}
    problems = []
    for arg in argv:
        key, eq, value = arg.partition("=")
        if not eq or key.startswith(("-", "+", "~", "hydra")) or "@" in key:  # -m, additions, deletions,
            continue  # Hydra's own keys and package overrides (group@pkg=option) are Hydra's to check
        if key in groups:
            for name in sweep_values(value):
                if name not in groups[key] and "(" not in name:
                    problems.append(f"{key}={name}: no such config{closest(name, groups[key])}; the {key} "
                                    f"configs (configs/{key}/) are {', '.join(groups[key])}")
            continue
        kind, path, parts = Config, [], key.split(".")
        for i, part in enumerate(parts):
            if typing.get_origin(kind) is dict:  # data.splits.<any name>
                kind = typing.get_args(kind)[1]
                path.append(part)
                continue
            if typing.get_origin(kind) is list and part.isdigit():  # data.corpora.<index>
                kind = typing.get_args(kind)[0]
                path.append(part)
                continue
            fields = typing.get_type_hints(kind) if dataclasses.is_dataclass(kind) else {}
            if part not in fields:
                near = closest(part, list(fields)).removeprefix(" (did you mean ").removesuffix("?)")
                hint = f" (did you mean {'.'.join([*path, near, *parts[i + 1:]])}?)" if near else ""
                where = " in " + ".".join(path) if path else ""
                problems.append(f"{key}: no such key{where}{hint}")
                break
            kind = fields[part]
            path.append(part)
        else:
            if typing.get_origin(kind) in (typing.Union, types.UnionType):  # X | None
                kind = next(a for a in typing.get_args(kind) if a is not type(None))
            if isinstance(kind, type) and issubclass(kind, enum.Enum):
                allowed = [e.value for e in kind]
                for name in sweep_values(value):
                    if name not in allowed and name != "null" and "(" not in name:
                        problems.append(f"{key}={name}: not a valid value{closest(name, allowed)}; the values are "
                                        f"{', '.join(allowed)}")
            elif kind in SCALARS:
                problems += [f"{key}={name}: {SCALARS[kind]}" for name in sweep_values(value)
                             if not scalar_ok(kind, name)]
    return problems


# what a scalar field's value must be, in the words of the error (OmegaConf's own says "Value '6/8' of type
# 'str' could not be converted to Integer", and Hydra exits 1 with it)
SCALARS = {int: "must be an integer", float: "must be a number", bool: "must be true or false"}


def scalar_ok(kind: type, value: str) -> bool:
    """Whether OmegaConf takes `value` (one value of an override, as Hydra parses it) for a field of
    type `kind`: null, interpolations and sweep functions are Hydra's and OmegaConf's to judge."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import BooleanNode, FloatNode, IntegerNode
    from omegaconf.errors import ValidationError

    if "(" in value or "${" in value:
        return True
    try:
        parsed = OverridesParser.create().parse_override(f"key={value}").value()
    except Exception:  # Hydra's grammar refuses it, and says why in its own words
        return True
    try:
        {int: IntegerNode, float: FloatNode, bool: BooleanNode}[kind](parsed)
    except ValidationError:
        return False
    return True


def renamed_overrides(argv: list[str]) -> list[str]:
    """For each key=value of `argv` whose key was renamed (relmt.config.RENAMED_KEYS), what to use
    instead: Hydra alone would only say that the old key is not in the schema."""
    from relmt.config import RENAMED_KEYS

    keys = [a.split("=", 1)[0].lstrip("+~") for a in argv if "=" in a]
    return [f"{key} was renamed: use {RENAMED_KEYS[key]}" for key in keys if key in RENAMED_KEYS]


def main() -> None:
    """Console script `relmt-train` (Hydra: `relmt-train model=base data=... train.max_steps=...`,
    sweeps with `-m`)."""
    import hydra

    from relmt.config import config_dir, register_configs

    problems = renamed_overrides(sys.argv[1:]) or check_overrides(sys.argv[1:])
    if problems:
        print(f"relmt-train: error: {'; '.join(problems)}", file=sys.stderr)
        sys.exit(EXIT_USER_ERROR)
    register_configs()
    if any(re.match(r"data\.corpora\.\d+\.", a) for a in sys.argv[1:]):  # a corpus the list may not hold
        from relmt.config import compose

        try:
            compose([a for a in sys.argv[1:] if "=" in a and not a.startswith(("hydra", "-"))])
        except Exception as e:  # noqa: BLE001 -- only the list's own error is said here; Hydra says the rest
            if "is not a subclass of CorpusConfig" in format_error(e):
                print(f"relmt-train: error: {format_error(e)}", file=sys.stderr)
                sys.exit(EXIT_USER_ERROR)
    remember_run_dirs(sys.argv[1:])
    register_resolvers()  # hydra.sweep.subdir's ${relmt_sweep_subdir:}
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # under torchrun: one run directory for all ranks
        if not any(a.startswith("hydra.run.dir=") for a in sys.argv[1:]):
            sys.argv.append(f"hydra.run.dir=runs/ddp-{os.environ.get('TORCHELASTIC_RUN_ID', 'run')}")
        if int(os.environ.get("RANK", "0")) > 0:
            sys.argv += ["hydra.output_subdir=null", "hydra/job_logging=stdout"]
    app = hydra.main(config_path=str(config_dir()), config_name="config", version_base="1.3")(_train_job)
    app()
