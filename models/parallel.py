"""Tensor parallelism: the column/row-parallel linears and the process's tensor-parallel group.

Which part of each HF-layout weight a rank holds is ms_atb/formats/sharding.py's rules: column-parallel
linears (q/k/v, gate/up) hold a slice of the output columns, row-parallel ones (o, down) a slice of the
input rows, and sum their partial outputs with an AllReduce.
The AllReduces run over the process's tensor-parallel group: the whole world unless data parallelism
made one group per replica (set_tp_group, before the model is built).
"""
import numpy as np
import mindspore as ms
from mindspore.common.initializer import initializer
from mindspore import nn, ops

from ms_atb.ops import LoraAdd, PackedMatMul, QuantMatMul, pack_weight, packed_shape
from ms_atb.ops import quant_matmul
from ms_atb.ops.lora import lora_shapes
from ms_atb.models.lora import host_parameter


_tp_group: str | None = None       # None: MindSpore's world group


def set_tp_group(name: str | None) -> None:
    """The communication group of this process's tensor-parallel ranks (one engine per process)."""
    global _tp_group
    _tp_group = name


def tp_group() -> str | None:
    return _tp_group


class _Linear(nn.Cell):
    """x @ W with W [in, out] kept in the layout the device multiplies fastest: on the CPU in float32,
    packed column panels [ceil(out / 16), in, 16] for our PackedMatMul kernel; elsewhere [in, out] for
    MindSpore's MatMul. fmt (CPU only): a quantized format of ops/quant_matmul.py ("q8_0", "q4_0", "q4_1",
    "int8"), W then held as its panels of blocks [P, panel_bytes] int8 for QuantMatMul. Our CPU kernels
    multiply float32: a float16 / bfloat16 model's activations are cast to float32 and back around them,
    which costs two casts a linear where MindSpore's half-precision CPU MatMul costs several times the
    multiply. Fill it with set_weight([in, out] float array; int8 quantizes it) or, for a GGUF block format,
    set_blocks([out, bytes] GGUF rows). activations (model.activation_dtype): "int8" quantizes x per row and
    block of 32 for a quantized W (integer dot products, W packed in their layout at load and held as uint8
    raw bytes, so that nothing mistakes it for the float path's int8 panels: a weight cache entry of the other
    layout fails its dtype check); a float W keeps float32 activations."""

    def __init__(self, in_features: int, out_features: int, dtype, device: str, fmt: str = "float32",
                 activations: str = "float32"):
        super().__init__()
        self.in_features, self.out_features, self.dtype, self.fmt = in_features, out_features, dtype, fmt
        self.quantized = fmt != "float32"
        assert not self.quantized or device == "cpu", "the engine checks weight_dtype"
        self.activations = activations if self.quantized else "float32"
        self.packed = device == "cpu" and not self.quantized
        self.wtype = ms.uint8 if self.activations == "int8" else ms.int8   # the dot layout: raw bytes
        if self.quantized:
            shape, wtype = quant_matmul.packed_shape(fmt, in_features, out_features), self.wtype
        elif self.packed:
            shape, wtype = packed_shape(in_features, out_features), ms.float32
        else:
            shape, wtype = (in_features, out_features), dtype
        self.weight = ms.Parameter(initializer("zeros", shape, wtype), name="weight")
        self.packed_matmul = PackedMatMul(out_features) if self.packed else None
        self.quant_matmul = QuantMatMul(fmt, out_features, self.activations) if self.quantized else None
        self.lora_add = self.lora_a = self.lora_b = None

    def enable_lora(self, max_loras: int, max_rank: int, segments) -> None:
        """Room for max_loras adapters of rank <= max_rank (CPU only): lora_a [L, S R, in] and lora_b [L, R, out]
        float32 Parameters over host arrays (lora_a_host, lora_b_host) that models/lora.py writes a slot into
        between steps; zeros (no delta) until then. segments: (target, width) per output segment (ops/lora.py)."""
        assert self.quantized or self.packed, "LoRA runs on the CPU (the engine checks enable_lora)"
        self.lora_segments = tuple((int(t), int(w)) for t, w in segments)
        self.lora_add = LoraAdd(self.lora_segments)
        assert self.lora_add.width == self.out_features, "the segments cover the linear's output"
        shape_a, shape_b = lora_shapes(max_loras, max_rank, self.in_features, [w for _, w in segments])
        self.lora_a_host = np.zeros(shape_a, np.float32)
        self.lora_b_host = np.zeros(shape_b, np.float32)
        # the Parameters read the host arrays' memory: a slot written there is what the graphs use
        self.lora_a = host_parameter(self.lora_a_host, "lora_a")      # [L, S R, in]
        self.lora_b = host_parameter(self.lora_b_host, "lora_b")      # [L, R, out]

    def set_weight(self, w: np.ndarray) -> None:
        """w [in, out] (float32 or castable)."""
        if tuple(w.shape) != (self.in_features, self.out_features):
            raise ValueError(f"weight [in, out] must be {(self.in_features, self.out_features)}, "
                             f"found {tuple(w.shape)}")
        if self.fmt == "int8":
            self.weight.set_data(self._raw(quant_matmul.quantize_int8(w, self.activations)))
            return
        if self.quantized:   # a GGUF format from floats: the loader converts before it gets here
            raise ValueError(f"a {self.fmt} linear takes GGUF blocks (set_blocks), not float weights")
        if self.packed:
            self.weight.set_data(ms.Tensor(pack_weight(w), ms.float32))
        else:
            self.weight.set_data(ms.Tensor(np.ascontiguousarray(w, np.float32), self.dtype))

    def set_blocks(self, rows) -> None:
        """rows [out, in / 32 * block bytes] uint8: GGUF blocks of this linear's format, one row per output; or a
        list of (first output column, rows) parts of a fused linear, in order, which fill its columns. A part
        starting on a panel (16 columns), after parts of whole panels, is packed straight into its panels of the
        weight's buffer; the others are joined first."""
        parts = [(0, rows)] if isinstance(rows, np.ndarray) else list(rows)
        fmt, k, act = self.fmt, self.in_features, self.activations
        if not all(o % 16 == 0 for o, _ in parts) or any(len(r) % 16 for _, r in parts[:-1]):
            parts = [(0, np.concatenate([r for _, r in parts]))]
        packed = np.empty(quant_matmul.packed_shape(fmt, k, self.out_features), np.int8)
        for offset, part in parts:
            quant_matmul.pack_gguf(part, fmt, k, act, packed, offset // 16)
        self.weight.set_data(self._raw(packed, copy=False))

    def _raw(self, packed: np.ndarray, copy: bool = True):
        """[P, panel_bytes] int8 -> the weight's tensor (its bytes as int8, or as uint8 for the dot layout);
        copy=False: the tensor takes packed's memory (a buffer no one else holds)."""
        packed = packed.view(np.uint8) if self.wtype == ms.uint8 else packed
        return ms.Tensor(packed, self.wtype) if copy else ms.Tensor.from_numpy(packed)

    def matmul(self, x, rows=None, lora=None):
        """[T, in] -> [T, out]; rows: int32 [1] real rows of x, or None (all); lora: (slots [T] int32, ranks
        [L, 7] int32) with enable_lora: each row's adapter delta added."""
        if not (self.quantized or self.packed):
            return ops.matmul(x, self.weight)
        half = self.dtype != ms.float32
        x32 = x.astype(ms.float32) if half else x
        if self.quantized:
            y = self.quant_matmul(x32, self.weight, rows)
        else:
            y = self.packed_matmul(x32, self.weight, rows)
        if self.lora_add is not None and lora is not None:
            y = self.lora_add(y, x32, lora[0], self.lora_a, self.lora_b, lora[1])
        return y.astype(self.dtype) if half else y


class ColumnParallelLinear(_Linear):
    """y = x @ W, W [in, out_local]: this rank's output columns of one or several fused projections
    (out_sizes: their per-rank sizes, e.g. (q, k, v) or (gate, up)); no bias, no communication."""

    def __init__(self, in_features: int, out_sizes, tp_size: int = 1, tp_rank: int = 0, dtype=ms.float32,
                 device: str = "cpu", fmt: str = "float32", activations: str = "float32"):
        out_sizes = (out_sizes,) if isinstance(out_sizes, int) else tuple(out_sizes)
        super().__init__(in_features, sum(out_sizes), dtype, device, fmt, activations)
        self.out_sizes = out_sizes

    def construct(self, x, rows=None, lora=None):  # [T, in] -> [T, out_local]
        return self.matmul(x, rows, lora)


class RowParallelLinear(_Linear):
    """y = sum over ranks of x_r @ W_r, W_r [in_local, out]; AllReduce when tp_size > 1."""

    def __init__(self, in_features: int, out_features: int, tp_size: int = 1, tp_rank: int = 0,
                 dtype=ms.float32, device: str = "cpu", fmt: str = "float32", activations: str = "float32"):
        super().__init__(in_features, out_features, dtype, device, fmt, activations)  # in_features: per rank
        self.tp_size = tp_size
        group = {} if _tp_group is None else {"group": _tp_group}
        self.all_reduce = ops.AllReduce(**group) if tp_size > 1 else None
        # MindSpore's CPU collectives sum float32 only; on Ascend reduce in the model's dtype.
        self.reduce_in_fp32 = ms.get_context("device_target") == "CPU"

    def construct(self, x, rows=None, lora=None):  # [T, in_local] -> [T, out]
        y = self.matmul(x, rows, lora)  # a LoRA delta of this rank's input rows: a part of the sum, as y is
        if self.tp_size > 1:
            if self.reduce_in_fp32:
                y = self.all_reduce(y.astype(ms.float32)).astype(x.dtype)
            else:
                y = self.all_reduce(y)
        return y
