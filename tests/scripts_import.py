"""Import a benchmark script under scripts/ (or scripts/research/) as a module, for the tests that check the scripts."""
import importlib.util
import pathlib
import sys

SCRIPTS = pathlib.Path(__file__).resolve().parent.parent / "scripts"


def load_script(name: str):
    """name: a path under scripts/ without .py, e.g. "bench_block_manager" or "research/placement_variants"."""
    path = SCRIPTS / f"{name}.py"
    for folder in (SCRIPTS, path.parent):   # the scripts import each other by name
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
