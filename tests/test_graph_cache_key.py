"""The compiled-graph cache key covers every source file that can shape a graph: each package's
Python and C++ files at any depth (sub-packages included), and nothing else."""
import importlib
from types import SimpleNamespace

from ms_atb.worker import graph_cache


def _tree(tmp_path):
    roots = {}
    for package in graph_cache._PACKAGES:
        root = tmp_path / package.replace(".", "_")
        (root / "sub" / "deeper").mkdir(parents=True)
        (root / "__init__.py").write_text("")
        (root / "sub" / "__init__.py").write_text("")
        (root / "sub" / "deeper" / "kernel.cc").write_text("int f() { return 1; }\n")
        (root / "sub" / "deeper" / "mod.py").write_text("X = 1\n")
        roots[package] = root
    return roots


def _digest(monkeypatch, roots):
    monkeypatch.setattr(importlib, "import_module",
                        lambda name: SimpleNamespace(__file__=str(roots[name] / "__init__.py")))
    return graph_cache.sources_digest()


def test_key_covers_sources_at_any_depth(tmp_path, monkeypatch):
    roots = _tree(tmp_path)
    base = _digest(monkeypatch, roots)
    assert _digest(monkeypatch, roots) == base                       # deterministic
    root = roots["ms_atb"]
    (root / "sub" / "deeper" / "mod.py").write_text("X = 2\n")
    changed_py = _digest(monkeypatch, roots)
    assert changed_py != base
    (root / "sub" / "deeper" / "kernel.cc").write_text("int f() { return 2; }\n")
    assert _digest(monkeypatch, roots) != changed_py
    # a moved file changes the key: its path is part of it
    (root / "sub" / "deeper" / "mod.py").rename(root / "sub" / "mod.py")
    assert _digest(monkeypatch, roots) not in (base, changed_py)


def test_key_ignores_what_shapes_no_graph(tmp_path, monkeypatch):
    roots = _tree(tmp_path)
    base = _digest(monkeypatch, roots)
    root = roots["ms_atb.ops"]
    (root / "notes.txt").write_text("a note\n")
    (root / "sub" / "__pycache__").mkdir()
    (root / "sub" / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"\0\1")
    (root / "sub" / "__pycache__" / "stray.py").write_text("Y = 1\n")
    assert _digest(monkeypatch, roots) == base
