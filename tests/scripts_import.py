"""scripts/NAME.py imported as a module, for the tests of what a script computes."""

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).parents[1]


def load_script(name: str) -> ModuleType:
    """scripts/<name>.py as the module `name`, registered in sys.modules (dataclasses look it up there)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
