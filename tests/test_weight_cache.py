"""The weight cache beside the compiled graphs: a second runner reads the weights the first one saved, with the
same values; a torn, stale or foreign entry is removed with a warning and the weights come from the model file."""
import json
import os

import mindspore as ms
import numpy as np
import pytest

from ms_atb.config import EngineConfig
from ms_atb.models.llama import LlamaConfig
from ms_atb.worker import weight_cache
from ms_atb.worker.model_runner import ModelRunner
from ms_atb.worker.weight_cache import WeightCache

CONFIG = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=16, max_position_embeddings=128, rope_theta=10000.0,
                     tie_word_embeddings=True, rope_interleaved=True, bos_token_id=1, eos_token_id=2)
_GGUF_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
_GGUF_LAYER = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
               "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
               "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def write_q4_1_gguf(path) -> None:
    """A tiny Llama GGUF with Q4_1 linears and embedding, as llama.cpp quantizes SmolLM2."""
    import gguf
    from gguf import quants
    from ms_atb.formats.loader import expected_shapes
    c, rng = CONFIG, np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), "llama")
    for add, value in ((w.add_context_length, c.max_position_embeddings), (w.add_embedding_length, c.hidden_size),
                       (w.add_block_count, c.num_hidden_layers), (w.add_feed_forward_length, c.intermediate_size),
                       (w.add_head_count, c.num_attention_heads), (w.add_head_count_kv, c.num_key_value_heads),
                       (w.add_layer_norm_rms_eps, c.rms_norm_eps), (w.add_rope_freq_base, c.rope_theta),
                       (w.add_rope_dimension_count, c.head_dim), (w.add_bos_token_id, c.bos_token_id),
                       (w.add_eos_token_id, c.eos_token_id)):
        add(value)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"t{i}" for i in range(c.vocab_size)])
    for name, shape in expected_shapes(c).items():
        a = (rng.standard_normal(shape) * (0.1 if len(shape) == 2 else 1.0)).astype(np.float32)
        if name.startswith("model.layers."):
            layer, module = name[len("model.layers."):-len(".weight")].split(".", 1)
            gname = f"blk.{layer}.{_GGUF_LAYER[module]}.weight"
        else:
            gname = _GGUF_NAMES[name]
        if a.ndim == 2:
            w.add_tensor(gname, quants.quantize(a, gguf.GGMLQuantizationType.Q4_1),
                         raw_dtype=gguf.GGMLQuantizationType.Q4_1)
        else:
            w.add_tensor(gname, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def gguf_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("model") / "tiny.q4_1.gguf"
    write_q4_1_gguf(path)
    return str(path)


def runner(model, cache, **keywords):
    config = EngineConfig.load(model, compile_cache=None if cache is None else str(cache), num_blocks=8,
                               max_model_len=64, max_num_batched_tokens=16, max_num_seqs=2, **keywords)
    return ModelRunner(config)


def held(r) -> dict:
    return {name: p.asnumpy() for name, p in r.model.weight_parameters().items()}


def assert_same_weights(a: dict, b: dict) -> None:
    assert list(a) == list(b)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_second_runner_loads_the_saved_weights(gguf_model, tmp_path):
    plain = runner(gguf_model, None)
    assert plain.weight_cache.status == "off" and "q4_1" in plain.weight_formats.values()
    first = runner(gguf_model, tmp_path)
    assert first.weight_cache.wait() == "saved"                   # written by a thread of its own
    assert sorted(os.listdir(tmp_path / "weights")) == [first.weight_cache.key + e for e in (".bin", ".json")]
    second = runner(gguf_model, tmp_path)
    assert second.weight_cache.status == "loaded" and second.weight_cache.key == first.weight_cache.key
    assert_same_weights(held(second), held(plain))
    # int8 activations (the default): the quantized linears in the dot layout, held as raw uint8 bytes
    assert {p.dtype for p in second.model.weight_parameters().values()} == {ms.float32, ms.uint8}
    exact = runner(gguf_model, tmp_path, activation_dtype="float32")
    assert exact.weight_cache.wait() == "saved" and exact.weight_cache.key != first.weight_cache.key
    assert {p.dtype for p in exact.model.weight_parameters().values()} == {ms.float32, ms.int8}


def test_the_key_follows_the_model_file_and_the_rank_settings(gguf_model, tmp_path):
    first = runner(gguf_model, tmp_path)
    float32 = runner(gguf_model, tmp_path, weight_dtype="float32")          # other held layouts: another entry
    assert float32.weight_cache.wait() == "saved" and float32.weight_cache.key != first.weight_cache.key
    stat = os.stat(gguf_model)
    os.utime(gguf_model, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))   # the model file changed
    touched = runner(gguf_model, tmp_path)
    assert touched.weight_cache.wait() == "saved" and touched.weight_cache.key != first.weight_cache.key
    assert runner("random:tiny-llama", tmp_path).weight_cache.status == "off"   # computed, not read


def _break_truncated(cache):
    with open(cache.data_path, "r+b") as f:
        f.truncate(os.path.getsize(cache.data_path) - 1)


def _break_json(cache):
    cache.index_path.write_text("{not json")


def _break_shapes(cache):
    index = json.loads(cache.index_path.read_text())
    index["weights"][0][2] = [1] + index["weights"][0][2]
    cache.index_path.write_text(json.dumps(index))


def _break_key(cache):
    index = json.loads(cache.index_path.read_text())
    index["key"] = "0" * 32
    cache.index_path.write_text(json.dumps(index))


def _break_offset(cache):
    index = json.loads(cache.index_path.read_text())
    index["weights"][-1][3] = index["bytes"]                # past the end of the data
    cache.index_path.write_text(json.dumps(index))


def _break_layout(cache):
    index = json.loads(cache.index_path.read_text())
    index["weights"] = {"not": "a list"}
    cache.index_path.write_text(json.dumps(index))


@pytest.mark.parametrize("damage", [_break_truncated, _break_json, _break_shapes, _break_key, _break_offset,
                                    _break_layout])
def test_a_damaged_entry_is_removed_with_a_warning_and_rebuilt(gguf_model, tmp_path, damage):
    first = runner(gguf_model, tmp_path)
    want = held(first)
    first.weight_cache.wait()
    damage(first.weight_cache)
    with pytest.warns(RuntimeWarning, match="could not load"):
        rebuilt = runner(gguf_model, tmp_path)
    assert rebuilt.weight_cache.wait() == "saved"                  # read from the file, saved afresh
    assert_same_weights(held(rebuilt), want)
    assert runner(gguf_model, tmp_path).weight_cache.status == "loaded"


def test_parameters_of_another_dtype_or_shape_are_refused_before_any_is_set(tmp_path):
    a = {"w": ms.Parameter(ms.Tensor(np.arange(6, dtype=np.float32).reshape(2, 3)), name="w"),
         "q": ms.Parameter(ms.Tensor(np.arange(4, dtype=np.int8)), name="q")}
    cache = WeightCache(str(tmp_path), {"model": "x"})
    assert cache.status == "missing" and not cache.load(a)
    cache.save(a)
    b = {"w": ms.Parameter(ms.Tensor(np.zeros((2, 3), np.float32)), name="w"),
         "q": ms.Parameter(ms.Tensor(np.zeros(4, np.int8)), name="q")}
    assert WeightCache(str(tmp_path), {"model": "x"}).load(b)
    np.testing.assert_array_equal(b["w"].asnumpy(), a["w"].asnumpy())
    np.testing.assert_array_equal(b["q"].asnumpy(), a["q"].asnumpy())
    c = {"w": ms.Parameter(ms.Tensor(np.zeros((2, 3), np.float16)), name="w"), "q": b["q"]}
    with pytest.warns(RuntimeWarning, match="other weights, dtypes or shapes"):
        assert not WeightCache(str(tmp_path), {"model": "x"}).load(c)
    assert not c["w"].asnumpy().any() and not os.listdir(tmp_path / "weights")


def test_only_the_entries_used_last_are_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(weight_cache, "MAX_ENTRIES", 2)
    w = {"w": ms.Parameter(ms.Tensor(np.ones(3, np.float32)), name="w")}
    caches = [WeightCache(str(tmp_path), {"model": i}) for i in range(3)]
    for i, cache in enumerate(caches[:2]):
        cache.save(w)
        cache.wait()
        os.utime(cache.index_path, ns=(i * 10**9, i * 10**9))
    assert caches[0].load(w)                        # caches[0] becomes the one used last: caches[1] goes
    caches[2].save(w)
    caches[2].wait()
    assert sorted(os.listdir(tmp_path / "weights")) == sorted(c.key + e for c in (caches[0], caches[2])
                                                               for e in (".bin", ".json"))


def test_a_folder_others_may_write_is_refused(tmp_path):
    root = tmp_path / "shared"
    root.mkdir(mode=0o777)
    os.chmod(root, 0o777)
    (root / "weights").mkdir(mode=0o777)
    os.chmod(root / "weights", 0o777)
    with pytest.raises(ValueError, match="writable by group or others"):
        WeightCache(str(root), {"model": "x"})
    assert WeightCache(None, {"model": "x"}).status == "off" and WeightCache(str(root), None).status == "off"


def test_the_cache_root_is_created_private_and_must_be_private(tmp_path):
    WeightCache(str(tmp_path / "c"), {"model": "x"})
    assert oct(os.stat(tmp_path / "c").st_mode & 0o777) == oct(os.stat(tmp_path / "c" / "weights").st_mode & 0o777) \
        == "0o700"
    shared = tmp_path / "shared"
    (shared / "weights").mkdir(mode=0o700, parents=True)
    os.chmod(shared, 0o770)                        # the root: others could swap its weights folder
    with pytest.raises(ValueError, match=rf"'{shared}' is writable by group or others"):
        WeightCache(str(shared), {"model": "x"})


def test_a_data_file_swapped_after_its_check_is_not_the_one_mapped(tmp_path, monkeypatch):
    """The weights are mapped through the descriptor whose file's size was checked: a data file put in its place
    after the check is not what the weights hold."""
    a = {"w": ms.Parameter(ms.Tensor(np.arange(1, 7, dtype=np.float32)), name="w")}
    WeightCache(str(tmp_path), {"model": "x"}).save(a)
    check = WeightCache._check

    def check_then_swap(self, *args):
        entries = check(self, *args)
        other = self.data_path.with_name("other")
        other.write_bytes(bytes(os.path.getsize(self.data_path)))     # the same size, other bytes
        os.replace(other, self.data_path)
        return entries

    monkeypatch.setattr(WeightCache, "_check", check_then_swap)
    b = {"w": ms.Parameter(ms.Tensor(np.zeros(6, np.float32)), name="w")}
    assert WeightCache(str(tmp_path), {"model": "x"}).load(b)
    np.testing.assert_array_equal(b["w"].asnumpy(), a["w"].asnumpy())
