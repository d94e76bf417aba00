"""The house rules of the layout (docs/design.md): ms_atb.core never imports MindSpore; no import
circle among the project's modules, counting imports inside functions and under TYPE_CHECKING;
models know no engine types; kernels know no model; no module imports another's private names."""
import ast
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# installed package -> folder (setup.cfg's package_dir)
_ROOTS = {"ms_atb": "ms_atb", "ms_atb.models": "models", "ms_atb.ops": "ops"}


def _modules() -> dict[str, str]:
    """Every project module name -> its file, sub-packages at any depth included."""
    found = {}
    for package, folder in _ROOTS.items():
        base = os.path.join(ROOT, folder)
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = [d for d in dirnames if os.path.isfile(os.path.join(dirpath, d, "__init__.py"))]
            rel = os.path.relpath(dirpath, base)
            prefix = package if rel == "." else package + "." + rel.replace(os.sep, ".")
            if package == "ms_atb" and prefix.split(".")[1:2] in (["models"], ["ops"]):
                continue
            for name in filenames:
                if name.endswith(".py"):
                    mod = prefix if name == "__init__.py" else f"{prefix}.{name[:-3]}"
                    found[mod] = os.path.join(dirpath, name)
    return found


MODULES = _modules()


def _imports(module: str, path: str):
    """(imported project module, imported names, line) for every import statement anywhere in the file."""
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _project_module(alias.name)
                if target:
                    yield target, [], node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in MODULES:
                    yield sub, [], node.lineno
                elif _project_module(base):
                    yield _project_module(base), [alias.name], node.lineno


def _project_module(name: str) -> str | None:
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def _graph() -> dict[str, set[str]]:
    return {m: {t for t, _, _ in _imports(m, p) if t != m} for m, p in MODULES.items()}


def test_the_layout_is_found():
    for name in ("ms_atb.core.block_manager", "ms_atb.core.scheduler", "ms_atb.worker.model_runner",
                 "ms_atb.text.tokenizer", "ms_atb.sim.simulator", "ms_atb.llm", "ms_atb.models.llama",
                 "ms_atb.ops.paged_attention"):
        assert name in MODULES, name


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def test_no_import_circle():
    assert not _cycles(_graph()), f"import circles: {_cycles(_graph())}"


def test_the_circle_check_finds_circles():
    graph = _graph()
    graph["ms_atb.core.block_manager"].add("ms_atb.core.scheduler")   # the scheduler imports the block manager
    assert any({"ms_atb.core.block_manager", "ms_atb.core.scheduler"} <= set(c) for c in _cycles(graph))
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_imports_another_modules_private_names():
    bad = [(m, t, names, line) for m, p in MODULES.items() for t, names, line in _imports(m, p)
           if t != m and any(n.startswith("_") and not n.startswith("__") for n in names)]
    assert not bad, bad


@pytest.mark.parametrize("prefix, forbidden", [
    ("ms_atb.core", ("mindspore", "ms_atb.worker", "ms_atb.models", "ms_atb.ops", "ms_atb.llm")),
    ("ms_atb.models", ("ms_atb.core", "ms_atb.worker", "ms_atb.text", "ms_atb.sim", "ms_atb.llm",
                       "ms_atb.engine_loop", "ms_atb.config", "ms_atb.request")),
    ("ms_atb.ops", ("ms_atb.models", "ms_atb.core", "ms_atb.worker", "ms_atb.llm")),
    # file formats are numpy: no MindSpore and no other ms_atb package (each of them may read files through it)
    ("ms_atb.formats", ("mindspore",) + tuple(sorted({".".join(m.split(".")[:2]) for m in MODULES}
                                                     - {"ms_atb", "ms_atb.formats"}))),
    ("ms_atb.text", ("mindspore", "ms_atb.models", "ms_atb.ops", "ms_atb.worker", "ms_atb.llm")),
    # the backend table is read by the config and by the kernels: it imports nothing of either
    ("ms_atb.attention_backends", ("mindspore", "ms_atb")),
])
def test_who_may_import_whom(prefix, forbidden):
    bad = []
    for m, p in MODULES.items():
        if m != prefix and not m.startswith(prefix + "."):
            continue
        tree = ast.parse(open(p, encoding="utf-8").read())
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            bad += [(m, n) for n in names for f in forbidden if n == f or n.startswith(f + ".")]
    assert not bad, bad


def test_core_runs_with_mindspore_unimportable():
    code = textwrap.dedent("""
        import importlib.abc, sys
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name == "mindspore" or name.startswith("mindspore."):
                    raise ImportError("mindspore is blocked in this test")
        sys.meta_path.insert(0, Block())
        import pkgutil, ms_atb.core
        for info in pkgutil.iter_modules(ms_atb.core.__path__, "ms_atb.core."):
            __import__(info.name)
        from ms_atb.core.block_manager import BlockManager, NoFreeBlocksError
        from ms_atb.core.scheduler import Scheduler
        from ms_atb.core.sequence import Sequence
        bm = BlockManager(8, 4, enable_prefix_caching=True)
        assert bm.allocate("a", list(range(10))) == 0 and bm.block_table("a") == [0, 1, 2]
        try:
            import mindspore
        except ImportError:
            pass
        else:
            raise AssertionError("the blocker does not block")
        assert not any(m == "mindspore" or m.startswith("mindspore.") for m in sys.modules)
        print("core ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0 and "core ok" in out.stdout, out.stderr


def test_formats_and_text_run_with_mindspore_unimportable(tmp_path):
    """Every module of ms_atb.formats and ms_atb.text imports without MindSpore, and a model's config, which
    linears stay quantized, its weights and its tokenizer are read from a GGUF file and an HF directory."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from family_files import write_gguf
    hf_dir = os.path.join(ROOT, "tests", "data", "families", "qwen3")
    gguf_path = str(tmp_path / "qwen3.gguf")
    write_gguf(hf_dir, gguf_path, "qwen3")          # its vocabulary: 255 bytes and the merge "AB"
    code = textwrap.dedent(f"""
        import importlib.abc, sys
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name == "mindspore" or name.startswith("mindspore."):
                    raise ImportError("mindspore is blocked in this test")
        sys.meta_path.insert(0, Block())
        import dataclasses, pkgutil, ms_atb.formats, ms_atb.text
        for package in (ms_atb.formats, ms_atb.text):
            for info in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
                __import__(info.name)
        from ms_atb.formats import loader
        from ms_atb.formats.weight_formats import weight_formats
        from ms_atb.text.tokenizer import load_tokenizer
        config = loader.load_config({gguf_path!r})
        assert (config.num_hidden_layers, config.head_dim, config.qk_norm) == (2, 32, True), config
        assert dataclasses.replace(loader.load_config({hf_dir!r}), extra={{}}) == config   # the same model
        assert weight_formats({gguf_path!r}, config, "auto")[0] == {{}}          # float16 linears stay float
        slices = {{n: (slice(None),) * len(s) for n, s in loader.expected_shapes(config).items()}}
        names = [n for n, _ in loader.iter_tensors("hf", {hf_dir!r}, config, slices)]
        assert names == list(slices), names
        tok = load_tokenizer({gguf_path!r})
        ids = tok.encode("ABBA", add_special_tokens=False)
        assert ids == [255, 66, 65] and tok.decode(ids) == "ABBA", ids
        assert load_tokenizer("random:tiny-llama").vocab_size == 512
        try:
            import mindspore
        except ImportError:
            pass
        else:
            raise AssertionError("the blocker does not block")
        assert not any(m == "mindspore" or m.startswith("mindspore.") for m in sys.modules)
        print("formats ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0 and "formats ok" in out.stdout, out.stderr
