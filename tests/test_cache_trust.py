"""Cached code (the kernel library, compiled graphs) is loaded only from a directory that is the user's own
and closed to others' writes, and only when its sha256 is the one recorded when it was built."""
import ctypes
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from ms_atb.ops import ascendc_build, build, trusted_cache
from ms_atb.worker import graph_cache
from ms_atb.worker.graph_cache import GraphCache

pytestmark = pytest.mark.usefixtures("entry_script")     # the graph cache keys on the entry script

ELF = shutil.which("true") or "/bin/true"        # any complete ELF file stands in for a built library


@pytest.fixture
def kernel_cache(tmp_path, monkeypatch):
    """MS_ATB_KERNEL_CACHE in tmp_path, with a stand-in compiler step that counts its builds."""
    folder = tmp_path / "kernels"
    monkeypatch.setenv("MS_ATB_KERNEL_CACHE", str(folder))
    builds = []

    def fake_compile(target, extra_flags=(), sources=build.SOURCES):
        target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        shutil.copyfile(ELF, target)
        builds.append(target)

    monkeypatch.setattr(build, "compile_library", fake_compile)
    build.kernel_library.cache_clear()
    yield folder, builds
    build.kernel_library.cache_clear()


def _target(folder):
    return folder / f"ms_atb_kernels_{build.cache_key(build.find_compiler())}.so"


def test_a_good_kernel_cache_is_reused(kernel_cache):
    folder, builds = kernel_cache
    path = build.kernel_library()
    assert len(builds) == 1 and oct(os.stat(folder).st_mode & 0o777) == "0o700"
    build.kernel_library.cache_clear()
    assert build.kernel_library() == path and len(builds) == 1


@pytest.mark.parametrize("record", [None, "0" * 64])
def test_a_planted_library_is_not_loaded_but_rebuilt(kernel_cache, record):
    folder, builds = kernel_cache
    folder.mkdir(mode=0o700)
    planted = _target(folder)
    shutil.copyfile(ELF, planted)
    with open(planted, "ab") as f:
        f.write(b"planted")                        # still a complete ELF, not the one built here
    if record is not None:
        (folder / (planted.name + ".sha256")).write_text(record)
    assert build.kernel_library() == str(planted)
    assert len(builds) == 1 and not planted.read_bytes().endswith(b"planted")


def test_a_library_changed_after_its_build_is_rebuilt(kernel_cache):
    folder, builds = kernel_cache
    path = build.kernel_library()
    with open(path, "ab") as f:
        f.write(b"x")
    build.kernel_library.cache_clear()
    build.kernel_library()
    assert len(builds) == 2


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o757, 0o720])
def test_a_kernel_cache_others_can_write_is_refused(kernel_cache, mode):
    folder, builds = kernel_cache
    folder.mkdir()
    os.chmod(folder, mode)
    with pytest.raises(ValueError, match=r"kernel cache .* is writable by group or others .*chmod go-w"):
        build.kernel_library()
    assert not builds


def test_a_kernel_cache_of_another_user_is_refused(kernel_cache):
    folder, builds = kernel_cache
    folder.mkdir(mode=0o700)
    try:
        os.chown(folder, os.geteuid() + 1, -1)
    except PermissionError:
        pytest.skip("chown needs privileges here")
    with pytest.raises(ValueError, match=r"belongs to uid \d+, not to you"):
        build.kernel_library()
    assert not builds


# ------------------------------------------------------------ the AscendC library, and what is loaded

@pytest.fixture(scope="module")
def two_libraries(tmp_path_factory):
    """Two small shared libraries whose Which() returns 1 and 2: a built library and another one planted."""
    folder = tmp_path_factory.mktemp("libs")
    paths = []
    for n in (1, 2):
        (folder / f"which{n}.cc").write_text(f'extern "C" int Which() {{ return {n}; }}\n')
        subprocess.run([build.find_compiler(), "-shared", "-fPIC", "-o", str(folder / f"which{n}.so"),
                        str(folder / f"which{n}.cc")], check=True)
        paths.append(folder / f"which{n}.so")
    return paths


@pytest.fixture
def ascendc_cache(tmp_path, monkeypatch, two_libraries):
    """MS_ATB_KERNEL_CACHE in tmp_path; 'compiling' either library copies which1.so and counts the builds."""
    folder = tmp_path / "kernels"
    monkeypatch.setenv("MS_ATB_KERNEL_CACHE", str(folder))
    builds = []

    def fake_compile(target, extra_flags=(), sources=build.SOURCES):
        shutil.copyfile(two_libraries[0], target)
        builds.append(target)

    monkeypatch.setattr(build, "compile_library", fake_compile)
    for fn in (build.kernel_library, build.loaded_kernel_library, ascendc_build.ascendc_library,
               ascendc_build.loaded_ascendc_library):
        fn.cache_clear()
    yield folder, builds
    for fn in (build.kernel_library, build.loaded_kernel_library, ascendc_build.ascendc_library,
               ascendc_build.loaded_ascendc_library):
        fn.cache_clear()


def _ascendc_target(folder):
    return folder / f"ms_atb_ascendc_{ascendc_build.cache_key(build.find_compiler())}.so"


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o722])
def test_an_ascendc_cache_others_can_write_is_refused_naming_it(ascendc_cache, two_libraries, mode):
    folder, builds = ascendc_cache
    folder.mkdir()
    shutil.copyfile(two_libraries[1], _ascendc_target(folder))      # planted where the library would be
    os.chmod(folder, mode)
    with pytest.raises(ValueError, match=rf"kernel cache .*'{folder}' is writable by group or others"):
        ascendc_build.ascendc_library()
    assert not builds and sorted(os.listdir(folder)) == [_ascendc_target(folder).name]


def test_a_planted_ascendc_library_is_rebuilt_and_recorded(ascendc_cache, two_libraries):
    folder, builds = ascendc_cache
    folder.mkdir(mode=0o700)
    planted = _ascendc_target(folder)
    shutil.copyfile(two_libraries[1], planted)
    assert ascendc_build.ascendc_library() == str(planted) and builds == [planted]
    assert planted.read_bytes() == two_libraries[0].read_bytes()
    assert trusted_cache.recorded_digest(planted) == trusted_cache.file_digest(planted)
    ascendc_build.ascendc_library.cache_clear()
    assert ascendc_build.ascendc_library() == str(planted) and len(builds) == 1      # recorded: reused


@pytest.mark.parametrize("which", ["kernels", "ascendc"])
def test_a_library_swapped_after_its_check_is_not_the_one_loaded(ascendc_cache, two_libraries, monkeypatch, which):
    """The library is read once, its sha256 checked, and loaded from a copy of those very bytes: a library (and
    its record) put in its place between the check and the load is never what ctypes or MindSpore load."""
    folder, builds = ascendc_cache
    checked, loaded = ((build.kernel_library, build.loaded_kernel_library) if which == "kernels" else
                       (ascendc_build.ascendc_library, ascendc_build.loaded_ascendc_library))
    target = checked()                                  # built and recorded
    load = trusted_cache.load_library

    def swap_then_load(data, path):
        shutil.copyfile(two_libraries[1], target)       # another library, and a record that matches it
        trusted_cache.record_digest(target, trusted_cache.file_digest(target))
        return load(data, path)

    monkeypatch.setattr(trusted_cache, "load_library", swap_then_load)
    path = loaded()
    assert ctypes.CDLL(path).Which() == 1 and Path(target).read_bytes() == two_libraries[1].read_bytes()
    assert os.path.realpath(path) == path and len(builds) == 1
    monkeypatch.setattr(trusted_cache, "load_library", load)
    loaded.cache_clear()
    assert ctypes.CDLL(loaded()).Which() == 2          # the swapped one, now recorded, is another library


def test_mindspore_is_handed_the_loaded_copy(ascendc_cache, two_libraries):
    """ops.Custom's aot kernels realpath the library and dlopen it when the graph is built: the path they get
    is the copy this process already loaded, which a later dlopen of the same path returns."""
    folder, _ = ascendc_cache
    target = build.kernel_library()
    op = build.aot_op("Which", ("x",), None)
    shutil.copyfile(two_libraries[1], target)           # after the load, the cache's file changes
    library = op.func.rpartition(":")[0]
    assert library == build.loaded_kernel_library() != target and ctypes.CDLL(library).Which() == 1


# ------------------------------------------------------------ compiled graphs

def _warmup(root, parts=None):
    """A GraphCache round as the engine runs it on one bucket; 'compiling' writes graph 0 unless it exists."""
    graph_cache._claimed_by_pid = None

    def compile_one(bucket):
        target = os.environ["MS_COMPILER_CACHE_PATH"]
        if not os.path.exists(os.path.join(target, "compile_cache_0.mindir")):
            with open(os.path.join(target, "compile_cache_0.mindir"), "w") as f:
                f.write("graph")
    cache = GraphCache(str(root), parts or {"model": "m"}).open()
    cache.ensure(8, compile_one)
    graph_cache._claimed_by_pid = None
    return cache


def test_a_good_graph_cache_is_reused(tmp_path):
    assert _warmup(tmp_path / "g").status == "saved"
    assert _warmup(tmp_path / "g").status == "loaded"


@pytest.mark.parametrize("tamper", ["planted", "changed", "added", "record"])
def test_an_unrecorded_or_changed_graph_cache_is_compiled_afresh(tmp_path, tamper):
    first = _warmup(tmp_path / "g")
    if tamper == "planted":                           # a directory with the right name, never recorded
        os.unlink(str(first.path) + ".sha256")
    elif tamper == "changed":
        (first.path / "compile_cache_0.mindir").write_text("other code")
    elif tamper == "added":
        (first.path / "compile_cache_1.mindir").write_text("more code")
    else:
        open(str(first.path) + ".sha256", "w").write("0" * 64)
    again = _warmup(tmp_path / "g")
    assert again.status == "saved"
    assert (again.path / "compile_cache_0.mindir").read_text() == "graph"
    assert sorted(os.listdir(again.path)) == ["buckets.json", "compile_cache_0.mindir"]
    assert _warmup(tmp_path / "g").status == "loaded"


def test_a_graph_changed_after_its_check_is_not_the_one_loaded(tmp_path, monkeypatch):
    """The graphs MindSpore loads are the private copy written from the bytes whose digest was checked: a
    graph changed in the cache right after the check is not what loads."""
    first = _warmup(tmp_path / "g")
    digest = graph_cache.tree_digest

    def digest_then_change(folder, *args, **kwargs):
        out = digest(folder, *args, **kwargs)
        if Path(folder) == first.path:
            (first.path / "compile_cache_0.mindir").write_text("other code")
        return out

    monkeypatch.setattr(graph_cache, "tree_digest", digest_then_change)
    graph_cache._claimed_by_pid = None
    cache, seen = GraphCache(str(tmp_path / "g"), {"model": "m"}).open(), []
    cache.ensure(8, lambda b: seen.append(open(os.path.join(os.environ["MS_COMPILER_CACHE_PATH"],
                                                            "compile_cache_0.mindir")).read()))
    graph_cache._claimed_by_pid = None
    assert cache.status == "loaded" and seen == ["graph"]


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o722])
def test_a_graph_cache_others_can_write_is_refused(tmp_path, mode):
    (tmp_path / "g").mkdir()
    os.chmod(tmp_path / "g", mode)
    with pytest.raises(ValueError, match=r"context.compile_cache .* is writable by group or others"):
        _warmup(tmp_path / "g")
