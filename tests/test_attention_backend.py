"""kv_cache.attention_backend and context.device npu:N: what the config accepts, what the ops build for
each backend, and the clear errors when a backend cannot run."""
import json
import subprocess
import sys

import pytest

from ms_atb.attention_backends import DEVICE_BACKENDS
from ms_atb.config import EngineConfig, parse_device
from ms_atb.ops import PagedAttention, ReshapeAndCache, backends

TINY = "configs/tiny_llama.yaml"


def load(**overrides):
    return EngineConfig.load({"model": {"path": "random:tiny-llama"}}, **overrides)


def test_one_table_drives_the_config_the_ops_and_the_model_runner(monkeypatch):
    """ms_atb/attention_backends.py's table, changed, changes what the config allows, what the ops resolve and
    the backend the model runner builds its model with."""
    from ms_atb.worker.model_runner import ModelRunner
    monkeypatch.setitem(DEVICE_BACKENDS, "cpu", ("ascendc", "cpu"))       # "auto" on the CPU: ascendc
    with pytest.raises(ValueError, match=r"'ms_atb' does not run on context\.device 'cpu'; allowed there: "
                                         r"\['auto', 'ascendc', 'cpu'\]"):
        load(attention_backend="ms_atb")
    assert backends.resolve_backend("cpu", "auto") == "ascendc" == ReshapeAndCache(device="cpu").backend
    runner = ModelRunner(load(dtype="float16", num_blocks=4, max_model_len=64, max_num_batched_tokens=16), 4, 64)
    assert runner.attention_backend == "ascendc"
    assert {c.backend for _, c in runner.model.cells_and_names()
            if isinstance(c, (PagedAttention, ReshapeAndCache))} == {"ascendc"}


@pytest.mark.parametrize("device, backend, dtype", [
    ("cpu", "auto", "float32"), ("cpu", "cpu", "float32"), ("cpu", "ascendc", "float16"),
    ("npu", "auto", "float16"), ("npu:0", "ms_atb", "bfloat16"), ("npu:7", "mindspore", "float16"),
])
def test_valid_combinations(device, backend, dtype):
    cfg = load(device=device, attention_backend=backend, dtype=dtype)
    assert (cfg.context.device, cfg.kv_cache.attention_backend) == (device, backend)


@pytest.mark.parametrize("overrides, match", [
    (dict(attention_backend="flash"), r"kv_cache\.attention_backend must be one of \['auto', 'ms_atb', "
                                      r"'mindspore', 'cpu', 'ascendc'\], got 'flash'"),
    (dict(device="npu", attention_backend="ascendc"), r"'ascendc' does not run on context\.device 'npu'; allowed "
                                                      r"there: \['auto', 'ms_atb', 'mindspore'\]"),
    (dict(device="cpu", attention_backend="ms_atb"), r"'ms_atb' does not run on context\.device 'cpu'; allowed "
                                                     r"there: \['auto', 'cpu', 'ascendc'\]"),
    (dict(attention_backend="ascendc"), "'ascendc' runs float16 and bfloat16 caches: set model.dtype float16"),
    (dict(device="npu:x"), r"context\.device must be one of \['cpu', 'npu', 'npu:N'\]"),
    (dict(device="npu:-1"), r"context\.device must be one of"),
])
def test_invalid_combinations_are_value_errors(overrides, match):
    with pytest.raises(ValueError, match=match):
        load(**overrides)


def test_parse_device():
    assert parse_device("cpu") == ("cpu", None)
    assert parse_device("npu") == ("npu", None)
    assert parse_device("npu:3") == ("npu", 3)


def test_ops_resolve_auto_per_device_and_refuse_other_devices_backends():
    assert PagedAttention(4, 2, 16, 0.25).backend == "cpu"
    assert ReshapeAndCache(device="cpu", backend="ascendc").backend == "ascendc"
    with pytest.raises(ValueError, match=r"'mindspore' does not run on device 'cpu'"):
        PagedAttention(4, 2, 16, 0.25, backend="mindspore")
    with pytest.raises(ValueError, match="head_dim must be a multiple of 16, got 8"):
        PagedAttention(4, 2, 8, 0.25, backend="ascendc")


def test_an_unbuilt_custom_op_package_names_the_build_command(monkeypatch, tmp_path):
    monkeypatch.setenv("ASCEND_CUSTOM_OPP_PATH", str(tmp_path))
    monkeypatch.delenv("ASCEND_OPP_PATH", raising=False)
    with pytest.raises(ValueError, match=r"MsAtbPagedAttention, which no installed package declares .*"
                                         r"bash scripts/build_ascend_ops\.sh"):
        PagedAttention(4, 2, 16, 0.25, device="npu")
    with pytest.raises(ValueError, match=r"MsAtbReshapeAndCache, which no installed package declares"):
        ReshapeAndCache(device="npu", backend="ms_atb")


def test_an_installed_custom_op_package_is_found(monkeypatch, tmp_path):
    vendor = tmp_path / "vendors" / "ms_atb"
    info = vendor / "op_impl" / "ai_core" / "tbe" / "config" / "ascend910b" / "aic-ascend910b-ops-info.json"
    info.parent.mkdir(parents=True)
    info.write_text(json.dumps({"MsAtbPagedAttention": {}, "MsAtbReshapeAndCache": {}}))
    monkeypatch.setenv("ASCEND_CUSTOM_OPP_PATH", f"/no/such/dir:{vendor}")
    assert backends.custom_op_package("MsAtbPagedAttention") == str(vendor)
    assert backends.custom_op_package("MsAtbOther") is None
    monkeypatch.setenv("ASCEND_CUSTOM_OPP_PATH", "")
    monkeypatch.setenv("ASCEND_OPP_PATH", str(tmp_path))
    assert backends.custom_op_package("MsAtbReshapeAndCache") == str(vendor)


def test_npu_with_a_device_id_fails_later_with_a_clear_message():
    # its own process: a MindSpore that can switch to Ascend would stay switched
    code = ("import sys\nfrom ms_atb import LLM\ntry:\n    LLM(sys.argv[1], device='npu:0')\n"
            "except ValueError as e:\n    print('ValueError:', e)\nelse:\n    print('built')\n")
    run = subprocess.run([sys.executable, "-c", code, TINY], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    if run.stdout.strip().endswith("built"):
        pytest.skip("this MindSpore runs on Ascend")
    assert "ValueError: context.device 'npu:0': this MindSpore" in run.stdout and "'cpu' works" in run.stdout
