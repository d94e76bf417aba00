"""Hypothesis state machine over random allocate / append / commit / free sequences, requests with and without an
extra key (blocks are shared only among requests of the same one)."""
from collections import Counter

from hypothesis import given, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from ms_atb.core.block_manager import BlockManager, NoFreeBlocksError
from ms_atb.core.free_ranges import OrphanIndex, SizeIndex

BS = 4
NUM_BLOCKS = 12
# few distinct token values and prefixes so that prompts often share blocks
prompts = st.lists(st.integers(0, 2), min_size=1, max_size=6).map(
    lambda xs: [t for x in xs for t in ([x] * BS if x else [7, x])])


class BlockManagerMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.bm = None
        self.tokens = {}       # rid -> all token ids
        self.committed = {}    # rid -> committed token count
        self.committed_prefixes = set()  # (extra key, full-block prefix) ever committed
        self.keys = {}         # rid -> its extra key
        self.next_id = 0

    @rule(allocation=st.sampled_from(["contiguous", "scattered"]))
    @precondition(lambda self: self.bm is None)
    def create(self, allocation):
        self.bm = BlockManager(NUM_BLOCKS, BS, enable_prefix_caching=True, allocation=allocation)

    @rule(prompt=prompts, max_tokens=st.none() | st.integers(0, 100), key=st.sampled_from([None, None, "a"]))
    @precondition(lambda self: self.bm is not None)
    def allocate(self, prompt, max_tokens, key):
        rid = f"r{self.next_id}"
        self.next_id += 1
        before = (self.bm.num_free_blocks, self.bm.stats())
        try:
            cached = self.bm.allocate(rid, prompt, max_tokens, extra_key=key)
        except NoFreeBlocksError:
            assert (self.bm.num_free_blocks, self.bm.stats()) == before
            return
        assert cached % BS == 0 and cached < len(prompt)
        for n in range(BS, cached + 1, BS):
            # never an uncommitted hit, nor one committed under another extra key
            assert (key, tuple(prompt[:n])) in self.committed_prefixes
        self.tokens[rid] = list(prompt)
        self.committed[rid] = 0
        self.keys[rid] = key

    def _some(self, data):
        return data.draw(st.sampled_from(sorted(self.tokens)))

    @rule(data=st.data(), token=st.integers(0, 2))
    @precondition(lambda self: self.tokens)
    def append(self, data, token):
        rid = self._some(data)
        table = self.bm.block_table(rid)
        free = self.bm.num_free_blocks
        try:
            self.bm.append_token(rid, token)
        except NoFreeBlocksError:
            assert self.bm.block_table(rid) == table and self.bm.num_free_blocks == free
            return
        self.tokens[rid].append(token)

    @rule(data=st.data())
    @precondition(lambda self: self.tokens)
    def commit(self, data):
        rid = self._some(data)
        toks = self.tokens[rid]
        n = data.draw(st.integers(0, len(toks)))
        self.bm.commit(rid, n)
        self.committed[rid] = max(self.committed[rid], n)
        for k in range(BS, n + 1, BS):
            self.committed_prefixes.add((self.keys[rid], tuple(toks[:k])))

    @rule(data=st.data())
    @precondition(lambda self: self.tokens)
    def free(self, data):
        rid = self._some(data)
        self.bm.free(rid)
        del self.tokens[rid], self.committed[rid], self.keys[rid]

    @invariant()
    def consistent(self):
        bm = self.bm
        if bm is None:
            return
        holders = Counter(b for rid in self.tokens for b in bm.block_table(rid))
        for rid, toks in self.tokens.items():
            assert len(bm.block_table(rid)) == -(-len(toks) // BS)
        free = set(bm._prefix.lru)
        ranges = getattr(bm.placement, "ranges", None)
        if ranges is not None:
            for s, e in ranges.ranges():
                free.update(range(s, e))
                assert ranges.start_ending_at(e) == s and s in ranges.by_size.buckets[e - s]
                # ranges are maximal: merged on free
                assert ranges.start_ending_at(s) is None and ranges.end_of(e) is None
                # an orphan is exactly a range after no live request's last block
                assert ranges.orphans.size_of.get(s) == (None if ranges.is_tail(s - 1) else e - s)
            assert set(ranges.orphans.size_of) <= {s for s, _ in ranges.ranges()}
            assert ranges.tails() == {bm.block_table(rid)[-1] for rid in self.tokens}
            ends = {e: s for s, e in ranges.ranges()}             # no stale end: exactly the ranges' ends
            assert all(ranges.start_ending_at(b) == ends.get(b) for b in range(NUM_BLOCKS + 1))
            assert ranges.num_clean == sum(e - s for s, e in ranges.ranges())
        else:
            free.update(bm.placement.free_blocks())
        assert bm.num_free_blocks == len(free)                # no id listed twice
        assert not free & set(holders)                        # never both free and held
        assert len(free) + len(holders) == NUM_BLOCKS         # nothing lost
        for b in range(NUM_BLOCKS):
            assert bm._ref_counts[b] == holders.get(b, 0)
        cache = bm._prefix
        registered = [b for copies in cache.copies.values() for b in copies]
        assert len(registered) == len(set(registered))       # one hash per block
        assert set(registered) == {b for b in range(NUM_BLOCKS) if cache.block_hash[b] is not None}
        for h, copies in cache.copies.items():                # cached tokens match their hash
            assert copies and all(cache.block_hash[b] == h for b in copies)
        for rid, toks in self.tokens.items():
            parent, chain = cache.root(self.keys[rid])
            for i, b in enumerate(bm.block_table(rid)[: len(toks) // BS]):
                parent = cache.hash(parent, toks[i * BS:(i + 1) * BS])
                chain = (chain, tuple(toks[i * BS:(i + 1) * BS]))
                if cache.block_hash[b] is not None:
                    assert cache.block_hash[b] == parent
                    assert list(cache.block_tokens[b]) == toks[i * BS:(i + 1) * BS]
                    assert cache.block_chain[b] == chain          # its whole chain of tokens is this request's

    def teardown(self):
        if self.bm is None:
            return
        for rid in list(self.tokens):
            self.bm.free(rid)
        assert self.bm.num_free_blocks == NUM_BLOCKS and self.bm.stats()["usage"] == 0.0
        assert all(r == 0 for r in self.bm._ref_counts)


BlockManagerMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)
TestBlockManagerMachine = BlockManagerMachine.TestCase


@settings(max_examples=200, deadline=None)
@given(ops=st.lists(st.tuples(st.booleans(), st.integers(1, 6), st.integers(0, 30)), max_size=60),
       queries=st.lists(st.tuples(st.integers(1, 7), st.integers(0, 3)), min_size=1, max_size=5))
def test_size_index_near_fit_matches_a_scan(ops, queries):
    index, model = SizeIndex(), {}          # model: start -> size
    for add, size, start in ops:
        if add and start not in model:
            index.add(size, start)
            model[start] = size
        elif not add and start in model:
            index.remove(model.pop(start), start)
    for need, slack in queries:
        fits = [size for size in model.values() if size >= need]
        expected = (min(s for s, size in model.items() if min(fits) <= size <= min(fits) + slack)
                    if fits else None)
        size = index.best_fit(need)         # the placement's near fit: best_fit, then lowest_between
        assert (None if size is None else index.lowest_between(size, size + slack)) == expected


@settings(max_examples=200, deadline=None)
@given(ops=st.lists(st.tuples(st.booleans(), st.integers(1, 9), st.integers(0, 30)), max_size=60),
       caps=st.lists(st.integers(0, 12), min_size=1, max_size=5))
def test_orphan_index_matches_a_scan(ops, caps):
    index, model = OrphanIndex(9), {}       # model: start -> size
    for add, size, start in ops:
        if add and start not in model:
            index.add(start, size)
            model[start] = size
        elif not add:
            index.discard(start)            # a start that is not there is ignored
            model.pop(start, None)
    assert index.size_of == model
    assert index.lowest() == min(model, default=None)
    for cap in caps:
        assert index.lowest_at_most(cap) == min((s for s, size in model.items() if size <= cap), default=None)
    for lo, hi in ((1, 3), (2, 9), (4, 4)):
        assert index.by_size.lowest_between(lo, hi) == min(
            (s for s, size in model.items() if lo <= size <= hi), default=None)
