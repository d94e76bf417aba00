"""ms-atb-generate: offline batch generation from a prompt file into JSONL.

Input: a text file (one prompt per line; "\\n" in a line is a newline) or JSONL lines with "prompt"
(a string or token ids) or "messages" (a chat), an optional "id" and optional sampling fields. Each
request is written and flushed as soon as it finishes; --resume skips ids already in the output, so
an interrupted run loses nothing and duplicates nothing. With --skip-invalid, a request that cannot
run (bad JSON, a bad sampling field, a prompt too long...) is written as {"id", "error"} and the
others run; --resume counts those lines as done.
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import sys
import time

from ms_atb.sampling_params import SamplingParams


# Sampling defaults settable on the command line (--max-tokens ...), with their types; plus --ignore-eos.
SAMPLING_FLAGS = {"max_tokens": int, "temperature": float, "top_k": int, "top_p": float, "min_p": float,
                  "seed": int, "repetition_penalty": float, "presence_penalty": float,
                  "frequency_penalty": float, "min_tokens": int, "n": int, "truncate_prompt_tokens": int}
# ... and the ones that take a list of strings (--guided-choice positive negative).
LIST_FLAGS = {"guided_choice": "the output text is exactly one of these", "bad_words": "words never generated"}
BEAM_FIELDS = ("max_tokens", "ignore_eos")      # what a request may set under --beam-width
BEAM_CHUNK = 16                                 # prompts per beam search call: results are written per chunk


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="ms-atb-generate", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True, help="YAML config, HF directory or .gguf file")
    p.add_argument("--input", required=True, help="prompts: .txt (one per line) or .jsonl")
    p.add_argument("--output", required=True, help="JSONL results, one line per request")
    existing = p.add_mutually_exclusive_group()
    existing.add_argument("--resume", action="store_true", help="skip ids already in --output and append")
    existing.add_argument("--overwrite", action="store_true", help="replace an existing --output")
    p.add_argument("--chat", action="store_true", help="apply the chat template to plain prompts")
    p.add_argument("--skip-invalid", action="store_true",
                   help="write an error line for each invalid request and run the others (default: stop)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config leaf, e.g. --set num_blocks=256 (YAML value syntax)")
    for name, typ in SAMPLING_FLAGS.items():
        p.add_argument(f"--{name.replace('_', '-')}", dest=name, type=typ, default=None,
                       help=f"default {name} for requests that do not set it")
    for name, meaning in LIST_FLAGS.items():
        p.add_argument(f"--{name.replace('_', '-')}", dest=name, nargs="+", default=None, metavar="TEXT",
                       help=f"default {name} for requests that do not set it: {meaning}")
    p.add_argument("--ignore-eos", action="store_true", default=None)
    p.add_argument("--beam-width", type=int, default=None, metavar="W",
                   help="beam search with W beams instead of sampling (requests may set only max_tokens, ignore_eos)")
    p.add_argument("--length-penalty", type=float, default=1.0,
                   help="beam search: a beam's score is its log-probability / its tokens ** this (default 1)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p.parse_args(argv)


def read_requests(path: str, skip_invalid: bool = False) -> list[dict]:
    """Lines -> [{"id", "prompt" | "messages", sampling fields...}]; ValueError naming the line.
    skip_invalid: a line that is not a request becomes {"id", "_line", "_error"} instead."""
    if not os.path.isfile(path):
        problem = "is a directory, not a file" if os.path.isdir(path) else "not found"
        raise ValueError(f"--input {path!r} {problem}")
    items = []
    jsonl = path.endswith((".jsonl", ".json"))
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                items.extend(_parse_line(raw, lineno, path, jsonl))
            except ValueError as e:
                if not skip_invalid:
                    raise
                rid = getattr(e, "request_id", None) or f"line-{lineno}"
                items.append({"id": rid, "_line": lineno, "_error": str(e)})
    if not items:
        raise ValueError(f"--input {path!r} holds no prompts")
    ids = [i["id"] for i in items]
    if len(set(ids)) != len(ids):
        dup = next(x for x in ids if ids.count(x) > 1)
        raise ValueError(f"{path}: id {dup!r} appears more than once")
    return items


def _parse_line(raw: bytes, lineno: int, path: str, jsonl: bool) -> list[dict]:
    """[] for a blank line, else [one request]."""
    try:
        line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8").rstrip("\r\n")   # a BOM, CRLF
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}:{lineno}: not valid UTF-8 ({e.reason} at byte {e.start})") from None
    if not line.strip():
        return []
    if not jsonl:
        return [{"id": f"line-{lineno}", "prompt": line.replace("\\n", "\n")}]
    try:
        item = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
    if not isinstance(item, dict) or ("prompt" in item) == ("messages" in item):
        error = ValueError(f"{path}:{lineno}: each line needs exactly one of 'prompt' or 'messages'")
        error.request_id = str(item["id"]) if isinstance(item, dict) and "id" in item else None
        raise error
    rid = item.setdefault("id", f"line-{lineno}")
    if not isinstance(rid, (str, int)) or isinstance(rid, bool):
        raise ValueError(f"{path}:{lineno}: 'id' must be a string or an integer, got {json.dumps(rid)}")
    item["id"] = str(rid)
    item["_line"] = lineno
    return [item]


RESULT_START = b'{"id": '     # how every line this command writes begins


def done_ids(path: str) -> set[str]:
    """Ids already written: lines with an id and a result (token_ids, text) or an error. A torn last line (the
    run was killed mid-write: no newline, and the start of a result line) is cut off, and a complete last
    line that lost only its newline gets it back. Any other line that is not a result is an error, so
    results, and files that are not ours, are never truncated away."""
    if not os.path.exists(path):
        return set()
    size = os.path.getsize(path)
    ids, good, last = set(), 0, b""
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            last = raw
            if raw.strip():
                rid = _result_id(raw)
                if rid is None:
                    torn = (good + len(raw) == size and not raw.endswith(b"\n")
                            and (raw.startswith(RESULT_START) or RESULT_START.startswith(raw)))
                    if not torn:
                        raise ValueError(f"--output {path}:{lineno} is not a result line (JSON with an 'id' and "
                                         f"'token_ids', 'text' or 'error'); fix or remove it, or pass --overwrite")
                    break
                ids.add(rid)
            good += len(raw)
    if good < size:
        with open(path, "r+b") as f:
            f.truncate(good)
    elif last and not last.endswith(b"\n"):
        with open(path, "ab") as f:
            f.write(b"\n")
    return ids


def _result_id(raw: bytes) -> str | None:
    try:
        item = json.loads(raw)
    except ValueError:
        return None
    if isinstance(item, dict) and "id" in item and any(k in item for k in ("token_ids", "text", "error")):
        return str(item["id"])
    return None


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        return _main(args)
    except ValueError as e:
        print(f"ms-atb-generate: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"ms-atb-generate: interrupted; the results written so far are in {args.output}: rerun with "
              f"--resume to finish", file=sys.stderr)
        return 130


def _main(args) -> int:
    import yaml
    from ms_atb.config import EngineConfig
    from ms_atb.llm import LLM
    from ms_atb.engine_summary import format_summary, summarize

    items = read_requests(args.input, args.skip_invalid)
    if os.path.exists(args.output) and os.path.samefile(args.input, args.output):
        raise ValueError(f"--output {args.output!r} is the --input file; give another path")
    if os.path.isdir(args.output):
        raise ValueError(f"--output {args.output!r} is a directory; give a file path such as {args.output}/out.jsonl")
    if os.path.exists(args.output) and not (args.resume or args.overwrite):
        raise ValueError(f"--output {args.output!r} exists: pass --resume to continue it or --overwrite")
    folder = os.path.dirname(os.path.abspath(args.output))
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        raise ValueError(f"--output {args.output!r}: cannot create its directory ({e.strerror})") from None
    if not os.access(args.output if os.path.exists(args.output) else folder, os.W_OK):
        raise ValueError(f"--output {args.output!r} is not writable")
    skip = done_ids(args.output) if args.resume else set()
    overrides = {}
    for kv in args.set:
        key, eq, value = kv.partition("=")
        if not eq:
            raise ValueError(f"--set expects KEY=VALUE, got {kv!r}")
        try:
            overrides[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError as e:
            problem = getattr(e, "problem", None) or e
            raise ValueError(f"--set {kv!r}: the value is not valid YAML ({problem})") from None
    # Every request is checked (configuration, sampling fields, prompts) before the engine is built.
    cfg = EngineConfig.load(args.config, **overrides)
    defaults = {k: v for k, v in vars(args).items()
                if (k in SAMPLING_FLAGS or k in LIST_FLAGS or k == "ignore_eos") and v is not None}
    beam = None
    if args.beam_width is not None:
        from ms_atb.beam_search import BeamSearchParams
        beam = BeamSearchParams(args.beam_width, length_penalty=args.length_penalty)      # checks both
        flags = sorted(set(defaults) - set(BEAM_FIELDS))
        if flags:
            raise ValueError(f"--beam-width takes only --max-tokens and --ignore-eos of the sampling flags, "
                             f"got {['--' + f.replace('_', '-') for f in flags]}")
    invalid = []                  # error records of the requests skipped by --skip-invalid

    def reject(item, message):
        if not args.skip_invalid:
            raise ValueError(message)
        invalid.append({"id": item["id"], "error": message})

    pending = []
    for n, item in enumerate(items):
        if item["id"] in skip:
            continue
        if "_error" in item:
            invalid.append({"id": item["id"], "error": item["_error"]})
            continue
        where = f"{args.input}:{item.get('_line', n + 1)} (id {item['id']!r})"
        fields = {k: v for k, v in item.items() if k not in ("id", "prompt", "messages", "_line")}
        if beam is not None and set(fields) - set(BEAM_FIELDS):
            reject(item, f"{where}: under --beam-width a request may set only {list(BEAM_FIELDS)}, "
                         f"got {sorted(set(fields) - set(BEAM_FIELDS))}")
            continue
        try:
            params = SamplingParams.from_dict({**dataclasses.asdict(cfg.sampling), **defaults, **fields})
        except ValueError as e:
            reject(item, f"{where}: {e}")
            continue
        pending.append((item, where, params))
    llm = LLM.prepare(args.config, **overrides)    # tokenizer and limits: prompts are checked before the build
    requests = []
    for item, where, params in pending:
        try:
            prompt, special = item.get("prompt"), True
            if "messages" in item:
                prompt, special = llm.apply_chat_template(item["messages"]), False
            elif args.chat:
                if not isinstance(prompt, str):
                    raise ValueError("--chat applies the chat template to text prompts; this prompt is token ids")
                prompt, special = llm.apply_chat_template([{"role": "user", "content": prompt}]), False
            requests.append(llm.make_request(prompt, params, len(requests), request_id=item["id"],
                                             add_special_tokens=special))
        except ValueError as e:     # make_request names the request by its index; `where` names the line
            reject(item, f"{where}: {str(e).removeprefix(f'request {len(requests)}: ')}")
    llm.build()
    rank0 = llm.rank == 0
    if rank0:
        skipped = f", {len(invalid)} invalid written as error lines" if invalid else ""
        print(f"[ms_atb] {len(requests)} requests to run ({len(skip)} already in {args.output}{skipped}); "
              f"engine built in {llm.build_seconds:.1f} s", file=sys.stderr)
    outputs = []
    t0 = time.perf_counter()
    try:
        out = open(args.output, "a" if args.resume else "w", encoding="utf-8") if rank0 else None
    except OSError as e:
        raise ValueError(f"--output {args.output!r} cannot be written ({e.strerror})") from None
    try:
        records = (_beam_records(llm, requests, beam, outputs, not args.no_progress) if beam is not None
                   else _sample_records(llm, requests, outputs, not args.no_progress))
        for record in itertools.chain(invalid, records):
            if out is not None:
                try:
                    out.write(json.dumps(record, ensure_ascii=False) + "\n")
                    out.flush()
                except OSError as e:
                    raise ValueError(f"writing --output {args.output!r} failed ({e.strerror}); the results "
                                     f"written before are kept: make room and rerun with --resume") from None
    finally:
        if out is not None:
            try:
                out.close()
            except OSError:
                pass                      # the write that failed said so
    if rank0 and beam is not None:
        elapsed = time.perf_counter() - t0
        tokens = sum(len(o.sequences[0].token_ids) for o in outputs)
        print(f"[ms_atb] beam search: {len(outputs)} requests in {elapsed:.1f} s, {tokens} best-beam tokens "
              f"({tokens / max(elapsed, 1e-9):.1f}/s)", file=sys.stderr)
    elif rank0:
        print(format_summary(summarize(outputs, time.perf_counter() - t0, llm.stats())), file=sys.stderr)
    return 0


def _sample_records(llm, requests, outputs: list, progress: bool):
    """Result lines of generate(), each as soon as its request finishes (outputs collects the RequestOutputs)."""
    for _, o in llm.generate_iter(requests, use_tqdm=progress):
        outputs.append(o)
        record = {"id": o.request_id, **_sample_record(o.outputs[0]),   # the first sample's fields
                  "num_prompt_tokens": len(o.prompt_token_ids), "num_cached_tokens": o.num_cached_tokens,
                  "ttft_s": round(o.metrics.ttft, 6) if o.metrics.ttft is not None else None}
        del record["index"]
        if o.prompt_logprobs is not None:
            record["prompt_logprobs"] = o.prompt_logprobs
        if len(o.outputs) > 1:              # SamplingParams n > 1: every sample
            record["outputs"] = [_sample_record(c) for c in o.outputs]
        yield record


def _beam_records(llm, requests, beam, outputs: list, progress: bool):
    """Result lines of beam search: the best beam's fields and every beam, written chunk by chunk (runs of
    up to BEAM_CHUNK requests with the same max_tokens and ignore_eos)."""
    i = 0
    while i < len(requests):
        key = (requests[i].params.max_tokens, requests[i].params.ignore_eos)
        j = i + 1
        while j < len(requests) and j - i < BEAM_CHUNK and \
                (requests[j].params.max_tokens, requests[j].params.ignore_eos) == key:
            j += 1
        params = dataclasses.replace(beam, max_tokens=key[0], ignore_eos=key[1])
        chunk = llm.beam_search([r.prompt_token_ids for r in requests[i:j]], params, use_tqdm=progress)
        for request, o in zip(requests[i:j], chunk):
            outputs.append(o)
            beams = [{"text": b.text, "token_ids": b.token_ids, "finish_reason": b.finish_reason,
                      "cumulative_logprob": b.cumulative_logprob, "score": b.score} for b in o.sequences]
            yield {"id": request.request_id, **beams[0], "num_prompt_tokens": len(o.prompt_token_ids),
                   "beams": beams}
        i = j


def _sample_record(c) -> dict:
    record = {"index": c.index, "text": c.text, "token_ids": c.token_ids, "finish_reason": c.finish_reason}
    if c.logprobs is not None:          # keys become strings in JSON
        record.update(logprobs=c.logprobs, cumulative_logprob=c.cumulative_logprob)
    return record


if __name__ == "__main__":
    sys.exit(main())
