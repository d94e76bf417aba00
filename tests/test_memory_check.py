"""The memory check before a model is loaded (ms_atb/memory_budget.py): what the weights hold, what the process
may take (MemAvailable and cgroup limits), and an engine refused before it reads a weight."""
import os
import time

import pytest

from ms_atb.memory_budget import available_bytes, check_fits, weight_bytes

GIB = 2 ** 30
TINY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "tiny_llama.yaml")


def _tree(tmp_path, files: dict):
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(tmp_path / "proc"), str(tmp_path / "cg")


MEMINFO = {"proc/meminfo": "MemTotal: 67108864 kB\nMemAvailable: 33554432 kB\n"}     # 32 GiB available


def test_mem_available_alone(tmp_path):
    proc, cg = _tree(tmp_path, {**MEMINFO, "proc/self/cgroup": "0::/\n"})
    assert available_bytes(proc, cg) == 32 * GIB
    proc, cg = _tree(tmp_path / "none", {"proc/x": ""})
    assert available_bytes(proc, cg) is None


def test_cgroup_v2_limit_of_the_process_or_a_parent(tmp_path):
    proc, cg = _tree(tmp_path, {**MEMINFO, "proc/self/cgroup": "0::/job/step\n",
                                "cg/memory.max": "max\n", "cg/memory.current": str(50 * GIB),
                                "cg/job/memory.max": str(8 * GIB), "cg/job/memory.current": str(3 * GIB),
                                "cg/job/memory.stat": f"anon 1\ninactive_file {GIB}\n",
                                "cg/job/step/memory.max": "max\n", "cg/job/step/memory.current": "0\n"})
    assert available_bytes(proc, cg) == 6 * GIB         # 8 - 3 + 1 dropable page cache, under 32
    proc, cg = _tree(tmp_path / "over", {**MEMINFO, "proc/self/cgroup": "0::/\n", "cg/memory.max": str(GIB),
                                         "cg/memory.current": str(2 * GIB)})
    assert available_bytes(proc, cg) == 0


def test_cgroup_v1_limit_and_its_unlimited_value(tmp_path):
    files = {**MEMINFO, "proc/self/cgroup": "5:devices:/\n4:memory:/pod/ctr\n0::/\n",
             "cg/memory/memory.limit_in_bytes": "9223372036854771712\n",
             "cg/memory/memory.usage_in_bytes": str(40 * GIB)}
    proc, cg = _tree(tmp_path, files)
    assert available_bytes(proc, cg) == 32 * GIB        # no limit: MemAvailable decides
    proc, cg = _tree(tmp_path / "limited", {**files, "cg/memory/pod/ctr/memory.limit_in_bytes": str(4 * GIB),
                                            "cg/memory/pod/ctr/memory.usage_in_bytes": str(GIB),
                                            "cg/memory/pod/ctr/memory.stat": f"total_inactive_file {GIB // 2}\n"})
    assert available_bytes(proc, cg) == 3 * GIB + GIB // 2


@pytest.mark.parametrize("tied", [False, True])
def test_weight_bytes_is_what_the_model_holds(tied):
    import mindspore as ms
    from ms_atb.models.llama import LlamaConfig, LlamaForCausalLM
    from ms_atb.formats.loader import PRESETS
    config = LlamaConfig(**{**PRESETS["tiny-llama"], "tie_word_embeddings": tied, "vocab_size": 500,
                            "bos_token_id": 498, "eos_token_id": 499})
    model = LlamaForCausalLM(config, num_blocks=4, block_size=16, dtype=ms.float32, device="cpu")
    held = sum(p.size for p in model.get_parameters() if "_cache." not in p.name)
    assert weight_bytes(config, 1, 4, packed=True) == held * 4
    # float16 on the CPU: the linears float32 panels like float32's, every other parameter 2 bytes
    half = LlamaForCausalLM(config, num_blocks=4, block_size=16, dtype=ms.float16, device="cpu")
    assert weight_bytes(config, 1, 2, packed=True) == sum(
        p.size * (4 if p.dtype == ms.float32 else 2) for p in half.get_parameters() if "_cache." not in p.name)
    assert any(p.dtype == ms.float16 for p in half.get_parameters())
    # elsewhere (the NPU) every parameter is in the model's dtype, the linears [in, out] unpadded
    npu = LlamaForCausalLM(config, num_blocks=4, block_size=16, dtype=ms.float16, device="npu",
                           attention_backend="mindspore")
    assert weight_bytes(config, 1, 2, packed=False) == sum(p.size for p in npu.get_parameters()
                                                          if "_cache." not in p.name) * 2


def test_check_fits_names_weights_kv_and_what_there_is():
    check_fits(3 * GIB, GIB, 4 * GIB, "m")
    check_fits(100 * GIB, GIB, None, "m")              # unknown: nothing to check against
    with pytest.raises(ValueError, match=r"m needs 5.00 GiB of memory \(weights 4.00 GiB, KV cache 1.00 GiB\) but "
                                         r"this process has 4.50 GiB available"):
        check_fits(4 * GIB, GIB, 4 * GIB + GIB // 2, "m")


def test_a_model_larger_than_memory_is_refused_before_any_weight_is_read(monkeypatch):
    import ms_atb.memory_budget
    from ms_atb.models import weights
    from ms_atb.llm import LLM

    def no_read(*args, **kwargs):
        raise AssertionError("a weight was read")
    monkeypatch.setattr(weights, "iter_weights", no_read)
    monkeypatch.setattr(ms_atb.memory_budget, "available_bytes", lambda: 8 * GIB)
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=r"random:tiny-llama\?vocab_size=40000000' with 64 KV blocks needs "
                                         r"19\.\d\d GiB of memory \(weights 19\.\d\d GiB, KV cache 0\.00 GiB\) "
                                         r"but this process has 8\.00 GiB available"):
        LLM(TINY, path="random:tiny-llama?vocab_size=40000000", num_blocks=64)
    assert time.perf_counter() - t0 < 30
    monkeypatch.undo()
    monkeypatch.setattr(weights, "iter_weights", no_read)
    with pytest.raises(ValueError, match=r"needs [\d.]+ GiB of memory \(weights [\d.]+ GiB"):    # this machine's memory
        LLM.prepare(TINY, path="random:tiny-llama?vocab_size=4000000000&hidden_size=512")


def test_lora_bytes_is_what_the_slots_hold_and_the_check_counts_them(monkeypatch):
    import mindspore as ms
    import ms_atb.memory_budget
    from ms_atb.formats.loader import PRESETS
    from ms_atb.llm import LLM
    from ms_atb.memory_budget import lora_bytes
    from ms_atb.models.llama import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(**{**PRESETS["tiny-llama"], "vocab_size": 500, "bos_token_id": 498, "eos_token_id": 499})
    model = LlamaForCausalLM(config, num_blocks=4, block_size=16, dtype=ms.float32, device="cpu", lora=(3, 8))
    assert lora_bytes(config, 1, 3, 8) == sum(p.size * 4 for p in model.lora_parameters())
    # many big slots: refused before the build, the slots named
    monkeypatch.setattr(ms_atb.memory_budget, "available_bytes", lambda: 8 * GIB)
    with pytest.raises(ValueError, match=r"and 64 LoRA slots of rank 4096 needs [\d.]+ GiB"):
        LLM(TINY, path="random:tiny-llama?hidden_size=4096&intermediate_size=8192&num_hidden_layers=4",
            enable_lora=True, max_loras=64, max_lora_rank=4096, num_blocks=16)
