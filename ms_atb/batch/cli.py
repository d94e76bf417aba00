"""ms-atb-generate: offline batch generation from a prompt file into JSONL.

Input: a text file (one prompt per line; "\\n" in a line is a newline) or JSONL lines with "prompt"
(a string or token ids) or "messages" (a chat), an optional "id" (a string or an integer, written back
as given) and optional sampling fields; `--input -` reads standard input (ms_atb/batch/prompt_file.py). Each
request is written and flushed as soon as it finishes; --resume skips ids already in the output, so
an interrupted run loses nothing and duplicates nothing. With --skip-invalid, a request that cannot
run (bad JSON, a bad sampling field, a prompt too long...) is written as {"id", "error"} and the
others run; --resume counts those lines as done. The OpenAI batch format (ms_atb/batch/openai_batch.py) is read
and written too (--format openai, or found by --format auto): there every invalid line is an error line.

One job writes an output at a time: a second one exits with status 2 at once, whatever its mode
(ms_atb/batch/output_file.py). Exit status: 0 done, 2 a usage or input error, 130 Ctrl-C, 143 SIGTERM; after
an interruption the output holds complete result lines only.

With parallel.data_parallel_size > 1 (under msrun) each replica runs its share of the input into a part file
and the last one done merges them into the output (ms_atb/batch/replicas.py); `--merge` does it by hand and
exits 1 while an input id has no result. The job's stages are in ms_atb/batch/job.py.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import sys

from ms_atb.batch import quiet
from ms_atb.batch.job import BEAM_FIELDS, BatchJob
from ms_atb.batch.lora_choice import lora_overrides, parse_loras
from ms_atb.batch.output_file import OutputLock
from ms_atb.batch.prompt_file import FORMATS, InputFile
from ms_atb.sampling_params import CLI, sampling_fields
from ms_atb.signals import EXIT_INTERRUPTED, EXIT_TERMINATED, Terminated, watch_signals

__all__ = ["main", "parse_args"]


# The sampling defaults settable on the command line (--max-tokens ...): SamplingParams declares them.
SAMPLING_FLAGS = {f.name: f for f in sampling_fields(CLI)}


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
    p.add_argument("--lora", action="append", default=[], metavar="NAME=PATH",
                   help="a LoRA adapter (PEFT directory) lines may name: an OpenAI line by its body's model, a JSONL "
                        "line by its 'lora' field; repeatable; turns LoRA on (max_lora_rank: the largest rank given)")
    p.add_argument("--chat", action="store_true", help="apply the chat template to plain prompts")
    p.add_argument("--skip-invalid", action="store_true",
                   help="write an error line for each invalid request and run the others (default: stop; OpenAI "
                        "batch input always does)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config leaf, e.g. --set num_blocks=256 (YAML value syntax)")
    for name, f in SAMPLING_FLAGS.items():
        p.add_argument(f"--{name.replace('_', '-')}", dest=name, default=None,
                       help=f"default {name} for requests that do not set it: {f.metadata['doc']}",
                       **_flag_kind(str(f.type)))
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


def _flag_kind(annotation: str) -> dict:
    """argparse's keywords for a SamplingParams field of this annotation."""
    if annotation == "bool":
        return {"action": "store_true"}
    if annotation.startswith("list[str]"):
        return {"nargs": "+", "metavar": "TEXT"}
    return {"type": {"int": int, "float": float, "str": str}[annotation.split(" | ")[0]]}


def main(argv=None) -> int:
    """argv None: the process's own command line; then Ctrl-C and an external SIGTERM are told apart
    (ms_atb/signals.py), which needs this call to come before any thread starts: this module imports
    neither MindSpore nor numpy at its top."""
    if argv is None:
        watch_signals()
        gc.disable()        # until the engine is built (BatchJob.run): imports and build leave almost no cycles
    args = parse_args(argv)
    args.own_process = argv is None     # the engine then lives as long as the process
    quiet.set_up(args.verbose)          # before MindSpore is imported: it reads its log level then
    try:
        return merge(args) if args.merge else generate(args)
    except ValueError as e:
        print(f"ms-atb-generate: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        what = "terminated (SIGTERM)" if isinstance(e, Terminated) else "interrupted"
        from ms_atb.batch.replicas import part_paths
        where = f"{args.output} and its part files" if part_paths(args.output) else args.output
        print(f"ms-atb-generate: {what}; the results written so far are in {where}: rerun with "
              f"--resume to finish", file=sys.stderr)
        return EXIT_TERMINATED if isinstance(e, Terminated) else EXIT_INTERRUPTED


def generate(args) -> int:
    """The job: its flags checked, then read -> lock -> prepare -> validate -> shard -> run -> write -> merge
    (ms_atb/batch/job.py)."""
    defaults = {k: v for k, v in vars(args).items() if k in SAMPLING_FLAGS and v is not None}
    loras = parse_loras(args.lora)
    if loras and args.beam_width is not None:
        raise ValueError("--beam-width runs the base model only; it takes no --lora")
    job = BatchJob(args, defaults, lora_overrides(loras, parse_overrides(args.set)), beam_params(args, defaults),
                   loras)
    with contextlib.ExitStack() as held:
        job.read(held)
        job.lock(held)
        job.prepare(held)
        job.validate()
        job.shard()
        elapsed = job.write(job.run())
        job.report(elapsed)
        job.merge()
    return 0


def parse_overrides(pairs: list[str]) -> dict:
    """--set KEY=VALUE flags -> {key: value}, each value read as YAML."""
    import yaml
    overrides = {}
    for kv in pairs:
        key, eq, value = kv.partition("=")
        if not eq:
            raise ValueError(f"--set expects KEY=VALUE, got {kv!r}")
        try:
            overrides[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError as e:
            problem = getattr(e, "problem", None) or e
            raise ValueError(f"--set {kv!r}: the value is not valid YAML ({problem})") from None
    return overrides


def beam_params(args, defaults: dict):
    """BeamSearchParams under --beam-width (None without); ValueError for a sampling flag beam search ignores."""
    if args.beam_width is None:
        return None
    from ms_atb.beam_search import BeamSearchParams
    beam = BeamSearchParams(args.beam_width, length_penalty=args.length_penalty)      # checks both
    flags = sorted(set(defaults) - set(BEAM_FIELDS))
    if flags:
        raise ValueError(f"--beam-width takes only --max-tokens and --ignore-eos of the sampling flags, "
                         f"got {['--' + f.replace('_', '-') for f in flags]}")
    return beam


def merge(args) -> int:
    """--merge: the output and its parts merged into the output; 0 when it holds every input id, else 1."""
    from ms_atb.batch import replicas
    if not replicas.part_paths(args.output):
        raise ValueError(f"--output {args.output!r} has no part files ({args.output}.part<k>-of-<n>) to merge")
    with InputFile(args.input, skip_invalid=True) as source, OutputLock(args.output):
        result = replicas.merge(args.output, (item.id for item in source.items()))
    if result is None:
        raise ValueError(f"--output {args.output!r} is being merged by another process")
    print(f"[ms_atb] merged {result.num_written} results from {len(result.parts)} part files into {args.output}",
          file=sys.stderr)
    if result.missing:
        print(f"ms-atb-generate: {len(result.missing)} input ids have no result (first {result.missing[0]!r}); the "
              f"parts are kept: rerun the job with --resume to finish", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
