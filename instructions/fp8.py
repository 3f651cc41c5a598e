"""The e4m3 arithmetic the FP8 tiles share: e4m3 weights made bf16 (or float32) exactly with integer
ops (``e4m3_bf16``; both batched tiles), and for w8a8 (the weights-on-M tile) float32 inputs
quantized to e4m3 with one scale per 128 columns (``quantize_e4m3``, ``round_e4m3``).
"""

import triton
import triton.language as tl

# The batched tiles' FP8 weights are made bf16 with integer ops, not the conversion unit (Triton's
# e4m3 -> bf16 costs a conversion-unit op a weight, which bounds the tile on Hopper), on both 16-bit
# halves of a word at once: bytes 0 and 2 of a word, or 1 and 3, become the bf16s with bits
# sign << 15 | (e4m3 & 0x7f) << 4, the e4m3 value times 2^-120, exactly (a bf16 subnormal for an
# e4m3 subnormal). A packed bf16 multiply by 2^120 then gives the plain conversion (bf16 arithmetic
# keeps subnormals, so exactly), all normal numbers, which tensor cores cannot flush.
E4M3_MAG2: tl.constexpr = tl.constexpr(0x07F007F0)                 # a half's exponent and mantissa, twice
E4M3_SIGN2: tl.constexpr = tl.constexpr(0x80008000 - (1 << 32))    # a half's sign, twice, as int32


@triton.jit
def e4m3_halves(w):
    """(bytes 0 and 2, bytes 1 and 3) of int32 words of four e4m3 bytes (little-endian), each byte in
    a 16-bit half of the result: the bf16 bits of its value times 2^-120. Five integer ops a word."""
    even = ((w << 4) & E4M3_MAG2) | ((w << 8) & E4M3_SIGN2)
    odd = ((w >> 4) & E4M3_MAG2) | (w & E4M3_SIGN2)
    return even, odd


@triton.jit
def _halves_times_2_120(v, F32: tl.constexpr):
    """(the low half, the high half) of int32 ``v``, bf16 bits, times 2^120: as bf16 by a packed bf16
    multiply, or with F32 as float32 by float32 multiplies of the bits moved to the top (the
    interpreter's bf16 arithmetic flushes subnormals and rounds wrongly; a float32 model wants
    float32 weights anyway)."""
    if F32:
        lo = (v << 16).to(tl.float32, bitcast=True) * 2.0 ** 120
        hi = (v & -65536).to(tl.float32, bitcast=True) * 2.0 ** 120
    else:
        lo = (v & 0xFFFF).to(tl.int16).to(tl.bfloat16, bitcast=True) * 2.0 ** 120
        hi = (v >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True) * 2.0 ** 120
    return lo, hi


@triton.jit
def e4m3_bf16(w, F32: tl.constexpr):
    """[S, M, KW] int32 words of four e4m3 bytes (``load_wbs``) as [S, M, 4 * KW] bf16, column 4i + j
    byte j of word i: for every byte but NaN exactly its bf16 conversion (with F32 that value as
    float32, ``_halves_times_2_120``). Two weights cost five integer ops and a packed multiply."""
    even, odd = e4m3_halves(w)
    b0, b2 = _halves_times_2_120(even, F32)
    b1, b3 = _halves_times_2_120(odd, F32)
    # [S, M, KW, 2, 2]: element [.., i, p, q] is byte 2p + q of word i
    j = tl.join(tl.join(b0, b2), tl.join(b1, b3))
    return tl.reshape(j, [w.shape[0], w.shape[1], 4 * w.shape[2]])


FP8_MAX: tl.constexpr = tl.constexpr(448.0)     # the largest finite e4m3 value


@triton.jit
def round_e4m3(v):
    """float32 v (|v| <= 448) rounded to the nearest e4m3 value (ties to even, as the GPU's
    conversion), as float32, by float32 arithmetic: Triton's interpreter does not carry a rounded
    mantissa into the exponent in ``.to(tl.float8e4nv)``. e4m3 keeps 3 mantissa bits down to 2^-6,
    then steps of 2^-9."""
    e = ((v.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    e = tl.maximum(e, -6)
    quantum = ((e - 3 + 127) << 23).to(tl.float32, bitcast=True)
    MAGIC: tl.constexpr = 12582912.0          # 1.5 * 2^23: adding and taking it away rounds to an integer
    r = (v / quantum + MAGIC) - MAGIC
    return r * quantum


@triton.jit
def quantize_e4m3(y, EXACT: tl.constexpr):
    """Each row of float32 y [BP, 128] as e4m3 with one scale: (q, scale [BP]), y ~ q * scale.
    scale = max(amax, 1e-10) / 448 (vLLM's per-token-group quantization); with EXACT q stays
    float32 (``round_e4m3``), else it is tl.float8e4nv for the FP8 tensor cores."""
    amax = tl.max(tl.abs(y), axis=1)
    scale = tl.maximum(amax, 1e-10) / FP8_MAX
    v = tl.clamp(y / scale[:, None], -FP8_MAX, FP8_MAX)
    if EXACT:
        q = round_e4m3(v)
    else:
        q = v.to(tl.float8e4nv)
    return q, scale
