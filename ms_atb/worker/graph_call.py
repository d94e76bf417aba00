"""GraphCall: runs a Cell's compiled graphs, one per fixed set of input shapes (a key), without the per-call
compile check of an ordinary graph-mode call.

An ordinary call `cell(*args)` in graph mode goes through Cell.compile_and_run on every call: it hashes the
arguments (generate_arguments_key), sets compile_phase on every sub-cell (hundreds of attribute sets on a
30-layer model) and looks the graph up before it runs it: milliseconds of host time per decode step.
MindSpore's Cell.__call__ skips all of that when the Cell's `phase` is "prefill" or "increment" and its
`phase_cache` maps that name to a compiled graph's full phase: it converts the arguments and runs that graph
(Cell._predict). That path checks neither the number nor the dtypes nor the shapes of the arguments, so
a key must stand for one fixed set of input shapes and dtypes: ModelRunner's key is the token bucket, and
ModelRunner.prepare pads every step to its bucket's shapes (int32 ids [T], positions [T], slots [T], block
tables [B, W], context lengths [B], query starts [B + 1]).

Rules:
- a key's graph is compiled (or loaded from MindSpore's compile cache) by an ordinary call in the Cell's own
  phase (`compile`), so graphs compile, and are numbered by the compile cache (graph_cache.py), in the order
  of those calls, exactly as without GraphCall; the full phase the call compiled is recorded for the key;
- phase_cache holds one full phase per name and one Cell has one graph per key, so a run (`__call__`) points
  phase_cache["increment"] at its key's graph and sets the Cell's phase to "increment" for that call only:
  keys alternate freely, and every other call of the Cell (a new key's compile, a Cell that wraps it) takes
  the ordinary path.
"""
from __future__ import annotations

_FAST_PHASE = "increment"      # one of the two phase names Cell.__call__ runs from phase_cache


class GraphCall:
    def __init__(self, cell):
        self.cell = cell
        self.phases = {}           # key -> the full phase of its compiled graph

    def __contains__(self, key) -> bool:
        return key in self.phases

    def compile(self, key, *args):
        """The ordinary call (compiles or loads the graph of args' shapes), recorded as key's graph; returns its
        output."""
        cell = self.cell
        if cell.phase == _FAST_PHASE:
            raise ValueError(f"GraphCall needs a Cell whose own phase is not {_FAST_PHASE!r}")
        out = cell(*args)
        self.phases[key] = cell.phase_cache[cell.phase]
        return out

    def __call__(self, key, *args):
        """Runs key's graph on args, which must have the shapes and dtypes key's graph was compiled for."""
        phase = self.phases.get(key)
        if phase is None:
            raise ValueError(f"no graph compiled for {key!r}; compiled: {sorted(self.phases)}")
        cell = self.cell
        own = cell.phase
        cell.phase_cache[_FAST_PHASE] = phase
        cell.phase = _FAST_PHASE
        try:
            return cell(*args)
        finally:
            cell.phase = own
