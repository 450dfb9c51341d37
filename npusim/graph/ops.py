"""The op graph: ops with shapes, dtypes, FLOPs and bytes; layers as ordered ops repeated over identical layers.

FLOPs count the multiply-adds of cube work as 2 per MAC and a few FLOPs per element for vector work. Bytes are the
HBM traffic of one launch with ideal on-chip reuse (weights and shared KV read once per launch); the kernel layer
refines both, these figures are the roofline inputs and the accounting users check.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from npusim.spec.chip import BYTES_PER_ELEMENT
from npusim.spec.quant import BF16, Storage

@dataclass(frozen=True, kw_only=True)
class Op:
    """One kernel launch on `unit` (cube, vector or memory). `weight_bytes` is the part of `bytes_read` that is
    parameters (what a decode step streams)."""

    name: str
    kind: str
    unit: str
    shape: dict[str, int]
    dtypes: dict[str, str]
    flops: float
    bytes_read: float
    bytes_written: float
    weight_bytes: float = 0.0

    @property
    def bytes(self) -> float:
        return self.bytes_read + self.bytes_written

    @property
    def arithmetic_intensity(self) -> float:
        """FLOP per byte of HBM traffic: compared with the chip's ridge point it says compute- or memory-bound."""
        return self.flops / self.bytes if self.bytes else 0.0


def gemm(name: str, m: int, k: int, n: int, weight: Storage, act: Storage, *, batch: int = 1,
         kind: str = "gemm", out: str = BF16.dtype) -> Op:
    """[batch] x (m x k) @ (k x n): a linear (batch 1), per-head absorption or a grouped low-rank projection; `out`
    int32: a W8A8 linear's accumulators left undequantised for a fused dequant-SwiGLU-quant."""
    w = weight.bytes_for(batch * k * n)
    shape = {"m": m, "k": k, "n": n} | ({"batch": batch} if batch > 1 else {})
    return Op(name=name, kind=kind, unit="cube", shape=shape,
              dtypes={"a": act.dtype, "b": weight.dtype, "out": out},
              flops=2.0 * batch * m * k * n, bytes_read=act.bytes_for(batch * m * k) + w,
              bytes_written=batch * m * n * BYTES_PER_ELEMENT[out], weight_bytes=w)


def grouped_gemm(name: str, rows: int, k: int, n: int, experts: float, weight: Storage, act: Storage,
                 out: str = BF16.dtype) -> Op:
    """Routed experts: `rows` token-expert assignments spread over `experts` distinct experts (weights read once each);
    `out` int32: the accumulators left undequantised for a fused dequant-SwiGLU-quant."""
    w = experts * weight.bytes_for(k * n)
    return Op(name=name, kind="grouped_gemm", unit="cube", shape={"rows": rows, "k": k, "n": n,
                                                                   "experts": round(experts)},
              dtypes={"a": act.dtype, "b": weight.dtype, "out": out}, flops=2.0 * rows * k * n,
              bytes_read=act.bytes_for(rows * k) + w, bytes_written=rows * n * BYTES_PER_ELEMENT[out], weight_bytes=w)


def vector(name: str, kind: str, shape: dict[str, int], *, read: float, written: float, flops: float,
           dtype: str = BF16.dtype, weight_bytes: float = 0.0) -> Op:
    """An elementwise / reduction op on the vector cores."""
    return Op(name=name, kind=kind, unit="vector", shape=shape, dtypes={"x": dtype}, flops=flops,
              bytes_read=read + weight_bytes, bytes_written=written, weight_bytes=weight_bytes)


def norm(name: str, tokens: int, width: int, kind: str = "rmsnorm", residual: bool = False) -> Op:
    """RMSNorm / LayerNorm over `width` (4 FLOP per element: square, sum, scale, weight); `residual`: AddRmsNorm, the
    residual added first and the sum written back (twice the rows in and out, one more FLOP per element)."""
    elements, arrays = tokens * width, 1 + residual
    shape = {"tokens": tokens, "width": width} | ({"residual": 1} if residual else {})
    return vector(name, kind, shape, read=arrays * BF16.bytes_for(elements), written=arrays * BF16.bytes_for(elements),
                  flops=(4.0 + residual) * elements, weight_bytes=BF16.bytes_for(width))


def rope(name: str, tokens: int, heads: int, dim: int) -> Op:
    """Rotary embedding on `dim` dims of `heads` vectors per token (3 FLOP per element)."""
    elements = tokens * heads * dim
    return vector(name, "rope", {"tokens": tokens, "heads": heads, "dim": dim}, read=BF16.bytes_for(elements),
                  written=BF16.bytes_for(elements), flops=3.0 * elements)


def swiglu(name: str, rows: int, width: int, clamp: float) -> Op:
    """silu(gate) * up over `width` outputs per row (clamp > 0: V4's clamped SwiGLU)."""
    shape = {"rows": rows, "width": width} | ({"clamp": round(clamp)} if clamp else {})
    return vector(name, "swiglu", shape, read=BF16.bytes_for(2 * rows * width), written=BF16.bytes_for(rows * width),
                  flops=(6.0 + (2.0 if clamp else 0.0)) * rows * width)


def dequant_swiglu_quant(name: str, rows: int, width: int, clamp: float, act: Storage) -> Op:
    """W8A8 experts, shared expert and dense MLP: the gate-up's int32 [gate | up] and the rows' scales -> SwiGLU ->
    `act` (int8 per row), the down projection's input, in one vector pass (npu_dequant_swiglu_quant)."""
    shape = {"rows": rows, "width": width} | ({"clamp": round(clamp)} if clamp else {})
    return replace(vector(name, "dequant_swiglu_quant", shape, read=rows * (2 * width * BYTES_PER_ELEMENT["int32"] + 4),
                          written=rows * act.bytes_for(width), flops=(11.0 + (2.0 if clamp else 0.0)) * rows * width),
                   dtypes={"x": "int32", "out": act.dtype})


def copy(name: str, rows: int, cols: int, src: str, dst: str, repeat: int = 1) -> Op:
    """Rows copied (a layout change), cast (`src` -> `dst`) or repeated `repeat` times, on the vector cores."""
    shape = {"rows": rows, "cols": cols} | ({"repeat": repeat} if repeat > 1 else {})
    return replace(vector(name, "copy", shape, read=rows * cols * BYTES_PER_ELEMENT[src],
                          written=rows * repeat * cols * BYTES_PER_ELEMENT[dst], flops=0.0),
                   dtypes={"x": src, "out": dst})


def cache_store(name: str, tokens: int, elements: int, row_bytes: float, store: Storage) -> Op:
    """Quantise (when the cache format is) and scatter new cache rows."""
    return Op(name=name, kind="quant" if store.quantised else "cache_update", unit="vector",
              shape={"rows": tokens, "elements": elements}, dtypes={"x": BF16.dtype, "cache": store.dtype},
              flops=3.0 * tokens * elements if store.quantised else 0.0,
              bytes_read=BF16.bytes_for(tokens * elements), bytes_written=tokens * row_bytes)


@dataclass(frozen=True, kw_only=True)
class LayerGraph:
    """The ordered ops of one layer type, standing for `repeat` identical layers (decoder indices in `layers`)."""

    name: str
    ops: tuple[Op, ...]
    layers: tuple[int, ...] = ()
    repeat: int = 1

    @property
    def flops(self) -> float:
        return sum(op.flops for op in self.ops)

    @property
    def bytes_read(self) -> float:
        return sum(op.bytes_read for op in self.ops)

    @property
    def bytes_written(self) -> float:
        return sum(op.bytes_written for op in self.ops)

    @property
    def weight_bytes(self) -> float:
        return sum(op.weight_bytes for op in self.ops)

    def op(self, name: str) -> Op:
        for o in self.ops:
            if o.name == name:
                return o
        raise KeyError(f"layer {self.name} has no op {name}")


@dataclass(frozen=True, kw_only=True)
class ModelGraph:
    """All layers of one step (prefill of a batch, or one decode step) in execution order."""

    model: str
    phase: str
    quant: str
    scenario: dict[str, int] = field(default_factory=dict)
    layers: tuple[LayerGraph, ...]

    def _total(self, attr: str) -> float:
        return sum(getattr(lg, attr) * lg.repeat for lg in self.layers)

    @property
    def flops(self) -> float:
        return self._total("flops")

    @property
    def bytes_read(self) -> float:
        return self._total("bytes_read")

    @property
    def bytes_written(self) -> float:
        return self._total("bytes_written")

    @property
    def weight_bytes(self) -> float:
        return self._total("weight_bytes")

    @property
    def arithmetic_intensity(self) -> float:
        return self.flops / (self.bytes_read + self.bytes_written)

    def layer(self, name: str) -> LayerGraph:
        for lg in self.layers:
            if lg.name == name:
                return lg
        raise KeyError(f"{self.model} has no layer type {name} (have {[lg.name for lg in self.layers]})")

    def op_total(self, name: str, attr: str = "flops") -> float:
        """Sum of one op's `attr` over every layer that has it, times the layer repeats."""
        return sum(getattr(o, attr) * lg.repeat for lg in self.layers for o in lg.ops if o.name == name)
