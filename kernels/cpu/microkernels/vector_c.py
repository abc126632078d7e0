"""C vector functions shared by the generated micro-kernels (a `str.format` template on
`lanes`, braces doubled): max and min as one instruction where the ISA has one, e^x,
a reciprocal, the sigmoid, tanh and erf, all on GCC vector extensions (`vf`, `vi`, `vsel`,
`vsplat` and `INLINE` defined before them; `INTRINSICS` first among the includes), and
`FMA_ACC`, the register tiles' multiply-add; `HALF_VECTORS`, half-width vectors for a
conv's last output vector of at most half a vector of real channels (`half_last`).

    header = INTRINSICS + "..." + VECTOR_FUNCTIONS        # then .format(lanes=16)

e^x is float32-accurate: 2^n e^r with r in [-ln2/2, ln2/2] and a degree-6
polynomial, n by the ISA's round instruction (a truncation fixed up to a floor on
the portable path) and 2^n applied by AVX-512's scalef or built in the exponent
bits. The reciprocal is the ISA's estimate refined by one Newton step (about 1
ulp). `tests/unit/test_inverted_residual.py` checks the activations built on them
for every ISA against numpy from -200 to 200.
"""

INTRINSICS = """#if defined(__AVX__)
#include <immintrin.h>
#endif
"""

# Half vectors (`vh`, lanes / 2 floats): a conv's last output vector when its real channels
# fit in half of it (`half_last`), computed with half-width FMAs and widened, zero above,
# for the store. Formatted by `half_vectors(lanes)`.
HALF_VECTORS = r"""#include <string.h>
typedef float vh __attribute__((vector_size({lanes} * 2)));
typedef float vhu __attribute__((vector_size({lanes} * 2), aligned(4), may_alias));
INLINE vh vhload(const float *p) {{ return *(const vhu *)p; }}
INLINE vh vhsplat(float v) {{ return v - (vh){{0}}; }}
#if defined(__has_builtin)
#if __has_builtin(__builtin_shufflevector)
#define HAS_SHUFFLEVECTOR 1
#endif
#endif
#ifdef HAS_SHUFFLEVECTOR   /* in registers (the copies below go through memory) */
INLINE vh vlow(vf v) {{ return __builtin_shufflevector(v, v, {low}); }}
INLINE vf vwiden(vh h) {{ return __builtin_shufflevector(h, (vh){{0}}, {widen}); }}
#else
INLINE vh vlow(vf v) {{ vh h; memcpy(&h, &v, sizeof h); return h; }}
INLINE vf vwiden(vh h) {{ vf v = vsplat(0.0f); memcpy(&v, &h, sizeof h); return v; }}
#endif
"""


def half_vectors(lanes: int) -> str:
    """`HALF_VECTORS` for vectors of `lanes` floats (after `vf`, `vsplat` and `INLINE`)."""
    return HALF_VECTORS.format(lanes=lanes, low=", ".join(map(str, range(lanes // 2))),
                               widen=", ".join(map(str, range(lanes))))


def half_last(real: int, vectors: int, lanes: int) -> bool:
    """Whether the last of a conv's `vectors` output vectors of `lanes` holds at most half a
    vector of its `real` channels (the rest padding: 24 or 40 channels in blocks of 16), so
    that a half vector computes it (on the Zen 4 VM a 512-bit FMA costs two 256-bit ones)."""
    rest = real - (vectors - 1) * lanes
    return lanes >= 8 and 0 < rest <= lanes // 2


# acc += x * w with the accumulator pinned to one register (an x86 FMA as inline asm whose
# accumulator is both input and output). Written as plain C, gcc 12's register allocator moves
# a tile's accumulators between registers across the unrolled FMAs (the 132/213 forms write
# the product into the broadcast's register) and then spills some to the stack: a conv tile
# that is a function of its own (`templates.py`) did in 23 of 168 ResNet-50 configs on AVX2,
# 1 with this macro; a spilled accumulator is read and written on every reduction step (a
# 3x3 conv's phase split ran 46 instead of 85 GFLOP/s on one thread).
# No braces: it goes into `str.format` templates as is.
FMA_ACC = r"""
#if defined(__x86_64__) && defined(__FMA__)
#define FMA_ACC(acc, x, w) __asm__("vfmadd231ps %2, %1, %0" : "+v"(acc) : "v"(x), "v"(w))
#else
#define FMA_ACC(acc, x, w) ((acc) += (x) * (w))
#endif
"""

VECTOR_FUNCTIONS = FMA_ACC + r"""
/* max/min: one instruction where the ISA has it (a select of masks compiles to three); both
   give b when either is NaN */
#if defined(__AVX512F__) && {lanes} == 16
INLINE vf vmax(vf a, vf b) {{ return (vf)_mm512_max_ps((__m512)a, (__m512)b); }}
INLINE vf vmin(vf a, vf b) {{ return (vf)_mm512_min_ps((__m512)a, (__m512)b); }}
#elif defined(__AVX__) && {lanes} == 8
INLINE vf vmax(vf a, vf b) {{ return (vf)_mm256_max_ps((__m256)a, (__m256)b); }}
INLINE vf vmin(vf a, vf b) {{ return (vf)_mm256_min_ps((__m256)a, (__m256)b); }}
#else
INLINE vf vmax(vf a, vf b) {{ return vsel(a > b, a, b); }}
INLINE vf vmin(vf a, vf b) {{ return vsel(a < b, a, b); }}
#endif
/* e^x, float32 accuracy: 2^n e^r with r in [-ln2/2, ln2/2], a degree-6 polynomial */
INLINE vf vexp(vf x) {{
    x = vmin(vmax(x, vsplat(-87.0f)), vsplat(88.0f));
#if defined(__AVX512F__) && {lanes} == 16
    /* n = round(x / ln2) and 2^n applied by scalef: no integer round trip */
    vf nf = (vf)_mm512_roundscale_ps((__m512)(x * 1.44269504088896341f),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#elif defined(__AVX__) && {lanes} == 8
    vf nf = (vf)_mm256_round_ps((__m256)(x * 1.44269504088896341f),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#else
    vf f = x * 1.44269504088896341f + 0.5f;
    vi n0 = __builtin_convertvector(f, vi);
    n0 += (vi)(__builtin_convertvector(n0, vf) > f);   /* truncation -> floor */
    vf nf = __builtin_convertvector(n0, vf);
#endif
    vf r = x - nf * 0.693359375f + nf * 2.12194440e-4f;
    vf p = r * 1.9875691500e-4f + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    vf e = p * r * r + r + 1.0f;
#if defined(__AVX512F__) && {lanes} == 16
    return (vf)_mm512_scalef_ps((__m512)e, (__m512)nf);
#else
    vi n = __builtin_convertvector(nf, vi);
    return e * (vf)((n + 127) << 23);
#endif
}}
/* 1/d: the ISA's reciprocal estimate and one Newton step (about 1 ulp, a few times the
   throughput of a vector division: EfficientNet's small blocks 1.07-1.25x on 2 threads),
   else a division */
INLINE vf vrecip(vf d) {{
#if defined(__AVX512F__) && {lanes} == 16
    vf r = (vf)_mm512_rcp14_ps((__m512)d);
    return r * (2.0f - d * r);
#elif defined(__AVX__) && {lanes} == 8
    vf r = (vf)_mm256_rcp_ps((__m256)d);
    return r * (2.0f - d * r);
#else
    return 1.0f / d;
#endif
}}
INLINE vf vsigmoid(vf v) {{ return vrecip(vexp(vmin(-v, vsplat(80.0f))) + 1.0f); }}
/* tanh: (1 - e) / (1 + e), e = e^(-2|x|), for |x| >= 1/4 (1 - e > 0.39: no cancellation;
   |x| clamped at 9, where tanh is 1 in float32), the odd Taylor polynomial to x^9 below
   (its first term left out under 1e-8 relative), the sign of x; NaN stays NaN */
INLINE vf vtanh(vf x) {{
    vf a = vmin(vmax(x, -x), vsplat(9.0f));
    vf e = vexp(a * -2.0f);
    vf big = (1.0f - e) * vrecip(1.0f + e);
    vf s = a * a;
    vf small = a + a * s * (-0.333333333333f + s * (0.133333333333f + s * (-0.053968253968f
               + s * 0.021869488536f)));
    vf r = vsel(a < 0.25f, small, big);
    return vsel(x != x, x, vsel(x < 0.0f, -r, r));
}}
/* erf: 1 - t (a1 + t (a2 + ... + t a5)) e^(-x^2), t = 1 / (1 + p |x|) (Abramowitz and
   Stegun 7.1.26, absolute error below 1.5e-7), the sign of x */
INLINE vf verf(vf x) {{
    vf a = vmax(x, -x);
    vf t = vrecip(a * 0.3275911f + 1.0f);
    vf p = (((1.061405429f * t - 1.453152027f) * t + 1.421413741f) * t - 0.284496736f) * t
           + 0.254829592f;
    vf r = 1.0f - p * t * vexp(-a * a);
    return vsel(x < 0.0f, -r, r);
}}
"""


def transpose_macro(vw: int) -> str:
    """C for TRANSPOSE_BLOCK(rows): transposes `vw` vectors of `vw` floats in place (a
    `VW` x `VW` block, `VW` #defined as `vw`, `vf` and `vi` vectors of that many lanes),
    one stage per bit h of the lane index swapping it with the same bit of the row index
    (constant shuffle masks, so the compiler emits plain permutes)."""
    lines = ["#define TRANSPOSE_BLOCK(rows) do { \\"]
    h = vw // 2
    while h >= 1:
        low = ", ".join(str(lane if not lane & h else vw + lane - h) for lane in range(vw))
        high = ", ".join(str(lane + h if not lane & h else vw + lane) for lane in range(vw))
        lines += [f"    for (int r = 0; r < VW; ++r) if (!(r & {h})) {{ \\",
                  f"        vf x = rows[r], y = rows[r + {h}]; \\",
                  f"        rows[r] = __builtin_shuffle(x, y, (vi){{{low}}}); \\",
                  f"        rows[r + {h}] = __builtin_shuffle(x, y, (vi){{{high}}}); \\",
                  "    } \\"]
        h //= 2
    return "\n".join(lines + ["} while (0)", ""])
