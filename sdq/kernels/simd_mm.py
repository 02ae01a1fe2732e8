"""Register-tiled K-quant x Q8_K products for x86 AVX2, written as Numba intrinsics.

One call computes ``out[t0 + j, r]`` for one weight row ``r`` and a tile of n tokens
(j < n, n = 1..TILE), looping over the row's blocks inside the intrinsic:

- Weights are unpacked in registers once per block and used by all n tokens of the tile
  (prefill); a tile of 8 tokens reads and unpacks each weight byte an eighth as often as
  token-by-token dots, shares the block's scales and per-block bookkeeping, and keeps 8
  independent multiply-add chains busy. Code is generated for every n up to TILE, so an
  expert's ~6 tokens are one tile, not 4 + 2.
- The float accumulators, block scales and loop counters stay in registers for the whole
  row: no stores between blocks.

Integer lanes: lane k (k < 8) of a block holds, over the block's eight 32-value chunks c,
sum_c sc(c, k) * sum_{i = 4k .. 4k+3} w[32c + i] * x[32c + i], where w are the weights'
integer quants (Q6_K: q + 32, the excess taken off per lane at the end of the block, as
ggml does) and sc the scale of the sub-block that value is in. These are the lanes
``vpmaddubsw`` followed by ``vpmaddwd`` produce. The float steps per block follow one of
ggml's orders (kquant_ref.py): eight float lanes (vec_dot), or one float per token fed by
the block's whole integer sum (tiled, repacked gemv) or by each pair of sub-blocks
(repacked gemm). One intrinsic per (type, order); ``product_order`` picks the order and the
``q*_k_row`` helpers at the end call the intrinsics for one weight row.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from sdq.kernels.jit import inline
from sdq.kernels.quant import Q4_K_BYTES, Q5_K_BYTES, Q6_K_BYTES, QK_K
from sdq.kernels.simd import _Emit, _i8, _i16, _i32, _V8x32, _V16x8, _V16x16

# Bytes: the weights are requested this far ahead of use (see dot.PREFETCH_AHEAD's note;
# kept equal to it there).
PREFETCH_AHEAD = 8192
TILE = 8  # most tokens per tile (prefill)
# Bytes of one block's Q8_K block sums in the bs argument (16 int16 sums of 16 quants each).
_BSUM_BYTES = QK_K // 16 * 2

_i64 = ir.IntType(64)
_f32 = ir.FloatType()
_V8f = ir.VectorType(_f32, 8)

# Argument positions shared by every tile intrinsic:
#   raw uint8 [nbytes] (flat weight bytes), ro int (byte offset of row r), nb int (blocks
#   per row), qs int8 [T, cols], d f32 [T, nb], bs int16 (Q4_K/Q5_K: the Q8_K block sums
#   [T, cols/16]), t0 int (first token of the tile), n int
#   (tokens in the tile), out f32 [T, rows], r int (row)
_RAW, _RO, _NB, _QS, _D, _BS, _T0, _N, _OUT, _R = range(10)


class _Gen(_Emit):
    """_Emit plus what a whole-row loop needs: integer arguments, 2-D row offsets, floats."""

    def __init__(self, context, builder, sig, args):
        super().__init__(context, builder, sig, args)
        self.context, self.sig = context, sig

    def int_arg(self, k):
        return self.context.cast(self.b, self.args[k], self.sig.args[k], types.int64)

    def stride0(self, k):
        return cgutils.unpack_tuple(self.b, self.arrays[k].strides, 2)[0]

    def row_off(self, k, row):
        """Byte offset of row `row` of the 2-D array argument k."""
        return self.b.mul(row, self.stride0(k))

    def i64(self, v):
        return ir.Constant(_i64, v)

    def load_scalar(self, k, off, t):
        ptr = cgutils.pointer_add(self.b, self.arrays[k].data, off)
        return self.b.load(self.b.bitcast(ptr, t.as_pointer()), align=1)

    def load_half(self, k, off):
        h = self.load_scalar(k, off, _i16)
        return self.b.fpext(self.b.bitcast(h, ir.HalfType()), _f32)

    def fsplat(self, v):
        vec = self.b.insert_element(ir.Constant(_V8f, ir.Undefined), v, ir.Constant(_i32, 0))
        return self.lanes(vec, [0] * 8)

    def prefetch_block(self, o, nbytes):
        ptr_t = ir.PointerType(_i8)
        fn = self.fn("llvm.prefetch.p0", ir.VoidType(), [ptr_t, _i32, _i32, _i32])
        for k in range(0, nbytes, 64):
            p = cgutils.pointer_add(self.b, self.arrays[_RAW].data, self.off(o, PREFETCH_AHEAD + k))
            args = [self.b.bitcast(p, ptr_t)] + [ir.Constant(_i32, v) for v in (0, 3, 1)]
            self.b.call(fn, args)

    def kscales(self, o):
        """Q4_K/Q5_K: the block's 8 scales as <8 x i16> and its 8 mins duplicated pairwise
        as <16 x i16> (m0, m0, m1, m1, ...), from the 12 packed bytes at raw[o+4:o+16]."""
        b = self.b
        w0, w1, w2 = (self.load_scalar(_RAW, self.off(o, k), _i32) for k in (4, 8, 12))
        w0, w1, w2 = (b.zext(w, _i64) for w in (w0, w1, w2))
        c = self.i64
        m6, m4, m2 = c(0x3F3F3F3F), c(0x0F0F0F0F), c(0x03030303)
        sc_hi = b.or_(b.and_(w2, m4), b.shl(b.and_(b.lshr(w0, c(6)), m2), c(4)))
        mn_hi = b.or_(b.and_(b.lshr(w2, c(4)), m4), b.shl(b.and_(b.lshr(w1, c(6)), m2), c(4)))
        sc = b.or_(b.and_(w0, m6), b.shl(sc_hi, c(32)))
        mn = b.or_(b.and_(w1, m6), b.shl(mn_hi, c(32)))
        scales = self.packed_bytes(sc, _i16)  # <8 x i16>
        mins = self.lanes(self.packed_bytes(mn, _i16), [j // 2 for j in range(16)])
        return scales, mins

    def madd_acc(self, acc, a, c):
        """acc + vpmaddwd(a, c): <8 x i32> plus the pairwise products of <16 x i16>."""
        return self.b.add(acc, self.maddwd(a, c))

    def store_out(self, value, t):
        """out[t, r] = value."""
        b = self.b
        off = b.add(self.row_off(_OUT, t), b.mul(self.int_arg(_R), self.i64(4)))
        ptr = cgutils.pointer_add(b, self.arrays[_OUT].data, off)
        b.store(value, b.bitcast(ptr, _f32.as_pointer()), align=1)


def _fma(g: _Gen, a, b, c):
    """a * b + c rounded once (scalars or vectors of float)."""
    name = "llvm.fma.f32" if a.type == _f32 else f"llvm.fma.v{a.type.count}f32"
    return g.b.call(g.fn(name, a.type, [a.type] * 3), [a, b, c])


def _hsum8(g: _Gen, acc):
    """ggml's hsum_float_8: ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7))."""
    b = g.b
    lane = [b.extract_element(acc, ir.Constant(_i32, k)) for k in range(8)]
    h = [b.fadd(lane[k], lane[k + 4]) for k in range(4)]
    return b.fadd(b.fadd(h[0], h[2]), b.fadd(h[1], h[3]))


def _splat_f(g: _Gen, v, count: int):
    vt = ir.VectorType(_f32, count)
    vec = g.b.insert_element(ir.Constant(vt, ir.Undefined), v, ir.Constant(_i32, 0))
    return g.lanes(vec, [0] * count)


def _hadd(g: _Gen, a, b):
    """vphaddd: pairwise sums of a and b within each 128-bit half."""
    return g.b.call(g.fn("llvm.x86.avx2.phadd.d", _V8x32, [_V8x32, _V8x32]), [a, b])


def _token_sums(g: _Gen, vs):
    """<8 x i32> whose lane j is the sum of the lanes of vs[j] (len(vs) <= 8; the lanes past
    len(vs) are 0): eight horizontal sums in six vphaddd and two shuffles."""
    zero = ir.Constant(_V8x32, None)
    if len(vs) == 1:  # decode: one horizontal sum
        return g.b.insert_element(zero, g.hsum(vs[0]), ir.Constant(_i32, 0))
    v = list(vs) + [zero] * (8 - len(vs))
    x = [_hadd(g, v[2 * k], v[2 * k + 1]) for k in range(4)]
    y1, y2 = _hadd(g, x[0], x[1]), _hadd(g, x[2], x[3])
    lo = g.b.shuffle_vector(y1, y2, ir.Constant(ir.VectorType(_i32, 8), [0, 1, 2, 3, 8, 9, 10, 11]))
    hi = g.b.shuffle_vector(
        y1, y2, ir.Constant(ir.VectorType(_i32, 8), [4, 5, 6, 7, 12, 13, 14, 15])
    )
    return g.b.add(lo, hi)


def _two_sums(g: _Gen, a, c):
    """(<8 x float>, <8 x float>) holding in lane 0 the integer sums of a and of c."""
    h = _hadd(g, a, c)  # [a01, a23, c01, c23 | a45, a67, c45, c67]
    h = _hadd(g, h, h)  # [a0-3, c0-3, a0-3, c0-3 | a4-7, c4-7, ...]
    idx = ir.Constant(ir.VectorType(_i32, 8), [0, 1, 0, 0, 0, 0, 0, 0])
    lo = g.b.shuffle_vector(h, h, idx)
    hi = g.b.shuffle_vector(h, h, ir.Constant(ir.VectorType(_i32, 8), [4, 5, 4, 4, 4, 4, 4, 4]))
    t = g.b.sitofp(g.b.add(lo, hi), _V8f)  # lane 0: sum of a, lane 1: sum of c
    s_a = g.b.shuffle_vector(t, t, ir.Constant(ir.VectorType(_i32, 8), [0] * 8))
    s_c = g.b.shuffle_vector(t, t, ir.Constant(ir.VectorType(_i32, 8), [1] * 8))
    return s_a, s_c


def _token_pairs(g: _Gen, ms):
    """[4 x <8 x i32>]: vector p holds, in lane j, ms[j][2p] + ms[j][2p+1] (len(ms) <= 8)."""
    zero = ir.Constant(_V8x32, None)
    m = list(ms) + [zero] * (8 - len(ms))
    # h[k] = [a01, a23, b01, b23 | a45, a67, b45, b67] for tokens a = 2k, b = 2k + 1
    h = [_hadd(g, m[2 * k], m[2 * k + 1]) for k in range(4)]
    out = []
    for p in range(4):
        i0 = p if p < 2 else p + 2  # token 2k's pair p in h[k]; token 2k + 1's is i0 + 2
        idx4 = ir.Constant(ir.VectorType(_i32, 4), [i0, i0 + 2, 8 + i0, 8 + i0 + 2])
        s01 = g.b.shuffle_vector(h[0], h[1], idx4)
        s23 = g.b.shuffle_vector(h[2], h[3], idx4)
        out.append(
            g.b.shuffle_vector(s01, s23, ir.Constant(ir.VectorType(_i32, 8), list(range(8))))
        )
    return out


def _token_vector(g: _Gen, values):
    """<8 x float> holding values[j] in lane j (0 past len(values))."""
    v = ir.Constant(_V8f, None)
    for j, x in enumerate(values):
        v = g.b.insert_element(v, x, ir.Constant(_i32, j))
    return v


def _emit_k(g: _Gen, n: int, five_bit: bool, order: str) -> None:
    """One row of Q4_K (five_bit False) or Q5_K blocks for a tile of n tokens, summed in
    ggml's `order` (kquant_ref.py): "vec_dot", "tiled", or Q4_K's repacked "gemv"/"gemm".

    vec_dot keeps eight float lanes per token; the other orders keep one float per token,
    the tile's tokens side by side in one vector (lane j: token j), fed by horizontal
    integer sums taken for all the tile's tokens at once (_token_sums)."""
    bpb = Q5_K_BYTES if five_bit else Q4_K_BYTES  # bytes per block
    qoff = 48 if five_bit else 16  # offset of the 4-bit quants in the block
    b = g.b
    ro, nb, t0 = g.int_arg(_RO), g.int_arg(_NB), g.int_arg(_T0)
    toks = [b.add(t0, g.i64(j)) for j in range(n)]
    xrow = [g.row_off(_QS, t) for t in toks]  # byte offsets of each token's rows
    drow = [g.row_off(_D, t) for t in toks]
    brow = [g.row_off(_BS, t) for t in toks]
    lanes = order == "vec_dot"
    accs = accm = acc_v = accm_v = None
    if lanes:  # per token: eight float lanes, and the min term (Q4_K: 4 lanes, Q5_K: 1)
        acc_t, mins_t = _V8f, (_f32 if five_bit else ir.VectorType(_f32, 4))
        accs = [cgutils.alloca_once_value(b, ir.Constant(acc_t, None)) for _ in range(n)]
        accm = [cgutils.alloca_once_value(b, ir.Constant(mins_t, None)) for _ in range(n)]
    else:  # lane j: token j
        acc_v = cgutils.alloca_once_value(b, ir.Constant(_V8f, None))
        accm_v = cgutils.alloca_once_value(b, ir.Constant(_V8f, None))
    m4, one = g.splat(15), g.splat(1)
    with cgutils.for_range(b, nb) as loop:
        blk = loop.index
        o = b.add(ro, b.mul(blk, g.i64(bpb)))
        g.prefetch_block(o, bpb)
        scales, mins = g.kscales(o)
        dw, dmw = g.load_half(_RAW, o), g.load_half(_RAW, g.off(o, 2))
        xb = b.mul(blk, g.i64(QK_K))  # this block's first activation (byte offset)
        qh = g.load(_RAW, g.off(o, 16)) if five_bit else None
        zero = ir.Constant(_V8x32, None)
        sums = [[zero] * _chains(n) for _ in range(n)]  # per token: <8 x i32> running sums
        pair_sums = []  # gemm: per pair of sub-blocks, <8 x i32> of the tokens' sums
        for p in range(4):  # sub-blocks 2p (low nibbles) and 2p+1 (high) share 32 bytes
            q = g.load(_RAW, g.off(o, qoff + 32 * p))
            lo, hi = b.and_(q, m4), b.lshr(q, g.splat(4))
            if five_bit:
                h0 = b.and_(b.lshr(qh, g.splat(2 * p)), one)
                h1 = b.and_(b.lshr(qh, g.splat(2 * p + 1)), one)
                lo = b.or_(lo, b.shl(h0, g.splat(4)))
                hi = b.or_(hi, b.shl(h1, g.splat(4)))
            s_lo = g.lanes(scales, [2 * p] * 16)
            s_hi = g.lanes(scales, [2 * p + 1] * 16)
            per_token = []
            for j in range(n):
                xo = b.add(xrow[j], xb)
                pl = g.maddubs(lo, g.load(_QS, g.off(xo, 64 * p)))
                ph = g.maddubs(hi, g.load(_QS, g.off(xo, 64 * p + 32)))
                if order == "gemm":
                    per_token.append(b.add(g.maddwd(pl, s_lo), g.maddwd(ph, s_hi)))
                    continue
                k = len(sums[j]) - 1  # 0 or 1
                sums[j][0] = g.madd_acc(sums[j][0], pl, s_lo)
                sums[j][k] = g.madd_acc(sums[j][k], ph, s_hi)
            if order == "gemm":
                pair_sums.append(_token_sums(g, per_token))
        dxs = [g.load_scalar(_D, b.add(drow[j], b.mul(blk, g.i64(4))), _f32) for j in range(n)]
        msums = []  # per token: lane k = m_k * (sum of sub-block k's quants)
        for j in range(n):
            bs16 = g.load(_BS, b.add(brow[j], b.mul(blk, g.i64(_BSUM_BYTES))), _V16x16)
            msums.append(g.maddwd(bs16, mins))
        if lanes:
            _vec_dot_step(g, five_bit, sums, msums, dxs, dw, dmw, accs, accm)
        else:
            _one_float_step(g, order, sums, pair_sums, msums, dxs, dw, dmw, acc_v, accm_v)
    if lanes:
        for j in range(n):
            acc, am = b.load(accs[j]), b.load(accm[j])
            tot = _hsum8(g, acc)
            if five_bit:
                tot = b.fadd(tot, am)
            else:
                m = [b.extract_element(am, ir.Constant(_i32, k)) for k in range(4)]
                tot = b.fadd(tot, b.fadd(b.fadd(m[0], m[2]), b.fadd(m[1], m[3])))
            g.store_out(tot, toks[j])
        return
    res = b.load(acc_v)
    if order != "tiled":
        res = b.fsub(res, b.load(accm_v))
    for j in range(n):
        g.store_out(b.extract_element(res, ir.Constant(_i32, j)), toks[j])


def _vec_dot_step(g: _Gen, five_bit: bool, sums, msums, dxs, dw, dmw, accs, accm) -> None:
    """vec_dot's block step for each token j: eight float lanes, and the min term (Q4_K: four
    lanes of two mins each; Q5_K: one float)."""
    b = g.b
    for j, dx in enumerate(dxs):
        acc, am = b.load(accs[j]), b.load(accm[j])
        isum = b.sitofp(_total(b, sums[j]), _V8f)
        acc = _fma(g, _splat_f(g, b.fmul(dx, dw), 8), isum, acc)
        dm = b.fneg(b.fmul(dx, dmw))
        if five_bit:
            am = _fma(g, dm, b.sitofp(g.hsum(msums[j]), _f32), am)
        else:  # lane m: mins 2m and 2m+1
            pm = b.add(g.lanes(msums[j], [0, 2, 4, 6]), g.lanes(msums[j], [1, 3, 5, 7]))
            am = _fma(g, _splat_f(g, dm, 4), b.sitofp(pm, am.type), am)
        b.store(acc, accs[j])
        b.store(am, accm[j])


def _one_float_step(g: _Gen, order: str, sums, pair_sums, msums, dxs, dw, dmw, acc_v, accm_v):
    """The tiled and repacked block steps, for the tile's tokens at once (lane j: token j)."""
    b = g.b
    dx = _token_vector(g, dxs)
    acc, am = b.load(acc_v), b.load(accm_v)
    if order == "gemm":  # repacked: one step per pair of sub-blocks
        sd, sm = b.fmul(g.fsplat(dw), dx), b.fmul(g.fsplat(dmw), dx)
        for ip, mp in zip(pair_sums, _token_pairs(g, msums), strict=True):
            acc = _fma(g, b.sitofp(ip, _V8f), sd, acc)
            am = _fma(g, b.sitofp(mp, _V8f), sm, am)
    else:
        if len(sums) == 1:  # decode: both horizontal sums in one vphaddd sequence
            s1, s2 = _two_sums(g, _total(b, sums[0]), msums[0])
        else:
            s1 = b.sitofp(_token_sums(g, [_total(b, v) for v in sums]), _V8f)
            s2 = b.sitofp(_token_sums(g, msums), _V8f)
        if order == "tiled":
            res = _fma(g, g.fsplat(b.fneg(dmw)), s2, b.fmul(s1, g.fsplat(dw)))
            acc = _fma(g, res, dx, acc)
        else:  # repacked gemv: one step per block
            acc = _fma(g, s1, b.fmul(g.fsplat(dw), dx), acc)
            am = _fma(g, s2, b.fmul(g.fsplat(dmw), dx), am)
    b.store(acc, acc_v)
    b.store(am, accm_v)


def _emit_q6_k(g: _Gen, n: int, order: str) -> None:
    """One row of Q6_K blocks for a tile of n tokens, in ggml's "vec_dot" or "tiled" order
    (tiled: one float per token, the tile's tokens side by side as in _emit_k).

    Q6_K stores q + 32 (unsigned, as ``vpmaddubsw`` wants); as ggml, the excess is taken off
    each integer lane at the end of the block: 32 * (bsum_2k * sc_2k + bsum_2k+1 * sc_2k+1)."""
    b = g.b
    ro, nb, t0 = g.int_arg(_RO), g.int_arg(_NB), g.int_arg(_T0)
    toks = [b.add(t0, g.i64(j)) for j in range(n)]
    xrow = [g.row_off(_QS, t) for t in toks]
    drow = [g.row_off(_D, t) for t in toks]
    brow = [g.row_off(_BS, t) for t in toks]
    lanes = order == "vec_dot"
    accs = [cgutils.alloca_once_value(b, ir.Constant(_V8f, None)) for _ in range(n if lanes else 1)]
    m4, m2 = g.splat(15), g.splat(3)
    with cgutils.for_range(b, nb) as loop:
        blk = loop.index
        o = b.add(ro, b.mul(blk, g.i64(Q6_K_BYTES)))
        g.prefetch_block(o, Q6_K_BYTES)
        scales = b.sext(g.load(_RAW, g.off(o, 192), _V16x8), _V16x16)  # 16 signed scales
        dw = g.load_half(_RAW, g.off(o, 208))
        xb = b.mul(blk, g.i64(QK_K))
        zero = ir.Constant(_V8x32, None)
        sums = [[zero] * _chains(n) for _ in range(n)]  # per token: <8 x i32> running sums
        for h in range(2):  # two halves of 128 values
            ql0 = g.load(_RAW, g.off(o, 64 * h))
            ql1 = g.load(_RAW, g.off(o, 64 * h + 32))
            qh = g.load(_RAW, g.off(o, 128 + 32 * h))
            lows = [b.and_(ql0, m4), b.and_(ql1, m4), b.lshr(ql0, g.splat(4))]
            lows.append(b.lshr(ql1, g.splat(4)))
            for c in range(4):  # values 128h + 32c + i: high bits 2c, 2c+1 of qh[i]
                hb = b.and_(b.lshr(qh, g.splat(2 * c)), m2)
                u = b.or_(lows[c], b.shl(hb, g.splat(4)))  # q + 32, unsigned
                s = 8 * h + 2 * c
                sv = g.lanes(scales, [s] * 8 + [s + 1] * 8)
                for j in range(n):
                    xo = 128 * h + 32 * c  # value offset in the block = byte offset
                    x = g.load(_QS, g.off(b.add(xrow[j], xb), xo))
                    k = c % len(sums[j])
                    sums[j][k] = g.madd_acc(sums[j][k], g.maddubs(u, x), sv)
        isums, dxs = [], []
        for j in range(n):
            dxs.append(g.load_scalar(_D, b.add(drow[j], b.mul(blk, g.i64(4))), _f32))
            bs16 = g.load(_BS, b.add(brow[j], b.mul(blk, g.i64(_BSUM_BYTES))), _V16x16)
            excess = b.shl(g.maddwd(bs16, scales), ir.Constant(_V8x32, [5] * 8))
            isums.append(b.sub(_total(b, sums[j]), excess))
        if lanes:
            for j in range(n):
                acc = b.load(accs[j])
                dd = _splat_f(g, b.fmul(dxs[j], dw), 8)
                b.store(_fma(g, dd, b.sitofp(isums[j], _V8f), acc), accs[j])
        else:
            res = b.fmul(b.sitofp(_token_sums(g, isums), _V8f), g.fsplat(dw))
            b.store(_fma(g, res, _token_vector(g, dxs), b.load(accs[0])), accs[0])
    for j in range(n):
        if lanes:
            tot = _hsum8(g, b.load(accs[j]))
        else:
            tot = b.extract_element(b.load(accs[0]), ir.Constant(_i32, j))
        g.store_out(tot, toks[j])


def _chains(n: int) -> int:
    """Running integer sums per token: two short dependency chains while registers allow
    (16 256-bit registers without AVX-512), one for larger tiles."""
    return 2 if n <= 4 else 1


def _total(b, vectors):
    total = vectors[0]
    for v in vectors[1:]:
        total = b.add(total, v)
    return total


def _rows_intrinsic(emit):
    """A tile intrinsic (raw, ro, nb, qs, d, bs, t0, n, out, r) -> None: out[t0 : t0+n, r]
    for 1 <= n <= TILE tokens; one switch per call selects the code made for that n."""

    def codegen(context, builder, sig, args):
        g = _Gen(context, builder, sig, args)
        end = builder.append_basic_block("tile.end")
        switch = builder.switch(g.int_arg(_N), end)
        for n in range(1, TILE + 1):
            case = builder.append_basic_block(f"tile.{n}")
            switch.add_case(ir.Constant(_i64, n), case)
            builder.position_at_end(case)
            emit(g, n)
            builder.branch(end)
        builder.position_at_end(end)
        return context.get_dummy_value()

    @intrinsic
    def tile(typingctx, raw, ro, nb, qs, d, bs, t0, n, out, r):
        return types.void(raw, ro, nb, qs, d, bs, t0, n, out, r), codegen

    return tile


q4_k_vec_dot = _rows_intrinsic(lambda g, n: _emit_k(g, n, False, "vec_dot"))
q4_k_tiled = _rows_intrinsic(lambda g, n: _emit_k(g, n, False, "tiled"))
q4_k_gemv = _rows_intrinsic(lambda g, n: _emit_k(g, n, False, "gemv"))
q4_k_gemm = _rows_intrinsic(lambda g, n: _emit_k(g, n, False, "gemm"))
q5_k_vec_dot = _rows_intrinsic(lambda g, n: _emit_k(g, n, True, "vec_dot"))
q5_k_tiled = _rows_intrinsic(lambda g, n: _emit_k(g, n, True, "tiled"))
q6_k_vec_dot = _rows_intrinsic(lambda g, n: _emit_q6_k(g, n, "vec_dot"))
q6_k_tiled = _rows_intrinsic(lambda g, n: _emit_q6_k(g, n, "tiled"))


# ---------------------------------------------------------------------------------------
# One weight row for T tokens, in the order ggml's x86 build takes for that product.
# Arguments: raw, r (row), nb (blocks per row), qs, d, bs (Q8_K activations: quants, scales,
# block sums), T (tokens), out [T, rows]; order: VEC_DOT / TILED (all three types) or, for
# Q4_K with rows % 8 == 0, REPACKED with tokens < ngemm in the gemm order.

VEC_DOT, TILED, REPACKED = 0, 1, 2
# ggml's tiled K-quant mul_mat (and mul_mat_id per expert) takes over from this many tokens
TILED_MIN_TOKENS = 8


def product_order(qtype_is_q4_k: bool, rows: int, tokens: int, per_row: bool, repack=True):
    """(order, ngemm) ggml's x86 build uses for a K-quant product of `rows` weight rows and
    `tokens` tokens: repacked Q4_K (rows % 8 == 0, and `repack`: weights ggml repacks at
    load, 2-D matrices and 3-D expert tensors; mul_mat's leading multiple of 4 tokens in the
    gemm order, the rest and every per_row (mul_mat_id) product in the gemv order), else its
    tiled kernel from TILED_MIN_TOKENS tokens, else vec_dot."""
    if qtype_is_q4_k and repack and rows % 8 == 0:
        return REPACKED, 0 if per_row else tokens - tokens % 4
    return (TILED if tokens >= TILED_MIN_TOKENS else VEC_DOT), 0


@inline
def q4_k_row(raw, r, nb, qs, d, bs, T, out, order, ngemm):
    ro = r * nb * Q4_K_BYTES
    if order == REPACKED:
        for t in range(0, ngemm, TILE):
            q4_k_gemm(raw, ro, nb, qs, d, bs, t, min(TILE, ngemm - t), out, r)
        for t in range(ngemm, T, TILE):
            q4_k_gemv(raw, ro, nb, qs, d, bs, t, min(TILE, T - t), out, r)
    elif order == TILED:
        for t in range(0, T, TILE):
            q4_k_tiled(raw, ro, nb, qs, d, bs, t, min(TILE, T - t), out, r)
    else:
        for t in range(0, T, TILE):
            q4_k_vec_dot(raw, ro, nb, qs, d, bs, t, min(TILE, T - t), out, r)


@inline
def q5_k_row(raw, r, nb, qs, d, bs, T, out, order):
    ro = r * nb * Q5_K_BYTES
    for t in range(0, T, TILE):
        if order == TILED:
            q5_k_tiled(raw, ro, nb, qs, d, bs, t, min(TILE, T - t), out, r)
        else:
            q5_k_vec_dot(raw, ro, nb, qs, d, bs, t, min(TILE, T - t), out, r)


@inline
def q6_k_row(raw, r, nb, qs, d, bs, T, out, order):
    ro = r * nb * Q6_K_BYTES
    for t in range(0, T, TILE):
        if order == TILED:
            q6_k_tiled(raw, ro, nb, qs, d, bs, t, min(TILE, T - t), out, r)
        else:
            q6_k_vec_dot(raw, ro, nb, qs, d, bs, t, min(TILE, T - t), out, r)
