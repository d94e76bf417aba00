"""LLM: the public face. It prepares the engine (config, tokenizer, KV pool size), builds its model, checks
requests through its InputProcessor and runs them: Engine.step() turns requests into sampled tokens and the
OutputProcessor turns those into RequestOutputs (ms_atb/engine, docs/design.md section 2)."""
from __future__ import annotations

import dataclasses
import os
import time
from typing import Iterable, Iterator, Sequence as Seq, Union

from ms_atb import memory_budget
from ms_atb.config import (DEFAULT_MAX_MODEL_LEN, EngineConfig, config_keys, parse_device, parse_size,
                           resolve_cache_dtype)
from ms_atb.core.prefix_order import POLICIES
from ms_atb.core.scheduler import Scheduler, SchedulerConfig
from ms_atb.engine.adapters import Adapters
from ms_atb.engine.admission import Admission
from ms_atb.engine.engine import Engine
from ms_atb.engine.input_processor import InputProcessor, Prompt
from ms_atb.engine.output_processor import OutputProcessor
from ms_atb.engine.request import Request
from ms_atb.engine.run import run_steps
from ms_atb.engine.stats import flat_stats
from ms_atb.engine.structured_outputs import StructuredOutputManager
from ms_atb.outputs import RequestOutput
from ms_atb.progress import progress_bar
from ms_atb.sampling_params import SamplingParams
from ms_atb.signals import interrupts_raise
from ms_atb.worker.distributed import init_distributed, replica_index, spmd_sampler
from ms_atb.worker.sampler import Sampler


class LLM:
    """llm = LLM("configs/smollm2_135m.yaml", device="cpu", enable_prefix_caching=True)

    The first argument is a YAML config, an HF directory or a GGUF file; every config leaf may be
    passed as a keyword that overrides the file. LLM(...) is LLM.prepare(...) followed by build()."""

    def __init__(self, model_or_config: Union[str, dict, None] = None, device: str | None = None,
                 **keywords):
        self._prepare(model_or_config, device, keywords)
        self.build()

    @classmethod
    def prepare(cls, model_or_config: Union[str, dict, None] = None, device: str | None = None,
                default_policy: str = "fcfs", **keywords) -> "LLM":
        """The engine without its model: make_request() and apply_chat_template() check requests against the
        tokenizer, the vocabulary, max_model_len and the KV pool, so a bad batch is rejected before build()
        spends a minute compiling graphs (ms-atb-generate does this). default_policy ("fcfs" or "prefix") is
        what scheduler.policy "auto" means for this engine: "fcfs" for LLM(...), "prefix" for a batch tool."""
        llm = cls.__new__(cls)
        llm._prepare(model_or_config, device, keywords, default_policy)
        return llm

    def _prepare(self, model_or_config, device, keywords, default_policy: str = "fcfs") -> None:
        """Everything but the model: config, tokenizer, KV pool size, engine."""
        if default_policy not in POLICIES:
            raise ValueError(f"default_policy must be one of {list(POLICIES)}, got {default_policy!r}")
        self.default_policy = default_policy
        from ms_atb.formats.loader import generation_eos_ids, load_config
        from ms_atb.formats.weight_formats import weight_formats
        from ms_atb.formats.sharding import validate_tp
        from ms_atb.text.tokenizer import load_tokenizer

        if device is not None:                   # None: the config's context.device
            keywords["device"] = device
        self.config = cfg = EngineConfig.load(model_or_config, **keywords)
        tp = cfg.parallel.tensor_parallel_size
        self.model_config = load_config(cfg.model.path)
        validate_tp(self.model_config, tp)
        self.rank = init_distributed(tp, cfg.parallel.data_parallel_size)      # within this replica
        self.replica = replica_index(tp, cfg.parallel.data_parallel_size)
        self.max_model_len = self.model_config.resolve_max_model_len(cfg.model.max_model_len, DEFAULT_MAX_MODEL_LEN)
        self.num_blocks = self._size_kv_pool()
        self.weight_formats, notes = weight_formats(cfg.model.path, self.model_config, cfg.model.weight_dtype, tp,
                                                    parse_device(cfg.context.device)[0],
                                                    cfg.model.activation_dtype, cfg.model.dtype)
        for note in notes:
            self._log(note)
        if cfg.context.device == "cpu":          # before any weight is read
            memory_budget.check_engine_fits(cfg, self.model_config, self.num_blocks, self.kv_bytes_per_block,
                                            self.weight_formats)
        self.generation_eos_ids = generation_eos_ids(cfg.model.path)
        self.tokenizer = (load_tokenizer(cfg.model.tokenizer) if cfg.model.tokenizer else
                          load_tokenizer(cfg.model.path, vocab_size=self.model_config.vocab_size))
        if self.tokenizer is not None:      # a model may pad its vocabulary past the tokenizer's
            self.tokenizer.pad_to(self.model_config.vocab_size)
        if cfg.kv_cache.disk_cache_dir:           # refused now, before the build, if others may write there
            from ms_atb.worker.disk_tier import open_dir
            open_dir(cfg.kv_cache.disk_cache_dir)
        self.disk_tier = None                     # DiskTier, opened by build()
        sc = cfg.scheduler
        self._built_limits = {"num_blocks": self.num_blocks, "max_num_seqs": sc.max_num_seqs,
                              "max_num_batched_tokens": sc.max_num_batched_tokens}
        self.adapters = Adapters(self.model_config, cfg.lora.max_lora_rank if cfg.lora.enable_lora else None)
        self.engine = Engine(self.new_scheduler, spmd_sampler(Sampler(), tp),
                             StructuredOutputManager(self.tokenizer) if self.tokenizer is not None else None,
                             self.adapters)
        self.input_processor = InputProcessor(self.tokenizer, self.model_config.vocab_size, self.max_model_len,
                                              self.engine, self.adapters)
        self._run_stats: dict = {}
        self._iterating = False                  # a generate_iter() is open
        self.build_seconds = 0.0

    def _size_kv_pool(self) -> int:
        """The pool's blocks: kv_cache.num_blocks, or memory_budget / bytes per block."""
        from ms_atb.worker.model_runner import kv_cache_bytes_per_block
        cfg = self.config
        self.kv_bytes_per_block = kv_cache_bytes_per_block(self.model_config, cfg.kv_cache.block_size, cfg.model.dtype,
                                                           cfg.parallel.tensor_parallel_size, self.cache_dtype,
                                                           parse_device(cfg.context.device)[0])
        num_blocks, note = memory_budget.kv_pool_blocks(cfg.kv_cache, self.kv_bytes_per_block, self.cache_dtype)
        if note:
            self._log(note)
        return num_blocks

    # ---- the engine's parts, for callers that inspect them ------------------------------------
    @property
    def scheduler(self) -> Scheduler:
        return self.engine.scheduler

    @property
    def runner(self):
        """The ModelRunner, None before build()."""
        return self.engine.runner

    @property
    def sampler(self):
        return self.engine.sampler

    def build(self) -> None:
        """Builds the model runner and compiles (or loads) its graphs; a second call does nothing."""
        if self.runner is not None:
            return
        from ms_atb.worker.graph_cache import cache_root
        from ms_atb.worker.model_runner import ModelRunner

        cfg = self.config
        t0 = time.perf_counter()
        with interrupts_raise():                 # the warmup runs graphs: Ctrl-C must not kill the process
            runner = ModelRunner(cfg, self.num_blocks, self.max_model_len, self.rank, self.model_config,
                                 self.weight_formats)
            # Each bucket's graph is loaded or compiled when a step first needs it; precompile does all now.
            status = runner.open_graph_cache(cache_root(cfg.context.compile_cache))
            if cfg.context.precompile:
                runner.warmup()
        self.engine.runner = runner
        if cfg.kv_cache.disk_cache_dir:
            self._open_disk_tier(runner)
        if runner.weight_cache.status != "off":
            self._log(f"weight cache {runner.weight_cache.status} ({runner.weight_cache.index_path})")
        stats = runner.graph_stats()
        where = {"skipped": " (an earlier engine of this process uses it)",
                 "unavailable": " (no entry script file, as under python -c)"}.get(
            status, f" ({stats['graph_cache_path']}, {len(runner.graph_cache.recorded)} graphs recorded)")
        if cfg.context.precompile:
            self._log(f"{stats['graphs']} graphs ready in {stats['seconds']:.1f} s; compile cache "
                      f"{stats['graph_cache']}{where if stats['graph_cache'] != 'off' else ''}")
        elif status != "off":
            self._log(f"graphs load or compile on first use; compile cache{where}")
        self.build_seconds = time.perf_counter() - t0

    def _open_disk_tier(self, runner) -> None:
        """The KV tier on disk (kv_cache.disk_cache_dir), given to the runner and to a fresh scheduler."""
        from ms_atb.worker.disk_tier import DiskTier
        from ms_atb.worker.distributed import ranks_min
        kv, tp = self.config.kv_cache, self.config.parallel.tensor_parallel_size
        self.disk_tier = runner.disk_tier = DiskTier(
            kv.disk_cache_dir, parse_size(kv.disk_cache_bytes, "kv_cache.disk_cache_bytes"), runner.kv_identity(),
            kv.block_size, runner.kv_pool.block_bytes, agree=ranks_min() if tp > 1 else None)
        self.engine.reset(self.new_scheduler())
        self._log(f"KV disk tier {self.disk_tier.folder} (budget {kv.disk_cache_bytes})")

    def flush_disk_cache(self) -> None:
        """Returns once every block handed to the KV disk tier is on disk (a normal exit does this too)."""
        if self.disk_tier is not None:
            self.disk_tier.flush()

    # ---- public API -----------------------------------------------------------------------
    def get_tokenizer(self):
        return self.tokenizer

    def generate(self, prompts: Union[Prompt, Seq[Prompt]],
                 sampling_params: Union[SamplingParams, Seq[SamplingParams], None] = None,
                 use_tqdm: bool = True, lora_request=None) -> list[RequestOutput]:
        """Returns one RequestOutput per prompt, in input order. lora_request: a LoRARequest for every prompt, one
        (or None: the base model) per prompt, or None (engines built with enable_lora=True)."""
        return self._run(self.make_requests(prompts, sampling_params, lora_request=lora_request), use_tqdm)

    def make_requests(self, prompts, sampling_params=None, add_special_tokens: bool = True,
                      lora_request=None) -> list[Request]:
        """Validated Requests for generate_iter(); ValueError naming the first bad prompt's index."""
        return self.input_processor.build_all(prompts, sampling_params, self.default_sampling_params(),
                                              add_special_tokens, lora_request)

    def make_request(self, prompt: Prompt, params: SamplingParams, index: int, request_id: str | None = None,
                     add_special_tokens: bool = True, tag=None, lora_request=None) -> Request:
        """One validated Request; ValueError naming its index. tag: the caller's own data, handed back with the
        request by stream(); lora_request: its LoRARequest, None for the base model."""
        return self.input_processor.build(prompt, params, index, request_id, add_special_tokens, tag, lora_request)

    def _run(self, requests: list[Request], use_tqdm: bool) -> list[RequestOutput]:
        outputs: list[RequestOutput | None] = [None] * len(requests)
        try:
            for index, out in self.generate_iter(requests, use_tqdm=use_tqdm):
                outputs[index] = out
        except BaseException as e:
            # What finished before the failure is not lost: it rides on the exception.
            e.partial_outputs = [o for o in outputs if o is not None]
            raise
        return outputs

    def generate_iter(self, requests: list[Request], use_tqdm: bool = True
                      ) -> Iterator[tuple[int, RequestOutput]]:
        """Runs validated requests; yields (index, output) as each finishes. If the run fails
        or the caller stops early, the unfinished requests are dropped and the engine stays
        usable. For prompts and SamplingParams, use generate()."""
        if not isinstance(requests, (list, tuple)):
            raise ValueError(f"generate_iter() takes a list of requests, got {type(requests).__name__}")
        for request, out in self.stream(requests, use_tqdm):
            yield request.index, out

    def stream(self, requests: Iterable[Request], use_tqdm: bool = True, window: int | None = None,
               total: int | None = None) -> Iterator[tuple[Request, RequestOutput]]:
        """generate_iter(), yielding each finished request itself (its tag included) with its output. requests
        may be any iterable: with window, at most that many of its requests are taken ahead of their outputs
        (a run over a generator then holds a bounded number of requests); total: the progress bar's length."""
        if isinstance(requests, (list, tuple)):
            bad = next((r for r in requests if not isinstance(r, Request)), None)
            if bad is not None:
                raise ValueError(f"generate_iter() runs a list of requests made by LLM.make_request(), got "
                                 f"{type(bad).__name__}; generate() takes prompts")
            total = len(requests)
        if window is not None and (not isinstance(window, int) or window < 1):
            raise ValueError(f"window must be None or an int >= 1, got {window!r}")
        if self.runner is None:
            raise ValueError("this engine's model is not built yet (LLM.prepare): call build() first")
        if self._iterating:     # one scheduler: a nested run would take the open run's requests as its own
            raise ValueError("this engine is already running a generate_iter(); finish or close it before "
                             "calling generate(), chat(), beam_search() or generate_iter() again")
        self._iterating = True
        try:
            steps = self._steps(requests, use_tqdm and self.rank == 0, window, total)
            try:
                while True:
                    with interrupts_raise():      # Ctrl-C in engine work: KeyboardInterrupt, not a killed process
                        item = next(steps, None)
                    if item is None:
                        break
                    yield item
            finally:
                steps.close()
                self.engine.abort_unfinished()
        finally:
            self._iterating = False

    def _steps(self, requests: Iterable[Request], progress: bool, window: int | None, total: int | None
               ) -> Iterator[tuple[Request, RequestOutput]]:
        """The run: requests admitted (all at once, or up to window ahead of their outputs), engine steps until
        every one is done; each output as it is made."""
        processor = OutputProcessor(self.tokenizer, deduplicate=self.engine.policy == "prefix")
        admit = Admission(self.engine, requests, processor, window, self.stop_token_ids,
                          [self.config.context.seed, self.input_processor.num_built])
        return run_steps(self.engine, admit, processor, lambda: progress_bar(total, progress, "req", "generate"),
                         self._run_stats)

    def beam_search(self, prompts, params, use_tqdm: bool = True):
        """Beam search (ms_atb.beam_search.BeamSearchParams); one BeamSearchOutput per prompt, in order."""
        from ms_atb.beam_search import beam_search
        return beam_search(self, prompts, params, use_tqdm)

    @property
    def stop_token_ids(self) -> set[int]:
        """The tokens that end a request unless ignore_eos: the tokenizer's (EOS, end of turn), the
        generation config's eos_token_id (generation_config.json), and the model's EOS ids (config.json)
        when the tokenizer names no EOS."""
        ids = set() if self.tokenizer is None else set(self.tokenizer.stop_token_ids)
        ids.update(self.generation_eos_ids)
        if self.tokenizer is None or self.tokenizer.eos_token_id is None:
            eos = self.model_config.eos_token_id
            ids.update(eos if isinstance(eos, list) else [] if eos is None else [eos])
        return ids

    def chat(self, conversations, sampling_params=None, use_tqdm: bool = True,
             add_generation_prompt: bool = True, lora_request=None) -> list[RequestOutput]:
        """conversations: one list of {"role", "content"} messages, or a list of them; lora_request as generate()'s."""
        if not isinstance(conversations, (list, tuple)) or not conversations:
            raise ValueError("chat() takes a conversation (a non-empty list of messages) or a list of them")
        if isinstance(conversations[0], dict):
            conversations = [conversations]
        prompts = [self.apply_chat_template(c, add_generation_prompt, index=i)
                   for i, c in enumerate(conversations)]
        # The template writes the special tokens (BOS included) itself.
        requests = self.make_requests(prompts, sampling_params, add_special_tokens=False, lora_request=lora_request)
        return self._run(requests, use_tqdm)

    def apply_chat_template(self, messages, add_generation_prompt: bool = True, index: int = 0) -> str:
        if not isinstance(messages, (list, tuple)) or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in messages) or not messages:
            raise ValueError(f"conversation {index}: expected a non-empty list of "
                             f"{{'role': str, 'content': str}} messages")
        if self.tokenizer is None:
            raise ValueError("this model has no tokenizer, so it has no chat template")
        return self.tokenizer.apply_chat_template(list(messages), add_generation_prompt=add_generation_prompt)

    def stats(self) -> dict:
        """Flat statistics. Run figures (tokens_per_s, num_output_tokens, elapsed_s, kv_cache_usage and its
        peak, num_deduplicated) are the last run's; output tokens are those delivered, the copies a duplicate
        gets under the prefix policy included; the cache and scheduling counters add up since the KV cache was last
        emptied (build, reset_scheduler(), or a run that failed inside a step)."""
        s = self.engine.stats()
        extra = {}
        if "num_lora_loads" in s:               # LoRA on: adapters written into slots, and the time it took
            extra["lora_loads"] = s["num_lora_loads"]
            extra["lora_load_s"] = self.runner.lora_load_seconds if self.runner is not None else 0.0
        if self.disk_tier is not None:
            extra.update(self.disk_tier.stats())
        pool = {"num_blocks": self.num_blocks, "block_size": self.config.kv_cache.block_size,
                "cache_dtype": self.cache_dtype, "bytes_per_block": self.kv_bytes_per_block}
        return flat_stats(s, self._run_stats, pool, extra)

    @property
    def policy(self) -> str:
        """The admission order of every run: scheduler.policy, with "auto" read as default_policy (prepare).
        Under "prefix" a run also computes once the requests that are exact duplicates
        (ms_atb/engine/output_processor.py)."""
        policy = self.config.scheduler.policy
        return self.default_policy if policy == "auto" else policy

    @property
    def cache_dtype(self) -> str:
        """The KV cache's storage dtype, "auto" resolved (config.resolve_cache_dtype)."""
        cfg = self.config
        return resolve_cache_dtype(cfg.kv_cache.cache_dtype, cfg.model.dtype, cfg.context.device)

    def new_scheduler(self) -> Scheduler:
        """A fresh scheduler (and block manager: an empty prefix cache) over the same KV pool."""
        kv, sc = self.config.kv_cache, self.config.scheduler
        scheduler = Scheduler(SchedulerConfig(
            num_blocks=self.num_blocks, block_size=kv.block_size, max_model_len=self.max_model_len,
            max_num_seqs=sc.max_num_seqs, max_num_batched_tokens=sc.max_num_batched_tokens,
            enable_chunked_prefill=sc.enable_chunked_prefill, enable_prefix_caching=kv.enable_prefix_caching,
            allocation=kv.allocation, max_loras=self.config.lora.max_loras if self.config.lora.enable_lora else 0),
            kv_tier=self.disk_tier)
        scheduler.set_policy(self.policy)
        return scheduler

    def reset_scheduler(self, **overrides) -> None:
        """Empties the KV cache and applies scheduling settings that need no recompilation:
        num_blocks (up to the pool built), enable_prefix_caching, allocation, policy,
        enable_chunked_prefill, max_num_seqs and max_num_batched_tokens (up to those built).
        A ValueError changes nothing: every override is checked before the engine keeps any."""
        built = self._built_limits
        allowed = ("num_blocks", "enable_prefix_caching", "allocation", "policy", "enable_chunked_prefill",
                   "max_num_seqs", "max_num_batched_tokens")
        for key, value in overrides.items():
            if key not in allowed:
                raise ValueError(f"reset_scheduler() takes {allowed}, got {key!r}")
            if key in built and not (isinstance(value, int) and 1 <= value <= built[key]):
                raise ValueError(f"{key} must be an integer in [1, {built[key]}] (the engine was built "
                                 f"for {built[key]}), got {value!r}")
        sections = config_keys()

        def put(values: dict) -> None:
            for key, value in values.items():
                if key == "num_blocks":
                    self.num_blocks = value
                else:
                    self.config._set(sections[key], key, value)
        old = {key: self.num_blocks if key == "num_blocks" else getattr(getattr(self.config, sections[key]), key)
               for key in overrides}
        try:
            put(overrides)
            self.config.validate()
            scheduler = self.new_scheduler()
        except ValueError:
            put(old)
            raise
        self.engine.reset(scheduler)

    def default_sampling_params(self) -> SamplingParams:
        return SamplingParams(**dataclasses.asdict(self.config.sampling))

    def _log(self, message: str) -> None:
        if self.rank == 0 and os.environ.get("MS_ATB_QUIET") != "1":
            print(f"[ms_atb] {message}", flush=True)

