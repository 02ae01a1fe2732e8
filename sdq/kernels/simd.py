"""SIMD block dot products for x86 AVX2, written as Numba intrinsics (LLVM IR).

LLVM's auto-vectorizer turns the portable kernels' int8 products into 16-bit multiply-adds
(``vpmaddwd``: 16 products per 256-bit instruction). ggml's kernels use ``vpmaddubsw``
instead (unsigned 8-bit x signed 8-bit -> pairwise 16-bit sums: 32 products per
instruction), unpacking the 4/5/6-bit weights in registers. The Q4_0 function here does
the same, one quantization block per call, and returns the block's exact integer sum, so
results are identical to the portable kernels (tests check both against each other); Q8_0's
rows are one intrinsic in dot.py (`_dot_q8_0_row`), built on `_Emit` too. MXFP4's
4-bit codes are looked up in a 16-entry table with ``vpshufb`` before the same product. The
K-quant products are whole-row tiles in simd_mm.py, built on this module's ``_Emit``.

No saturation can happen in ``vpmaddubsw``: the unsigned operand is at most 63 (Q6_K) or
128 (|int8|) and the signed one at most 127 in magnitude, so a pair sums to < 32767.

``HAVE_AVX2`` says whether this CPU can run them; dot.py falls back to the portable kernels
otherwise. ``load_f16`` (half -> float via LLVM's ``fpext``) works on any CPU.
"""

from __future__ import annotations

import llvmlite.binding as llvm
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

HAVE_AVX2 = bool(llvm.get_host_cpu_features().get("avx2", False))

_i8, _i16, _i32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)
_V32x8 = ir.VectorType(_i8, 32)
_V16x8 = ir.VectorType(_i8, 16)
_V16x16 = ir.VectorType(_i16, 16)
_V8x32 = ir.VectorType(_i32, 8)


class _Emit:
    """Small helpers over an IRBuilder for 256-bit integer vectors."""

    def __init__(self, context, builder, sig, args):
        self.b = builder
        self.mod = builder.module
        self.arrays = [
            context.make_array(t)(context, builder, a) if isinstance(t, types.Array) else None
            for t, a in zip(sig.args, args, strict=True)
        ]
        self.args = args

    def fn(self, name, ret, params):
        return cgutils.get_or_insert_function(self.mod, ir.FunctionType(ret, params), name)

    def load(self, arg_index, offset, vtype=_V32x8):
        ptr = cgutils.pointer_add(self.b, self.arrays[arg_index].data, offset)
        return self.b.load(self.b.bitcast(ptr, vtype.as_pointer()), align=1)

    def store(self, arg_index, offset, value):
        """Store a vector at byte `offset` (an int) of an array argument."""
        ptr = cgutils.pointer_add(self.b, self.arrays[arg_index].data, offset)
        self.b.store(value, self.b.bitcast(ptr, value.type.as_pointer()), align=1)

    def off(self, base, k):
        return self.b.add(base, ir.Constant(base.type, k))

    @staticmethod
    def splat(v, vtype=_V32x8):
        return ir.Constant(vtype, [v] * vtype.count)

    def maddubs(self, u, s):  # <32 x u8> x <32 x i8> -> <16 x i16> pairwise sums
        return self.b.call(self.fn("llvm.x86.avx2.pmadd.ub.sw", _V16x16, [_V32x8, _V32x8]), [u, s])

    def maddwd(self, a, b):  # <16 x i16> x <16 x i16> -> <8 x i32> pairwise sums
        return self.b.call(self.fn("llvm.x86.avx2.pmadd.wd", _V8x32, [_V16x16, _V16x16]), [a, b])

    def sum(self, terms):
        acc = terms[0]
        for t in terms[1:]:
            acc = self.b.add(acc, t)
        return acc

    def hsum(self, v):
        return self.b.call(self.fn("llvm.vector.reduce.add.v8i32", _i32, [_V8x32]), [v])

    def packed_bytes(self, value, out_type):
        """A uint64 holding 8 bytes -> <8 x out_type>, each byte zero-extended."""
        v8 = self.b.bitcast(value, ir.VectorType(_i8, 8))
        return self.b.zext(v8, ir.VectorType(out_type, 8))

    def lanes(self, v, idx):
        """<len(idx) x T>: lane k = v[idx[k]] (broadcasts and pair splats of scales)."""
        undef = ir.Constant(v.type, ir.Undefined)
        return self.b.shuffle_vector(v, undef, ir.Constant(ir.VectorType(_i32, len(idx)), idx))

    def signed_dot(self, w, x):
        """sum(w * x) pairwise for signed int8 w, x (|x| <= 127): |w| times x with w's sign."""
        b = self.b
        zero = ir.Constant(_V32x8, None)
        neg = b.icmp_signed("<", w, zero)
        aw = b.select(neg, b.sub(zero, w), w)
        sx = b.select(neg, b.sub(zero, x), b.select(b.icmp_signed("==", w, zero), zero, x))
        ones = self.splat(1, _V16x16)
        return self.maddwd(self.maddubs(aw, sx), ones)


@intrinsic
def load_f16(typingctx, arr, off):
    """The little-endian IEEE half at arr[off:off+2] (uint8 array) as float32, exactly."""
    sig = types.float32(arr, off)

    def codegen(context, builder, sig, args):
        e = _Emit(context, builder, sig, args)
        ptr = cgutils.pointer_add(builder, e.arrays[0].data, args[1])
        h = builder.load(builder.bitcast(ptr, _i16.as_pointer()), align=1)
        return builder.fpext(builder.bitcast(h, ir.HalfType()), ir.FloatType())

    return sig, codegen


@intrinsic
def dot_q4_0(typingctx, raw, o, x, xo):
    """sum_i (nibble_i - 8) * x[xo + i] for the Q4_0 block at raw[o:o+18]."""
    sig = types.int32(raw, o, x, xo)

    def codegen(context, builder, sig, args):
        e = _Emit(context, builder, sig, args)
        _, o_, _, xo_ = args
        q = e.load(0, e.off(o_, 2), _V16x8)
        lo = builder.and_(q, e.splat(15, _V16x8))
        hi = builder.lshr(q, e.splat(4, _V16x8))
        w = builder.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(_i32, 32), list(range(32))))
        w = builder.sub(w, e.splat(8))
        return e.hsum(e.signed_dot(w, e.load(2, xo_)))

    return sig, codegen


# MXFP4's E2M1 codes doubled to integers (sdq.kernels.mxfp4.KVALUES): the table of vpshufb
_MXFP4_KVALUES = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)


@intrinsic
def dot_mxfp4(typingctx, raw, o, x, xo):
    """sum_i KVALUES[code_i] * x[xo + i] for the MXFP4 block at raw[o:o+17] (scale byte at o,
    codes 0..15 in the low nibbles of bytes o+1.., codes 16..31 in the high ones)."""
    sig = types.int32(raw, o, x, xo)

    def codegen(context, builder, sig, args):
        e = _Emit(context, builder, sig, args)
        _, o_, _, xo_ = args
        q = e.load(0, e.off(o_, 1), _V16x8)
        table = ir.Constant(_V16x8, [v & 0xFF for v in _MXFP4_KVALUES])
        pshufb = e.fn("llvm.x86.ssse3.pshuf.b.128", _V16x8, [_V16x8, _V16x8])
        lo = builder.call(pshufb, [table, builder.and_(q, e.splat(15, _V16x8))])
        hi = builder.call(pshufb, [table, builder.lshr(q, e.splat(4, _V16x8))])
        w = builder.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(_i32, 32), list(range(32))))
        return e.hsum(e.signed_dot(w, e.load(2, xo_)))

    return sig, codegen


@intrinsic
def load_bf16(typingctx, arr, off):
    """The little-endian bfloat16 at arr[off:off+2] (uint8 array) as float32, exactly."""
    sig = types.float32(arr, off)

    def codegen(context, builder, sig, args):
        e = _Emit(context, builder, sig, args)
        ptr = cgutils.pointer_add(builder, e.arrays[0].data, args[1])
        h = builder.load(builder.bitcast(ptr, _i16.as_pointer()), align=1)
        bits = builder.shl(builder.zext(h, _i32), ir.Constant(_i32, 16))
        return builder.bitcast(bits, ir.FloatType())

    return sig, codegen


@intrinsic
def round_f16(typingctx, x):
    """float32 -> nearest IEEE half (ties to even, overflow to inf), returned as float32."""
    sig = types.float32(types.float32)

    def codegen(context, builder, sig, args):
        return builder.fpext(builder.fptrunc(args[0], ir.HalfType()), ir.FloatType())

    return sig, codegen


@intrinsic
def prefetch(typingctx, arr, off):
    """Hint the CPU to fetch arr[off] (byte offset) into cache for reading; no effect on
    results. Past the end of the array is allowed: a prefetch never faults."""
    sig = types.void(arr, off)

    def codegen(context, builder, sig, args):
        e = _Emit(context, builder, sig, args)
        ptr = cgutils.pointer_add(builder, e.arrays[0].data, args[1])
        ptr = builder.bitcast(ptr, ir.PointerType(_i8))
        fn = e.fn("llvm.prefetch.p0", ir.VoidType(), [ir.PointerType(_i8), _i32, _i32, _i32])
        # rw = 0 (read), locality = 3 (keep in all cache levels), cache type = 1 (data)
        builder.call(fn, [ptr, ir.Constant(_i32, 0), ir.Constant(_i32, 3), ir.Constant(_i32, 1)])
        return context.get_dummy_value()

    return sig, codegen
