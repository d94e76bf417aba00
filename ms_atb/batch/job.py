"""BatchJob: one ms-atb-generate run as named stages: read -> validate -> shard -> run -> write -> merge.

Rules:
  1. Everything that can be checked is checked before the engine is built: paths, flags, the config, every
     line's sampling fields and prompt (tokenized once, against the vocabulary, max_model_len and the pool).
  2. One job writes an output at a time (ms_atb/batch/output_file.py): outside msrun the output is locked before
     the config is read; under msrun the writing rank (tp rank 0 of each replica) locks its file once the engine is
     prepared, since only then is its rank known.
  3. A line that cannot run is an error line (with --skip-invalid, and always in the OpenAI format); error lines
     come first, then results as their requests finish, each flushed: a killed job keeps every line written.
  4. With data_parallel_size > 1, replica k runs its share (ms_atb/batch/replicas.py) into its part file; the last
     replica done merges the parts into the output.
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import itertools
import json
import os
import sys
import time

from ms_atb.batch import openai_batch, replicas, results
from ms_atb.batch.item import BatchItem
from ms_atb.batch.output_file import OutputLock, done_ids
from ms_atb.batch.prompt_file import STDIN, STDIN_NAME, read_input
from ms_atb.sampling_params import SamplingParams

BEAM_FIELDS = ("max_tokens", "ignore_eos")      # what a request may set under --beam-width
BEAM_CHUNK = 16                                 # prompts per beam search call: results are written per chunk


class BatchJob:
    def __init__(self, args, sampling_defaults: dict, overrides: dict, beam=None):
        self.args = args
        self.sampling_defaults = sampling_defaults     # the command line's sampling flags
        self.overrides = overrides                     # --set KEY=VALUE, parsed
        self.beam = beam                               # BeamSearchParams under --beam-width
        self.openai = False
        self.items: list[BatchItem] = []
        self.llm = None
        self.target = args.output                      # the file this process writes (a part file under dp > 1)
        self.parts: list[str] = []                     # part files of the output found at the start
        self.skip: set = set()                         # ids already written (--resume)
        self.requests: list = []                       # Requests to run, each tagged with its BatchItem
        self.invalid: list[tuple[BatchItem, str]] = []     # items that cannot run, with the reason
        self.replica_note = ""
        self.outputs: list = []                        # RequestOutputs (or beam outputs), for the summary

    # ---- read ------------------------------------------------------------------------------
    def read(self) -> None:
        """The input's items, and the checks of the output path that need no engine (rule 1)."""
        args = self.args
        args.format, self.items = read_input(args.input, args.format, args.skip_invalid)
        self.openai = args.format == "openai"
        if self.openai and (args.chat or self.beam is not None):
            raise ValueError("--chat and --beam-width do not apply to OpenAI batch input: each line names its endpoint")
        check_output_path(args)

    def prepare(self, held: contextlib.ExitStack) -> None:
        """The engine without its model; the writing rank's lock under msrun (rule 2); the part files and the
        ids already written."""
        from ms_atb.llm import LLM
        from ms_atb.worker.distributed import global_rank, world_size_from_env
        args = self.args
        # scheduler.policy "auto" means "prefix" here: prompts are ordered by shared prefix
        self.llm = llm = LLM.prepare(args.config, default_policy="prefix", **self.overrides)
        if world_size_from_env() is not None:         # scripts/msrun_generate.sh names a failed rank by its pid
            print(f"[ms_atb] msrun rank {global_rank()} is pid {os.getpid()}", file=sys.stderr, flush=True)
        dp = llm.config.parallel.data_parallel_size
        if dp > 1:
            self.target = replicas.part_path(args.output, llm.replica, dp)
            self.replica_note = f"replica {llm.replica} of {dp}: "
        if llm.rank == 0 and world_size_from_env() is not None:
            held.enter_context(OutputLock(self.target))
        self._handle_parts(dp)
        if args.resume:
            self.skip = done_ids(self.target) | replicas.read_results(args.output).keys()
            for path in self.parts:
                self.skip |= replicas.read_results(path).keys()

    def _handle_parts(self, dp: int) -> None:
        """Part files of another layout (or of a dp 1 run) are stale; another replica's part is its own business."""
        args, rank0 = self.args, self.llm.rank == 0
        layout = {replicas.part_path(args.output, k, dp) for k in range(dp)} if dp > 1 else set()
        parts = replicas.part_paths(args.output)
        mine = [p for p in parts if p == self.target or p not in layout]
        if mine and rank0 and not (args.resume or args.overwrite):      # the other ranks may see it made
            raise ValueError(f"--output {args.output!r} has the part file {mine[0]}: pass --resume to continue the "
                             f"job or --overwrite")
        if args.overwrite and rank0:
            for path in ([args.output] if dp > 1 else []) + [p for p in parts if p not in layout]:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
            parts = [p for p in parts if p in layout]
        self.parts = parts

    # ---- validate --------------------------------------------------------------------------
    def validate(self) -> None:
        """Every item not yet written becomes a Request tagged with it, or an error line (rule 3)."""
        for item in self.items:
            if item.id in self.skip:
                continue
            if item.error is not None:
                self.invalid.append((item, item.error))
                continue
            where = (f"{STDIN_NAME if self.args.input == STDIN else self.args.input}:{item.line} "
                     f"({'custom_id' if self.openai else 'id'} {item.id!r})")
            try:
                self.requests.append(self._request(item))
            except ValueError as e:     # make_request names the request by its index; `where` names the line
                message = f"{where}: {str(e).removeprefix(f'request {len(self.requests)}: ')}"
                if not (self.args.skip_invalid or self.openai):
                    raise ValueError(message) from None
                self.invalid.append((item, message))

    def _request(self, item: BatchItem):
        """The item's checked Request; ValueError saying what is wrong."""
        if self.beam is not None and set(item.sampling) - set(BEAM_FIELDS):
            raise ValueError(f"under --beam-width a request may set only {list(BEAM_FIELDS)}, "
                             f"got {sorted(set(item.sampling) - set(BEAM_FIELDS))}")
        params = SamplingParams.from_dict({**dataclasses.asdict(self.llm.config.sampling), **self.sampling_defaults,
                                           **item.sampling})
        prompt, special = self._prompt(item)
        return self.llm.make_request(prompt, params, len(self.requests), request_id=item.engine_id,
                                     add_special_tokens=special, tag=item)

    def _prompt(self, item: BatchItem) -> tuple:
        """(the prompt the engine runs, whether the tokenizer adds its special tokens): a chat goes through the
        chat template, which writes them itself."""
        if item.messages is not None:
            return self.llm.apply_chat_template(item.messages), False
        if self.args.chat:
            if not isinstance(item.prompt, str):
                raise ValueError("--chat applies the chat template to text prompts; this prompt is token ids")
            return self.llm.apply_chat_template([{"role": "user", "content": item.prompt}]), False
        return item.prompt, True

    # ---- shard -----------------------------------------------------------------------------
    def shard(self) -> None:
        """Under data_parallel_size > 1 this replica keeps its share of the requests and error lines (rule 4)."""
        dp = self.llm.config.parallel.data_parallel_size
        if dp == 1:
            return
        built = {id(r.tag): len(r.prompt_token_ids) for r in self.requests}
        shares = replicas.split([self._weight(item, built) for item in self.items], dp)
        mine = {self.items[i].line for i in shares[self.llm.replica]}      # an item's line is its own
        self.requests = [r for r in self.requests if r.tag.line in mine]
        self.invalid = [(item, message) for item, message in self.invalid if item.line in mine]

    def _weight(self, item: BatchItem, built: dict) -> int:
        """An item's weight in the split, the same whether it is done or not: its prompt's tokens (as the engine
        runs it), 0 when it cannot run. built: the tokens of the items validate() made requests of."""
        if id(item) in built:
            return built[id(item)]
        if item.error is not None:
            return 0
        try:
            return len(self._request(item).prompt_token_ids)
        except ValueError:
            return 0

    # ---- run -------------------------------------------------------------------------------
    def run(self):
        """Builds the model (unless this replica has nothing to run) and yields the output lines: error lines
        first, then results as they finish (rule 3)."""
        idle = self.llm.config.parallel.data_parallel_size > 1 and not self.requests
        if not idle:
            self.llm.build()
        if self.args.own_process:
            # The engine and MindSpore's modules live as long as this process: the collector need not scan them
            # again, neither in the full collection MindSpore starts each graph's compile (or load) with, nor at
            # exit (half a second of CPU each time otherwise). Collecting while they were made cost 0.3 s more
            # (for ~3,000 objects of cycles, kept from here on).
            gc.freeze()
            gc.enable()
        if self.llm.rank == 0:
            skipped = f", {len(self.invalid)} invalid written as error lines" if self.invalid else ""
            print(f"[ms_atb] {self.replica_note}{len(self.requests)} requests to run ({len(self.skip)} already in "
                  f"{self.args.output}{' and its parts' if self.parts else ''}{skipped}); engine built in "
                  f"{self.llm.build_seconds:.1f} s", file=sys.stderr)
        errors = (self._error_line(item, message) for item, message in self.invalid)
        lines = () if idle else self._beam_lines() if self.beam is not None else self._sample_lines()
        return itertools.chain(errors, lines)

    def _error_line(self, item: BatchItem, message: str) -> dict:
        return openai_batch.error_line(item, message) if self.openai else results.error_line(item.id, message)

    def _sample_lines(self):
        for request, out in self.llm.stream(self.requests, use_tqdm=not self.args.no_progress):
            self.outputs.append(out)
            item = request.tag
            yield (openai_batch.result_line(item, out, self.llm.tokenizer, self.llm.config.model.path)
                   if self.openai else results.sample_line(item.id, out))

    def _beam_lines(self):
        """Runs of up to BEAM_CHUNK requests with the same max_tokens and ignore_eos, written chunk by chunk."""
        requests, i = self.requests, 0
        while i < len(requests):
            key = (requests[i].params.max_tokens, requests[i].params.ignore_eos)
            j = i + 1
            while j < len(requests) and j - i < BEAM_CHUNK and \
                    (requests[j].params.max_tokens, requests[j].params.ignore_eos) == key:
                j += 1
            params = dataclasses.replace(self.beam, max_tokens=key[0], ignore_eos=key[1])
            chunk = self.llm.beam_search([r.prompt_token_ids for r in requests[i:j]], params,
                                         use_tqdm=not self.args.no_progress)
            for request, out in zip(requests[i:j], chunk):
                self.outputs.append(out)
                yield results.beam_line(request.tag.id, out)
            i = j

    # ---- write -----------------------------------------------------------------------------
    def write(self, lines) -> float:
        """Writes and flushes each line as it comes (rank 0; the other ranks only run); returns the seconds the
        lines took."""
        t0 = time.perf_counter()
        out = None
        if self.llm.rank == 0:
            try:
                out = open(self.target, "a" if self.args.resume else "w", encoding="utf-8")
            except OSError as e:
                raise ValueError(f"--output {self.args.output!r} cannot be written ({e.strerror})") from None
        try:
            for line in lines:
                if out is None:
                    continue
                try:
                    out.write(json.dumps(line, ensure_ascii=False) + "\n")
                    out.flush()
                except OSError as e:
                    raise ValueError(f"writing --output {self.args.output!r} failed ({e.strerror}); the results "
                                     f"written before are kept: make room and rerun with --resume") from None
        finally:
            if out is not None:
                with contextlib.suppress(OSError):     # the write that failed said so
                    out.close()
        return time.perf_counter() - t0

    # ---- summary and merge -----------------------------------------------------------------
    def report(self, elapsed: float) -> None:
        """The end-of-run summary (rank 0)."""
        from ms_atb.batch.summary import format_summary, summarize
        if self.llm.rank != 0:
            return
        if self.beam is not None:
            tokens = sum(len(o.sequences[0].token_ids) for o in self.outputs)
            print(f"[ms_atb] beam search: {len(self.outputs)} requests in {elapsed:.1f} s, {tokens} best-beam tokens "
                  f"({tokens / max(elapsed, 1e-9):.1f}/s)", file=sys.stderr)
        elif self.llm.runner is not None:
            print(format_summary(summarize(self.outputs, elapsed, self.llm.stats())), file=sys.stderr)

    def merge(self) -> None:
        """The last replica done merges the part files into the output (rule 4)."""
        dp = self.llm.config.parallel.data_parallel_size
        if self.llm.rank != 0 or not (dp > 1 or self.parts):
            return
        merged = replicas.merge_if_done(self.args.output, [item.id for item in self.items], output_locked=dp == 1)
        print(f"[ms_atb] {self.replica_note}{merged or 'done; the last replica to finish merges the parts'}",
              file=sys.stderr)


def check_output_path(args) -> None:
    """ValueError when --output is the input, a directory, an existing file without --resume or --overwrite, or
    cannot be written; creates its directory."""
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
