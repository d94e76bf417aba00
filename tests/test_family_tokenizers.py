"""Qwen2 and Llama 3 tokenizers and chat templates as those families ship them, on the family fixtures
(tests/data/families/): a byte-level BPE tokenizer.json trained here on a few sentences with the family's
special tokens after the learned vocabulary, a tokenizer_config.json with the family's chat template and EOS,
and a generation_config.json listing the end tokens. The engine renders each family's chat format, encodes
the rendered special tokens as single ids (one BOS for Llama 3, none for Qwen), round-trips text, and stops a
request at each of the family's end tokens; a Qwen2 GGUF with the same vocabulary and the template in its
metadata encodes and renders the same."""
import json
import os
import shutil

import pytest

from ms_atb import LLM, SamplingParams
from engine_helpers import with_buckets
from ms_atb.text.tokenizer import load_tokenizer

from family_files import write_gguf

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "families")
SETTINGS = dict(max_num_seqs=4, max_num_batched_tokens=32, num_blocks=64, max_model_len=128, precompile=False)
# The pre-tokenizer patterns of the published Qwen2 and Llama 3 tokenizer.json files.
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_SPLIT = QWEN2_SPLIT.replace(r"|\p{N}|", r"|\p{N}{1,3}|")
CHATML = ("{% if messages[0]['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
          "{% endif %}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
LLAMA3_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
                   "{{ m['content'] | trim }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}"
                   "<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")
FAMILIES = {
    # specials (in id order after the learned vocabulary), pre-tokenizer, template, tokenizer_config, end tokens
    "qwen2": dict(specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>"], split=QWEN2_SPLIT, template=CHATML,
                  config={"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
                  bos=None, stops=["<|im_end|>", "<|endoftext|>"], other_special="<|im_start|>"),
    "llama3": dict(specials=["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                             "<|eot_id|>"], split=LLAMA3_SPLIT, template=LLAMA3_TEMPLATE,
                   config={"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
                   bos="<|begin_of_text|>", stops=["<|end_of_text|>", "<|eot_id|>"],
                   other_special="<|start_header_id|>"),
}
CORPUS = ["You are a helpful assistant.", "What is the capital of France?", "The capital of France is Paris.",
          "Hello, how are you today? I am fine, thanks!", "Numbers: 12 345 6789.\nNew lines\tand tabs."] * 4
TEXTS = ["Hello, how are you today?", "The capital of France is Paris.\nIt has 2,100,000 people!",
         "  two  spaces, xyz QZ ~{}  "]
TALK = [{"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "Paris."},
        {"role": "user", "content": "And of Italy?"}]


def _backend(family: str, vocab_size: int):
    """A byte-level BPE over printable ASCII and newline, merges learned from CORPUS, the family's special
    tokens appended after them (as in the published files); at most vocab_size ids in all."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from ms_atb.text.gguf_vocab import byte_to_unicode
    spec = FAMILIES[family]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(spec["split"]), behavior="isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    alphabet = [byte_to_unicode()[b] for b in [9, 10] + list(range(32, 127))]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - len(spec["specials"]), initial_alphabet=alphabet,
                                  show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    tok.add_special_tokens(spec["specials"])
    if spec["bos"]:                         # Llama 3's post-processor puts BOS in front of every text
        tok.post_processor = processors.TemplateProcessing(
            single=f"{spec['bos']} $A", pair=f"{spec['bos']} $A {spec['bos']} $B",
            special_tokens=[(spec["bos"], tok.token_to_id(spec["bos"]))])
    assert tok.get_vocab_size() <= vocab_size
    return tok


def _family_dir(root, family: str):
    """The fixture's weights and config with the family's tokenizer files; (folder, backend)."""
    folder = root / family
    shutil.copytree(os.path.join(DATA, family), folder)
    os.remove(folder / "reference.json")
    vocab_size = json.loads((folder / "config.json").read_text())["vocab_size"]
    spec = FAMILIES[family]
    backend = _backend(family, vocab_size)
    backend.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(dict(spec["config"], chat_template=spec["template"])))
    ids = {t: backend.token_to_id(t) for t in spec["specials"]}
    bos = ids[spec["bos"]] if spec["bos"] else ids["<|endoftext|>"]
    (folder / "generation_config.json").write_text(json.dumps({"bos_token_id": bos,
                                                               "eos_token_id": [ids[t] for t in spec["stops"]]}))
    return folder, backend


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family_chat(request, tmp_path_factory):
    folder, backend = _family_dir(tmp_path_factory.mktemp("fam"), request.param)
    return request.param, with_buckets(LLM(str(folder), **SETTINGS), [32]), backend     # one graph


def test_chat_template_renders_the_family_format(family_chat):
    family, llm, _ = family_chat
    got = llm.apply_chat_template(TALK)
    if family == "qwen2":       # ChatML, with Qwen's default system message when the conversation has none
        assert got == ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                       "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
                       "<|im_start|>assistant\nParis.<|im_end|>\n<|im_start|>user\nAnd of Italy?<|im_end|>\n"
                       "<|im_start|>assistant\n")
        own = llm.apply_chat_template([{"role": "system", "content": "Be brief."}] + TALK[:1],
                                      add_generation_prompt=False)
        assert own == ("<|im_start|>system\nBe brief.<|im_end|>\n"
                       "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n")
    else:
        assert got == ("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n"
                       "What is the capital of France?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
                       "Paris.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nAnd of Italy?<|eot_id|>"
                       "<|start_header_id|>assistant<|end_header_id|>\n\n")
        own = llm.apply_chat_template([{"role": "user", "content": "  Hi \n"}], add_generation_prompt=False)
        assert own == "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"


def test_text_round_trips_and_special_tokens_are_single_ids(family_chat):
    family, llm, backend = family_chat
    tok = llm.get_tokenizer()
    bos = FAMILIES[family]["bos"]
    for text in TEXTS:
        ids = tok.encode(text)
        assert ids == ([backend.token_to_id(bos)] if bos else []) + backend.encode(text, add_special_tokens=False).ids
        assert tok.decode(ids) == text
        assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    specials = FAMILIES[family]["specials"]
    text = "".join(f"{s}x " for s in specials)
    ids = tok.encode(text, add_special_tokens=False)
    assert [i for i in ids if tok.is_special(i)] == [backend.token_to_id(s) for s in specials]
    assert tok.decode(ids, skip_special_tokens=False) == text
    assert tok.decode(ids) == "x " * len(specials)


def test_chat_prompt_tokens_carry_the_template_specials_once(family_chat):
    family, llm, backend = family_chat
    out = llm.chat(TALK, SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True), use_tqdm=False)[0]
    rendered = llm.apply_chat_template(TALK)
    assert out.prompt_token_ids == backend.encode(rendered, add_special_tokens=False).ids
    ids = out.prompt_token_ids
    if family == "qwen2":
        start, end = backend.token_to_id("<|im_start|>"), backend.token_to_id("<|im_end|>")
        assert ids[0] == start and ids.count(start) == 5 and ids.count(end) == 4     # system + 3 + assistant
    else:
        bos, eot = backend.token_to_id("<|begin_of_text|>"), backend.token_to_id("<|eot_id|>")
        assert ids[0] == bos and ids.count(bos) == 1 and ids.count(eot) == 3    # the template writes the BOS


def test_requests_stop_at_each_family_end_token(family_chat):
    family, llm, backend = family_chat
    spec = FAMILIES[family]
    stops = [backend.token_to_id(t) for t in spec["stops"]]
    assert llm.stop_token_ids == set(stops)
    for stop in stops:   # the random model would not choose the end token: a bias makes it, after min_tokens
        params = SamplingParams(max_tokens=10, temperature=0.0, min_tokens=3, logit_bias={stop: 100.0})
        out = llm.chat(TALK, params, use_tqdm=False)[0]
        assert len(out.token_ids) == 4 and out.token_ids[-1] == stop and out.finish_reason == "stop"
        assert spec["stops"][0] not in out.text and spec["stops"][1] not in out.text
    other = backend.token_to_id(spec["other_special"])      # a special token that is no end token
    params = SamplingParams(max_tokens=3, temperature=0.0, logit_bias={other: 100.0})
    out = llm.generate([TEXTS[0]], params, use_tqdm=False)[0]
    assert out.token_ids == [other] * 3 and out.finish_reason == "length" and out.text == ""
    params.skip_special_tokens = False
    assert llm.generate([TEXTS[0]], params, use_tqdm=False)[0].text == spec["other_special"] * 3


def test_gguf_with_the_family_vocabulary_and_template_in_its_metadata(tmp_path):
    """A Qwen2 GGUF as llama.cpp converts one: the BPE tokens padded with [PAD] entries up to the embedding
    rows, the specials typed as control tokens, the chat template and EOS (<|im_end|>) in the metadata."""
    folder, backend = _family_dir(tmp_path, "qwen2")
    model = json.loads(backend.to_str())["model"]
    tokens = [t for t, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1])]
    specials = FAMILIES["qwen2"]["specials"]
    tokens += specials
    n = json.loads((folder / "config.json").read_text())["vocab_size"]
    types = [3 if t in specials else 1 for t in tokens] + [5] * (n - len(tokens))
    tokens += [f"[PAD{i}]" for i in range(n - len(tokens))]
    assert [tokens.index(s) for s in specials] == [backend.token_to_id(s) for s in specials]
    path = str(tmp_path / "qwen2-chat.gguf")
    write_gguf(str(folder), path, "qwen2", dict(
        tokens=tokens, types=types, merges=[m if isinstance(m, str) else " ".join(m) for m in model["merges"]],
        pre="qwen2", bos=backend.token_to_id("<|endoftext|>"), eos=backend.token_to_id("<|im_end|>"),
        chat_template=CHATML))
    tok, hf = load_tokenizer(path), load_tokenizer(str(folder))
    for text in TEXTS + ["<|im_start|>user\nHi<|im_end|>\n"]:
        assert tok.encode(text) == hf.encode(text) == backend.encode(text).ids
        assert tok.decode(tok.encode(text), skip_special_tokens=False) == text
    llm = LLM.prepare(path, **SETTINGS)
    assert llm.apply_chat_template(TALK) == load_tokenizer(str(folder)).apply_chat_template(TALK)
    assert llm.stop_token_ids == {backend.token_to_id("<|im_end|>")}
    assert llm.tokenizer.is_special(backend.token_to_id("<|im_start|>"))
