"""Structured outputs on the embedded default (SmolLM2-135M-Instruct): JSON extraction constrained by a schema.

The workload: `--requests` chat requests (32), each asking for a JSON object of one fixed schema (a nested object,
an array, an enum, an integer, strings) about a short made-up profile, greedy, max_tokens `--max-tokens` (200), all
submitted at once (the config's max_num_seqs is 32: one batch). Printed, from one engine in one run:
  - quality: how many constrained requests finish with "stop", and how many of those parse and validate against
    the schema (jsonschema);
  - throughput: output tok/s of the constrained run (after warm-up runs of the same batch, so no graph compiles
    inside a timed run: printed) and of the same prompts unconstrained, each request generating exactly as many tokens as
    its constrained run did (ignore_eos, max_tokens its length: the same batch at every step, so the ratio is the
    constraint's cost), and their ratio; CPU seconds of this process for each; and the same prompts
    unconstrained and free (max_tokens, EOS): their tok/s and how many of them are valid JSON of the schema;
  - masks: fill time per step and per constrained token (p50 / p99), and how long the steps waited for them
    after the model's step (what the overlap did not hide);
  - compiles: the schema's compile (cold, on the grammar thread), a cached one (the lookup and a sample's copy of
    the matcher), and the llguidance tokenizer's construction (once per engine).
It needs jsonschema (the test and bench extras: the .venv scripts/test.sh makes has it).
    .venv/bin/python scripts/bench_structured.py
    .venv/bin/python scripts/bench_structured.py --requests 8 --max-tokens 120     # quicker
"""
import argparse
import json
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_kv import hardware  # noqa: E402
from script_args import require_at_least  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "occupation": {"enum": ["engineer", "teacher", "doctor", "artist", "farmer", "student"]},
        "skills": {"type": "array", "items": {"type": "string"}},
        "address": {"type": "object", "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
                    "required": ["city", "country"], "additionalProperties": False},
    },
    "required": ["name", "age", "occupation", "skills", "address"],
    "additionalProperties": False,
}
NAMES = ["Alice Martin", "Bob Chen", "Carla Rossi", "David Okafor", "Elena Petrova", "Farid Haddad", "Grace Kim",
         "Hugo Silva", "Ines Duarte", "Jonas Berg", "Keiko Sato", "Liam Walsh", "Maya Cohen", "Nils Larsen"]
JOBS = [("engineer", "designs bridges", ["welding", "CAD"]), ("teacher", "teaches maths", ["algebra", "chess"]),
        ("doctor", "works in a hospital", ["surgery", "first aid"]), ("artist", "paints murals", ["painting", "design"]),
        ("farmer", "grows apples", ["driving tractors", "pruning"]), ("student", "studies physics", ["coding", "maths"])]
PLACES = [("Lyon", "France"), ("Osaka", "Japan"), ("Porto", "Portugal"), ("Toronto", "Canada"), ("Nairobi", "Kenya"),
          ("Bergen", "Norway"), ("Cusco", "Peru"), ("Adelaide", "Australia")]


def prompts(n: int, seed: int) -> list[list[dict]]:
    """n chats, each a made-up profile and the request for its JSON."""
    rng = random.Random(seed)
    chats = []
    for _ in range(n):
        name, (job, does, skills), (city, country) = rng.choice(NAMES), rng.choice(JOBS), rng.choice(PLACES)
        profile = (f"{name} is {rng.randint(19, 70)} years old and lives in {city}, {country}. "
                   f"{name.split()[0]} is a {job} who {does} and is good at {skills[0]} and {skills[1]}.")
        chats.append([{"role": "user", "content": f"{profile}\nExtract this person's details as a JSON object with "
                                                  f"the keys name, age, occupation, skills and address (city, "
                                                  f"country)."}])
    return chats


def run(llm, chats, params):
    """(outputs, output tok/s over the wall time, CPU seconds of this process)."""
    cpu = time.process_time()
    outs = llm.chat(chats, params, use_tqdm=False)
    return outs, llm.stats()["tokens_per_s"], time.process_time() - cpu


def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def quality(outs) -> tuple[int, int]:
    """(finished with stop, of those: parse and validate)."""
    import jsonschema
    stopped = [o for o in outs if o.finish_reason == "stop"]
    valid = 0
    for o in stopped:
        try:
            jsonschema.validate(json.loads(o.text), SCHEMA)
            valid += 1
        except (ValueError, jsonschema.ValidationError):
            pass
    return len(stopped), valid


def compile_times(llm) -> dict:
    """Cold compile of a fresh schema, a cached one (lookup and a sample's matcher copy), the tokenizer's build."""
    from ms_atb.engine.structured_outputs import StructuredOutputManager
    from ms_atb.structured_outputs import StructuredOutputsParams
    from ms_atb.text.grammar import make_guide
    fresh = StructuredOutputManager(llm.tokenizer)
    t0 = time.perf_counter()
    fresh.ll_tokenizer
    tokenizer_s = time.perf_counter() - t0
    so = StructuredOutputsParams(json=SCHEMA)
    guide = make_guide(so.key, so.json, llm.tokenizer)
    t0 = time.perf_counter()
    fresh.check(guide)
    check_s = time.perf_counter() - t0
    fresh.compile(guide).result()
    cached = []
    for _ in range(200):
        t0 = time.perf_counter()
        fresh.matcher(fresh.compile(guide))
        cached.append(time.perf_counter() - t0)
    return {"tokenizer_s": tokenizer_s, "check_s": check_s, "cold_s": fresh.compile_seconds[0],
            "cached_s": statistics.median(cached)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "smollm2_135m.yaml"))
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    require_at_least(ap, args, 1, "requests", "max_tokens")
    os.environ.setdefault("MS_ATB_QUIET", "1")
    from ms_atb import LLM, SamplingParams
    llm = LLM(args.config)
    chats = prompts(args.requests, args.seed)
    plain = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
    constrained = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, guided_json=SCHEMA)
    manager = llm.engine.structured
    # Warm-up: every graph both timed runs need, and the grammar. The first run computes the whole prompts; from the
    # second on they are prefix-cache hits, whose steps take other token buckets: so two runs, and then both timed
    # runs find the cache in the same state.
    warm, _, _ = run(llm, chats, constrained)
    run(llm, chats, [SamplingParams(max_tokens=len(o.token_ids), temperature=0.0, ignore_eos=True) for o in warm])
    manager.mask_seconds.clear()
    manager.wait_seconds.clear()
    graphs = len(llm.runner.compiled)
    outs, guided_tps, guided_cpu = run(llm, chats, constrained)
    masks, waits = list(manager.mask_seconds), list(manager.wait_seconds)
    matched = [SamplingParams(max_tokens=len(o.token_ids), temperature=0.0, ignore_eos=True) for o in outs]
    _, matched_tps, matched_cpu = run(llm, chats, matched)
    compiled_in_timed_runs = len(llm.runner.compiled) - graphs
    free, free_tps, _ = run(llm, chats, plain)
    stopped, valid = quality(outs)
    free_stopped, free_valid = quality(free)
    per_token = [s / r for r, s in masks for _ in range(r)]
    c = compile_times(llm)
    n = len(outs)
    print(f"hardware: {hardware()}")
    print(f"workload: {args.config}, {n} chat requests for one JSON schema (nested object, array, enum, integer, "
          f"strings), greedy, max_tokens {args.max_tokens}, one batch")
    print(f"quality: {stopped}/{n} finish with stop ({stopped / n:.0%}); {valid}/{stopped} of those parse and "
          f"validate ({valid / max(stopped, 1):.0%}); mean output {statistics.mean(len(o.token_ids) for o in outs):.0f} "
          f"tokens. Unconstrained: {free_stopped}/{n} stop, {free_valid}/{n} valid, mean output "
          f"{statistics.mean(len(o.token_ids) for o in free):.0f} tokens, {free_tps:.1f} tok/s")
    print(f"throughput: constrained {guided_tps:.1f} tok/s ({guided_cpu:.1f} CPU s), unconstrained with the same "
          f"lengths {matched_tps:.1f} tok/s ({matched_cpu:.1f} CPU s); ratio {guided_tps / matched_tps:.2f}; graphs "
          f"compiled during them: {compiled_in_timed_runs}")
    print(f"masks: per step p50 {pct([s for _, s in masks], .5) * 1e3:.2f} ms, p99 "
          f"{pct([s for _, s in masks], .99) * 1e3:.2f} ms over {len(masks)} steps; per token p50 "
          f"{pct(per_token, .5) * 1e6:.0f} us, p99 {pct(per_token, .99) * 1e6:.0f} us; waited after the model's step "
          f"p50 {pct(waits, .5) * 1e3:.2f} ms, p99 {pct(waits, .99) * 1e3:.2f} ms")
    print(f"compile: the schema cold {c['cold_s'] * 1e3:.2f} ms (its check {c['check_s'] * 1e3:.2f} ms), cached "
          f"{c['cached_s'] * 1e6:.0f} us (lookup and a sample's matcher); the llguidance tokenizer once per engine "
          f"{c['tokenizer_s']:.2f} s")
    print("example:", outs[0].text)


if __name__ == "__main__":
    main()
