"""llama.cpp's weight codecs in numpy: Q2_K, Q3_K, Q4_K and Q6_K encoders, plus whatever ``gguf.quants`` has.

``gguf.quants`` (the ``gguf`` package) encodes F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1
and decodes nearly every type, but it has no K-quant encoder. ``quantize_q2_k``,
``quantize_q3_k``, ``quantize_q4_k`` and ``quantize_q6_k`` follow ``quantize_row_q2_K_ref``, ...
``quantize_row_q6_K_ref`` of ggml-quants.c, which is what ``llama-quantize`` runs for these types
when it has no importance matrix. Blocks hold ``QK_K = 256`` consecutive weights of one row:

* Q2_K (84 bytes): 16 sub-blocks of 16; 16 bytes of 4-bit scale ``sc`` (low nibble) and 4-bit
  min ``m`` (high nibble), 64 bytes of 2-bit codes ``q``, fp16 ``d`` and ``dmin``:
  ``w = d * sc * q - dmin * m``. Each sub-block's (scale, min) comes from ``make_qkx2_quants``
  with 16 trial inverse scales, weights ``|x|`` and absolute (not squared) errors.
* Q3_K (110 bytes): 16 sub-blocks of 16; 32 bytes of high code bits, 64 bytes of low 2-bit code
  pairs, 12 bytes of 6-bit signed scales ``s``, fp16 ``d``: ``w = d * s * (q - 4)``. Each
  sub-block's scale comes from ``make_q3_quants``: weights x^2, then up to 5 passes that move one
  code at a time while that improves the fit. (Q2_K files keep some tensors at Q3_K.)
* Q4_K (144 bytes): fp16 ``d`` and ``dmin``, 8 sub-blocks of 32 with 6-bit scale ``sc`` and
  6-bit min ``m``, 4-bit codes ``q``: ``w = d * sc * q - dmin * m``. Each sub-block's
  (scale, min) comes from ``make_qkx2_quants``: a weighted least-squares fit over 21 trial
  inverse scales, weights ``sqrt(mean(x^2)) + |x|``.
* Q6_K (210 bytes): fp16 ``d``, 16 sub-blocks of 16 with int8 scale ``s``, 6-bit codes:
  ``w = d * s * (q - 32)``. Each sub-block's scale comes from ``make_qx_quants`` (weights x^2,
  19 trial scales).

The arithmetic is float32 with the C code's left-to-right sums, vectorised over blocks; rounding
is ggml's ``nearest_int`` (to nearest even, and its same unchecked bits beyond 2^22). The output
was checked byte for byte against ggml-quants.c built with gcc -O2 (no FMA contraction; a build
that fuses multiply-adds can round a rare trial differently). Decoding is left to
``gguf.quants.dequantize``, llama.cpp's decoders.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants

QK_K = 256
GROUP_MAX_EPS = np.float32(1e-15)
f32 = np.float32


def _fp16(x: np.ndarray) -> np.ndarray:
    """Round to fp16 and back, as FP32_TO_FP16 then FP16_TO_FP32 do."""
    return x.astype(np.float16).astype(np.float32)


def _nearest(x: np.ndarray) -> np.ndarray:
    """ggml's ``nearest_int``: add 1.5 * 2^23 in float32 and keep the low mantissa bits.

    That is round half to even for |x| <= 2^22; beyond (a release build does not check) it gives
    the same wrapped value as C, where ``np.rint`` would not.
    """
    bits = (np.asarray(x, dtype=np.float32) + f32(12582912)).view(np.int32)
    return (bits & 0x007FFFFF) - 0x00400000


def _sum(a: np.ndarray) -> np.ndarray:
    """Sum over the last axis left to right in float32, as the C loops do (numpy's pairwise sum rounds differently)."""
    total = a[..., 0].copy()
    for i in range(1, a.shape[-1]):
        total += a[..., i]
    return total


def _make_qkx2_quants(
    x: np.ndarray, w: np.ndarray, nmax: int, rmin: float, rdelta: float, nstep: int, use_mad: bool = False
):
    """Fit ``x ~ scale * L - min_`` per row of x (rows, n): returns scale, min_ (rows,) and codes L (rows, n).

    As in ggml, each improving trial also moves the offset that later trials quantize from. Trials
    are compared by weighted squared error, or weighted absolute error with ``use_mad``.
    """

    def loss(diff: np.ndarray) -> np.ndarray:
        return np.abs(diff) if use_mad else diff * diff

    lo = np.minimum(x.min(axis=1), f32(0))
    hi = x.max(axis=1)
    flat = hi == lo
    sum_w, sum_x = _sum(w), _sum(w * x)

    span = np.where(flat, f32(1), hi - lo)
    iscale = f32(nmax) / span
    scale = f32(1) / iscale
    L = np.clip(_nearest(iscale[:, None] * (x - lo[:, None])), 0, nmax).astype(np.float32)
    best = _sum(w * loss(scale[:, None] * L + lo[:, None] - x))
    codes = L
    for step in range(nstep + 1):
        span = np.where(flat, f32(1), hi - lo)
        iscale = (f32(rmin) + f32(rdelta) * f32(step) + f32(nmax)) / span
        L = np.clip(_nearest(iscale[:, None] * (x - lo[:, None])), 0, nmax).astype(np.float32)
        sum_l, sum_l2, sum_xl = _sum(w * L), _sum(w * L * L), _sum(w * L * x)
        D = sum_w * sum_l2 - sum_l * sum_l
        ok = D > 0
        D = np.where(ok, D, f32(1))
        this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
        this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
        positive = this_min > 0
        this_scale = np.where(positive, sum_xl / np.where(sum_l2 > 0, sum_l2, f32(1)), this_scale)
        this_min = np.where(positive, f32(0), this_min)
        error = _sum(w * loss(this_scale[:, None] * L + this_min[:, None] - x))
        better = ok & (error < best) & ~flat
        best = np.where(better, error, best)
        scale = np.where(better, this_scale, scale)
        lo = np.where(better, this_min, lo)
        codes = np.where(better[:, None], L, codes)
    scale = np.where(flat, f32(0), scale)
    codes = np.where(flat[:, None], f32(0), codes)
    return scale.astype(np.float32), (-lo).astype(np.float32), codes.astype(np.uint8)


def _positive_max(values: np.ndarray) -> np.ndarray:
    """ggml's ``max = 0; if (v > max) max = v``: the largest positive value per row, else +0."""
    top = values.max(axis=1)
    return np.where(top > 0, top, f32(0)).astype(np.float32)


def _signed_max(a: np.ndarray) -> np.ndarray:
    """Per row of a (rows, n), the entry of largest magnitude with its sign (ggml's ``max`` with ``amax``): (rows,)."""
    return np.take_along_axis(a, np.abs(a).argmax(axis=1)[:, None], axis=1)[:, 0]


def _pack_2bit(L: np.ndarray) -> np.ndarray:
    """(nb, 256) codes 0..3 -> (nb, 64) bytes: in each half of 128, byte l holds codes l, l + 32, l + 64, l + 96."""
    L = L.astype(np.uint8).reshape(-1, 2, 4, 32)
    return (L[:, :, 0] | (L[:, :, 1] << 2) | (L[:, :, 2] << 4) | (L[:, :, 3] << 6)).reshape(-1, 64)


def quantize_q2_k(rows: np.ndarray) -> np.ndarray:
    """Q2_K encode: (..., n) float with n % 256 == 0 -> (..., n // 256 * 84) uint8."""
    x = np.asarray(rows, dtype=np.float32)
    shape = x.shape
    blocks = x.reshape(-1, QK_K)
    nb = blocks.shape[0]
    sub = blocks.reshape(nb * 16, 16)
    scales, mins, codes = _make_qkx2_quants(sub, np.abs(sub), 3, -0.5, 0.1, 15, use_mad=True)
    scales, mins, codes = scales.reshape(nb, 16), mins.reshape(nb, 16), codes.reshape(nb, 16, 16)
    max_scale, max_min = _positive_max(scales), _positive_max(mins)
    q4scale = f32(15)
    inv_scale = np.where(max_scale > 0, q4scale / np.where(max_scale > 0, max_scale, f32(1)), f32(0))
    inv_min = np.where(max_min > 0, q4scale / np.where(max_min > 0, max_min, f32(1)), f32(0))
    ls = _nearest(inv_scale[:, None] * scales)  # no clamp in C: the byte keeps what fits, as here
    lm = _nearest(inv_min[:, None] * mins)
    packed = ((ls | (lm << 4)) & 0xFF).astype(np.uint8)
    d16 = (max_scale / q4scale).astype(np.float16)  # max_scale is +0 when no scale is positive
    dmin16 = (max_min / q4scale).astype(np.float16)
    d = d16.astype(np.float32)[:, None] * (packed & 0xF).astype(np.float32)
    dm = dmin16.astype(np.float32)[:, None] * (packed >> 4).astype(np.float32)
    safe_d = np.where(d == 0, f32(1), d)
    L = np.clip(_nearest((blocks.reshape(nb, 16, 16) + dm[:, :, None]) / safe_d[:, :, None]), 0, 3)
    L = np.where((d == 0)[:, :, None], codes, L).reshape(nb, QK_K)  # d = 0 keeps the fit's codes
    out = np.concatenate(
        [packed, _pack_2bit(L), d16.view(np.uint8).reshape(nb, 2), dmin16.view(np.uint8).reshape(nb, 2)], axis=1
    )
    return out.reshape(*shape[:-1], shape[-1] // QK_K * 84)


def _make_q3_quants(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """ggml's ``make_q3_quants(do_rmse = true)`` per row of x (rows, n): scale (rows,), codes 0..2 nmax - 1.

    A first rounding at ``-nmax / max``, then passes over the weights, each moving one code to
    its best value given the others while that raises ``sumlx^2 / suml2`` (weights x^2). C stops
    after a pass that changes nothing; further passes would change nothing either.
    """
    amax_signed = _signed_max(x)
    tiny = np.abs(amax_signed) < GROUP_MAX_EPS
    iscale = f32(-nmax) / np.where(tiny, f32(1), amax_signed)
    L = np.clip(_nearest(iscale[:, None] * x), -nmax, nmax - 1).astype(np.float32)
    w = x * x
    sumlx, suml2 = _sum(w * x * L), _sum(w * L * L)
    for _ in range(5):
        for i in range(x.shape[1]):
            wi, xi, li = w[:, i], x[:, i], L[:, i]
            slx = sumlx - wi * xi * li
            sl2 = suml2 - wi * li * li
            positive = slx > 0
            new_l = np.clip(_nearest(xi * sl2 / np.where(positive, slx, f32(1))), -nmax, nmax - 1).astype(np.float32)
            slx = slx + wi * xi * new_l
            sl2 = sl2 + wi * new_l * new_l
            take = positive & (new_l != li) & (sl2 > 0) & (slx * slx * suml2 > sumlx * sumlx * sl2)
            L[:, i] = np.where(take, new_l, li)
            sumlx = np.where(take, slx, sumlx)
            suml2 = np.where(take, sl2, suml2)
    scale = np.where(suml2 > 0, sumlx / np.where(suml2 > 0, suml2, f32(1)), f32(0))
    codes = np.where(tiny[:, None], 0, L.astype(np.int32) + nmax).astype(np.uint8)  # all zero: codes 0, not nmax
    return np.where(tiny, f32(0), scale).astype(np.float32), codes


def quantize_q3_k(rows: np.ndarray) -> np.ndarray:
    """Q3_K encode: (..., n) float with n % 256 == 0 -> (..., n // 256 * 110) uint8."""
    x = np.asarray(rows, dtype=np.float32)
    shape = x.shape
    blocks = x.reshape(-1, QK_K)
    nb = blocks.shape[0]
    scales, codes = _make_q3_quants(blocks.reshape(nb * 16, 16), 4)
    scales, codes = scales.reshape(nb, 16), codes.reshape(nb, 16, 16)
    max_scale = _signed_max(scales)
    has = max_scale != 0
    iscale = f32(-32) / np.where(has, max_scale, f32(1))
    ls = np.clip(_nearest(iscale[:, None] * scales).astype(np.int8), -32, 31).astype(np.int32) + 32
    ls = np.where(has[:, None], ls, 0)  # all-zero scale bytes when every sub-block is empty
    packed = np.zeros((nb, 12), dtype=np.int32)
    packed[:, :8] = (ls[:, :8] & 0xF) | ((ls[:, 8:] & 0xF) << 4)
    high = (ls >> 4).reshape(nb, 4, 4)  # [j // 4, j % 4]
    packed[:, 8:] = high[:, 0] | (high[:, 1] << 2) | (high[:, 2] << 4) | (high[:, 3] << 6)
    d16 = np.where(has, f32(1) / iscale, f32(0)).astype(np.float16)
    d = d16.astype(np.float32)[:, None] * (ls - 32).astype(np.float32)
    safe_d = np.where(d == 0, f32(1), d)
    L = np.clip(_nearest(blocks.reshape(nb, 16, 16) / safe_d[:, :, None]), -4, 3) + 4
    L = np.where((d == 0)[:, :, None], codes, L).reshape(nb, 8, 32)  # d = 0 keeps the fit's codes
    hmask = np.zeros((nb, 32), dtype=np.int32)
    for bit in range(8):  # weight j's high bit: byte j % 32, bit j // 32
        hmask |= (L[:, bit] > 3).astype(np.int32) << bit
    out = np.concatenate(
        [hmask.astype(np.uint8), _pack_2bit(L & 3), packed.astype(np.uint8), d16.view(np.uint8).reshape(nb, 2)],
        axis=1,
    )
    return out.reshape(*shape[:-1], shape[-1] // QK_K * 110)


def quantize_q4_k(rows: np.ndarray) -> np.ndarray:
    """Q4_K encode: (..., n) float with n % 256 == 0 -> (..., n // 256 * 144) uint8."""
    x = np.asarray(rows, dtype=np.float32)
    shape = x.shape
    blocks = x.reshape(-1, QK_K)
    nb = blocks.shape[0]
    sub = blocks.reshape(nb * 8, 32)
    av_x = np.sqrt(_sum(sub * sub) / f32(32))
    scales, mins, codes = _make_qkx2_quants(sub, av_x[:, None] + np.abs(sub), 15, -1.0, 0.1, 20)
    scales, mins, codes = scales.reshape(nb, 8), mins.reshape(nb, 8), codes.reshape(nb, 8, 32)
    max_scale, max_min = _positive_max(scales), _positive_max(mins)
    inv_scale = np.where(max_scale > 0, f32(63) / np.where(max_scale > 0, max_scale, f32(1)), f32(0))
    inv_min = np.where(max_min > 0, f32(63) / np.where(max_min > 0, max_min, f32(1)), f32(0))
    ls = np.minimum(63, _nearest(inv_scale[:, None] * scales)).astype(np.uint8)
    lm = np.minimum(63, _nearest(inv_min[:, None] * mins)).astype(np.uint8)
    packed = np.zeros((nb, 12), dtype=np.uint8)
    packed[:, 0:4] = ls[:, :4] | ((ls[:, 4:] >> 4) << 6)
    packed[:, 4:8] = lm[:, :4] | ((lm[:, 4:] >> 4) << 6)
    packed[:, 8:12] = (ls[:, 4:] & 0xF) | ((lm[:, 4:] & 0xF) << 4)
    d16 = (max_scale / f32(63)).astype(np.float16)
    dmin16 = (max_min / f32(63)).astype(np.float16)
    d = d16.astype(np.float32)[:, None] * ls.astype(np.float32)
    dm = dmin16.astype(np.float32)[:, None] * lm.astype(np.float32)
    safe_d = np.where(d == 0, f32(1), d)
    L = np.clip(_nearest((blocks.reshape(nb, 8, 32) + dm[:, :, None]) / safe_d[:, :, None]), 0, 15)
    L = np.where((d == 0)[:, :, None], codes, L).astype(np.uint8).reshape(nb, 4, 2, 32)  # d = 0 keeps the fit's codes
    qs = (L[:, :, 0, :] | (L[:, :, 1, :] << 4)).reshape(nb, 128)
    out = np.concatenate([d16.view(np.uint8).reshape(nb, 2), dmin16.view(np.uint8).reshape(nb, 2), packed, qs], axis=1)
    return out.reshape(*shape[:-1], shape[-1] // QK_K * 144)


def _make_qx_quants(x: np.ndarray, nmax: int) -> np.ndarray:
    """Symmetric scale per row of x (rows, n), weights x^2 (``rmse_type = 1``): scale (rows,), codes (rows, n)."""
    amax_signed = _signed_max(x)
    tiny = np.abs(amax_signed) < GROUP_MAX_EPS
    safe_max = np.where(tiny, f32(1), amax_signed)
    w = x * x

    def fit(iscale: np.ndarray):
        L = np.clip(_nearest(iscale[:, None] * x), -nmax, nmax - 1).astype(np.float32)
        return _sum(w * x * L), _sum(w * L * L), L

    sumlx, suml2, codes = fit(f32(-nmax) / safe_max)
    scale = np.where(suml2 > 0, sumlx / np.where(suml2 > 0, suml2, f32(1)), f32(0))
    best = scale * sumlx
    for step in range(-9, 10):
        if step == 0:
            continue
        sumlx, suml2, L = fit(-(f32(nmax) + f32(0.1) * f32(step)) / safe_max)
        better = (suml2 > 0) & (sumlx * sumlx > best * suml2)
        new_scale = sumlx / np.where(suml2 > 0, suml2, f32(1))
        scale = np.where(better, new_scale, scale)
        best = np.where(better, new_scale * sumlx, best)
        codes = np.where(better[:, None], L, codes)
    codes = np.where(tiny[:, None], 0, codes + nmax).astype(np.uint8)
    return np.where(tiny, f32(0), scale).astype(np.float32), codes


def quantize_q6_k(rows: np.ndarray) -> np.ndarray:
    """Q6_K encode: (..., n) float with n % 256 == 0 -> (..., n // 256 * 210) uint8."""
    x = np.asarray(rows, dtype=np.float32)
    shape = x.shape
    blocks = x.reshape(-1, QK_K)
    nb = blocks.shape[0]
    scales, codes = _make_qx_quants(blocks.reshape(nb * 16, 16), 32)
    scales, codes = scales.reshape(nb, 16), codes.reshape(nb, 16, 16)
    max_scale = _signed_max(scales)
    empty = np.abs(max_scale) < GROUP_MAX_EPS
    iscale = f32(-128) / np.where(empty, f32(1), max_scale)
    d16 = np.where(empty, f32(0), f32(1) / iscale).astype(np.float16)
    sc = np.minimum(127, _nearest(iscale[:, None] * scales)).astype(np.int8)
    sc = np.where(empty[:, None], np.int8(0), sc)
    d = d16.astype(np.float32)[:, None] * sc.astype(np.float32)
    safe_d = np.where(d == 0, f32(1), d)
    L = np.clip(_nearest(blocks.reshape(nb, 16, 16) / safe_d[:, :, None]), -32, 31) + 32
    L = np.where((d == 0)[:, :, None], codes, L)  # d = 0 keeps the fit's codes, an empty block is all zero bytes
    L = np.where(empty[:, None, None], 0, L).astype(np.uint8).reshape(nb, 2, 4, 32)  # halves of 128, quarters of 32
    ql = np.concatenate(
        [L[:, :, 0] & 0xF | ((L[:, :, 2] & 0xF) << 4), L[:, :, 1] & 0xF | ((L[:, :, 3] & 0xF) << 4)], axis=2
    )
    qh = (L[:, :, 0] >> 4) | ((L[:, :, 1] >> 4) << 2) | ((L[:, :, 2] >> 4) << 4) | ((L[:, :, 3] >> 4) << 6)
    out = np.concatenate(
        [ql.reshape(nb, 128), qh.reshape(nb, 64), sc.view(np.uint8), d16.view(np.uint8).reshape(nb, 2)], axis=1
    )
    return out.reshape(*shape[:-1], shape[-1] // QK_K * 210)


ENCODERS = {T.Q2_K: quantize_q2_k, T.Q3_K: quantize_q3_k, T.Q4_K: quantize_q4_k, T.Q6_K: quantize_q6_k}
CHUNK_WEIGHTS = 1 << 22


def encode(data: np.ndarray, qtype: T) -> np.ndarray:
    """Encode a float array to ``qtype``'s GGUF bytes (last axis must fit the type's block size)."""
    data = np.asarray(data, dtype=np.float32)
    if qtype == T.F32:
        return data
    if qtype == T.F16:
        return data.astype(np.float16)
    if qtype in ENCODERS:
        if data.shape[-1] % QK_K:
            raise ValueError(f"{qtype.name} needs rows of a multiple of {QK_K} weights, not {data.shape[-1]}")
        rows = data.reshape(-1, data.shape[-1])
        step = max(1, CHUNK_WEIGHTS // rows.shape[1])  # bounds the float32 temporaries of the trial fits
        with np.errstate(over="ignore", invalid="ignore"):  # extreme values overflow float32 to inf, as in C
            parts = [ENCODERS[qtype](rows[i : i + step]) for i in range(0, rows.shape[0], step)]
        return np.concatenate(parts).reshape(*data.shape[:-1], -1)
    return quants.quantize(data, qtype)


def roundtrip(data: np.ndarray, qtype: T) -> np.ndarray:
    """Encode then decode with llama.cpp's decoders (``gguf.quants.dequantize``): same shape, float32."""
    if qtype == T.F32:
        return np.asarray(data, dtype=np.float32)
    return quants.dequantize(encode(data, qtype), qtype).reshape(np.shape(data))
