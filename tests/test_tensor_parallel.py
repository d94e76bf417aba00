"""Tensor parallelism: wrong sizes fail before any weight is read; under msrun, 2 ranks generate exactly
the greedy tokens of 1 rank (prefix caching on, a pool tight enough to preempt), agree on every sampled
token (MS_ATB_DEBUG=1 checks it each step), and the launch script writes rank 0's output once."""
import json
import os
import signal
import socket
import subprocess
import sys

import numpy as np
import pytest

from ms_atb import LLM, SamplingParams
from ms_atb.worker.distributed import init_distributed
from ms_atb.formats import loader
from ms_atb.models import weights
from engine_helpers import EXACT

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "configs", "tiny_llama.yaml")
WORKER = os.path.join(ROOT, "tests", "tp_worker.py")
BIN = os.path.dirname(sys.executable)
# Small step caps keep the token buckets few (5, each compiled on first use); 10 blocks of 16 make 8 requests preempt.
OVERRIDES = {"max_num_batched_tokens": 16, "max_num_seqs": 8, "num_blocks": 10,
             "enable_prefix_caching": True, "precompile": False, **EXACT}
MAX_TOKENS = 24
# Sampled under a constraint that follows the output so far: a guided choice (on PROMPTS[:3]).
GUIDED = {"max_tokens": 20, "temperature": 0.9, "seed": 5, "guided_choice": ["yes please", "yes", "no way"]}
MSRUN_TIMEOUT = 300


def prompts_with_shared_prefix(n, prefix_len=40, seed=1):
    rng = np.random.default_rng(seed)
    prefix = rng.integers(0, 500, prefix_len).tolist()
    return [prefix + rng.integers(0, 500, int(rng.integers(1, 30))).tolist() for _ in range(n)]


PROMPTS = prompts_with_shared_prefix(8)


@pytest.fixture
def no_weights(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("weights were read before the tensor-parallel size was checked")
    monkeypatch.setattr(weights, "iter_weights", fail)


@pytest.fixture
def outside_msrun(monkeypatch):
    for name in ("MS_WORKER_NUM", "RANK_TABLE_FILE", "MS_ROLE"):
        monkeypatch.delenv(name, raising=False)


def test_heads_not_divisible_fail_before_loading(no_weights, outside_msrun):
    with pytest.raises(ValueError, match="tensor_parallel_size 3 must divide num_attention_heads 4"):
        LLM(TINY, tensor_parallel_size=3)


def test_tp2_without_msrun_fails_before_loading(no_weights, outside_msrun):
    with pytest.raises(ValueError, match="needs one process per rank: launch with msrun --worker_num=2"):
        LLM(TINY, tensor_parallel_size=2)


def test_world_size_must_match(monkeypatch):
    monkeypatch.setenv("MS_WORKER_NUM", "2")
    with pytest.raises(ValueError, match="tensor_parallel_size is 1 but msrun started 2 workers"):
        init_distributed(1)
    monkeypatch.setenv("MS_WORKER_NUM", "4")
    with pytest.raises(ValueError, match="tensor_parallel_size 2 does not match the msrun world size 4"):
        init_distributed(2)


def test_safetensors_rank_reads_only_its_slices(tmp_path):
    """Loading for rank 0 of 2 allocates about half of what one rank alone does: slices are read,
    never whole split tensors (the MLP weights, 4 MiB each, dominate this checkpoint)."""
    import tracemalloc
    from safetensors.numpy import save_file
    src = "random:tiny-llama?hidden_size=256&intermediate_size=4096&head_dim=64"
    config = loader.load_config(src)
    save_file(dict(weights.iter_weights(src, config)), str(tmp_path / "model.safetensors"))
    keys = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim", "max_position_embeddings", "tie_word_embeddings")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama",
                                                      **{k: getattr(config, k) for k in keys}}))
    peaks, sizes = {}, {}
    for tp in (1, 2):
        tracemalloc.start()
        base, total = tracemalloc.get_traced_memory()[0], 0
        for name, w in weights.iter_weights(str(tmp_path), config, tp, 0):
            total += w.nbytes
            del w
        peaks[tp], sizes[tp] = tracemalloc.get_traced_memory()[1] - base, total
        tracemalloc.stop()
    full_mlp = 4096 * 256 * 4
    assert peaks[1] >= full_mlp                        # the measurement sees a whole tensor when read
    assert peaks[2] < 0.6 * peaks[1] and peaks[2] < 1.1 * full_mlp
    assert sizes[2] < 0.55 * sizes[1]


# ---------------------------------------------------------------- under msrun

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(command: list[str], log_dir, extra_env=None) -> subprocess.CompletedProcess:
    """Runs a launcher in its own process group; kills the whole group on timeout or when done."""
    # Heartbeats every second, as scripts/msrun_generate.sh sets them: the job starts and ends without a 3-5 s wait.
    env = dict(os.environ, PATH=BIN + os.pathsep + os.environ.get("PATH", ""), MS_ATB_QUIET="1",
               MS_RETRY_INTERVAL_LOWER="1", MS_RETRY_INTERVAL_UPPER="1", **(extra_env or {}))
    for name in ("MS_WORKER_NUM", "MS_ROLE", "MS_NODE_ID", "RANK_ID"):
        env.pop(name, None)
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=MSRUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{command[0]} ran over {MSRUN_TIMEOUT} s\n{out[-3000:]}\n{logs(log_dir)}")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)   # stray workers, if any
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(command, proc.returncode, out)


def msrun(n: int, script_args: list[str], log_dir, extra_env=None):
    command = [os.path.join(BIN, "msrun"), f"--worker_num={n}", f"--local_worker_num={n}",
               f"--master_port={free_port()}", f"--log_dir={log_dir}", "--join=True"] + script_args
    return launch(command, log_dir, extra_env)


def logs(log_dir) -> str:
    tails = []
    for name in sorted(os.listdir(log_dir)) if os.path.isdir(log_dir) else []:
        with open(os.path.join(log_dir, name), errors="replace") as f:
            lines = [ln for ln in f if not ln.startswith(("[WARNING]", "[INFO]"))]
        tails.append(f"--- {name}\n" + "".join(lines[-30:]))
    return "\n".join(tails)


def read_rank(out_dir, rank, log_dir) -> dict:
    path = os.path.join(out_dir, f"rank{rank}.json")
    assert os.path.exists(path), f"rank {rank} wrote no result\n{logs(log_dir)}"
    with open(path) as f:
        return json.load(f)


def write_spec(tmp_path, overrides) -> str:
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"config": TINY, "overrides": overrides, "prompts": PROMPTS,
                                "max_tokens": MAX_TOKENS, "guided": GUIDED}))
    return str(spec)


@pytest.fixture(scope="module")
def reference():
    """Greedy tokens and stats of tensor_parallel_size 1, same pool and prompts."""
    llm = LLM(TINY, **OVERRIDES)
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    stats = llm.stats()
    scored = llm.generate(PROMPTS[:1], SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=2),
                          use_tqdm=False)[0]
    guided = [o.token_ids for o in llm.generate(PROMPTS[:3], SamplingParams(**GUIDED), use_tqdm=False)]
    return llm, [o.token_ids for o in outs], stats, scored.prompt_logprobs, guided


@pytest.mark.slow
def test_tp2_generates_the_tokens_of_tp1(reference, tmp_path):
    _, tokens, stats, prompt_logprobs, guided = reference
    assert len({bytes(t).decode() for t in guided}) > 1                   # the draws reach different choices
    assert stats["num_preemptions"] > 0 and stats["prefix_cache_hits"] > 0   # the pool is tight
    log_dir, out_dir = tmp_path / "log", tmp_path / "out"
    out_dir.mkdir()
    spec = write_spec(tmp_path, dict(OVERRIDES, tensor_parallel_size=2))
    run = msrun(2, [WORKER, spec, str(out_dir)], log_dir, {"MS_ATB_DEBUG": "1"})
    assert run.returncode == 0, f"{run.stdout[-2000:]}\n{logs(log_dir)}"
    ranks = [read_rank(out_dir, r, log_dir) for r in (0, 1)]
    for r, result in enumerate(ranks):
        assert result["rank"] == r
        assert result["token_ids"] == tokens, f"rank {r} differs from tensor_parallel_size 1"
        # The same schedule everywhere: same preemptions and prefix-cache hits as one rank alone.
        assert result["stats"]["num_preemptions"] == stats["num_preemptions"]
        assert result["stats"]["prefix_cache_hits"] == stats["prefix_cache_hits"]
        assert max(result["num_cached_tokens"]) >= 32
        # Every token's logits (the prompt_logprobs graphs) agree with one rank's too.
        assert result["prompt_logprobs"][0] is None and len(result["prompt_logprobs"]) == len(prompt_logprobs)
        for got, want in zip(result["prompt_logprobs"][1:], prompt_logprobs[1:]):
            assert [t for t, _ in got] == list(want)
            assert max(abs(v - want[t]) for t, v in got) < 1e-4
        assert result["guided_token_ids"] == guided
        # MS_ATB_DEBUG=1 compared the sampled tokens across ranks at every sampling step ...
        assert result["spmd_checks"] >= MAX_TOKENS
        # ... and a deliberate difference (each rank's own id) is caught on every rank.
        assert "SPMD divergence" in result["divergence_error"]
        assert f"this is rank {r}" in result["divergence_error"]
    assert ranks[0]["spmd_checks"] == ranks[1]["spmd_checks"]


@pytest.mark.slow
def test_tp2_launched_with_one_worker_fails_before_loading(tmp_path):
    log_dir, out_dir = tmp_path / "log", tmp_path / "out"
    out_dir.mkdir()
    spec = write_spec(tmp_path, dict(OVERRIDES, tensor_parallel_size=2))
    run = msrun(1, [WORKER, spec, str(out_dir)], log_dir)
    assert run.returncode != 0
    error = read_rank(out_dir, 0, log_dir)["error"]
    assert "tensor_parallel_size 2 does not match the msrun world size 1" in error


@pytest.mark.slow
def test_msrun_generate_script_writes_rank0_output_once(reference, tmp_path):
    llm = reference[0]
    prompts = PROMPTS[:3]
    llm.reset_scheduler()
    want = [o.token_ids for o in llm.generate(prompts, SamplingParams(max_tokens=8, temperature=0.0,
                                                                      ignore_eos=True), use_tqdm=False)]
    inp, out, log_dir = tmp_path / "in.jsonl", tmp_path / "out.jsonl", tmp_path / "log"
    inp.write_text("".join(json.dumps({"id": f"p{i}", "prompt": p}) + "\n" for i, p in enumerate(prompts)))
    sets = [x for k, v in OVERRIDES.items() for x in ("--set", f"{k}={v}")]
    run = launch(["bash", os.path.join(ROOT, "scripts", "msrun_generate.sh"), "-n", "2",
                  "--master-port", str(free_port()), "--log-dir", str(log_dir), "--",
                  "--config", TINY, "--input", str(inp), "--output", str(out), "--max-tokens", "8",
                  "--ignore-eos", "--no-progress"] + sets, log_dir)
    assert run.returncode == 0, f"{run.stdout[-2000:]}\n{logs(log_dir)}"
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert sorted(x["id"] for x in lines) == ["p0", "p1", "p2"]       # written by rank 0 only, once
    assert {x["id"]: x["token_ids"] for x in lines} == {f"p{i}": t for i, t in enumerate(want)}
