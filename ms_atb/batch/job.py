"""BatchJob: one ms-atb-generate run as named stages: read -> lock -> prepare -> validate -> shard -> run ->
write -> merge.

Rules:
  1. Everything that can be checked is checked before the engine is built: paths, flags, the config, and every
     line (read: a pass parsing every line, ids distinct; validate: a pass checking each line's sampling fields
     and prompt against the vocabulary, max_model_len and the pool).
  2. One job writes an output at a time (ms_atb/batch/output_file.py), locked before the config is read: outside
     msrun by the process, under msrun by rank 0 for the whole job; each replica's writer joins it and locks its
     part file.
  3. The job streams: the input is read a line at a time (passes to check it, one to run it), at most WINDOW requests
     are built ahead of the engine, each result line is written and flushed as its request finishes, and the
     summary is a running aggregate. Memory holds a fixed 24-byte index entry per line and a byte of state, never
     the lines themselves.
  4. A line that cannot run is an error line (with --skip-invalid, and always in the OpenAI format), written where
     the run reaches it; a killed job keeps every line written.
  5. With data_parallel_size > 1, replica k runs its share (ms_atb/batch/replicas.py) into its part file; the last
     replica done merges the parts into the output.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import gc
import itertools
import os
import sys
import time

from ms_atb.batch import json_line, openai_batch, replicas, response_format, results
from ms_atb.batch.id_index import IdIndex
from ms_atb.batch.item import BatchItem
from ms_atb.batch.lora_choice import LoraChoice, without_lora
from ms_atb.batch.output_file import OutputLock, done_index
from ms_atb.batch.prompt_file import STDIN, InputFile
from ms_atb.batch.summary import Summary
from ms_atb.sampling_params import STRUCTURED_FIELDS, SamplingParams

BEAM_FIELDS = ("max_tokens", "ignore_eos")      # what a request may set under --beam-width
BEAM_CHUNK = 16                                 # prompts per beam search call: results are written per chunk
WINDOW = 1024                                   # requests built ahead of their results (rule 3)
_RUN, _INVALID, _DONE = 0, 1, 2                 # a line's state after validate()
_STATES = ("run", "invalid", "done")


class BatchJob:
    def __init__(self, args, sampling_defaults: dict, overrides: dict, beam=None, loras: dict | None = None):
        self.args = args
        self.loras = loras or {}                       # --lora NAME=PATH, parsed (ms_atb/batch/lora_choice.py)
        self.lora_choice: LoraChoice | None = None     # set once the config is read
        self.sampling_defaults = sampling_defaults     # the command line's sampling flags
        self.overrides = overrides                     # --set KEY=VALUE, parsed
        self.beam = beam                               # BeamSearchParams under --beam-width
        self.input: InputFile | None = None
        self.openai = False
        self.llm = None
        self.job_lock: OutputLock | None = None       # the output's lock, held by this process (rank 0 under msrun)
        self.target = args.output                      # the file this process writes (a part file under dp > 1)
        self.parts: list[str] = []                     # part files of the output found at the start
        self.skip = IdIndex()                          # ids already written (--resume)
        self.owner = None                              # numpy [lines]: each line's replica (dp > 1)
        self.counts = collections.Counter()            # this replica's lines: "run", "invalid", "done"
        self._state = self._weights = None             # validate() -> shard()
        self.replica_note = ""
        self.summary = Summary()
        self.num_beam_tokens = 0

    # ---- read and lock -----------------------------------------------------------------------
    def read(self, held: contextlib.ExitStack) -> None:
        """The input, opened (not read yet), and the checks of the output path that need no engine (rule 1)."""
        args = self.args
        self.input = held.enter_context(InputFile(args.input, args.format, args.skip_invalid))
        self.openai = self.input.openai
        if self.openai and (args.chat or self.beam is not None):
            raise ValueError("--chat and --beam-width do not apply to OpenAI batch input: each line names its endpoint")
        ids = IdIndex()
        for item in self.input.items():        # a line that is not a request stops here, unless it may be skipped
            ids.add(item.id, item.line)
        self.input.check_ids(ids)
        check_output_path(args)

    def lock(self, held: contextlib.ExitStack) -> None:
        """The output's lock, before the config is read (rule 2): this process's, or under msrun rank 0's."""
        role = msrun_role()
        if role is None:
            self.job_lock = held.enter_context(OutputLock(self.args.output))
        elif role == 0:
            self.job_lock = held.enter_context(OutputLock(self.args.output, job=msrun_job()))

    def prepare(self, held: contextlib.ExitStack) -> None:
        """The engine without its model; a replica's writer joins the job's lock and locks its part file; the
        part files and the ids already written."""
        from ms_atb.llm import LLM
        from ms_atb.worker.distributed import global_rank
        args = self.args
        # scheduler.policy "auto" means "prefix" here: prompts are ordered by shared prefix
        self.llm = llm = LLM.prepare(args.config, default_policy="prefix", **self.overrides)
        self.lora_choice = LoraChoice(self.loras, (args.config, llm.config.model.path))
        if msrun_role() is not None:         # scripts/msrun_generate.sh names a failed rank by its pid
            print(f"[ms_atb] msrun rank {global_rank()} is pid {os.getpid()}", file=sys.stderr, flush=True)
        dp = llm.config.parallel.data_parallel_size
        if dp > 1:
            self.target = replicas.part_path(args.output, llm.replica, dp)
            self.replica_note = f"replica {llm.replica} of {dp}: "
            if self.job_lock is not None:
                self.job_lock.share(dp)
            elif llm.rank == 0:
                held.enter_context(OutputLock.join(args.output, msrun_job(), llm.replica))
            if llm.rank == 0:
                held.enter_context(OutputLock(self.target))
        self._handle_parts(dp)
        if args.resume:
            done_index(self.target)                  # repairs a torn last line of our own file first
            written = replicas.written_index(args.output)
            written.close()
            self.skip = written.ids

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
            for path in ([args.output] if dp > 1 and self.job_lock is not None else []) + \
                    [p for p in parts if p not in layout]:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
            parts = [p for p in parts if p in layout]
        self.parts = parts

    # ---- validate and shard --------------------------------------------------------------------
    def validate(self) -> None:
        """Pass 2 (after read's): every line is checked against the engine (rule 1) and its state kept (a byte);
        under dp > 1 each line's weight in the split (its prompt's tokens)."""
        from array import array
        weights = array("i") if self.llm.config.parallel.data_parallel_size > 1 else None
        state, strict = bytearray(), not (self.args.skip_invalid or self.openai)
        for item in self.input.items():
            done = item.id in self.skip
            # a line already written is checked only for its weight in the split
            request, error = self._check(item) if not done or weights is not None else (None, None)
            if error is not None and not done and strict:
                raise ValueError(error)
            state.append(_DONE if done else _INVALID if error is not None else _RUN)
            if weights is not None:
                weights.append(0 if request is None else len(request.prompt_token_ids))
        self._state, self._weights = state, weights

    def shard(self) -> None:
        """Under data_parallel_size > 1, each line's replica (rule 5); this replica's counts."""
        if self._weights is not None:
            self.owner = replicas.assign(self._weights, self.llm.config.parallel.data_parallel_size)
        for n, s in enumerate(self._state):
            if self.owner is None or self.owner[n] == self.llm.replica:
                self.counts[_STATES[s]] += 1
        self._state = self._weights = None

    def _check(self, item: BatchItem):
        """(the item's Request, None) or (None, the message of its error line)."""
        if item.error is not None:
            return None, item.error
        try:
            return self._request(item, 0), None
        except ValueError as e:     # make_request names the request by its index; this names the line
            where = f"{self.input.name}:{item.line} ({'custom_id' if self.openai else 'id'} {item.id!r})"
            return None, f"{where}: {str(e).removeprefix('request 0: ')}"

    def _request(self, item: BatchItem, index: int):
        """The item's checked Request; ValueError saying what is wrong."""
        if self.beam is not None and set(item.sampling) - set(BEAM_FIELDS):
            structured = sorted(set(item.sampling) & {response_format.FIELD, *STRUCTURED_FIELDS})
            raise ValueError(f"beam search takes no structured output constraint, got {structured}" if structured
                             else f"under --beam-width a request may set only {list(BEAM_FIELDS)}, "
                                  f"got {sorted(set(item.sampling) - set(BEAM_FIELDS))}")
        lora = self.lora_choice.of(item)
        params = SamplingParams.from_dict(response_format.line_sampling(
            without_lora(item.sampling), {**dataclasses.asdict(self.llm.config.sampling), **self.sampling_defaults}))
        prompt, special = self._prompt(item)
        return self.llm.make_request(prompt, params, index, request_id=item.engine_id,
                                     add_special_tokens=special, tag=item, lora_request=lora)

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

    # ---- run -------------------------------------------------------------------------------
    def run(self):
        """The last pass: builds the model (unless this replica has nothing to run) and yields the output lines, results
        as they finish and error lines where the run reaches them (rule 4)."""
        idle = not self.counts["run"]
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
            invalid = self.counts["invalid"]
            skipped = f", {invalid} invalid written as error lines" if invalid else ""
            print(f"[ms_atb] {self.replica_note}{self.counts['run']} requests to run ({self.counts['done']} already "
                  f"in {self.args.output}{' and its parts' if self.parts else ''}{skipped}); engine built in "
                  f"{self.llm.build_seconds:.1f} s", file=sys.stderr)
        errors = collections.deque()           # error lines met while requests are read ahead
        requests = self._requests(errors)
        lines = self._beam_lines(requests) if self.beam is not None else self._sample_lines(requests)
        for line in itertools.chain(lines, _drain(errors)):
            yield from _drain(errors)
            yield line

    def _requests(self, errors: collections.deque):
        """This replica's requests to run, in input order; the error line of each invalid one goes to errors."""
        index = 0
        for n, item in enumerate(self.input.items()):
            if self.owner is not None and self.owner[n] != self.llm.replica or item.id in self.skip:
                continue
            request, error = self._check(item)
            if error is not None:
                errors.append(self._error_line(item, error))
                continue
            yield dataclasses.replace(request, index=index)
            index += 1

    def _error_line(self, item: BatchItem, message: str) -> dict:
        return openai_batch.error_line(item, message) if self.openai else results.error_line(item.id, message)

    def _sample_lines(self, requests):
        if not self.counts["run"]:
            for _ in requests:           # nothing to run here: the error lines are all there is
                pass
            return
        for request, out in self.llm.stream(requests, use_tqdm=not self.args.no_progress, window=WINDOW,
                                            total=self.counts["run"]):
            self.summary.add(out)
            item = request.tag
            yield (openai_batch.result_line(item, out, self.llm.tokenizer, self.llm.config.model.path)
                   if self.openai else results.sample_line(item.id, out))

    def _beam_lines(self, requests):
        """Runs of up to BEAM_CHUNK requests with the same max_tokens and ignore_eos, written chunk by chunk."""
        def key(r):
            return r.params.max_tokens, r.params.ignore_eos
        for (max_tokens, ignore_eos), run in itertools.groupby(requests, key=key):
            run = iter(run)
            while chunk := list(itertools.islice(run, BEAM_CHUNK)):
                params = dataclasses.replace(self.beam, max_tokens=max_tokens, ignore_eos=ignore_eos)
                outputs = self.llm.beam_search([r.prompt_token_ids for r in chunk], params,
                                               use_tqdm=not self.args.no_progress)
                for request, out in zip(chunk, outputs):
                    self.summary.requests += 1
                    self.num_beam_tokens += len(out.sequences[0].token_ids)
                    yield results.beam_line(request.tag.id, out)

    # ---- write -----------------------------------------------------------------------------
    def write(self, lines) -> float:
        """Writes and flushes each line as it comes (rank 0 of the replica; the other ranks only run); returns
        the seconds the lines took."""
        t0 = time.perf_counter()
        out = None
        if self.llm.rank == 0:
            try:
                out = open(self.target, "a" if self.args.resume else "w", encoding="utf-8")
            except OSError as e:
                raise ValueError(f"--output {self.args.output!r} cannot be written ({e.strerror})") from None
            if self.job_lock is not None and self.target == self.args.output:
                self.job_lock.adopt(self.target)       # the file itself, by any of its names (rule 2)
        try:
            for line in lines:
                if out is None:
                    continue
                try:
                    out.write(json_line.dumps(line) + "\n")
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
        from ms_atb.batch.summary import format_summary
        if self.llm.rank != 0:
            return
        if self.beam is not None:
            tokens, n = self.num_beam_tokens, self.summary.requests
            print(f"[ms_atb] beam search: {n} requests in {elapsed:.1f} s, {tokens} best-beam tokens "
                  f"({tokens / max(elapsed, 1e-9):.1f}/s)", file=sys.stderr)
        elif self.llm.runner is not None:
            self.llm.flush_disk_cache()          # the summary counts every block written
            print(format_summary(self.summary.result(elapsed, self.llm.stats())), file=sys.stderr)

    def merge(self) -> None:
        """The last replica done merges the part files into the output (rule 5)."""
        dp = self.llm.config.parallel.data_parallel_size
        if self.llm.rank != 0 or not (dp > 1 or self.parts):
            return
        merged = replicas.merge_if_done(self.args.output, lambda: (item.id for item in self.input.items()))
        print(f"[ms_atb] {self.replica_note}{merged or 'done; the last replica to finish merges the parts'}",
              file=sys.stderr)


def _drain(queue: collections.deque):
    while queue:
        yield queue.popleft()


def msrun_role() -> int | None:
    """None outside msrun; else 0 for the worker of global rank 0, 1 for any other worker, and -1 for msrun's
    scheduler process (which runs the command too and writes nothing)."""
    from ms_atb.worker.distributed import global_rank, world_size_from_env
    if world_size_from_env() is None:
        return None
    if os.environ.get("MS_ROLE") == "MS_SCHED":
        return -1
    return 0 if global_rank() == 0 else 1


def msrun_job() -> str:
    """The name of this msrun job: its scheduler's address, which no other running job shares."""
    return f"msrun {os.environ.get('MS_SCHED_HOST', '?')}:{os.environ.get('MS_SCHED_PORT', '?')}"


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
