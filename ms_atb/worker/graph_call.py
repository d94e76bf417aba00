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
  the ordinary path;
- with MindSpore's compile cache on (MS_COMPILER_CACHE_ENABLE=1: graph_cache.py), a graph runs only once its
  inputs' shapes, as its IR records them, are those of the arguments it was compiled for: the cache loads its
  N-th saved graph for the N-th compile, whatever shapes that graph takes, and since the fast path checks no
  shape, a graph of other shapes would read or write past the arguments' ends. (A graph compiled here takes
  its arguments' shapes; the check costs about 60 ms on SmolLM2, a fraction of a graph's load.)
- a graph whose compile, check or first run failed is dropped from MindSpore's executor: it keeps a graph
  whose run failed as failed, and would hand that state to the next compile of those shapes, so compiling
  the key again (without the compile cache) would fail too.
"""
from __future__ import annotations

import os

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
        try:
            cell.compile(*args)
            if os.environ.get("MS_COMPILER_CACHE_ENABLE") == "1":
                _check_input_shapes(cell.phase_cache[cell.phase], key, args)
            out = cell(*args)
        except Exception:
            self._drop_failed()
            raise
        self.phases[key] = cell.phase_cache[cell.phase]
        return out

    def _drop_failed(self) -> None:
        """Releases the Cell's graphs that are no key's (see the module docstring)."""
        from mindspore.graph.api import _cell_graph_executor
        failed = set(self.cell.compile_cache) - set(self.phases.values())
        if failed:
            _cell_graph_executor.del_net_res(self.cell, failed)
            self.cell.compile_cache.difference_update(failed)

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


def _check_input_shapes(phase: str, key, args) -> None:
    """ValueError unless compiled graph `phase` takes inputs of args' shapes, as MindSpore's IR of it records them."""
    from mindspore.graph.api import _cell_graph_executor
    from mindspore.train import anf_ir_pb2
    model = anf_ir_pb2.ModelProto()
    model.ParseFromString(_cell_graph_executor._graph_executor.get_func_graph_proto(phase, "anf_ir", False))
    shapes = [tuple(d.size for d in p.type.tensor_type.shape.dim) for p in model.graph.parameters[:len(args)]]
    want = [tuple(a.shape) for a in args]
    if shapes != want:
        raise ValueError(f"the graph compiled or loaded for {key!r} takes input shapes {shapes}, not {want}")
