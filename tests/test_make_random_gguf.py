"""scripts/make_random_gguf.py: random-weight GGUF files of a named shape, each block type, that the gguf package
reads back as written and the engine loads and runs with SmolLM2's tokenizer."""
import numpy as np
import pytest

from ms_atb.formats import gguf_reader, loader
from scripts_import import load_script

mrg = load_script("make_random_gguf")
SMALL = mrg.Shape(hidden=64, layers=2, heads=4, kv_heads=2, ffn=128)


def test_named_shapes_are_the_models_they_stand_for():
    one, seven, eight = (mrg.SHAPES[n] for n in ("llama-1b", "llama-7b", "llama-8b"))
    assert (one.hidden, one.layers, one.heads, one.kv_heads, one.ffn, one.head_dim) == (2048, 16, 32, 8, 8192, 64)
    assert (seven.hidden, seven.layers, seven.kv_heads, seven.ffn, seven.head_dim) == (4096, 32, 32, 11008, 128)
    assert (eight.kv_heads, eight.ffn) == (8, 14336)
    params = sum(int(np.prod(d)) for _, d in mrg.tensors(one))
    assert 1.17e9 < params < 1.18e9                     # 0.97 B in the layers, 2 x 0.10 B embedding and output


@pytest.mark.parametrize("qtype", mrg.TYPES)
def test_written_file_reads_back(tmp_path, qtype):
    import gguf
    from gguf import quants
    path = str(tmp_path / f"m-{qtype}.gguf")
    params = mrg.write(path, SMALL, qtype, seed=1)
    config = loader.load_config(path)
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads,
            config.intermediate_size, config.vocab_size, config.tie_word_embeddings) == (64, 2, 4, 2, 128, 49152,
                                                                                         False)
    types = gguf_reader.stored_types(path)
    matrices = [n for n, d in mrg.tensors(SMALL) if len(d) == 2]
    assert {types[gguf_reader.hf_name(n)] for n in matrices} == {qtype}
    assert params == sum(int(np.prod(d)) for _, d in mrg.tensors(SMALL))
    data, ggml = gguf_reader.open_reader(path).raw("blk.1.ffn_down.weight")
    assert ggml == gguf.GGMLQuantizationType[qtype.upper()]
    w = quants.dequantize(np.asarray(data), ggml)         # [64, 128]
    assert w.shape == (64, 128) and 0.03 < w.std() < 0.1 and abs(w.mean()) < 0.02


def test_engine_runs_the_file_with_smollm2s_tokenizer(tmp_path):
    from ms_atb import LLM, SamplingParams
    from engine_helpers import with_buckets
    path = str(tmp_path / "m.gguf")
    mrg.write(path, SMALL, "q4_0")
    llm = with_buckets(LLM(path, max_num_batched_tokens=16, max_num_seqs=2, num_blocks=16, max_model_len=64,
                           precompile=False), [16])
    assert set(llm.weight_formats.values()) == {"q4_0"} and llm.runner.activation_dtype == "int8"
    out = llm.generate(["The capital of France is"], SamplingParams(max_tokens=4, temperature=0.0,
                                                                   ignore_eos=True), use_tqdm=False)[0]
    assert out.prompt_token_ids == llm.get_tokenizer().encode("The capital of France is")
    assert len(out.token_ids) == 4 and all(0 <= t < 49152 for t in out.token_ids)
