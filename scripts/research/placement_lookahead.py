"""What knowing the future buys on the churn benchmark: a lookahead placement planner.

The planner stands on the near-fit baseline (`NearFitBaseline` of placement_base.py, the placement
BENCHMARKS.md's lookahead table was measured against; "the policy" below). At each new prompt that more
than one free range could hold, it tries candidate placements (the five smallest fitting ranges and the
two largest, each at its start and, after a live tail, at the policy's room), rolls the workload forward
`--horizon` steps from each with the policy, and keeps the candidate whose rollout scattered the fewest
allocations (ties: the policy's choice).
What the rollouts know is `--future`:
- exact: the real future, i.e. the next arrivals and when every running request ends (clairvoyant);
- sampled: futures drawn from the workload's own distributions (`--samples` of them, the same draws for
  every candidate): more than an engine knows, which has neither the arrival mix nor the end law;
- ends / arrivals: the real ends with sampled arrivals, or the real arrivals with sampled ends.
ChurnSim replays scripts/bench_block_manager.py's churn loop step for step (same random draws), so
with no planner it reproduces that benchmark's figures for the policy exactly
(tests/test_placement_lookahead.py).

    .venv/bin/python scripts/research/placement_lookahead.py [--future exact] [--seeds 0-1] [--steps 4000]
        [--horizon 200] [--samples 8] [--mix churn|short-heavy|long-heavy]
    # exact: ~2 min per churn seed; sampled: ~samples x that
"""
from __future__ import annotations

import argparse
import copy
import os
import random
import sys
import time
from collections import deque

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "scripts"))
sys.path.insert(0, HERE)

from bench_block_manager import MIXES  # noqa: E402
from placement_base import NearFitBaseline  # noqa: E402
from script_args import require_at_least, seed_range  # noqa: E402

from ms_atb.core.block_manager import BlockManager, NoFreeBlocksError  # noqa: E402


class PlacedPlacement(NearFitBaseline):
    """The near-fit baseline, except that the next new prompt may be put at a given (range start, first
    block); it counts the prompts of 2+ new blocks that did not get one run of consecutive ids."""
    force = None
    num_scattered = 0

    def place_prompt(self, req, num_new):
        force, self.force = self.force, None
        if force is None or req.block_ids:
            return super().place_prompt(req, num_new)
        start, lo = force
        self.ranges.carve(start, lo, lo + num_new)
        return list(range(lo, lo + num_new))

    def new_blocks(self, req, num_new):
        new_ids = super().new_blocks(req, num_new)
        if num_new >= 2 and any(new_ids[i] != new_ids[i - 1] + 1 for i in range(1, num_new)):
            self.num_scattered += 1
        return new_ids


class ChurnSim:
    """bench_block_manager.run_workload as a steppable, copyable state; requests are
    [id, tokens so far, generated, end_at, max_tokens]."""

    def __init__(self, seed: int, num_blocks: int = 4096, block_size: int = 16,
                 mix=((16, 1024), (16, 1024))):
        self.rng = random.Random(seed)
        self.mix, self.block_size = mix, block_size
        self.bm = BlockManager(num_blocks, block_size, placement=PlacedPlacement)
        self.placement = self.bm.placement
        self.waiting: deque = deque()
        self.running: dict = {}
        self.next_id = 0

    def copy(self) -> "ChurnSim":
        new = ChurnSim.__new__(ChurnSim)
        new.rng = random.Random()
        new.rng.setstate(self.rng.getstate())
        new.mix, new.block_size, new.next_id = self.mix, self.block_size, self.next_id
        new.bm = copy.deepcopy(self.bm)     # no prefix caching here: its structures stay empty
        new.placement = new.bm.placement
        new.waiting = deque(w[:] for w in self.waiting)
        new.running = {k: v[:] for k, v in self.running.items()}
        return new

    def _new_request(self) -> list:
        (p_lo, p_hi), (m_lo, m_hi) = self.mix
        prompt_len, max_tokens = self.rng.randint(p_lo, p_hi), self.rng.randint(m_lo, m_hi)
        self.next_id += 1
        return [f"r{self.next_id}", prompt_len, 0, self.rng.randint(1, max_tokens), max_tokens]

    def step(self, planner=None) -> None:
        bm, bs = self.bm, self.block_size
        while bm.stats()["usage"] < 0.9:                      # admission
            if not self.waiting:
                self.waiting.append(self._new_request())
            rid, ntok, gen, end_at, max_tokens = self.waiting[0]
            if ntok > bm.num_blocks * bs:
                self.waiting.popleft()
                continue
            self.placement.force = planner(self) if planner is not None else None
            try:
                bm.allocate(rid, list(range(ntok)), max_tokens - gen)
            except NoFreeBlocksError:
                self.placement.force = None
                break
            self.running[rid] = self.waiting.popleft()[1:]
        for rid in list(self.running):                        # every running request appends a token
            if rid not in self.running:
                continue
            state = self.running[rid]
            while True:
                try:
                    bm.append_token(rid, 7)
                    break
                except NoFreeBlocksError:                     # preempt the newest
                    newest = next(reversed(self.running))
                    bm.free(newest)
                    self.waiting.appendleft([newest] + self.running.pop(newest))
                    if newest == rid:
                        break
            if rid not in self.running:
                continue
            state[0] += 1
            state[1] += 1
            if state[1] >= state[2]:
                bm.free(rid)
                del self.running[rid]

    def scattered(self) -> int:
        return self.placement.num_scattered

    def resample(self, draw: random.Random, ends: bool, arrivals: bool) -> None:
        """Replace the real future by one drawn from the workload's distributions."""
        if ends:
            for state in self.running.values():               # still running: ends uniform in (gen, max]
                state[2] = draw.randint(state[1] + 1, max(state[1] + 1, state[3]))
            for w in self.waiting:
                w[3] = draw.randint(w[2] + 1, max(w[2] + 1, w[4]))
        if arrivals:
            self.rng = random.Random(draw.random())


def kept_placement(sim: ChurnSim, num_new: int):
    start = sim.placement.best_fit(num_new)
    return None if start is None else (start, sim.placement.first_block_in(start, num_new))


def candidates(sim: ChurnSim, num_new: int) -> list:
    placement = sim.placement
    fits = sorted((end - start, start) for start, end in placement.ranges.ranges() if end - start >= num_new)
    if len(fits) < 2:
        return []
    out = []
    for _, start in dict.fromkeys(fits[:5] + fits[-2:]):
        out.extend(dict.fromkeys([(start, start), (start, placement.first_block_in(start, num_new))]))
    return out


def make_planner(future: str, horizon: int, samples: int):
    ends, arrivals = {"exact": (False, False), "sampled": (True, True), "ends": (False, True),
                      "arrivals": (True, False)}[future]
    reps = 1 if future == "exact" else samples

    def planner(sim: ChurnSim):
        num_new = -(-sim.waiting[0][1] // sim.block_size)
        cands = candidates(sim, num_new) if num_new >= 2 else []
        if not cands:
            return None
        kept = kept_placement(sim, num_new)
        best, best_score = kept, None
        for cand in [kept] + [c for c in cands if c != kept]:
            score = 0
            for rep in range(reps):
                trial = sim.copy()
                if future != "exact":
                    trial.resample(random.Random(hash((sim.next_id, len(sim.running), rep))), ends, arrivals)
                before = trial.scattered()
                rid, ntok, gen, _, max_tokens = request = trial.waiting.popleft()
                trial.placement.force = cand
                trial.bm.allocate(rid, list(range(ntok)), max_tokens - gen)
                trial.running[rid] = request[1:]
                for _ in range(horizon):
                    trial.step()
                score += trial.scattered() - before
            if best_score is None or score < best_score:
                best, best_score = cand, score
        return best
    return planner


def run(seed: int, steps: int, planner=None, mix=((16, 1024), (16, 1024))) -> dict:
    sim = ChurnSim(seed, mix=mix)
    for _ in range(steps):
        sim.step(planner)
    s = sim.bm.stats()
    return dict(allocation_contiguity=s["allocation_contiguity"], contiguity=s["contiguity"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--future", choices=("exact", "sampled", "ends", "arrivals"), default="exact")
    ap.add_argument("--mix", choices=[name.split()[0] for name in MIXES], default="churn",
                    help="length mix of scripts/bench_block_manager.py (default: churn, the benchmark's own)")
    ap.add_argument("--seeds", default="0-1", help="seed range, e.g. 0-1 (default) or 3")
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--horizon", type=int, default=200, help="steps each rollout looks ahead")
    ap.add_argument("--samples", type=int, default=8, help="drawn futures per candidate (not for exact)")
    args = ap.parse_args()
    seeds = seed_range(ap, args.seeds)
    require_at_least(ap, args, 4, "steps")
    require_at_least(ap, args, 1, "horizon", "samples")
    mix_name = next(name for name in MIXES if name.split()[0] == args.mix)
    print(f"{mix_name} workload, {args.steps} steps; lookahead: future {args.future}, horizon {args.horizon}"
          + ("" if args.future == "exact" else f", {args.samples} samples"))
    for seed in seeds:
        kept = run(seed, args.steps, mix=MIXES[mix_name])
        t0 = time.perf_counter()
        plan = run(seed, args.steps, make_planner(args.future, args.horizon, args.samples), MIXES[mix_name])
        print(f"seed {seed}: near-fit baseline {kept['allocation_contiguity']:.3f} (contiguity {kept['contiguity']:.3f});"
              f" lookahead {plan['allocation_contiguity']:.3f} (contiguity {plan['contiguity']:.3f})"
              f"  [{time.perf_counter() - t0:.0f} s]", flush=True)


if __name__ == "__main__":
    main()
