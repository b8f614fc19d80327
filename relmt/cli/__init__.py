"""The command-line entry points: one module per command (fairseq_cli's layout), each with a `main`
that pyproject.toml's [project.scripts] names. With relmt/config.py, the only code that knows Hydra.

Each command composes configs/ with the user's overrides (train, prepare) or parses key=value
arguments against a small dataclass (the others), and hands typed values to plain functions. Errors
in the user's input (a bad key or value, a missing file) are printed as one message naming the key,
file or line, with no traceback. Shared: common.py (usage, the guard, exit statuses, argument
parsing) and rundirs.py (what relmt-train keeps of a run directory and how a run resumes).
"""
