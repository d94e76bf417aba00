"""context.compile_cache: compiled graphs saved by one run and loaded by the next, with the same tokens;
one directory per engine configuration; only the first engine of a process uses it."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ms_atb.worker.graph_cache import GraphCache, cache_key, files_identity, sweep_dead_temps

pytestmark = pytest.mark.usefixtures("entry_script")     # the graph cache keys on the entry script
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "configs", "tiny_llama.yaml")

# Builds one or two tiny engines with the cache at argv[1] (argv[2]: num_blocks of the first) and prints,
# per engine, its cache status, key directory, greedy tokens and the buckets of its graphs as one JSON line.
# Steps of at most 2 tokens: two graphs (token buckets 1 and 2) to compile, save and load in their recorded
# order, then run in alternation.
_RUN = """
import json, sys
from ms_atb import LLM, SamplingParams
params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
for num_blocks in map(int, sys.argv[2].split(",")):
    llm = LLM(%r, max_num_batched_tokens=2, max_num_seqs=2, num_blocks=num_blocks, compile_cache=sys.argv[1])
    outs = llm.generate([[1, 2, 3, 4, 5], list(range(100, 119))], params, use_tqdm=False)
    s = llm.runner.graph_stats()
    ran = sorted(llm.runner.compiled)
    print(json.dumps([s["graph_cache"], s["graph_cache_path"], [o.token_ids for o in outs], ran]))
""" % TINY


def _run(cache, num_blocks, inline=False):
    script = cache.parent / "run.py"       # MindSpore's cache hashes the entry script: it must be a file
    script.write_text(_RUN)
    cmd = [sys.executable, "-c", _RUN] if inline else [sys.executable, str(script)]
    proc = subprocess.run(cmd + [str(cache), num_blocks], capture_output=True, text=True,
                          env=dict(os.environ, MS_ATB_QUIET="1"), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("[")]


@pytest.mark.slow                # five processes: MindSpore keeps one cache path per process
def test_second_run_loads_the_graphs_and_gives_the_same_tokens(tmp_path):
    cache = tmp_path / "graphs"
    (saved, path, tokens, _), (second, second_path, second_tokens, _) = _run(cache, "40,40")
    assert saved == "saved" and os.path.isdir(path) \
        and sorted(os.listdir(cache)) == [os.path.basename(path), os.path.basename(path) + ".sha256"]
    assert second == "skipped" and second_path is None and second_tokens == tokens
    [(loaded, loaded_path, loaded_tokens, ran)] = _run(cache, "40")
    assert loaded == "loaded" and loaded_path == path and loaded_tokens == tokens and ran == [1, 2]
    [(other, other_path, other_tokens, _)] = _run(cache, "48")      # another pool: another key
    assert other == "saved" and other_path != path and other_tokens == tokens
    assert sorted(os.listdir(cache)) == sorted(os.path.basename(p) + end for p in (path, other_path)
                                               for end in ("", ".sha256"))    # no temporaries
    [(inline, inline_path, inline_tokens, _)] = _run(cache, "40", inline=True)
    assert inline == "unavailable" and inline_path is None and inline_tokens == tokens


def test_key_follows_the_model_files_and_the_shape(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"x" * 10)
    before = files_identity(str(model))
    os.utime(model, ns=(1, 1))
    assert files_identity(str(model)) != before
    assert files_identity("random:tiny-llama?seed=0") == ["random:tiny-llama?seed=0"]
    keys = {cache_key(parts) for parts in ({"model": before, "num_blocks": 8}, {"model": before, "num_blocks": 9},
                                           {"model": files_identity(str(model)), "num_blocks": 8})}
    assert len(keys) == 3 and cache_key({"model": before, "num_blocks": 8}) in keys


def test_off_without_a_directory():
    cache = GraphCache(None, {}).open()
    compiled = []
    cache.ensure(4, compiled.append)
    assert cache.status == "off" and cache.path is None and compiled == [4]
    assert "MS_COMPILER_CACHE_PATH" not in os.environ


def test_bad_cache_paths_are_value_errors(tmp_path, monkeypatch):
    from ms_atb.worker import graph_cache
    from ms_atb.config import EngineConfig
    monkeypatch.setattr(graph_cache, "_claimed_by_pid", None)
    afile = tmp_path / "f"
    afile.write_text("")
    with pytest.raises(ValueError, match="context.compile_cache must be a directory"):
        EngineConfig.load(TINY, compile_cache=str(afile))
    with pytest.raises(ValueError, match="context.compile_cache .* is not a usable directory"):
        GraphCache(str(afile / "sub"), {}).open()


def test_temporary_folders_of_dead_processes_are_swept(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()                                               # its pid names no live process now
    (tmp_path / f"k1.tmp-{dead.pid}").mkdir()
    (tmp_path / f"k1.tmp-{dead.pid}" / "graph.mindir").write_text("half")
    (tmp_path / f"k2.tmp-{os.getpid()}").mkdir()               # a save in progress: kept
    (tmp_path / "k3").mkdir()                                  # a finished cache: kept
    sweep_dead_temps(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k2.tmp-" + str(os.getpid()), "k3"]


def test_dead_temporary_files_and_links_are_swept_without_following_them(tmp_path):
    """The weight cache's temporaries are files, a killed publish may leave links: removed when their process is
    dead, and a link is removed, never followed (what it points to stays)."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("kept")
    root = tmp_path / "root"
    root.mkdir()
    (root / f"k.old-{dead.pid}").symlink_to(outside)                 # a link to a directory
    (root / f"k.json.tmp-{dead.pid}").symlink_to(outside / "keep")  # a link to a file
    (root / f"k.bin.tmp-{dead.pid}").write_text("half")              # a file
    (root / f"k.sha256.tmp-{dead.pid}-x8y").write_text("0")          # a digest record being written
    (root / f"k.tmp-{dead.pid}").mkdir()
    (root / f"k.tmp-{dead.pid}" / "inner").symlink_to(outside)       # a folder holding a link
    (root / f"k.bin.tmp-{os.getpid()}").write_text("mine")           # a live process's: kept
    sweep_dead_temps(root)
    assert sorted(os.listdir(root)) == [f"k.bin.tmp-{os.getpid()}"]
    assert sorted(os.listdir(outside)) == ["keep"] and (outside / "keep").read_text() == "kept"


def _tamper_consistently(folder, kind):
    """Changes a saved cache so that its index and digest still agree: the manifest's buckets reversed, or the
    two graph files swapped."""
    from ms_atb.ops.trusted_cache import record_digest, tree_digest
    if kind == "manifest":
        buckets = json.loads((folder / "buckets.json").read_text())
        (folder / "buckets.json").write_text(json.dumps(buckets[::-1]))
    else:
        graphs = sorted(folder.rglob("compile_cache_*.mindir"))
        assert len(graphs) == 2
        for g in graphs:
            os.chmod(g, 0o600)
        a, b = (g.read_bytes() for g in graphs)
        graphs[0].write_bytes(b)
        graphs[1].write_bytes(a)
    record_digest(folder, tree_digest(folder))


@pytest.mark.slow                # two processes: MindSpore keeps one cache path per process
@pytest.mark.parametrize("kind", ["manifest", "graphs"])
def test_a_cache_whose_graphs_do_not_fit_their_buckets_is_compiled_afresh_in_the_run(tmp_path, kind):
    """A cache whose index and digest agree but whose graphs are not their buckets' (a graph of other input
    shapes) is refused when the graph loads, before it runs on any step: the run compiles the bucket
    without the cache and gives the same tokens."""
    cache = tmp_path / "graphs"
    [(saved, path, tokens, _)] = _run(cache, "40")
    assert saved == "saved"
    _tamper_consistently(Path(path), kind)
    [(status, _, again, ran)] = _run(cache, "40")
    assert status.startswith("failed (ValueError: the graph") and "input shapes" in status
    assert again == tokens and ran == [1, 2]


def test_buckets_load_in_recorded_order_and_new_ones_are_appended(tmp_path, monkeypatch):
    """MindSpore loads the process's N-th cached graph for its N-th compile: a bucket recorded at N loads
    only after 0..N-1, and a bucket the cache lacks is appended after every recorded one."""
    from ms_atb.worker import graph_cache
    root = tmp_path / "g"

    def run(buckets_needed):
        monkeypatch.setattr(graph_cache, "_claimed_by_pid", None)
        calls = []                                 # (bucket, N it ran as, loaded?)

        def compile_one(bucket):
            work = os.environ["MS_COMPILER_CACHE_PATH"]
            n = len([c for c in calls if c[1] is not None])
            graph = os.path.join(work, f"compile_cache_{n}.mindir")
            loaded = os.path.exists(graph)
            if loaded:                             # what MindSpore would run: graph n, whatever was asked
                assert open(graph).read() == f"bucket {bucket}", f"graph {n} is not bucket {bucket}'s"
            else:
                open(graph, "w").write(f"bucket {bucket}")
            calls.append((bucket, n, loaded))
        cache = GraphCache(str(root), {"model": "m"}).open()
        for b in buckets_needed:
            cache.ensure(b, compile_one)
        return cache, calls

    first, calls = run([8, 1])
    assert first.status == "saved" and calls == [(8, 0, False), (1, 1, False)]
    second, calls = run([1, 4])                    # 1 is recorded second: 8 loads first; 4 is new
    assert calls == [(8, 0, True), (1, 1, True), (4, 2, False)]
    assert second.status == "saved" and second.recorded == [8, 1, 4]
    third, calls = run([8, 1, 4])
    assert third.status == "loaded" and [c[2] for c in calls] == [True] * 3
    assert json.loads((third.path / "buckets.json").read_text()) == [8, 1, 4]


def test_a_cache_that_fails_to_load_is_removed_and_the_bucket_compiled_without_it(tmp_path, monkeypatch):
    from ms_atb.worker import graph_cache
    monkeypatch.setattr(graph_cache, "_claimed_by_pid", None)
    root, compiled = tmp_path / "g", []
    cache = GraphCache(str(root), {"model": "m"}).open()
    cache.ensure(8, lambda b: open(os.path.join(os.environ["MS_COMPILER_CACHE_PATH"], "compile_cache_0.mindir"),
                                   "w").write("graph"))
    assert cache.path.is_dir()
    monkeypatch.setattr(graph_cache, "_claimed_by_pid", None)
    again = GraphCache(str(root), {"model": "m"}).open()

    def broken(bucket):
        if "MS_COMPILER_CACHE_PATH" in os.environ:
            raise RuntimeError("bad graph file")
        compiled.append(bucket)
    again.ensure(8, broken)
    assert compiled == [8] and again.status.startswith("failed (RuntimeError: bad graph file)")
    assert not again.path.exists()
    again.ensure(1, broken)                        # the rest of the process: no cache
    assert compiled == [8, 1]


def test_the_default_cache_lives_in_the_users_cache_directory(monkeypatch, tmp_path):
    from ms_atb.config import EngineConfig
    from ms_atb.worker.graph_cache import cache_root as graph_cache_root
    assert EngineConfig.load(TINY).context.compile_cache == "auto"
    monkeypatch.delenv("MS_ATB_GRAPH_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert graph_cache_root("auto") == os.path.join(str(tmp_path), "ms_atb", "graphs")
    monkeypatch.setenv("MS_ATB_GRAPH_CACHE", "off")
    assert graph_cache_root("auto") is None and graph_cache_root(None) is None
    monkeypatch.setenv("MS_ATB_GRAPH_CACHE", str(tmp_path / "g"))
    assert graph_cache_root("auto") == str(tmp_path / "g") and graph_cache_root("/x") == "/x"
