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
                 "ms_atb.text.tokenizer", "ms_atb.sim.simulator", "ms_atb.llm", "ms_atb.engine.engine",
                 "ms_atb.batch.job", "ms_atb.models.llama",
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
                       "ms_atb.engine", "ms_atb.batch", "ms_atb.config")),
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


def test_the_engine_never_imports_the_batch_tool():
    """ms_atb/batch is a client of LLM: nothing outside it imports it (docs/design.md, section 1)."""
    bad = [(m, t, line) for m, p in MODULES.items() if not m.startswith("ms_atb.batch")
           for t, _, line in _imports(m, p) if t == "ms_atb.batch" or t.startswith("ms_atb.batch.")]
    assert not bad, bad

# ---- The docs: short README, paths and test names that exist, the generated config reference --------------------

import fnmatch  # noqa: E402
import functools  # noqa: E402
import glob  # noqa: E402
import io  # noqa: E402
import re  # noqa: E402
import tokenize  # noqa: E402

README = os.path.join(ROOT, "README.md")
BENCHMARKS = os.path.join(ROOT, "BENCHMARKS.md")
# Markdown whose paths and test names must exist.
DOCS = ["README.md", "BENCHMARKS.md", "ops/ascendc/README.md",
        *sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))]
CODE_FOLDERS = ("ms_atb", "models", "ops", "scripts", "tests", "configs")
CODE_SUFFIXES = (".py", ".h", ".cc", ".cpp", ".sh", ".yaml")


def _repository_tops() -> list[str]:
    """The names at the top of the repository that a path may start with: tracked ones (git), else every entry
    .gitignore does not exclude."""
    try:
        out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, timeout=60)
        if out.returncode == 0 and out.stdout:
            return sorted({line.split("/")[0] for line in out.stdout.splitlines()})
    except OSError:
        pass
    with open(os.path.join(ROOT, ".gitignore"), encoding="utf-8") as f:
        ignored = [p.strip().strip("/") for p in f if p.strip() and not p.startswith("#")]
    return sorted(n for n in os.listdir(ROOT)
                  if not n.startswith(".") and not any(fnmatch.fnmatch(n, p) for p in ignored))


_TOPS = _repository_tops()
# A token that looks like a repository path: a top-level name, then /parts. `<...>` marks a placeholder.
_PATH = re.compile(r"(?<![\w./~$<>-])(?:%s)(?:/[\w.*<>-]+)*(?:::[\w:]+)?" % "|".join(map(re.escape, _TOPS)))
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _comments_and_docstrings(path: str):
    """(line, text) of every comment and docstring of a code file."""
    with open(path, encoding="utf-8") as f:
        source = f.read()
    if path.endswith(".py"):
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT:
                yield tok.start[0], tok.string
        for node in ast.walk(ast.parse(source, path)):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node, clean=False)
                if doc is not None:
                    for i, line in enumerate(doc.splitlines()):
                        yield node.body[0].lineno + i, line
        return
    in_block = False
    for number, line in enumerate(source.splitlines(), 1):
        if path.endswith((".sh", ".yaml")):
            match = re.search(r"(?:^|\s)#.*", line)
            if match:
                yield number, match.group(0)
            continue
        if in_block:
            end = line.find("*/")
            yield number, line if end < 0 else line[:end]
            in_block = end < 0
            continue
        comment, block = line.find("//"), line.find("/*")
        if comment >= 0 and (block < 0 or comment < block):
            yield number, line[comment:]
        elif block >= 0:
            end = line.find("*/", block)
            yield number, line[block:] if end < 0 else line[block:end]
            in_block = end < 0


@functools.lru_cache(maxsize=1)
def _texts() -> tuple:
    """(file, line, text) of the docs' lines and of the code's comments and docstrings (read once: several
    checks go over them)."""
    return tuple(_each_text())


def _each_text():
    for doc in DOCS:
        with open(os.path.join(ROOT, doc), encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                yield doc, number, line
    for folder in CODE_FOLDERS:
        for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, folder)):
            dirnames[:] = [d for d in dirnames if d not in ("__pycache__", "data")]
            for name in sorted(filenames):
                if name.endswith(CODE_SUFFIXES):
                    path = os.path.join(dirpath, name)
                    for number, text in _comments_and_docstrings(path):
                        yield os.path.relpath(path, ROOT), number, text


def _paths_in(text: str) -> list[str]:
    """The repository paths a text names (test ids cut to their file; placeholders left out)."""
    tokens = (m.group(0).split("::")[0].rstrip(".,;:'\"`") for m in _PATH.finditer(text))
    return [t for t in tokens if "/" in t and "<" not in t and ">" not in t]


def _named_paths():
    """(file, line, path as named, path to check from the root) of every repository path the texts name, and of
    every relative Markdown link."""
    for where, number, text in _texts():
        for token in _paths_in(text):
            yield where, number, token, token.rstrip("/")
        if where.endswith(".md"):
            for target in _LINK.findall(text):
                target = target.split("#")[0]
                if target and not re.match(r"[a-z]+:", target):
                    yield where, number, target, os.path.normpath(os.path.join(os.path.dirname(where), target))


def test_readme_and_benchmarks_stay_short():
    with open(README, encoding="utf-8") as f:
        readme = f.read()
    with open(BENCHMARKS, encoding="utf-8") as f:
        benchmarks = f.read()
    assert len(readme.splitlines()) <= 150, "README.md is what a newcomer reads first: move details to docs/"
    assert len(benchmarks.splitlines()) <= 600, "BENCHMARKS.md: each table once, its latest measurement"
    assert not re.search(r"\.py::", readme), "README.md names no test ids: docs/guarantees.md does"


def test_every_repository_path_named_in_docs_and_comments_exists():
    missing = [f"{where}:{number}: {named}" for where, number, named, path in _named_paths()
               if not (glob.glob(os.path.join(ROOT, path)) if any(c in path for c in "*[") else
                       os.path.exists(os.path.join(ROOT, path)))]
    assert not missing, "paths named but not in the repository (a placeholder is spelled <like-this>):\n" + \
        "\n".join(missing)


def test_the_path_check_finds_paths_and_leaves_placeholders():
    found = _paths_in("see ms_atb/ops/backends.py, `tests/<file>.py::<name>`, ~/.cache/ms_atb/graphs, "
                      "[a link](docs/usage.md), ops/ and tests/test_layout.py::test_no_import_circle.")
    assert found == ["ms_atb/ops/backends.py", "docs/usage.md", "tests/test_layout.py"]
    assert not os.path.exists(os.path.join(ROOT, "ms_atb/ops/backends.py"))


@functools.lru_cache(maxsize=None)
def _test_names(path: str) -> dict[str, set[str]]:
    """Module-level names of a test file (functions, classes, assignments) -> the names inside each class."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    names = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names[node.name] = set()
        elif isinstance(node, ast.ClassDef):
            names[node.name] = {n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        elif isinstance(node, ast.Assign):
            names.update({t.id: set() for t in node.targets if isinstance(t, ast.Name)})
    return names


def test_every_test_named_in_docs_and_comments_exists():
    bad = []
    for where, number, text in _texts():
        for path, ids in re.findall(r"(tests/[\w/]+\.py)((?:::\w+)+)", text):
            parts = ids.split("::")[1:]
            full = os.path.join(ROOT, path)
            names = _test_names(full) if os.path.exists(full) else {}
            if parts[0] not in names or (len(parts) > 1 and parts[1] not in names[parts[0]]):
                bad.append(f"{where}:{number}: {path}{ids}")
    assert not bad, "tests named but not found:\n" + "\n".join(bad)


def test_the_config_reference_is_generated_from_the_code():
    from scripts_import import load_script
    gen = load_script("gen_config_doc")
    for path, want in ((gen.CONFIG_DOC, gen.render_config_doc()),
                       (gen.USAGE_DOC, gen.usage_with_table(gen.USAGE_DOC.read_text(encoding="utf-8")))):
        assert path.read_text(encoding="utf-8") == want, \
            f"{path.relative_to(ROOT)} differs from the config dataclasses and SamplingParams: run {gen.COMMAND}"


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


def test_no_product_function_is_longer_than_sixty_lines():
    """A function that does one job fits on a screen: from `def` (or its first decorator) to its last line,
    docstring and nested functions included, at most 60 lines in ms_atb/, models/ and ops/."""
    long = []
    for module, path in MODULES.items():
        tree = ast.parse(open(path, encoding="utf-8").read(), path)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                start = min([node.lineno] + [d.lineno for d in node.decorator_list])
                if node.end_lineno - start + 1 > 60:
                    long.append(f"{os.path.relpath(path, ROOT)}:{node.lineno} {node.name} "
                                f"({node.end_lineno - start + 1} lines)")
    assert not long, long
