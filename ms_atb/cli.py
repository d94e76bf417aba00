"""ms-atb-generate: offline batch generation from a prompt file into JSONL.

Input: a text file (one prompt per line; "\\n" in a line is a newline) or JSONL lines with "prompt"
(a string or token ids) or "messages" (a chat), an optional "id" (a string or an integer, written back
as given) and optional sampling fields; `--input -` reads standard input (ms_atb/prompt_file.py). Each
request is written and flushed as soon as it finishes; --resume skips ids already in the output, so
an interrupted run loses nothing and duplicates nothing. With --skip-invalid, a request that cannot
run (bad JSON, a bad sampling field, a prompt too long...) is written as {"id", "error"} and the
others run; --resume counts those lines as done. The OpenAI batch format (ms_atb/openai_batch.py) is read
and written too (--format openai, or found by --format auto): there every invalid line is an error line.

One job writes an output at a time: a second one exits with status 2 at once, whatever its mode
(ms_atb/output_file.py). Exit status: 0 done, 2 a usage or input error, 130 Ctrl-C, 143 SIGTERM; after
an interruption the output holds complete result lines only.

With parallel.data_parallel_size > 1 (under msrun) each replica runs its share of the input into a part file
and the last one done merges them into the output (ms_atb/data_parallel.py); `--merge` does it by hand and
exits 1 while an input id has no result.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import itertools
import json
import os
import sys
import time

from ms_atb import quiet
from ms_atb.openai_batch import error_line, result_line
from ms_atb.output_file import OutputLock, done_ids
from ms_atb.prompt_file import FORMATS, STDIN, STDIN_NAME, read_input, read_requests
from ms_atb.sampling_params import SamplingParams
from ms_atb.termination import EXIT_INTERRUPTED, EXIT_TERMINATED, Terminated, watch_signals

__all__ = ["main", "parse_args", "read_requests", "done_ids"]


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
    p.add_argument("--config", help="YAML config, HF directory or .gguf file (required unless --merge)")
    p.add_argument("--input", required=True,
                   help="prompts: .txt (one per line) or .jsonl; - reads standard input (JSONL if its first line "
                        "starts with '{', else text)")
    p.add_argument("--output", required=True, help="JSONL results, one line per request")
    p.add_argument("--format", choices=FORMATS, default="auto",
                   help="input and output format: ms_atb (text or JSONL prompts), openai (OpenAI batch lines), or "
                        "auto (openai when the first JSON object of a JSONL input has a custom_id)")
    existing = p.add_mutually_exclusive_group()
    existing.add_argument("--resume", action="store_true", help="skip ids already in --output and append")
    existing.add_argument("--overwrite", action="store_true", help="replace an existing --output")
    p.add_argument("--chat", action="store_true", help="apply the chat template to plain prompts")
    p.add_argument("--skip-invalid", action="store_true",
                   help="write an error line for each invalid request and run the others (default: stop; OpenAI "
                        "batch input always does)")
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
    p.add_argument("--merge", action="store_true",
                   help="only merge the part files of a data-parallel job into --output, in --input order")
    p.add_argument("--verbose", action="store_true",
                   help="show MindSpore's own warnings (hidden by default; also MS_ATB_VERBOSE=1)")
    args = p.parse_args(argv)
    if args.config is None and not args.merge:
        p.error("the following arguments are required: --config")
    return args


def main(argv=None) -> int:
    """argv None: the process's own command line; then Ctrl-C and an external SIGTERM are told apart
    (ms_atb/termination.py), which needs this call to come before any thread starts: this module imports
    neither MindSpore nor numpy at its top."""
    if argv is None:
        watch_signals()
        gc.disable()        # until the engine is built (see _run): imports and build leave almost no cycles
    args = parse_args(argv)
    args.own_process = argv is None     # the engine then lives as long as the process
    quiet.set_up(args.verbose)          # before MindSpore is imported: it reads its log level then
    try:
        return _merge(args) if args.merge else _main(args)
    except ValueError as e:
        print(f"ms-atb-generate: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        what = "terminated (SIGTERM)" if isinstance(e, Terminated) else "interrupted"
        from ms_atb.data_parallel import part_paths
        where = f"{args.output} and its part files" if part_paths(args.output) else args.output
        print(f"ms-atb-generate: {what}; the results written so far are in {where}: rerun with "
              f"--resume to finish", file=sys.stderr)
        return EXIT_TERMINATED if isinstance(e, Terminated) else EXIT_INTERRUPTED


def _main(args) -> int:
    """Checks the input and output paths and locks the output, then _run()."""
    args.format, items = read_input(args.input, args.format, args.skip_invalid)
    if args.format == "openai" and (args.chat or args.beam_width is not None):
        raise ValueError("--chat and --beam-width do not apply to OpenAI batch input: each line names its endpoint")
    if args.input != STDIN and os.path.exists(args.output) and os.path.samefile(args.input, args.output):
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
    from ms_atb.worker.distributed import world_size_from_env
    with contextlib.ExitStack() as held:
        # One writer per output, locked before the output is read, cut or opened. Under msrun the
        # writing rank (0) is known only once the engine is prepared: it locks then.
        if world_size_from_env() is None:
            held.enter_context(OutputLock(args.output))
        return _run(args, items, held)


def _merge(args) -> int:
    """--merge: the output and its parts merged into the output; 0 when it holds every input id, else 1."""
    from ms_atb import data_parallel
    ids = [item["id"] for item in read_requests(args.input, skip_invalid=True)]
    if not data_parallel.part_paths(args.output):
        raise ValueError(f"--output {args.output!r} has no part files ({args.output}.part<k>-of-<n>) to merge")
    with OutputLock(args.output):
        result = data_parallel.merge(args.output, ids)
    print(f"[ms_atb] merged {result.num_written} results from {len(result.parts)} part files into {args.output}",
          file=sys.stderr)
    if result.missing:
        print(f"ms-atb-generate: {len(result.missing)} input ids have no result (first {result.missing[0]!r}); the "
              f"parts are kept: rerun the job with --resume to finish", file=sys.stderr)
        return 1
    return 0


def _run(args, items: list[dict], held: contextlib.ExitStack) -> int:
    import yaml
    from ms_atb.worker.distributed import world_size_from_env
    from ms_atb.config import EngineConfig
    from ms_atb.llm import LLM
    from ms_atb.engine_summary import format_summary, summarize

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
    # tokenizer and limits: prompts are checked before the build; scheduler.policy "auto" means "prefix" here
    llm = LLM.prepare(args.config, default_policy="prefix", **overrides)
    # Data parallelism (ms_atb/data_parallel.py): replica k's tp rank 0 writes part k; the last one done merges.
    from ms_atb import data_parallel
    if world_size_from_env() is not None:         # scripts/msrun_generate.sh names a failed rank by its pid
        from ms_atb.worker.distributed import global_rank
        print(f"[ms_atb] msrun rank {global_rank()} is pid {os.getpid()}", file=sys.stderr, flush=True)
    dp, all_ids = cfg.parallel.data_parallel_size, [item["id"] for item in items]
    target = args.output if dp == 1 else data_parallel.part_path(args.output, llm.replica, dp)
    if llm.rank == 0 and world_size_from_env() is not None:
        held.enter_context(OutputLock(target))
    # Part files of another layout (or of a dp 1 run) are stale; another replica's part is its own business.
    layout = {data_parallel.part_path(args.output, k, dp) for k in range(dp)} if dp > 1 else set()
    parts = data_parallel.part_paths(args.output)
    mine = [p for p in parts if p == target or p not in layout]
    if mine and llm.rank == 0 and not (args.resume or args.overwrite):      # the other ranks may see it made
        raise ValueError(f"--output {args.output!r} has the part file {mine[0]}: pass --resume to continue the "
                         f"job or --overwrite")
    if args.overwrite and llm.rank == 0:
        for path in ([args.output] if dp > 1 else []) + [p for p in parts if p not in layout]:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        parts = [p for p in parts if p in layout]
    skip = set()
    if args.resume:
        skip = done_ids(target) | data_parallel.read_results(args.output).keys()
        for path in parts:
            skip |= data_parallel.read_results(path).keys()
    source = STDIN_NAME if args.input == STDIN else args.input
    invalid = []                  # error records of the requests skipped by --skip-invalid
    openai = args.format == "openai"          # every invalid line is an error line in this format

    def error_record(item, message):
        return error_line(item, message) if openai else {"id": item["id"], "error": message}

    def reject(item, message):
        if not (args.skip_invalid or openai):
            raise ValueError(message)
        invalid.append(error_record(item, message))

    pending = []
    for n, item in enumerate(items):
        if item["id"] in skip:
            continue
        if "_error" in item:
            invalid.append(error_record(item, item["_error"]))
            continue
        where = f"{source}:{item.get('_line', n + 1)} ({'custom_id' if openai else 'id'} {item['id']!r})"
        fields = {k: v for k, v in item.items() if k not in ("id", "prompt", "messages", "_line", "_openai")}
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
    requests = []
    ids = {}                      # engine request id (the id as JSON: 7 and "7" differ) -> the input's id
    for item, where, params in pending:
        try:
            prompt, special = item.get("prompt"), True
            if "messages" in item:
                prompt, special = llm.apply_chat_template(item["messages"]), False
            elif args.chat:
                if not isinstance(prompt, str):
                    raise ValueError("--chat applies the chat template to text prompts; this prompt is token ids")
                prompt, special = llm.apply_chat_template([{"role": "user", "content": prompt}]), False
            ids[json.dumps(item["id"])] = item["id"]
            requests.append(llm.make_request(prompt, params, len(requests), request_id=json.dumps(item["id"]),
                                             add_special_tokens=special))
        except ValueError as e:     # make_request names the request by its index; `where` names the line
            reject(item, f"{where}: {str(e).removeprefix(f'request {len(requests)}: ')}")
    replica = ""
    if dp > 1:            # every request was checked above; this replica runs its share
        shares = data_parallel.split([data_parallel.prompt_tokens(llm, item, args.chat) for item in items], dp)
        share = {items[i]["id"] for i in shares[llm.replica]}
        requests = [r for r in requests if ids[r.request_id] in share]
        invalid = [x for x in invalid if x["id"] in share]
        replica = f"replica {llm.replica} of {dp}: "
    idle = dp > 1 and not requests         # this replica's share is done: no model to build
    if not idle:
        llm.build()
    if args.own_process:
        # The engine and MindSpore's modules live as long as this process: the collector need not scan them
        # again, neither in the full collection MindSpore starts each graph's compile (or load) with, nor at
        # exit (half a second of CPU each time otherwise). Collecting while they were made cost 0.3 s more
        # (for ~3,000 objects of cycles, kept from here on).
        gc.freeze()
        gc.enable()
    rank0 = llm.rank == 0
    if rank0:
        skipped = f", {len(invalid)} invalid written as error lines" if invalid else ""
        print(f"[ms_atb] {replica}{len(requests)} requests to run ({len(skip)} already in {args.output}"
              f"{' and its parts' if parts else ''}{skipped}); engine built in {llm.build_seconds:.1f} s",
              file=sys.stderr)
    outputs = []
    t0 = time.perf_counter()
    try:
        out = open(target, "a" if args.resume else "w", encoding="utf-8") if rank0 else None
    except OSError as e:
        raise ValueError(f"--output {args.output!r} cannot be written ({e.strerror})") from None
    try:
        by_id = {item["id"]: item for item, _, _ in pending}
        line = (lambda rid, o: result_line(by_id[rid], o, llm.tokenizer, cfg.model.path)) if openai else None
        records = (() if idle else _beam_records(llm, requests, beam, outputs, ids, not args.no_progress)
                   if beam is not None else _sample_records(llm, requests, outputs, ids, not args.no_progress, line))
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
    elif rank0 and not idle:
        print(format_summary(summarize(outputs, time.perf_counter() - t0, llm.stats())), file=sys.stderr)
    if rank0 and (dp > 1 or parts):
        merged = data_parallel.merge_if_done(args.output, all_ids, output_locked=dp == 1)
        print(f"[ms_atb] {replica}{merged or 'done; the last replica to finish merges the parts'}", file=sys.stderr)
    return 0


def _sample_records(llm, requests, outputs: list, ids: dict, progress: bool, line=None):
    """Result lines of generate(), each as soon as its request finishes (outputs collects the RequestOutputs;
    ids maps engine request ids to the input's; line(id, output), if given, makes the line instead)."""
    for _, o in llm.generate_iter(requests, use_tqdm=progress):
        outputs.append(o)
        if line is not None:
            yield line(ids[o.request_id], o)
            continue
        record = {"id": ids[o.request_id], **_sample_record(o.outputs[0]),   # the first sample's fields
                  "num_prompt_tokens": len(o.prompt_token_ids), "num_cached_tokens": o.num_cached_tokens,
                  "ttft_s": round(o.metrics.ttft, 6) if o.metrics.ttft is not None else None}
        del record["index"]
        if o.prompt_logprobs is not None:
            record["prompt_logprobs"] = o.prompt_logprobs
        if len(o.outputs) > 1:              # SamplingParams n > 1: every sample
            record["outputs"] = [_sample_record(c) for c in o.outputs]
        yield record


def _beam_records(llm, requests, beam, outputs: list, ids: dict, progress: bool):
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
            yield {"id": ids[request.request_id], **beams[0], "num_prompt_tokens": len(o.prompt_token_ids),
                   "beams": beams}
        i = j


def _sample_record(c) -> dict:
    record = {"index": c.index, "text": c.text, "token_ids": c.token_ids, "finish_reason": c.finish_reason}
    if c.logprobs is not None:          # keys become strings in JSON
        record.update(logprobs=c.logprobs, cumulative_logprob=c.cumulative_logprob)
    return record


if __name__ == "__main__":
    sys.exit(main())
