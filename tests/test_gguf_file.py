"""GGUFFile's per-process index: reused while the header bytes stay the same, re-read when they change."""
import gguf
import numpy as np

from ms_atb.formats.gguf_file import GGUFFile


def _write(path, name: str, length: int) -> None:
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_string("general.name", name)
    w.add_context_length(length)
    w.add_token_list([f"t{i}" for i in range(50)])
    w.add_tensor("token_embd.weight", np.arange(64, dtype=np.float32).reshape(8, 8))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_an_unchanged_file_reuses_its_index(tmp_path):
    path = tmp_path / "m.gguf"
    _write(path, "first", 64)
    a, b = GGUFFile(str(path)), GGUFFile(str(path))
    assert a.fields is b.fields and a.tensors is b.tensors
    assert b.get_str("general.name") == "first" and len(b.get_array("tokenizer.ggml.tokens", "str")) == 50


def test_a_rewritten_header_of_the_same_size_is_read_again(tmp_path):
    path = tmp_path / "m.gguf"
    _write(path, "first", 64)
    size = path.stat().st_size
    assert GGUFFile(str(path)).get_int("llama.context_length") == 64
    _write(path, "other", 128)                      # same byte count, other values
    assert path.stat().st_size == size
    f = GGUFFile(str(path))
    assert f.get_str("general.name") == "other" and f.get_int("llama.context_length") == 128
    shape, _, start = f.tensors["token_embd.weight"]
    data = np.frombuffer(path.read_bytes(), np.float32, 64, start)
    assert shape == (8, 8) and data[-1] == 63.0
