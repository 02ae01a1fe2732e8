"""SIMD block dot products for x86 AVX2, written as Numba intrinsics (LLVM IR).

LLVM's auto-vectorizer turns the portable kernels' int8 products into 16-bit multiply-adds
(``vpmaddwd``: 16 products per 256-bit instruction). ggml's kernels use ``vpmaddubsw``
instead (unsigned 8-bit x signed 8-bit -> pairwise 16-bit sums: 32 products per
instruction), unpacking the 4/5/6-bit weights in registers. The functions here do the same,
one quantization block per call, and return the block's exact integer sum, so results are
identical to the portable kernels (tests check both against each other).

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

    def load_i32x16(self, arg_index, index):
        """<16 x i32> at element `index` of an int32 array argument."""
        off = self.b.mul(index, ir.Constant(index.type, 4))
        return self.load(arg_index, off, ir.VectorType(_i32, 16))

    def fold16(self, v):
        """<16 x i32> -> <8 x i32>: lanes k and k + 8 added."""
        return self.b.add(self.lanes(v, list(range(8))), self.lanes(v, list(range(8, 16))))

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
def dot_q4_k(typingctx, raw, o, x, xo, sc):
    """sum_j sc_j * sum_i q_ji * x[xo + 32j + i] for the Q4_K block at raw[o:o+144].

    raw uint8, x int8 (one token's Q8_K quants), sc uint64: the block's eight 6-bit scales,
    one per byte (``kscales_packed`` in dot.py)."""
    sig = types.int32(raw, o, x, xo, sc)

    def codegen(context, builder, sig, args):
        e = _Emit(context, builder, sig, args)
        _, o_, _, xo_, sc_ = args
        terms = []  # <8 x i32> partial sums
        scales = e.packed_bytes(sc_, _i16)  # <8 x i16>
        m4 = e.splat(15)
        for p in range(4):  # sub-blocks 2p (low nibbles) and 2p+1 (high) share 32 bytes
            q = e.load(0, e.off(o_, 16 + 32 * p))
            lo = builder.and_(q, m4)
            hi = builder.lshr(q, e.splat(4))
            pl = e.maddubs(lo, e.load(2, e.off(xo_, 64 * p)))
            ph = e.maddubs(hi, e.load(2, e.off(xo_, 64 * p + 32)))
            terms.append(e.maddwd(pl, e.lanes(scales, [2 * p] * 16)))
            terms.append(e.maddwd(ph, e.lanes(scales, [2 * p + 1] * 16)))
        return e.hsum(e.sum(terms))

    return sig, codegen


@intrinsic
def dot_q5_k(typingctx, raw, o, x, xo, sc):
    """As dot_q4_k for the Q5_K block at raw[o:o+176] (5th bits in qh = raw[o+16:o+48])."""
    sig = types.int32(raw, o, x, xo, sc)

    def codegen(context, builder, sig, args):
        e = _Emit(context, builder, sig, args)
        _, o_, _, xo_, sc_ = args
        terms = []  # <8 x i32> partial sums
        scales = e.packed_bytes(sc_, _i16)  # <8 x i16>
        m4 = e.splat(15)
        one = e.splat(1)
        qh = e.load(0, e.off(o_, 16))
        for p in range(4):
            q = e.load(0, e.off(o_, 48 + 32 * p))
            h0 = builder.and_(builder.lshr(qh, e.splat(2 * p)), one)
            h1 = builder.and_(builder.lshr(qh, e.splat(2 * p + 1)), one)
            lo = builder.or_(builder.and_(q, m4), builder.shl(h0, e.splat(4)))
            hi = builder.or_(builder.lshr(q, e.splat(4)), builder.shl(h1, e.splat(4)))
            pl = e.maddubs(lo, e.load(2, e.off(xo_, 64 * p)))
            ph = e.maddubs(hi, e.load(2, e.off(xo_, 64 * p + 32)))
            terms.append(e.maddwd(pl, e.lanes(scales, [2 * p] * 16)))
            terms.append(e.maddwd(ph, e.lanes(scales, [2 * p + 1] * 16)))
        return e.hsum(e.sum(terms))

    return sig, codegen


@intrinsic
def min_sum_k(typingctx, mins, bs, bo):
    """sum_j m_j * (bs[bo + 2j] + bs[bo + 2j + 1]) for j < 8: the K-quant min term of one
    block (mins uint64: eight 6-bit mins, one per byte; bs int32: sums of 16 quants)."""
    sig = types.int32(mins, bs, bo)

    def codegen(context, builder, sig, args):
        e = _Emit(context, builder, sig, args)
        m = e.packed_bytes(args[0], _i32)  # <8 x i32>
        s16 = e.load_i32x16(1, args[2])
        even, odd = e.lanes(s16, list(range(0, 16, 2))), e.lanes(s16, list(range(1, 16, 2)))
        pairs = builder.add(even, odd)  # sums of each 32 quants
        return e.hsum(builder.mul(m, pairs))

    return sig, codegen


@intrinsic
def dot_q6_k(typingctx, raw, o, x, xo, bs, bo):
    """sum_g sc_g * sum_i q_gi * x[xo + 16g + i] for the Q6_K block at raw[o:o+210], with
    q the signed 6-bit value and sc_g the block's signed 8-bit scales (read from raw).

    The products are taken on the stored unsigned values u = q + 32 (``vpmaddubsw`` wants an
    unsigned operand); the excess 32 * sum_g sc_g * bs[bo + g] (bs int32: sums of each 16
    activation quants) is subtracted in the same vector before the final sum."""
    sig = types.int32(raw, o, x, xo, bs, bo)

    def codegen(context, builder, sig, args):
        e = _Emit(context, builder, sig, args)
        _, o_, _, xo_, _, bo_ = args
        terms = []  # <8 x i32> partial sums
        sc8 = e.load(0, e.off(o_, 192), _V16x8)
        scales = builder.sext(sc8, _V16x16)  # <16 x i16>
        m4, m2 = e.splat(15), e.splat(3)
        for h in range(2):  # two halves of 128 values
            ql0 = e.load(0, e.off(o_, 64 * h))
            ql1 = e.load(0, e.off(o_, 64 * h + 32))
            qh = e.load(0, e.off(o_, 128 + 32 * h))
            lows = [
                builder.and_(ql0, m4),
                builder.and_(ql1, m4),
                builder.lshr(ql0, e.splat(4)),
                builder.lshr(ql1, e.splat(4)),
            ]
            for t in range(4):  # values 128h + 32t + i: high bits are bits 2t, 2t+1 of qh[i]
                hb = builder.and_(builder.lshr(qh, e.splat(2 * t)), m2)
                u = builder.or_(lows[t], builder.shl(hb, e.splat(4)))
                pr = e.maddubs(u, e.load(2, e.off(xo_, 128 * h + 32 * t)))
                g = 8 * h + 2 * t
                terms.append(e.maddwd(pr, e.lanes(scales, [g] * 8 + [g + 1] * 8)))
        sc32 = builder.sext(sc8, ir.VectorType(_i32, 16))
        excess = e.fold16(builder.mul(sc32, e.load_i32x16(4, bo_)))  # sum sc_g * bs_g
        acc = builder.sub(e.sum(terms), builder.shl(excess, ir.Constant(_V8x32, [5] * 8)))
        return e.hsum(acc)

    return sig, codegen


@intrinsic
def dot_q8_0(typingctx, raw, o, x, xo):
    """sum_i w_i * x[xo + i] for the Q8_0 block at raw[o:o+34] (quants at o+2)."""
    sig = types.int32(raw, o, x, xo)

    def codegen(context, builder, sig, args):
        e = _Emit(context, builder, sig, args)
        _, o_, _, xo_ = args
        return e.hsum(e.signed_dot(e.load(0, e.off(o_, 2)), e.load(2, xo_)))

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


@intrinsic
def load_u32(typingctx, arr, off):
    """The little-endian uint32 at arr[off:off+4] (uint8 array), zero-extended to uint64."""
    sig = types.uint64(arr, off)

    def codegen(context, builder, sig, args):
        e = _Emit(context, builder, sig, args)
        ptr = cgutils.pointer_add(builder, e.arrays[0].data, args[1])
        w = builder.load(builder.bitcast(ptr, _i32.as_pointer()), align=1)
        return builder.zext(w, ir.IntType(64))

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


# ---------------------------------------------------------------------------------------
# Prefill: a block's weights unpacked once into 256 unsigned bytes (in the order of the
# activations they multiply), then dotted with each token's quants. The integer results
# equal the fused block dots above.


@intrinsic
def unpack_q4_k(typingctx, raw, o, buf):
    """buf[32j + i] = 4-bit value i of sub-block j of the Q4_K block at raw[o:o+144]."""
    sig = types.void(raw, o, buf)

    def codegen(context, builder, sig, args):
        e = _Emit(context, builder, sig, args)
        o_ = args[1]
        m4 = e.splat(15)
        for p in range(4):
            q = e.load(0, e.off(o_, 16 + 32 * p))
            e.store(2, 64 * p, builder.and_(q, m4))
            e.store(2, 64 * p + 32, builder.lshr(q, e.splat(4)))
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def unpack_q5_k(typingctx, raw, o, buf):
    """buf[32j + i] = 5-bit value i of sub-block j of the Q5_K block at raw[o:o+176]."""
    sig = types.void(raw, o, buf)

    def codegen(context, builder, sig, args):
        e = _Emit(context, builder, sig, args)
        o_ = args[1]
        m4, one = e.splat(15), e.splat(1)
        qh = e.load(0, e.off(o_, 16))
        for p in range(4):
            q = e.load(0, e.off(o_, 48 + 32 * p))
            h0 = builder.and_(builder.lshr(qh, e.splat(2 * p)), one)
            h1 = builder.and_(builder.lshr(qh, e.splat(2 * p + 1)), one)
            e.store(2, 64 * p, builder.or_(builder.and_(q, m4), builder.shl(h0, e.splat(4))))
            hi = builder.or_(builder.lshr(q, e.splat(4)), builder.shl(h1, e.splat(4)))
            e.store(2, 64 * p + 32, hi)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def unpack_q6_k(typingctx, raw, o, buf):
    """buf[n] = stored unsigned 6-bit value n (q + 32) of the Q6_K block at raw[o:o+210]."""
    sig = types.void(raw, o, buf)

    def codegen(context, builder, sig, args):
        e = _Emit(context, builder, sig, args)
        o_ = args[1]
        m4, m2 = e.splat(15), e.splat(3)
        for h in range(2):
            ql0 = e.load(0, e.off(o_, 64 * h))
            ql1 = e.load(0, e.off(o_, 64 * h + 32))
            qh = e.load(0, e.off(o_, 128 + 32 * h))
            lows = [
                builder.and_(ql0, m4),
                builder.and_(ql1, m4),
                builder.lshr(ql0, e.splat(4)),
                builder.lshr(ql1, e.splat(4)),
            ]
            for t in range(4):
                hb = builder.and_(builder.lshr(qh, e.splat(2 * t)), m2)
                e.store(2, 128 * h + 32 * t, builder.or_(lows[t], builder.shl(hb, e.splat(4))))
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def dot_unpacked_k(typingctx, buf, x, xo, sc):
    """sum_j sc_j * sum_i buf[32j + i] * x[xo + 32j + i]: dot_q4_k / dot_q5_k on a block
    unpacked by unpack_q4_k / unpack_q5_k (sc uint64: 8 scales, one per byte)."""
    sig = types.int32(buf, x, xo, sc)

    def codegen(context, builder, sig, args):
        e = _Emit(context, builder, sig, args)
        _, _, xo_, sc_ = args
        terms = []  # <8 x i32> partial sums
        scales = e.packed_bytes(sc_, _i16)
        for j in range(8):
            pr = e.maddubs(e.load(0, ir.Constant(xo_.type, 32 * j)), e.load(1, e.off(xo_, 32 * j)))
            terms.append(e.maddwd(pr, e.lanes(scales, [j] * 16)))
        return e.hsum(e.sum(terms))

    return sig, codegen


@intrinsic
def dot_unpacked_q6_k(typingctx, buf, x, xo, raw, o, bs, bo):
    """dot_q6_k on a block unpacked by unpack_q6_k (scales still read from raw[o+192:])."""
    sig = types.int32(buf, x, xo, raw, o, bs, bo)

    def codegen(context, builder, sig, args):
        e = _Emit(context, builder, sig, args)
        _, _, xo_, _, o_, _, bo_ = args
        terms = []  # <8 x i32> partial sums
        sc8 = e.load(3, e.off(o_, 192), _V16x8)
        scales = builder.sext(sc8, _V16x16)
        for j in range(8):  # 32 values: scales 2j (first 16) and 2j+1
            pr = e.maddubs(e.load(0, ir.Constant(xo_.type, 32 * j)), e.load(1, e.off(xo_, 32 * j)))
            terms.append(e.maddwd(pr, e.lanes(scales, [2 * j] * 8 + [2 * j + 1] * 8)))
        sc32 = builder.sext(sc8, ir.VectorType(_i32, 16))
        excess = e.fold16(builder.mul(sc32, e.load_i32x16(5, bo_)))
        acc = builder.sub(e.sum(terms), builder.shl(excess, ir.Constant(_V8x32, [5] * 8)))
        return e.hsum(acc)

    return sig, codegen
