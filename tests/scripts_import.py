"""scripts/[GROUP/]NAME.py imported as a module, for the tests of what a script computes."""

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).parents[1]


def script_file(name: str) -> Path:
    """scripts/<name>.py, or scripts/<group>/<name>.py (issue 45 grouped scripts/ by job)."""
    top = ROOT / "scripts" / f"{name}.py"
    return top if top.is_file() else next((ROOT / "scripts").glob(f"*/{name}.py"))


def load_script(name: str) -> ModuleType:
    """scripts/<name>.py as the module `name`, registered in sys.modules (dataclasses look it up there)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, script_file(name))
    module = sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
