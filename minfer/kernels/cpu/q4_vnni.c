/* int4 weights x int8 activations on AVX512-VNNI, or AVX2 (the vector layer below: -DMINFER_AVX2,
 * the same bits): the cpu backend's kernel for the 4-bit ggml types (Q4_0, Q4_1, Q4_K; the lookup
 * types IQ4_NL, IQ4_XS, MXFP4 through a 16-entry table), the 5-bit types (Q5_0, Q5_1, Q5_K), Q6_K
 * and Q8_0, built by minfer/kernels/cpu/vnni.py with the system C compiler; also the cpu backend's
 * decode attention, RMSNorm and RoPE.
 *
 * Weight W [n, k] (n a multiple of 32, k of 32), per group of 32 weights along k:
 * w = S * c + Z with codes c in 0..15 (S, Z float16). Layout: W [n/16][k/32][256] bytes: per
 * block of 16 output columns and group g, 4 chunks of 64 bytes; byte 4*col + t of chunk j holds
 * the code of (col, k = 8j + t) in its low nibble and of (col, 8j + 4 + t) in its high nibble,
 * so one chunk unpacks into the two registers vpdpbusd takes (16 columns x 4 consecutive k).
 * S, Z: [n/16][k/32][16] float16. The symmetric types store no Z: it is zm S (zm = -8, -16,
 * -128: exactly the float16 a stored Z would hold), made by the kernel.
 * Lookup types: the nibble is an index into a 16-byte table `lut` (vpshufb, one per register of
 * codes), c = lut[nibble] = v + 128 in 1..255 for the type's int8 value v, with S the block's
 * scale and Z = -128 S: w = S v.
 * 5- and 6-bit codes (q56_pack): the low 4 bits as above, then the codes' bit 4 (and bit 5) in
 * byte planes aligned with the registers' bytes, OR-ed back after a shift and a mask. Q6_K: two scales a group (one per
 * 16 weights), its zero -32 applied to the integer sums. 8-bit codes (Q8_0): a byte per code.
 *
 * Activations x [m, k] are quantized per row and group of 32 (llama.cpp's Q8_0 scheme), once
 * (P = 1) or twice (P = 2: the first pass's rounding error quantized again, ~15 bits in all):
 * q = round(x / d), d = max|x| / 127, and d * sum q per group for Z (so the result is exactly
 * the weights times the quantized activations: x's rounding is not multiplied by the codes'
 * offset). Then y[r, col] = sum_g (d[r,g] * S[col,g] * sum_t c q + Z[col,g] * d[r,g] sum_t q),
 * the groups in order; for a symmetric type at P = 1, sum_g d[r,g] * S[col,g] * sum_t (c + zm) q (the
 * zero in the exact integer sums: tile()'s ZI).
 * Integer dot products are exact, and each output's float sum runs over the groups in one fixed
 * order whatever the row count or tiling: a row's result does not depend on the other rows.
 */
#include <immintrin.h>
#include <omp.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>
#include <sched.h>
#include <stdatomic.h>
#include <x86intrin.h>
#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

/* ---------------------------------------------------------------- the decode program's work sharing
 * Inside prog_run (the decode step as one call) the work-shared loops of the steps hand out their items from
 * a counter (TEAM_FOR; a claim is a thread's even share, or one item), and a loop ends when all its items are
 * done, not when every thread has arrived: a thread that the kernel takes off its core (another busy process;
 * a laptop's slow core) holds up at most the items it has claimed, and the others do the rest. Its own loops it then passes through, finding
 * their items taken. (libgomp's static split and barrier make the team wait for the late thread at every
 * one of a token's ~240 steps: SmolLM2 at 2 threads beside one busy process ran 349 -> 23 tok/s, llama.cpp
 * 97 -> 4.) A waiter spins ~TEAM_SPIN_TICKS of the time stamp counter, then sleeps on a futex, so an idle
 * core lets the kernel run the late thread there. Which thread runs an item changes no number: each item's
 * arithmetic is its own, as under the static split. Outside prog_run the same loops are libgomp's work-shared
 * loops, as before. */
#ifndef TEAM_SPIN_TICKS
#define TEAM_SPIN_TICKS 150000
#endif
/* a loop's counters, each on a cache line of its own (and 256 bytes a loop: the adjacent-line prefetcher's pairs
 * apart too): the claims' `next`; the end check-ins' `done`, which only the threads' one add each touches; and
 * `over`, which the last to check in sets and the waiters poll (a check-in does not take the polled line from 15
 * pollers, and a claim does not take either) */
typedef struct {
    atomic_int next;
    char pad0[64 - sizeof(atomic_int)];
    atomic_int done;
    char pad1[64 - sizeof(atomic_int)];
    atomic_int over, sleepers;
    char pad2[128 - 2 * sizeof(atomic_int)];
} team_ctr;
static __thread team_ctr *team;  /* inside prog_run: the program's loop counters, in the order every thread meets
                                  * its loops (this thread's next one), else NULL */

/* the first of the next `chunk` items of a loop of n (-1: none left); `mine`: the items this thread has claimed */
static inline int team_claim(team_ctr *c, int n, int chunk, int *mine) {
    if (atomic_load_explicit(&c->next, memory_order_relaxed) >= n) return -1;  /* (no write where all are taken) */
    int i = atomic_fetch_add_explicit(&c->next, chunk, memory_order_relaxed);
    if (i >= n) return -1;
    *mine += n - i < chunk ? n - i : chunk;
    return i;
}

/* a thread's even share of n items (at least 1) */
static inline int team_share(int n) {
    int nth = omp_get_num_threads(), k = (n + nth - 1) / nth;
    return k > 0 ? k : 1;
}

/* this thread's `mine` items of the loop done; wait until all n are (the items' writes then visible: each
 * check-in's add releases its thread's writes, the last one's acquires them all and its store of `over` releases
 * them to the waiters) */
static void team_done(team_ctr *c, int n, int mine) {
    if (n <= 0) return;  /* (no items: nothing to wait for, and no check-in would set `over`) */
    if (mine > 0 && atomic_fetch_add(&c->done, mine) + mine == n) {
        atomic_store(&c->over, 1);  /* (seq_cst: ordered before the sleepers' read, as their add before the wait) */
        if (atomic_load(&c->sleepers) > 0) {
#ifdef __linux__
            syscall(SYS_futex, &c->over, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
#endif
        }
        return;
    }
    unsigned long long t0 = __rdtsc();
    while (atomic_load_explicit(&c->over, memory_order_acquire) == 0) {
        if (__rdtsc() - t0 < TEAM_SPIN_TICKS) {
            _mm_pause();
            continue;
        }
#ifdef __linux__
        atomic_fetch_add(&c->sleepers, 1);
        syscall(SYS_futex, &c->over, FUTEX_WAIT_PRIVATE, 0, NULL, NULL, 0);  /* (at once if `over` is set) */
        atomic_fetch_sub(&c->sleepers, 1);
#else
        sched_yield();
#endif
    }
}

/* for (int i = 0; i < n; i++) BODY as a work-shared loop ending when all its items are done: inside prog_run
 * the team's counters, CHUNK consecutive items a claim (0: a thread's even share: one claim each, the static
 * split's runs, where every thread is on its core), else `#pragma SCHED` (a string: "omp for
 * schedule(static)") with its barrier */
#define TEAM_FOR(i, n, CHUNK, SCHED, ...) do {                                       \
        const int team_n_ = (n);                                                     \
        if (team != NULL) {                                                          \
            team_ctr *team_c_ = team++;                                              \
            int team_mine_ = 0, team_k_ = (CHUNK) > 0 ? (CHUNK) : team_share(team_n_); \
            for (int team_i_; (team_i_ = team_claim(team_c_, team_n_, team_k_, &team_mine_)) >= 0;) \
                for (int i = team_i_; i < team_i_ + team_k_ && i < team_n_; i++) {  \
                    __VA_ARGS__                                                      \
                }                                                                    \
            team_done(team_c_, team_n_, team_mine_);                                 \
        } else {                                                                     \
            _Pragma(SCHED)                                                           \
            for (int i = 0; i < team_n_; i++) {                                      \
                __VA_ARGS__                                                          \
            }                                                                        \
        }                                                                            \
    } while (0)
#define TEAM_LOOPS_PER_STEP 2  /* the most TEAM_FOR loops one program step meets (attention's two) */

/* ---------------------------------------------------------------- the vector layer
 * The kernels below are written on 16-lane vectors: vf (16 float32) and vi (512 bits of integers),
 * through v_* operations. Built as is, these are the AVX-512 registers and intrinsics. Built with
 * -DMINFER_AVX2 (vnni.py's "avx2" and "avxvnni" builds), each is two 256-bit halves (lo: lanes
 * 0-7, hi: 8-15) and every operation does on each half what the AVX-512 one does on its lanes:
 * the same fused or unfused float op per lane, GCC's order for the horizontal reductions
 * (avx512fintrin.h's _mm512_reduce_add_ps / _mm512_reduce_max_ps: the 256-bit halves, then the
 * 128-bit halves, then the shuffles), exact integer dot products (vpdpbusd on AVX-VNNI; else
 * vpmaddubsw + vpmaddwd: the codes' int16 pair sums added over 8 registers (4-bit codes), 4
 * (5-bit) or 2 (6-bit) stay below 32767, and the 8-bit and table codes are shifted to signed bytes so no pair sum
 * saturates, DOT_SHIFT): every build gives the same bits. */
#define INL static inline __attribute__((always_inline))
#ifdef MINFER_AVX2
typedef struct { __m256 lo, hi; } vf;
typedef struct { __m256i lo, hi; } vi;
INL vf vf_of(__m256 lo, __m256 hi) { vf r = {lo, hi}; return r; }
INL vi vi_of(__m256i lo, __m256i hi) { vi r = {lo, hi}; return r; }
INL vf v_setzero_ps(void) { return vf_of(_mm256_setzero_ps(), _mm256_setzero_ps()); }
INL vi v_setzero_si512(void) { return vi_of(_mm256_setzero_si256(), _mm256_setzero_si256()); }
INL vf v_set1_ps(float a) { return vf_of(_mm256_set1_ps(a), _mm256_set1_ps(a)); }
INL vi v_set1_epi8(char a) { return vi_of(_mm256_set1_epi8(a), _mm256_set1_epi8(a)); }
INL vi v_set1_epi32(int a) { return vi_of(_mm256_set1_epi32(a), _mm256_set1_epi32(a)); }
INL vf v_loadu_ps(const float *p) { return vf_of(_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)); }
INL vf v_u8_ps(const uint8_t *p) {  /* 16 bytes as 16 floats */
    return vf_of(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p))),
                 _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p + 8)))));
}
INL void v_storeu_ps(float *p, vf a) { _mm256_storeu_ps(p, a.lo); _mm256_storeu_ps(p + 8, a.hi); }
INL vi v_loadu_si512(const void *p) {
    return vi_of(_mm256_loadu_si256((const __m256i *)p), _mm256_loadu_si256((const __m256i *)p + 1));
}
INL vf v_add_ps(vf a, vf b) { return vf_of(_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)); }
INL vf v_sub_ps(vf a, vf b) { return vf_of(_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)); }
INL vf v_mul_ps(vf a, vf b) { return vf_of(_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)); }
INL vf v_max_ps(vf a, vf b) { return vf_of(_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)); }
INL vf v_fmadd_ps(vf a, vf b, vf c) { return vf_of(_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)); }
INL vf v_fnmadd_ps(vf a, vf b, vf c) {
    return vf_of(_mm256_fnmadd_ps(a.lo, b.lo, c.lo), _mm256_fnmadd_ps(a.hi, b.hi, c.hi));
}
INL vf v_abs_ps(vf a) {  /* as GCC's _mm512_abs_ps: the sign bit cleared */
    const __m256 m = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    return vf_of(_mm256_and_ps(a.lo, m), _mm256_and_ps(a.hi, m));
}
#define v_roundscale_ps(a, mode) vf_of(_mm256_round_ps((a).lo, mode), _mm256_round_ps((a).hi, mode))
#define v_srli_epi16(a, n) vi_of(_mm256_srli_epi16((a).lo, n), _mm256_srli_epi16((a).hi, n))
#define v_slli_epi16(a, n) vi_of(_mm256_slli_epi16((a).lo, n), _mm256_slli_epi16((a).hi, n))
#define v_slli_epi32(a, n) vi_of(_mm256_slli_epi32((a).lo, n), _mm256_slli_epi32((a).hi, n))
INL vi v_and_si512(vi a, vi b) { return vi_of(_mm256_and_si256(a.lo, b.lo), _mm256_and_si256(a.hi, b.hi)); }
INL vi v_xor_si512(vi a, vi b) { return vi_of(_mm256_xor_si256(a.lo, b.lo), _mm256_xor_si256(a.hi, b.hi)); }
INL vi v_or_si512(vi a, vi b) { return vi_of(_mm256_or_si256(a.lo, b.lo), _mm256_or_si256(a.hi, b.hi)); }
INL vi v_add_epi32(vi a, vi b) { return vi_of(_mm256_add_epi32(a.lo, b.lo), _mm256_add_epi32(a.hi, b.hi)); }
INL vf v_castsi512_ps(vi a) { return vf_of(_mm256_castsi256_ps(a.lo), _mm256_castsi256_ps(a.hi)); }
INL vi v_cvtps_epi32(vf a) { return vi_of(_mm256_cvtps_epi32(a.lo), _mm256_cvtps_epi32(a.hi)); }
INL vf v_cvtepi32_ps(vi a) { return vf_of(_mm256_cvtepi32_ps(a.lo), _mm256_cvtepi32_ps(a.hi)); }
INL vi v_cvtepu16_epi32(__m256i a) {
    return vi_of(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(a)), _mm256_cvtepu16_epi32(_mm256_extracti128_si256(a, 1)));
}
INL vf v_cvtph_ps(__m256i h) {
    return vf_of(_mm256_cvtph_ps(_mm256_castsi256_si128(h)), _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)));
}
INL __m128i v_cvtsepi32_epi8(vi a) {  /* 16 int32 -> 16 int8, saturated (int16 first: the same result) */
    __m256i w = _mm256_permute4x64_epi64(_mm256_packs_epi32(a.lo, a.hi), 0xD8);
    return _mm_packs_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
}
INL vi v_broadcast_i32x4(__m128i a) { __m256i t = _mm256_broadcastsi128_si256(a); return vi_of(t, t); }
INL vi v_shuffle_epi8(vi t, vi a) { return vi_of(_mm256_shuffle_epi8(t.lo, a.lo), _mm256_shuffle_epi8(t.hi, a.hi)); }
INL vf v_div_ps(vf a, vf b) { return vf_of(_mm256_div_ps(a.lo, b.lo), _mm256_div_ps(a.hi, b.hi)); }
INL vf v_neg_blend_ps(vf g, vf a, vf b) {  /* lane i: b where g's lane i is below zero, else a */
    const __m256 z = _mm256_setzero_ps();
    return vf_of(_mm256_blendv_ps(a.lo, b.lo, _mm256_cmp_ps(g.lo, z, _CMP_LT_OQ)),
                 _mm256_blendv_ps(a.hi, b.hi, _mm256_cmp_ps(g.hi, z, _CMP_LT_OQ)));
}
INL unsigned v_eq_mask(vf a, vf b) {  /* bit i: lane i of a equals lane i of b (ordered) */
    return (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(a.lo, b.lo, _CMP_EQ_OQ))
           | (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(a.hi, b.hi, _CMP_EQ_OQ)) << 8;
}
INL vf v_mask_blend_ps(unsigned m, vf a, vf b) {  /* lane i: b where bit i of m is set, else a */
    const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    __m256i lo = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32((int)(m & 255)), bit), bit);
    __m256i hi = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32((int)(m >> 8 & 255)), bit), bit);
    return vf_of(_mm256_blendv_ps(a.lo, b.lo, _mm256_castsi256_ps(lo)), _mm256_blendv_ps(a.hi, b.hi, _mm256_castsi256_ps(hi)));
}
/* p 2^n for integral n in [-190, 63] and p of exponent -1 or 0 (exp_neg's): p 2^(n + 64) is exact,
 * so the one rounding is the final 2^-64's, as vscalefps rounds p 2^n once */
INL __m256 scalef8(__m256 p, __m256 n) {
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127 + 64)), 23);
    return _mm256_mul_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), _mm256_set1_ps(0x1p-64f));
}
INL vf v_scalef_ps(vf p, vf n) { return vf_of(scalef8(p.lo, n.lo), scalef8(p.hi, n.hi)); }
INL int v_reduce_add_epi32(vi a) {  /* exact: any order */
    __m256i s = _mm256_add_epi32(a.lo, a.hi);
    __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1));
    return _mm_cvtsi128_si32(t);
}
INL float v_reduce_add_ps(vf a) {  /* avx512fintrin.h's order */
    __m256 t3 = a.hi + a.lo;
    __m128 t4 = _mm256_extractf128_ps(t3, 1), t5 = _mm256_extractf128_ps(t3, 0);
    __m128 t6 = t4 + t5;
    __m128 t7 = __builtin_shuffle(t6, (__v4si){2, 3, 0, 1});
    __m128 t8 = t6 + t7;
    return t8[0] + t8[1];
}
INL float v_reduce_max_ps(vf a) {  /* avx512fintrin.h's order (and operand order: max is not symmetric) */
    __m256 t3 = _mm256_max_ps(a.hi, a.lo);
    __m128 t6 = _mm_max_ps(_mm256_extractf128_ps(t3, 1), _mm256_extractf128_ps(t3, 0));
    __m128 t8 = _mm_max_ps(t6, __builtin_shuffle(t6, (__v4si){2, 3, 0, 1}));
    __m128 t10 = _mm_max_ps(t8, __builtin_shuffle(t8, (__v4si){1, 0, 1, 0}));
    return t10[0];
}
INL vi v_sub_epi32(vi a, vi b) { return vi_of(_mm256_sub_epi32(a.lo, b.lo), _mm256_sub_epi32(a.hi, b.hi)); }
#ifdef __AVXVNNI__
#define DOT_SHIFT 0
INL vi v_dot_u8(vi acc, vi a, vi x) {  /* unsigned a x signed x, 4 bytes per int32 lane */
    return vi_of(_mm256_dpbusd_avx_epi32(acc.lo, a.lo, x.lo), _mm256_dpbusd_avx_epi32(acc.hi, a.hi, x.hi));
}
#else
#define DOT_SHIFT 1  /* codes above 127 (8-bit, table): as signed bytes code - 128, v_dot_s8, 128 sum x added */
INL __m256i dot8(__m256i acc, __m256i a, __m256i x) {  /* a unsigned, |pair sums| < 32768: exact */
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(a, x), _mm256_set1_epi16(1)));
}
INL vi v_dot_s8(vi acc, vi a, vi x) {  /* signed a x signed x (|x| <= 127): |a| a x sign(a) */
    return vi_of(dot8(acc.lo, _mm256_abs_epi8(a.lo), _mm256_sign_epi8(x.lo, a.lo)),
                 dot8(acc.hi, _mm256_abs_epi8(a.hi), _mm256_sign_epi8(x.hi, a.hi)));
}
/* The 4-k dot products of registers of codes 0..c with x, as vpmaddubsw's pair sums (|.| <= 2 c 127) added
 * in int16 (t), exact over n registers while n 2 c 127 < 32768 (4-bit codes: 8 registers, 30480; 5-bit: 4,
 * 31496; 6-bit: 2, 32004: DOT16_RUN), then added to the int32 sums i by one vpmaddwd (v_flush16) */
#define DOT16_RUN(BITS) ((BITS) == 4 ? 8 : (BITS) == 5 ? 4 : 2)
INL vi v_dot16(vi t, vi a, vi x) {
    return vi_of(_mm256_add_epi16(t.lo, _mm256_maddubs_epi16(a.lo, x.lo)),
                 _mm256_add_epi16(t.hi, _mm256_maddubs_epi16(a.hi, x.hi)));
}
INL vi v_flush16(vi i, vi t) {
    const __m256i one = _mm256_set1_epi16(1);
    return vi_of(_mm256_add_epi32(i.lo, _mm256_madd_epi16(t.lo, one)), _mm256_add_epi32(i.hi, _mm256_madd_epi16(t.hi, one)));
}
INL int group_sum(const int8_t *x) {  /* the 32 bytes' sum */
    __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), _mm256_loadu_si256((const __m256i *)x)),
                                  _mm256_set1_epi16(1));
    __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1));
    return _mm_cvtsi128_si32(t);
}
#endif
#else
typedef __m512 vf;
typedef __m512i vi;
#define DOT_SHIFT 0
#define v_setzero_ps _mm512_setzero_ps
#define v_setzero_si512 _mm512_setzero_si512
#define v_set1_ps _mm512_set1_ps
#define v_set1_epi8 _mm512_set1_epi8
#define v_set1_epi32 _mm512_set1_epi32
#define v_loadu_ps _mm512_loadu_ps
#define v_storeu_ps _mm512_storeu_ps
#define v_loadu_si512 _mm512_loadu_si512
#define v_add_ps _mm512_add_ps
#define v_sub_ps _mm512_sub_ps
#define v_mul_ps _mm512_mul_ps
#define v_max_ps _mm512_max_ps
#define v_fmadd_ps _mm512_fmadd_ps
#define v_fnmadd_ps _mm512_fnmadd_ps
#define v_abs_ps _mm512_abs_ps
#define v_roundscale_ps _mm512_roundscale_ps
#define v_srli_epi16 _mm512_srli_epi16
#define v_slli_epi32 _mm512_slli_epi32
#define v_and_si512 _mm512_and_si512
#define v_add_epi32 _mm512_add_epi32
#define v_castsi512_ps _mm512_castsi512_ps
#define v_cvtps_epi32 _mm512_cvtps_epi32
#define v_cvtepi32_ps _mm512_cvtepi32_ps
#define v_cvtepu16_epi32 _mm512_cvtepu16_epi32
#define v_cvtph_ps _mm512_cvtph_ps
#define v_cvtsepi32_epi8 _mm512_cvtsepi32_epi8
#define v_broadcast_i32x4 _mm512_broadcast_i32x4
#define v_shuffle_epi8 _mm512_shuffle_epi8
#define v_mask_blend_ps(m, a, b) _mm512_mask_blend_ps((__mmask16)(m), a, b)
#define v_eq_mask(a, b) ((unsigned)_mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ))
#define v_div_ps _mm512_div_ps
#define v_neg_blend_ps(g, a, b) _mm512_mask_blend_ps(_mm512_cmp_ps_mask(g, _mm512_setzero_ps(), _CMP_LT_OQ), a, b)
#define v_scalef_ps _mm512_scalef_ps
#define v_reduce_add_epi32 _mm512_reduce_add_epi32
#define v_reduce_add_ps _mm512_reduce_add_ps
#define v_reduce_max_ps _mm512_reduce_max_ps
#define v_dot_u8 _mm512_dpbusd_epi32
#define v_sub_epi32 _mm512_sub_epi32
#define v_or_si512 _mm512_or_si512
#define v_slli_epi16 _mm512_slli_epi16
INL vf v_u8_ps(const uint8_t *p) { return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p))); }
#endif

/* a | the bits `m` of H shifted left by s (right by -s) in 16-bit lanes: a 5- or 6-bit code's high bits
 * from their byte plane (q56_pack) into bits 4 (and 5) of the code bytes; every bit a lane's shift
 * carries across its byte boundary falls outside m (|s| <= 4, m within bits 4-5) */
INL vi v_hi_into(vi a, vi H, int s, vi m) {
    vi t = s > 0 ? v_slli_epi16(H, s) : s < 0 ? v_srli_epi16(H, -s) : H;
    return v_or_si512(a, v_and_si512(t, m));
}

/* ---------------------------------------------------------------- packing (load time) */

static void put_nibbles(uint8_t *Wb, int col, const uint8_t *codes) {
    /* the low 4 bits of codes[32] of one column's group into the block's 256 bytes */
    for (int j = 0; j < 4; j++)
        for (int t = 0; t < 4; t++) {
            uint8_t lo = codes[8 * j + t] & 15, hi = codes[8 * j + 4 + t] & 15;
            Wb[64 * j + 4 * col + t] = (uint8_t)(lo | (hi << 4));
        }
}

/* codes[32] of one column's group into the block's 256 bytes, its S and (Zb: where stored) Z */
static void put_group(uint8_t *Wb, uint16_t *Sb, uint16_t *Zb, int col, const uint8_t *codes, float s, float z) {
    put_nibbles(Wb, col, codes);
    Sb[col] = _cvtss_sh(s, _MM_FROUND_TO_NEAREST_INT);
    if (Zb != NULL) Zb[col] = _cvtss_sh(z, _MM_FROUND_TO_NEAREST_INT);
}

static inline float f16(const uint8_t *p) { uint16_t h; memcpy(&h, p, 2); return _cvtsh_ss(h); }

/* The K types' own scales (KM layout, Q4_K and Q5_K): per block of 16 columns and group, SC [32] bytes (the
 * columns' 6-bit scales, then their mins); per block and super-block of 256, D [32] float16 (the columns' d,
 * then dmin, the file's bits). The kernel makes S = d sc and Z = -(dmin m), both exact in float32. */
static void put_kscales(uint8_t *SC, uint16_t *D, int G, int blk, int g, int col, const uint8_t *b, int sc, int mn) {
    size_t off = (size_t)blk * G + g;
    SC[off * 32 + col] = (uint8_t)sc;
    SC[off * 32 + 16 + col] = (uint8_t)mn;
    uint16_t *Db = D + ((size_t)blk * (G / 8) + g / 8) * 32;
    memcpy(Db + col, b, 2);
    memcpy(Db + 16 + col, b + 2, 2);
}

static void scale_min_k4(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) { *sc = q[j] & 63; *m = q[j + 4] & 63; }
    else { *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4); *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4); }
}

static void scale_min_k4(int j, const uint8_t *q, int *sc, int *m);

/* the 32 codes of a Q4_0 (qtype 2), Q4_1 (3), Q5_0 (6) or Q5_1 (7) block b, in the file's element order:
 * 0..15 (the low nibbles then the high ones), plus the fifth bits of qh for the 5-bit types */
static void block_codes(int qtype, const uint8_t *b, uint8_t codes[32]) {
    const uint8_t *qs = b + (qtype == 2 ? 2 : qtype == 3 ? 4 : qtype == 6 ? 6 : 8);
    uint32_t qh = 0;
    if (qtype == 6 || qtype == 7) memcpy(&qh, b + (qtype == 6 ? 2 : 4), 4);
    for (int j = 0; j < 16; j++) {
        codes[j] = (uint8_t)((qs[j] & 15) | (((qh >> j) & 1) << 4));
        codes[j + 16] = (uint8_t)((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
    }
}

/* 8-bit codes: Q8_0 (qtype 8) u = q + 128, S = d, zero -128 d (Z: where stored). Layout W
 * [n/16][k/32][512]: byte 4*col + t of chunk j (64 bytes) is the code of (col, k = 4j + t). */
int q8_pack(const uint8_t *rows, int qtype, int n_rows, int k, int col0, uint8_t *W, uint16_t *S, uint16_t *Z) {
    int G = k / 32;
    if (qtype != 8 || k < 32 || k % 32 || n_rows < 0 || col0 < 0) return -1;
    for (int i = 0; i < n_rows; i++) {
        int col = col0 + i, blk = col / 16, c = col % 16;
        const uint8_t *r = rows + (size_t)i * G * 34;
        for (int g = 0; g < G; g++) {
            const uint8_t *b = r + (size_t)g * 34;
            size_t off = (size_t)blk * G + g;
            uint8_t *Wb = W + off * 512;
            for (int j = 0; j < 8; j++)
                for (int t = 0; t < 4; t++) Wb[64 * j + 4 * c + t] = (uint8_t)((int)(int8_t)b[2 + 4 * j + t] + 128);
            float s = f16(b);
            S[off * 16 + c] = _cvtss_sh(s, _MM_FROUND_TO_NEAREST_INT);
            if (Z != NULL) Z[off * 16 + c] = _cvtss_sh(-128.0f * s, _MM_FROUND_TO_NEAREST_INT);
        }
    }
    return 0;
}

/* 5- and 6-bit codes: Q5_0 (qtype 6), Q5_1 (7), Q5_K (13): codes 0..31; Q6_K (14): 0..63. Their
 * low 4 bits as the 4-bit layout's 256 bytes, then the high bits in byte planes aligned with the
 * code registers' bytes (byte 4*col + t of register c: the code of k = 4c + t): the 5-bit codes'
 * bit 4 of register c as bit c of plane byte 4*col + t (64 bytes: 320 a block and group); Q6_K's
 * bits 4-5 of register c as bits 2 (c % 4), + 1 of plane c / 4 (128 bytes: 384). A register's high
 * bits are then a shift and a mask of its plane, on AVX2 as on AVX-512.
 * Q5_0: S = d, zero -16 S; Q5_1: S = d, Z = m; Q5_K: S = d sc, Z = -dmin m (Z: where stored).
 * Q6_K: a scale per 16 weights, S [n/16][k/32][32] (the group's first 16 k, then its second 16),
 * S = d sc, the zero -32 S applied by the kernel (Z unused). W must start zeroed (the planes are OR-ed). */
int q56_pack(const uint8_t *rows, int qtype, int n_rows, int k, int col0, uint8_t *W, uint16_t *S, uint16_t *Z) {
    int G = k / 32, km = qtype >> 8, sc = 0, mn = 0;  /* qtype | KM: Q5_K in the KM layout (S: SC bytes, Z: D) */
    qtype &= 255;
    if (km && (km != 1 || qtype != 13 || Z == NULL)) return -1;
    int super = qtype == 13 || qtype == 14;
    int row_bytes = qtype == 6 ? G * 22 : qtype == 7 ? G * 24 : qtype == 13 ? k / 256 * 176 : qtype == 14 ? k / 256 * 210
                    : -1;
    if (row_bytes < 0 || k < 32 || k % (super ? 256 : 32) || n_rows < 0 || col0 < 0) return -1;
    size_t gb = qtype == 14 ? 384 : 320;
    uint8_t codes[32];
    for (int i = 0; i < n_rows; i++) {
        int col = col0 + i, blk = col / 16, c = col % 16;
        const uint8_t *r = rows + (size_t)i * row_bytes;
        for (int g = 0; g < G; g++) {
            float s = 0.0f, z = 0.0f, s2 = 0.0f;
            if (qtype == 6 || qtype == 7) {
                const uint8_t *b = r + (size_t)g * (qtype == 6 ? 22 : 24);
                block_codes(qtype, b, codes);
                s = f16(b);
                z = qtype == 6 ? -16.0f * s : f16(b + 2);
            } else if (qtype == 13) {
                const uint8_t *b = r + (size_t)(g / 8) * 176;
                int sub = g % 8;
                const uint8_t *qh = b + 16, *qs = b + 48 + 32 * (sub / 2);
                for (int j = 0; j < 32; j++)
                    codes[j] = (uint8_t)((sub % 2 ? qs[j] >> 4 : qs[j] & 15) | (((qh[j] >> sub) & 1) << 4));
                scale_min_k4(sub, b + 4, &sc, &mn);
                s = f16(b) * (float)sc;
                z = -(f16(b + 2) * (float)mn);
            } else {  /* Q6_K: ql[128] qh[64] scales[16] d; element e = 128 h + 32 quarter + l */
                const uint8_t *b = r + (size_t)(g / 8) * 210;
                for (int j = 0; j < 32; j++) {
                    int e = 32 * (g % 8) + j, h = e / 128, quarter = e % 128 / 32, l = e % 32;
                    const uint8_t *ql = b + 64 * h, *qh = b + 128 + 32 * h;
                    int lo = quarter & 1 ? ql[l + 32] : ql[l];
                    codes[j] = (uint8_t)((quarter & 2 ? lo >> 4 : lo & 15) | (((qh[l] >> (2 * quarter)) & 3) << 4));
                }
                float d = f16(b + 208);
                s = d * (float)(int8_t)b[192 + 2 * (g % 8)];
                s2 = d * (float)(int8_t)b[192 + 2 * (g % 8) + 1];
            }
            size_t off = (size_t)blk * G + g;
            uint8_t *Wb = W + off * gb;
            put_nibbles(Wb, c, codes);
            for (int reg = 0; reg < 8; reg++)  /* the high bits into their byte planes */
                for (int t = 0; t < 4; t++) {
                    int code = codes[4 * reg + t], at = 4 * c + t;
                    if (qtype == 14) Wb[256 + 64 * (reg / 4) + at] |= (uint8_t)((code >> 4 & 3) << (2 * (reg % 4)));
                    else Wb[256 + at] |= (uint8_t)((code >> 4 & 1) << reg);
                }
            if (km) {
                put_kscales((uint8_t *)S, Z, G, blk, g, c, r + (size_t)(g / 8) * 176, sc, mn);
            } else if (qtype == 14) {
                if (!isfinite(_cvtsh_ss(_cvtss_sh(s, _MM_FROUND_TO_NEAREST_INT)))
                    || !isfinite(_cvtsh_ss(_cvtss_sh(s2, _MM_FROUND_TO_NEAREST_INT))))
                    return -3;
                S[off * 32 + c] = _cvtss_sh(s, _MM_FROUND_TO_NEAREST_INT);
                S[off * 32 + 16 + c] = _cvtss_sh(s2, _MM_FROUND_TO_NEAREST_INT);
            } else {
                S[off * 16 + c] = _cvtss_sh(s, _MM_FROUND_TO_NEAREST_INT);
                if (Z != NULL) Z[off * 16 + c] = _cvtss_sh(z, _MM_FROUND_TO_NEAREST_INT);
            }
        }
    }
    return 0;
}

/* the float32 2^(e - 128) of an E8M0 byte, as ggml_e8m0_to_fp32_half */
static inline float e8m0_half(uint8_t e) {
    uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* rows [n_rows, row_bytes] of a Q4_0 (qtype 2), Q4_1 (3), Q4_K (12) or lookup-type IQ4_NL (20),
 * IQ4_XS (23), MXFP4 (39) weight -> W, S, Z for columns col0 .. col0 + n_rows (col0 and the
 * layout's n: multiples of 16). Returns -1 on a bad type or size, -3 where a lookup type's scale
 * does not fit float16 (|S|, or 128 |S| where Z is stored, above 65504). */
int q4_pack(const uint8_t *rows, int qtype, int n_rows, int k, int col0, uint8_t *W, uint16_t *S, uint16_t *Z) {
    int G = k / 32, km = qtype >> 8;  /* qtype | KM: Q4_K in the KM layout (S: SC bytes, Z: D) */
    qtype &= 255;
    if (km && (km != 1 || qtype != 12 || Z == NULL)) return -1;
    int super = qtype == 12 || qtype == 23;  /* 256-element super-blocks */
    int row_bytes = qtype == 12 ? k / 256 * 144 : qtype == 23 ? k / 256 * 136 : qtype == 39 ? G * 17
                    : qtype == 2 || qtype == 20 ? G * 18 : G * 20;
    if ((qtype != 2 && qtype != 3 && qtype != 12 && qtype != 20 && qtype != 23 && qtype != 39) || k < 32
        || k % (super ? 256 : 32) || n_rows < 0 || col0 < 0)
        return -1;
    uint8_t codes[32];
    for (int i = 0; i < n_rows; i++) {
        int col = col0 + i, blk = col / 16, c = col % 16;
        const uint8_t *r = rows + (size_t)i * row_bytes;
        for (int g = 0; g < G; g++) {
            float s, z;
            if (qtype == 2 || qtype == 3) {
                const uint8_t *b = r + (size_t)g * (qtype == 2 ? 18 : 20);
                block_codes(qtype, b, codes);
                s = f16(b);
                z = qtype == 2 ? -8.0f * s : f16(b + 2);
            } else if (qtype == 12) {
                const uint8_t *b = r + (size_t)(g / 8) * 144;
                int sub = g % 8, sc, mn;
                const uint8_t *qs = b + 16 + 32 * (sub / 2);
                for (int j = 0; j < 32; j++) codes[j] = sub % 2 ? qs[j] >> 4 : qs[j] & 15;
                scale_min_k4(sub, b + 4, &sc, &mn);
                if (km) {
                    put_nibbles(W + ((size_t)blk * G + g) * 256, c, codes);
                    put_kscales((uint8_t *)S, Z, G, blk, g, c, b, sc, mn);
                    continue;
                }
                s = f16(b) * (float)sc;
                z = -(f16(b + 2) * (float)mn);
            } else {  /* the lookup types: codes are table indices, S the scale, Z = -128 S (below) */
                const uint8_t *qs;
                if (qtype == 23) {
                    const uint8_t *b = r + (size_t)(g / 8) * 136;
                    int sub = g % 8;
                    int ls = ((b[4 + sub / 2] >> (4 * (sub % 2))) & 15) | (((b[2] | (b[3] << 8)) >> (2 * sub) & 3) << 4);
                    s = f16(b) * (float)(ls - 32);
                    qs = b + 8 + 16 * sub;
                } else if (qtype == 39) {
                    const uint8_t *b = r + (size_t)g * 17;
                    s = e8m0_half(b[0]);
                    qs = b + 1;
                } else {
                    const uint8_t *b = r + (size_t)g * 18;
                    s = f16(b);
                    qs = b + 2;
                }
                for (int j = 0; j < 16; j++) { codes[j] = qs[j] & 15; codes[j + 16] = qs[j] >> 4; }
                uint16_t sh = _cvtss_sh(s, _MM_FROUND_TO_NEAREST_INT);
                z = -128.0f * _cvtsh_ss(sh);
                if (!isfinite(_cvtsh_ss(sh)) || (Z != NULL && fabsf(z) > 65504.0f)) return -3;
            }
            size_t off = (size_t)blk * G + g;
            put_group(W + off * 256, S + off * 16, Z != NULL ? Z + off * 16 : NULL, c, codes, s, z);
        }
    }
    return 0;
}

/* ---------------------------------------------------------------- activations */

/* x [m, k] (float32 when bf16 == 0, else bfloat16 bits) -> per row: q [P][k] int8, d [P][k/32],
 * and sx [k/32] = sum_p d_p sum q_p; x16 (unless NULL) [P][k/32][2] the sums of q over each half group
 * (the 6-bit codes' zeros). P = 1: x ~ d q. P = 2: the rounding error r = x - d q is
 * quantized again, x ~ d q + d' q' with d' = max|r| / 127 (~15 bits for the pair). */
static void quantize_row(const void *x, int bf16, int k, int P, int8_t *q, float *d, float *sx, int *x16, int *zq,
                         int zmi, int g0, int g1) {
    int G = k / 32;
    for (int g = g0; g < g1; g++) {
        vf a, b;
        size_t at = (size_t)g * 32;
        if (bf16) {
            const uint16_t *p = (const uint16_t *)x + at;
            a = v_castsi512_ps(v_slli_epi32(v_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
            b = v_castsi512_ps(v_slli_epi32(v_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p + 16))), 16));
        } else {
            const float *p = (const float *)x + at;
            a = v_loadu_ps(p);
            b = v_loadu_ps(p + 16);
        }
        float total = 0.0f;
        for (int pass = 0; pass < P; pass++) {
            float amax = v_reduce_max_ps(v_max_ps(v_abs_ps(a), v_abs_ps(b)));
            float dd = amax / 127.0f;
            float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
            vf vinv = v_set1_ps(inv);
            vf ra = v_roundscale_ps(v_mul_ps(a, vinv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            vf rb = v_roundscale_ps(v_mul_ps(b, vinv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            vi qa = v_cvtps_epi32(ra), qb = v_cvtps_epi32(rb);
            int8_t *qr = q + (size_t)pass * k + g * 32;
            _mm_storeu_si128((__m128i *)qr, v_cvtsepi32_epi8(qa));
            _mm_storeu_si128((__m128i *)(qr + 16), v_cvtsepi32_epi8(qb));
            d[(size_t)pass * G + g] = dd;
            int sq = v_reduce_add_epi32(v_add_epi32(qa, qb));
            total += dd * (float)sq;
            if (zq != NULL) zq[g] = zmi * sq;  /* (P = 1) */
            if (x16 != NULL) {
                int *h = x16 + ((size_t)pass * G + g) * 2;
                h[0] = v_reduce_add_epi32(qa);
                h[1] = v_reduce_add_epi32(qb);
            }
            vf vd = v_set1_ps(dd);  /* what is left for the next pass */
            a = v_fnmadd_ps(ra, vd, a);
            b = v_fnmadd_ps(rb, vd, b);
        }
        sx[g] = total;
    }
}

/* quantize_row's groups g0 .. g1 - 1 of row r of x [m, k] (row stride ldx elements) into the m-row scratch
 * q, d, sx, x16, zq (each group on its own: any split of a row's groups gives the same bytes) */
static inline void quantize_row_at(const void *x, int bf16, size_t ldx, int k, int P, int r, int8_t *q, float *d,
                                   float *sx, int *x16, int *zq, int zmi, int g0, int g1) {
    int G = k / 32;
    const void *xr = bf16 ? (const void *)((const uint16_t *)x + (size_t)r * ldx) : (const void *)((const float *)x + (size_t)r * ldx);
    quantize_row(xr, bf16, k, P, q + (size_t)r * P * k, d + (size_t)r * P * G, sx + (size_t)r * G,
                 x16 != NULL ? x16 + (size_t)r * P * G * 2 : NULL, zq != NULL ? zq + (size_t)r * G : NULL, zmi, g0, g1);
}

static void quantize_rows(const void *x, int bf16, int m, int k, int P, int8_t *q, float *d, float *sx, int *x16,
                          int *zq, int zmi) {
    #pragma omp parallel for schedule(static) if (m >= 16)
    for (int r = 0; r < m; r++) quantize_row_at(x, bf16, (size_t)k, k, P, r, q, d, sx, x16, zq, zmi, 0, k / 32);
}

/* ---------------------------------------------------------------- the product */

/* A tile's two forms (tile()): PAIRS, a pair of code registers a block unpacked at a time for every row, the
 * rows' integer sums in registers (prompt rows, AVX-512: the unpacking shared by 6 rows, 4 of Q6_K's two sums
 * a block); else a group's codes unpacked at once, then the rows one at a time (decode rows: the weights
 * streamed from memory; and every AVX2 tile: its 16 registers hold no more, and the pair form ran slower
 * there: bench/NOTES.md stop 45). ROWS_CAP: the most rows of a tile; MT: the largest. */
#ifdef MINFER_AVX2
#define PAIRS(P, BITS) 0
#define PAIRS_MT 1
#define ROWS_CAP(P, BITS) 4
#define MT 4
#else
#define PAIRS(P, BITS) ((P) == 1)
#define PAIRS_MT 6
#define ROWS_CAP(P, BITS) ((P) == 1 ? ((BITS) == 6 ? 4 : 6) : 4)
#define MT 6
#endif
#define ROW_BLOCK 60  /* rows of one work item of a many-row product (a multiple of MT) */

/* How far ahead (bytes) a tile's codes and scales are prefetched (0: not at all). A decode GEMM streams its
 * weights from DRAM once; one core's hardware prefetchers kept ~10 GB/s of it (2-core EPYC, one thread,
 * 4.9 and 77 MB matrices), 16-22 GB/s with these (bench/NOTES.md, stop 43). Prompts re-read a tile
 * from L2: the prefetches cost them a few instructions a group. */
#ifndef W_AHEAD
#define W_AHEAD 1024
#endif
/* bytes of codes per block of 16 columns and group of 32, by code width (4, 5, 6, 8 bits) */
static inline size_t group_bytes(int bits) { return bits == 8 ? 512 : bits == 6 ? 384 : bits == 5 ? 320 : 256; }

/* AVX2 without VNNI: codes above 127 (8-bit, table) as the signed bytes code - 128 that v_dot_s8 takes */
INL void signed_codes(vi *a) {
#if DOT_SHIFT
    a[0] = v_xor_si512(a[0], v_set1_epi8((char)0x80));
    a[1] = v_xor_si512(a[1], v_set1_epi8((char)0x80));
#else
    (void)a;
#endif
}

/* The codes of one block of 16 columns and group of 32 (p: its bytes) as vpdpbusd's 8 registers: a[j]
 * lane c holds column c's codes for k = 4 j .. 4 j + 3 (unsigned bytes). BITS: 4 (LUT: the codes index
 * `table`, its 16 bytes in every 128-bit lane), 5 and 6 (the 4-bit layout + the high bits' byte planes),
 * 8 (as stored; as signed bytes code - 128 with the table's in the AVX2 build without VNNI, signed_codes).
 * unpack_pair: registers 2 c and 2 c + 1 of them (k = 8 c .. 8 c + 7) into a[0], a[1]. */
INL void unpack_pair(int BITS, int LUT, vi table, const uint8_t *p, int c, vi *a) {
    if (BITS == 8) {
        a[0] = v_loadu_si512(p + 128 * c);
        a[1] = v_loadu_si512(p + 128 * c + 64);
        signed_codes(a);
        return;
    }
    const vi mask = v_set1_epi8(0x0F);
    vi r = v_loadu_si512(p + 64 * c);
    a[0] = v_and_si512(r, mask);
    a[1] = v_and_si512(v_srli_epi16(r, 4), mask);
    if (LUT) {
        a[0] = v_shuffle_epi8(table, a[0]);
        a[1] = v_shuffle_epi8(table, a[1]);
        signed_codes(a);
    }
    if (BITS == 5) {  /* bit 4 of register j's codes: bit j of the plane's bytes */
        const vi m = v_set1_epi8(0x10);
        vi h = v_loadu_si512(p + 256);
        a[0] = v_hi_into(a[0], h, 4 - 2 * c, m);
        a[1] = v_hi_into(a[1], h, 3 - 2 * c, m);
    } else if (BITS == 6) {  /* bits 4-5 of register j's codes: bits 2 (j % 4), + 1 of plane j / 4 */
        const vi m = v_set1_epi8(0x30);
        vi h = v_loadu_si512(p + 256 + 64 * (c / 2));
        a[0] = v_hi_into(a[0], h, 4 - 2 * (2 * c % 4), m);
        a[1] = v_hi_into(a[1], h, 4 - 2 * ((2 * c + 1) % 4), m);
    }
}

INL void unpack_block(int BITS, int LUT, vi table, const uint8_t *p, vi *a) {
    _Pragma("GCC unroll 4")  /* (constant shifts in v_hi_into) */
    for (int c = 0; c < 4; c++) unpack_pair(BITS, LUT, table, p, c, a + 2 * c);
}

/* Group g's scales and zeros for one block in the KM layout (put_kscales'): S = d sc, Z = -(dmin m) per
 * column, exact in float32 (d, dmin float16, sc, m < 64); SC: the block's group 0; d, dm: the group's
 * super-block's d and dmin (k_dmin) */
INL void k_scales(const uint8_t *SC, vf d, vf dm, int g, vf *s, vf *z) {
    *s = v_mul_ps(d, v_u8_ps(SC + (size_t)g * 32));
    *z = v_sub_ps(v_setzero_ps(), v_mul_ps(dm, v_u8_ps(SC + (size_t)g * 32 + 16)));
}

/* Group g's scales and zeros for one block stored as float16 (S, Z: the block's group 0; Z NULL: the zero
 * is zm S, exactly the float16 a stored Z would hold, zm a power of two) */
INL void f16_scales(const uint16_t *S, const uint16_t *Z, float zm, int g, vf *s, vf *z) {
    *s = v_cvtph_ps(_mm256_loadu_si256((const __m256i *)(S + (size_t)g * 16)));
    *z = Z != NULL ? v_cvtph_ps(_mm256_loadu_si256((const __m256i *)(Z + (size_t)g * 16))) : v_mul_ps(*s, v_set1_ps(zm));
}

/* the d and dmin of super-block g / 8 (D: the block's super-block 0) */
INL void k_dmin(const uint16_t *D, int g, vf *d, vf *dm) {
    const uint16_t *dd = D + (size_t)(g / 8) * 32;
    *d = v_cvtph_ps(_mm256_loadu_si256((const __m256i *)dd));
    *dm = v_cvtph_ps(_mm256_loadu_si256((const __m256i *)(dd + 16)));
}

/* One row's and pass's exact sums for code registers 2 c and 2 c + 1 of blocks 0 and 1 (a, b: unpack_pair's):
 * into i0 / i1 (BITS 6: registers 4-7 into h0 / h1, the second half group's); AVX2 without VNNI through the
 * 16-bit running sums t0 / t1, flushed at their bound (and the signed codes of BITS 8 and LUT: v_dot_s8). */
INL void pair_dots(int BITS, int LUT, int c, const vi *a, const vi *b, const int32_t *xq, vi *i0, vi *i1,
                   vi *h0, vi *h1, vi *t0, vi *t1) {
    _Pragma("GCC unroll 2")
    for (int e = 0; e < 2; e++) {
        int j = 2 * c + e;
        vi xb = v_set1_epi32(xq[j]);
#if DOT_SHIFT  /* AVX2 without VNNI */
        if (BITS == 8 || LUT) {
            *i0 = v_dot_s8(*i0, a[e], xb);
            *i1 = v_dot_s8(*i1, b[e], xb);
        } else {
            *t0 = v_dot16(*t0, a[e], xb);
            *t1 = v_dot16(*t1, b[e], xb);
        }
        (void)h0; (void)h1;
#else
        (void)t0; (void)t1; (void)LUT;
        if (BITS == 6 && j >= 4) {
            *h0 = v_dot_u8(*h0, a[e], xb);
            *h1 = v_dot_u8(*h1, b[e], xb);
        } else {
            *i0 = v_dot_u8(*i0, a[e], xb);
            *i1 = v_dot_u8(*i1, b[e], xb);
        }
#endif
    }
#if DOT_SHIFT
    if (!(BITS == 8 || LUT) && (2 * c + 2) % DOT16_RUN(BITS) == 0) {  /* the 16-bit sums' bound */
        if (BITS == 6 && c >= 2) {
            *h0 = v_flush16(*h0, *t0);
            *h1 = v_flush16(*h1, *t1);
        } else {
            *i0 = v_flush16(*i0, *t0);
            *i1 = v_flush16(*i1, *t1);
        }
        *t0 = *t1 = v_setzero_si512();
    }
#endif
}

/* tile()'s steps over its locals: the group's scales and zeros (GROUP_SCALES), the 128 sum q of the AVX2
 * build's signed codes (SHIFTED_SUMS), a pass's exact sums of row r into its float sums A (FOLD_PASS: I,
 * blocks 0 and 1; H, BITS 6's second halves), then (after the passes) the zero term (FOLD_ZERO) */
#define GROUP_SCALES() \
        if (KSC == 1) { \
            k_scales((const uint8_t *)S0, d0, dm0, g, &s0, &z0); \
            k_scales((const uint8_t *)S1, d1, dm1, g, &s1, &z1); \
        } else if (KSC == 2) { \
            s0 = v_loadu_ps((const float *)S0 + g * 16); \
            s1 = v_loadu_ps((const float *)S1 + g * 16); \
            z0 = v_loadu_ps((const float *)Z0 + g * 16); \
            z1 = v_loadu_ps((const float *)Z1 + g * 16); \
        } else if (BITS == 6) { \
            s0 = v_cvtph_ps(_mm256_loadu_si256((const __m256i *)(S0 + g * sw))); \
            s1 = v_cvtph_ps(_mm256_loadu_si256((const __m256i *)(S1 + g * sw))); \
            s0h = v_cvtph_ps(_mm256_loadu_si256((const __m256i *)(S0 + g * sw + 16))); \
            s1h = v_cvtph_ps(_mm256_loadu_si256((const __m256i *)(S1 + g * sw + 16))); \
            z0 = s0;  /* (unused: Q6_K's zero is applied in integers) */ \
            z1 = s1; \
        } else { \
            f16_scales(S0, Z0, zm, g, &s0, &z0); \
            f16_scales(S1, Z1, zm, g, &s1, &z1); \
        }
#if DOT_SHIFT
#define SHIFTED_SUMS(r, pass, I0, I1) if (BITS == 8 || LUT) {  /* sum (c - 128) q + 128 sum q */           \
            vi cq = v_set1_epi32(128 * group_sum(X + ((size_t)(r) * P + (pass)) * k + g * 32));          \
            I0 = v_add_epi32(I0, cq);                                                                     \
            I1 = v_add_epi32(I1, cq);                                                                     \
        }
#else
#define SHIFTED_SUMS(r, pass, I0, I1)
#endif
#define FOLD_PASS(A0, A1, r, pass, I0, I1, H0, H1) {                                                                                  \
            vf dv = v_set1_ps(dx[((size_t)(r) * P + (pass)) * G + g]);                                       \
            if (BITS == 6) {  /* sum (c - 32) q per half group, exact in integers */                         \
                const int *qs = X16 + (((size_t)(r) * P + (pass)) * G + g) * 2;                              \
                vi z = v_set1_epi32(32 * qs[0]), zh = v_set1_epi32(32 * qs[1]);                              \
                A0[r] = v_fmadd_ps(v_cvtepi32_ps(v_sub_epi32(I0, z)), v_mul_ps(s0, dv), A0[r]);  \
                A1[r] = v_fmadd_ps(v_cvtepi32_ps(v_sub_epi32(I1, z)), v_mul_ps(s1, dv), A1[r]);  \
                A0[r] = v_fmadd_ps(v_cvtepi32_ps(v_sub_epi32(H0, zh)), v_mul_ps(s0h, dv), A0[r]); \
                A1[r] = v_fmadd_ps(v_cvtepi32_ps(v_sub_epi32(H1, zh)), v_mul_ps(s1h, dv), A1[r]); \
            } else {                                                                                          \
                A0[r] = v_fmadd_ps(v_cvtepi32_ps(I0), v_mul_ps(s0, dv), A0[r]);                 \
                A1[r] = v_fmadd_ps(v_cvtepi32_ps(I1), v_mul_ps(s1, dv), A1[r]);                 \
            }                                                                                                 \
        }
#define FOLD_ZERO(A0, A1, r) if (BITS != 6 && !ZI) {                                                                  \
            vf sv = v_set1_ps(sx[(size_t)(r) * G + g]);                                                      \
            A0[r] = v_fmadd_ps(z0, sv, A0[r]);                                                           \
            A1[r] = v_fmadd_ps(z1, sv, A1[r]);                                                           \
        }

/* rows (<= ROWS_CAP(P, BITS)) x 32 columns; X: the rows' quantized activations, P passes of k bytes per row.
 * BITS and LUT: unpack_block's. KSC (the KM layout, 4- and 5-bit): 1, S0 / S1 the blocks' SC bytes, Z0 / Z1
 * their D (k_scales); 2, the same scales and zeros made once for the tile's rows (k_prepare), float32 [G][16]
 * each. Z0 / Z1 NULL: the zero is zm S (the symmetric types). BITS 6
 * (Q6_K): two scales a group (S0 [G][32]), the zero -32 S applied in integers: per pass and half
 * group, (sum c q) - 32 (sum q) with the halves' sums of q in X16. ZI (P = 1, a symmetric type: Z NULL, zm an
 * integer): that zero in integers too, each group's sums starting at the row's zm sum q (ZQ, [G] a row):
 * sum (c + zm) q exactly, then one multiply-add a group and no float zero term.
 * The integer sums in one of two forms (PAIRS, above): a pair of code registers at a time for every row, or
 * the group's codes at once and then the rows one by one. Either way each output's sums and float operations
 * are the same, in the same order: a row's result does not depend on the tile's other rows. */
static inline __attribute__((always_inline)) void tile(int rows, int P, int BITS, int LUT, int KSC, int ZI,
        vi table, const uint8_t *W0, const uint8_t *W1,
        const uint16_t *S0, const uint16_t *S1, const uint16_t *Z0, const uint16_t *Z1, float zm, int G,
        const int8_t *X, const float *dx, const float *sx, const int *X16, const int *ZQ, int k, float *Y,
        int ldy) {
    vf acc0[MT], acc1[MT], pac0[PAIRS_MT], pac1[PAIRS_MT];  /* the rows' float sums (the PAIRS form's: pac) */
    _Pragma("GCC unroll 8")
    for (int r = 0; r < rows; r++) {
        if (PAIRS(P, BITS)) pac0[r] = pac1[r] = v_setzero_ps();
        else acc0[r] = acc1[r] = v_setzero_ps();
    }
    const size_t gb = group_bytes(BITS);
    const int sw = BITS == 6 ? 32 : 16;  /* scales per block and group */
    vf d0 = v_setzero_ps(), dm0 = d0, d1 = d0, dm1 = d0;  /* KSC: the super-block's d and dmin */
    for (int g = 0; g < G; g++) {
        if (KSC == 1 && g % 8 == 0) {
            k_dmin(Z0, g, &d0, &dm0);
            k_dmin(Z1, g, &d1, &dm1);
        }
        const uint8_t *p0 = W0 + (size_t)g * gb, *p1 = W1 + (size_t)g * gb;
#if W_AHEAD
        for (size_t o = 0; o < gb; o += 64) {  /* the codes W_AHEAD bytes ahead: a core's stream from DRAM */
            _mm_prefetch((const char *)(p0 + W_AHEAD + o), _MM_HINT_T0);
            _mm_prefetch((const char *)(p1 + W_AHEAD + o), _MM_HINT_T0);
        }
        if ((g & 1) == 0) {
            _mm_prefetch((const char *)(S0 + g * sw + W_AHEAD / 8), _MM_HINT_T0);
            _mm_prefetch((const char *)(S1 + g * sw + W_AHEAD / 8), _MM_HINT_T0);
        }
#endif
        /* the group's scales and zeros (BITS 6: a half group's scale each, s and sh), made where the sums need
         * them (GROUP_SCALES) */
        vf s0 = v_setzero_ps(), s1 = s0, z0 = s0, z1 = s0, s0h = s0, s1h = s0;
        if (PAIRS(P, BITS)) {
            /* each row's exact sums of the group: i (BITS 6: h, the second half's) for blocks 0 and 1 (AVX2
             * without VNNI: t, their 16-bit running sums) */
            vi i0[PAIRS_MT], i1[PAIRS_MT], h0[PAIRS_MT], h1[PAIRS_MT], t0[PAIRS_MT], t1[PAIRS_MT];
            _Pragma("GCC unroll 8")
            for (int r = 0; r < rows; r++) {
                i0[r] = i1[r] = ZI ? v_set1_epi32(ZQ[(size_t)r * G + g]) : v_setzero_si512();
                h0[r] = h1[r] = t0[r] = t1[r] = v_setzero_si512();
            }
            _Pragma("GCC unroll 4")
            for (int c = 0; c < 4; c++) {
                vi a[2], b[2];
                unpack_pair(BITS, LUT, table, p0, c, a);
                unpack_pair(BITS, LUT, table, p1, c, b);
                _Pragma("GCC unroll 8")
                for (int r = 0; r < rows; r++)
                    pair_dots(BITS, LUT, c, a, b, (const int32_t *)(X + (size_t)r * k + g * 32), &i0[r], &i1[r], &h0[r],
                              &h1[r], &t0[r], &t1[r]);
            }
            GROUP_SCALES()
            _Pragma("GCC unroll 8")
            for (int r = 0; r < rows; r++) {
                SHIFTED_SUMS(r, 0, i0[r], i1[r])
                FOLD_PASS(pac0, pac1, r, 0, i0[r], i1[r], h0[r], h1[r])
                FOLD_ZERO(pac0, pac1, r)
            }
        } else {
            vi a[8], b[8];
            unpack_block(BITS, LUT, table, p0, a);
            unpack_block(BITS, LUT, table, p1, b);
            GROUP_SCALES()
            _Pragma("GCC unroll 1")  /* (a row at a time: its running sums through memory, the codes in registers) */
            for (int r = 0; r < rows; r++) {
                _Pragma("GCC unroll 2")
                for (int pass = 0; pass < P; pass++) {
                    vi i0 = ZI ? v_set1_epi32(ZQ[(size_t)r * G + g]) : v_setzero_si512(), i1 = i0;
                    vi h0 = v_setzero_si512(), h1 = h0, t0 = h0, t1 = h0;
                    _Pragma("GCC unroll 4")
                    for (int c = 0; c < 4; c++)
                        pair_dots(BITS, LUT, c, a + 2 * c, b + 2 * c,
                                  (const int32_t *)(X + ((size_t)r * P + pass) * k + g * 32), &i0, &i1, &h0, &h1,
                                  &t0, &t1);
                    SHIFTED_SUMS(r, pass, i0, i1)
                    FOLD_PASS(acc0, acc1, r, pass, i0, i1, h0, h1)
                }
                FOLD_ZERO(acc0, acc1, r)
            }
        }
    }
    _Pragma("GCC unroll 8")
    for (int r = 0; r < rows; r++) {
        v_storeu_ps(Y + (size_t)r * ldy, PAIRS(P, BITS) ? pac0[r] : acc0[r]);
        v_storeu_ps(Y + (size_t)r * ldy + 16, PAIRS(P, BITS) ? pac1[r] : acc1[r]);
    }
}
#undef FOLD_ZERO
#undef GROUP_SCALES
#undef FOLD_PASS
#undef SHIFTED_SUMS

/* One weight's layout for the product: codes W, scales S, zeros Z (NULL: zm S), code width, table */
typedef struct {
    const uint8_t *W;
    const uint16_t *S, *Z;
    float zm;
    int bits, km;  /* km: the KM layout (S: SC bytes, Z: D; the `bits` argument's KM flag) */
    const uint8_t *lut;
    vi table;
} layout;

/* The KM layout's scales and zeros of tile pair b0 (its first block's group 0), made once for many rows:
 * prep [4][G][16] float32 (block 0's S, block 1's, block 0's Z, block 1's), k_scales' values */
static void k_prepare(const layout *L, size_t b0, int G, float *prep) {
    for (int h = 0; h < 2; h++) {
        const uint8_t *SC = (const uint8_t *)(L->S + (b0 + (size_t)h * G) * 16);
        const uint16_t *D = L->Z + (b0 / G + h) * (G / 8) * 32;
        vf d = v_setzero_ps(), dm = d, sv, zv;
        for (int g = 0; g < G; g++) {
            if (g % 8 == 0) k_dmin(D, g, &d, &dm);
            k_scales(SC, d, dm, g, &sv, &zv);
            v_storeu_ps(prep + ((size_t)h * G + g) * 16, sv);
            v_storeu_ps(prep + ((size_t)(2 + h) * G + g) * 16, zv);
        }
    }
}

/* rows (<= MT) rows from r0 of the quantized activations (q, d, sx, x16: quantize_rows') against the
 * 32 columns of tile pair b0 (the index of its first block's group 0) of layout L, into y + r0 * ldy:
 * tile() with its row count, passes and code width known at compile time (the registers unrolled). */
static void tile_rows1(int rows, int P, const layout *L, size_t b0, int G, const int8_t *q, const float *d,
                       const float *sx, const int *x16, const int *zq, int k, int r0, float *y, int ldy,
                       const float *prep) {
    size_t gb = group_bytes(L->bits), sw = L->bits == 6 ? 32 : 16;
    const uint8_t *W0 = L->W + b0 * gb, *W1 = L->W + (b0 + G) * gb;
    const uint16_t *S0 = L->S + b0 * sw, *S1 = L->S + (b0 + G) * sw;
    const uint16_t *Z0 = L->Z != NULL ? L->Z + b0 * 16 : NULL, *Z1 = L->Z != NULL ? L->Z + (b0 + G) * 16 : NULL;
    if (L->km && prep != NULL) {  /* the pair's scales and zeros made for many rows (k_prepare) */
        S0 = (const uint16_t *)prep;
        S1 = (const uint16_t *)(prep + (size_t)G * 16);
        Z0 = (const uint16_t *)(prep + (size_t)2 * G * 16);
        Z1 = (const uint16_t *)(prep + (size_t)3 * G * 16);
    } else if (L->km) {  /* (b0: a block's group 0) the blocks' SC bytes at the same offsets as S, their D per super-block */
        Z0 = L->Z + b0 / G * (G / 8) * 32;
        Z1 = Z0 + (G / 8) * 32;
    }
    vi table = L->table;
    float zm = L->zm;
#define TILE(R, PP, BB, LU, KS, ZZ) tile(R, PP, BB, LU, KS, ZZ, table, W0, W1, S0, S1, Z0, Z1, zm, G, \
                                 q + (size_t)r0 * PP * k, d + (size_t)r0 * PP * G, sx + (size_t)r0 * G, \
                                 x16 != NULL ? x16 + (size_t)r0 * PP * G * 2 : NULL, \
                                 ZZ ? zq + (size_t)r0 * G : NULL, k, y + (size_t)r0 * ldy, ldy)
/* (rows <= ROWS_CAP >= 4, tile_rows' split: a case past the cap is never taken, and compiles to nothing) */
#define ROWS(PP, BB, LU, KS, ZZ) switch (rows) {    \
        case 6: if (ROWS_CAP(PP, BB) >= 6) TILE(6, PP, BB, LU, KS, ZZ); break; \
        case 5: if (ROWS_CAP(PP, BB) >= 5) TILE(5, PP, BB, LU, KS, ZZ); break; \
        case 4: TILE(4, PP, BB, LU, KS, ZZ); break; \
        case 3: TILE(3, PP, BB, LU, KS, ZZ); break; \
        case 2: TILE(2, PP, BB, LU, KS, ZZ); break; \
        default: TILE(1, PP, BB, LU, KS, ZZ); break; \
    }
#define PASSES(BB, LU, KS) if (P == 1) { ROWS(1, BB, LU, KS, 0) } else { ROWS(2, BB, LU, KS, 0) }
/* the symmetric types: their prompt rows (P = 1) with the zero in integers where the scratch has zq */
#define PASSES_ZI(BB, LU) if (zq != NULL) { ROWS(1, BB, LU, 0, 1) } else { PASSES(BB, LU, 0) }
    switch (L->bits) {
        case 4:
            if (L->lut != NULL) { PASSES_ZI(4, 1) }
            else if (L->km && prep != NULL) { PASSES(4, 0, 2) }
            else if (L->km) { PASSES(4, 0, 1) }
            else if (L->Z == NULL) { PASSES_ZI(4, 0) }
            else { PASSES(4, 0, 0) }
            break;
        case 5:
            if (L->km && prep != NULL) { PASSES(5, 0, 2) } else if (L->km) { PASSES(5, 0, 1) }
            else if (L->Z == NULL) { PASSES_ZI(5, 0) } else { PASSES(5, 0, 0) }
            break;
        case 6: PASSES(6, 0, 0) break;
        default: PASSES_ZI(8, 0) break;
    }
#undef PASSES_ZI
#undef PASSES
#undef ROWS
#undef TILE
}

static void tile_rows(int rows, int P, const layout *L, size_t b0, int G, const int8_t *q, const float *d,
                      const float *sx, const int *x16, const int *zq, int k, int r0, float *y, int ldy,
                      const float *prep) {
    int cap = ROWS_CAP(P, L->bits);
    for (int r = 0; r < rows; r += cap)
        tile_rows1(rows - r < cap ? rows - r : cap, P, L, b0, G, q, d, sx, x16, zq, k, r0 + r, y, ldy, prep);
}

/* the activations' scratch: q [m][P][k] int8, d [m][P][G], sx [m][G], x16 [m][P][G][2] (6-bit codes), zq
 * [m][G] (a symmetric type's P = 1: zm sum q, tile()'s ZI; else NULL) */
typedef struct { int8_t *q; float *d, *sx; int *x16, *zq; } acts;

/* zm of a layout whose prompt rows take their zero in integers (a symmetric type at one pass), else 0 */
static int zero_int(const layout *L, int P) {
    return P == 1 && L->Z == NULL && L->bits != 6 && !L->km ? (int)L->zm : 0;
}

static int quantize_acts(const void *x, int bf16, int m, int k, int P, int bits, int zmi, acts *A) {
    int G = k / 32;
    size_t nq = ((size_t)m * P * k + 63) / 64 * 64, n16 = bits == 6 ? (size_t)m * P * G * 2 : 0;
    A->q = malloc(nq + (size_t)m * G * (P + 1) * sizeof(float) + (n16 + (zmi ? (size_t)m * G : 0)) * sizeof(int));
    if (A->q == NULL) return -2;
    A->d = (float *)(A->q + nq);
    A->sx = A->d + (size_t)m * P * G;
    A->x16 = bits == 6 ? (int *)(A->sx + (size_t)m * G) : NULL;
    A->zq = zmi ? (int *)(A->sx + (size_t)m * G) + n16 : NULL;
    quantize_rows(x, bf16, m, k, P, A->q, A->d, A->sx, A->x16, A->zq, zmi);
    return 0;
}

/* `bits`: the code width, | KM for the K types' own scales (4 and 5 bits, no table, Z: D) */
#define KM_FLAG 256
static int layout_ok(int P, int bits, const uint8_t *lut, const uint16_t *Z, float zm) {
    int km = bits / KM_FLAG;
    bits %= KM_FLAG;
    return (P == 1 || P == 2) && (bits == 4 || bits == 5 || bits == 6 || bits == 8) && (lut == NULL || bits == 4)
           && (bits == 6 || Z != NULL || zm != 0.0f) && (km == 0 || (km == 1 && (bits == 4 || bits == 5)
                                                                       && lut == NULL && Z != NULL));
}

static layout make_layout(const uint8_t *W, const uint16_t *S, const uint16_t *Z, float zm, int bits,
                          const uint8_t *lut) {
    layout L = {W, S, bits % KM_FLAG == 6 ? NULL : Z, zm, bits % KM_FLAG, bits / KM_FLAG, lut,
                lut != NULL ? v_broadcast_i32x4(_mm_loadu_si128((const __m128i *)lut)) : v_setzero_si512()};
    return L;
}

/* The decode program's gate+up GEMM with its GLU folded in (PS_GEMM's g_* fields): act(gate) up of the
 * output's two halves (gate: columns 0 .. 16 NT, up: the rest) into out (row stride ldo), and its int8 pass
 * (q NULL: none; P passes) into the scratch q, d, sx, x16 of rows 16 NT wide. */
typedef struct { int kind, ldo, P; float *out; int8_t *q; float *d, *sx; int *x16; } glu_epi;
static inline void glu_span(int kind, const float *g, const float *u, float *y, int c0, int c1);

/* Inside a parallel region: the NT column tiles of y [m, 32 NT] (row stride ldy) shared by the team
 * (each thread a share as the static schedule splits them, ending in the team's barrier; inside prog_run
 * claimed from the step's counter: TEAM_FOR's rules), every row of a tile in groups of MT; `bias` (NULL:
 * none) added to each output after its sum, as y + b. E (NULL: none): each thread runs the gate tiles
 * of its share of the output groups, then their up tiles (t + NT / 2), then the GLU of those columns and
 * their groups' int8 pass (glu_span's and quantize_row's code per group: the bytes PS_GLU_Q gives), so
 * no step and barrier follow; the team's barrier ends it. */
static void gemm_items(const layout *L, int G, const acts *A, int k, int m, int P, float *y, int ldy,
                       const float *bias, int item, int tile, float *prep, int *have);

/* gemm_tiles' items [lo, hi): without E, column tile item / RB's row block item % RB; with E, the gate tiles of
 * those groups, then their up tiles (each a stream through W, as the tiles' prefetch expects), then their GLU
 * and int8 pass */
static void gemm_range(const layout *L, int NT, int G, const acts *A, int k, int m, int P, float *y, int ldy,
                       const float *bias, const glu_epi *E, int RB, int lo, int hi, float *prep, int *have) {
    if (E == NULL) {
        for (int item = lo; item < hi; item++)
            gemm_items(L, G, A, k, m, P, y, ldy, bias, item, item / RB, prep, have);
        return;
    }
    int half = NT / 2;
    for (int part = 0; part < 2; part++)
        for (int item = lo; item < hi; item++)
            gemm_items(L, G, A, k, m, P, y, ldy, bias, item, item / RB + part * half, prep, have);
    for (int item = lo; item < hi; item++)
        for (int r = item % RB * ROW_BLOCK, g = item / RB; r < m && r < (item % RB + 1) * ROW_BLOCK; r++) {
            const float *yr = y + (size_t)r * ldy;
            glu_span(E->kind, yr, yr + 32 * half, E->out + (size_t)r * E->ldo, 32 * g, 32 * g + 32);
            if (E->q != NULL)
                quantize_row_at(E->out, 0, (size_t)E->ldo, 32 * half, E->P, r, E->q, E->d, E->sx, E->x16, NULL, 0,
                                g, g + 1);
        }
}

static void gemm_tiles(const layout *L, int NT, int G, const acts *A, int k, int m, int P, float *y, int ldy,
                       const float *bias, const glu_epi *E) {
    int RB = (m + ROW_BLOCK - 1) / ROW_BLOCK;  /* a prompt's rows in blocks: work for every thread on narrow weights */
    /* the KM layout over more rows than a tile: the pair's scales made once an item (NULL: in each tile) */
    float *prep = L->km && m > MT ? malloc(sizeof(float) * 64 * (size_t)G) : NULL;
    int have = -1, n = (E == NULL ? NT : NT / 2) * RB, nth = omp_get_num_threads(), tid = omp_get_thread_num();
    if (team != NULL) {  /* inside prog_run: a claim is a thread's share (a run of tiles, one stream through W) */
        team_ctr *c = team++;
        int chunk = team_share(n), mine = 0;
        for (int lo; (lo = team_claim(c, n, chunk, &mine)) >= 0;)
            gemm_range(L, NT, G, A, k, m, P, y, ldy, bias, E, RB, lo, lo + chunk < n ? lo + chunk : n, prep, &have);
        team_done(c, n, mine);
    } else {  /* a thread's share as the static schedule splits it (consecutive blocks of the same tiles) */
        gemm_range(L, NT, G, A, k, m, P, y, ldy, bias, E, RB, (int)((long)n * tid / nth),
                   (int)((long)n * (tid + 1) / nth), prep, &have);
        #pragma omp barrier
    }
    free(prep);
}

/* gemm_tiles' item: column tile `tile` for row block item % RB (its rows in groups of MT), + bias */
static void gemm_items(const layout *L, int G, const acts *A, int k, int m, int P, float *y, int ldy,
                       const float *bias, int item, int tile, float *prep, int *have) {
    int RB = (m + ROW_BLOCK - 1) / ROW_BLOCK, r1 = (item % RB + 1) * ROW_BLOCK < m ? (item % RB + 1) * ROW_BLOCK : m;
    if (prep != NULL && *have != tile) {
        k_prepare(L, (size_t)(2 * tile) * G, G, prep);
        *have = tile;
    }
    for (int r0 = item % RB * ROW_BLOCK; r0 < r1; r0 += MT)
        tile_rows(r1 - r0 < MT ? r1 - r0 : MT, P, L, (size_t)(2 * tile) * G, G, A->q, A->d, A->sx, A->x16, A->zq, k, r0,
                  y + 32 * tile, ldy, prep);
    if (bias != NULL)
        for (int r = item % RB * ROW_BLOCK; r < r1; r++)
            for (int c = 0; c < 32; c++) y[(size_t)r * ldy + 32 * tile + c] += bias[32 * tile + c];
}

#if defined(MINFER_AMX) && !defined(MINFER_AVX2)
/* ---------------------------------------------------------------- the prompt product on AMX tiles
 * vnni.py's "amx" build (-DMINFER_AMX): q4_gemm's rows in blocks of 32 on the tile unit, where the kernel
 * grants the process the tile state (amx_init). Per group of 32 weights, TDPBSUD multiplies 16 rows of
 * int8 activations (A: 16 x 32 bytes, row stride P k) by one block's unpacked codes (B: 8 rows of 64
 * bytes, unpack_block's registers as stored: row j, dword c = column c's codes for k = 4 j .. 4 j + 3)
 * into 16 x 16 exact int32 sums: the same integers the vpdpbusd tile makes. Four C tiles (32 rows x 32
 * columns) go to memory, and the vector unit scales and sums them in float with tile()'s operations in
 * tile()'s order (8 rows' sums in registers across the groups), so every output has the bits the vector
 * kernel gives it (and a row's result does not depend on the other rows). The two units work a span of
 * groups apart (amx_rows). Rows past the last block of 32 run on the vector tile. Tile registers: C 0-3, A 4-5, B 6-7.
 * -DMINFER_AMX_EMULATE (vnni.py's "amx-emulated", for the tests where the CPU has no AMX): the tile
 * registers in memory and the five instructions in C, by their definitions in the Intel SDM. */
#include <sys/syscall.h>
#include <unistd.h>
#define AMX_ROWS 128  /* rows of one work item (a multiple of 32): the block's unpacked codes are reused across them */
#define AMX_KS 32     /* groups of one unit's sums (amx_rows): 2 x AMX_KS x P x 4 KB of int32 a thread, in L2 */
typedef struct __attribute__((packed)) {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tilecfg;
static int amx_ready;

#ifdef MINFER_AMX_EMULATE
static __thread struct { int rows, colsb; uint8_t d[16][64]; } et[8];
static void emu_cfg(const tilecfg *c) {
    for (int t = 0; t < 8; t++) { et[t].rows = c->rows[t]; et[t].colsb = c->colsb[t]; }
}
static void emu_load(int t, const void *p, size_t stride) {
    for (int r = 0; r < et[t].rows; r++) memcpy(et[t].d[r], (const uint8_t *)p + r * stride, et[t].colsb);
}
static void emu_store(int t, void *p, size_t stride) {
    for (int r = 0; r < et[t].rows; r++) memcpy((uint8_t *)p + r * stride, et[t].d[r], et[t].colsb);
}
/* c[m][n] += sum_k a[m][k] (signed) b[k / 4][4 n + k % 4] (unsigned; signed where sb: TDPBSSD) */
static void emu_dpbs(int c, int a, int b, int sb) {
    for (int m = 0; m < et[c].rows; m++)
        for (int n = 0; n < et[c].colsb / 4; n++) {
            int32_t v;
            memcpy(&v, et[c].d[m] + 4 * n, 4);
            for (int q = 0; q < et[a].colsb / 4; q++)
                for (int i = 0; i < 4; i++) {
                    uint8_t w = et[b].d[q][4 * n + i];
                    v += (int8_t)et[a].d[m][4 * q + i] * (sb ? (int32_t)(int8_t)w : (int32_t)w);
                }
            memcpy(et[c].d[m] + 4 * n, &v, 4);
        }
}
#define TILE_CFG(c) emu_cfg(c)
#define TILE_LOAD(t, p, s) emu_load(t, p, s)
#define TILE_STORE(t, p, s) emu_store(t, p, s)
#define TILE_ZERO(t) memset(et[t].d, 0, sizeof et[t].d)
#define TILE_DPBSUD(c, a, b) emu_dpbs(c, a, b, 0)
#define TILE_DPBSSD(c, a, b) emu_dpbs(c, a, b, 1)
#define TILE_RELEASE() ((void)0)
int amx_init(void) { return amx_ready = 1; }
#else
#define TILE_CFG(c) _tile_loadconfig(c)
#define TILE_LOAD(t, p, s) _tile_loadd(t, p, s)
#define TILE_STORE(t, p, s) _tile_stored(t, p, s)
#define TILE_ZERO(t) _tile_zero(t)
#define TILE_DPBSUD(c, a, b) _tile_dpbsud(c, a, b)
#define TILE_DPBSSD(c, a, b) _tile_dpbssd(c, a, b)
#define TILE_RELEASE() _tile_release()
/* 1 when the kernel grants this process the tile data state (Linux >= 5.16, a CPU with AMX), else 0:
 * then vnni.py does not use this build */
int amx_init(void) {
    amx_ready = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
    return amx_ready;
}
#endif

/* The tile unit's part: groups [g0, g1) of the 32 rows from r0 x tile pair t's 32 columns (B: the pair's codes
 * unpacked, [2][G][512] bytes) into C, group g's [P][4][16][16] int32 sums at C + (g - gbase) P 1024. With
 * A's zq (tile()'s ZI) B holds the codes plus zm as signed bytes, and the sums are sum (c + zm) q (TDPBSSD):
 * the integers the vector tile makes, its zero included. */
static void amx_sums(const acts *A, int k, int P, int G, int r0, const uint8_t *B, int gbase, int g0, int g1,
                     int32_t *C) {
    for (int g = g0; g < g1; g++)
        for (int pass = 0; pass < P; pass++) {
            TILE_ZERO(0); TILE_ZERO(1); TILE_ZERO(2); TILE_ZERO(3);
            TILE_LOAD(4, A->q + ((size_t)r0 * P + pass) * k + g * 32, (size_t)P * k);
            TILE_LOAD(5, A->q + ((size_t)(r0 + 16) * P + pass) * k + g * 32, (size_t)P * k);
            TILE_LOAD(6, B + (size_t)g * 512, 64);
            TILE_LOAD(7, B + (size_t)(G + g) * 512, 64);
            if (A->zq != NULL) {
                TILE_DPBSSD(0, 4, 6); TILE_DPBSSD(1, 4, 7); TILE_DPBSSD(2, 5, 6); TILE_DPBSSD(3, 5, 7);
            } else {
                TILE_DPBSUD(0, 4, 6); TILE_DPBSUD(1, 4, 7); TILE_DPBSUD(2, 5, 6); TILE_DPBSUD(3, 5, 7);
            }
            int32_t *c = C + ((size_t)(g - gbase) * P + pass) * 1024;
            TILE_STORE(0, c, 64); TILE_STORE(1, c + 256, 64); TILE_STORE(2, c + 512, 64); TILE_STORE(3, c + 768, 64);
        }
}

/* The vector unit's part: groups [g0, g1) (their sums in C from group g0: amx_sums') for rows r0 + 8 s ..
 * r0 + 8 s + 7 x the pair's 32 columns, added to those rows' running sums in acc [32][32] (kept in registers
 * across the groups): per output and group, tile()'s operations in tile()'s order (the passes, then the zero) */
static void amx_scale8(const layout *L, int t, int G, const acts *A, int P, int r0, int s, int g0, int g1,
                       const int32_t *C, float *acc, const float *prep) {
    vf a0[8], a1[8];
    _Pragma("GCC unroll 8") for (int r = 0; r < 8; r++) {
        a0[r] = v_loadu_ps(acc + 32 * (8 * s + r));
        a1[r] = v_loadu_ps(acc + 32 * (8 * s + r) + 16);
    }
    for (int g = g0; g < g1; g++) {
        size_t b0 = (size_t)(2 * t) * G, b1 = b0 + G;  /* the pair's blocks' group 0 */
        vf s0, s1, z0, z1;
        if (L->km) {  /* (k_prepare's, made with the codes) */
            s0 = v_loadu_ps(prep + (size_t)g * 16);
            s1 = v_loadu_ps(prep + ((size_t)G + g) * 16);
            z0 = v_loadu_ps(prep + ((size_t)2 * G + g) * 16);
            z1 = v_loadu_ps(prep + ((size_t)3 * G + g) * 16);
        } else {
            f16_scales(L->S + b0 * 16, L->Z != NULL ? L->Z + b0 * 16 : NULL, L->zm, g, &s0, &z0);
            f16_scales(L->S + b1 * 16, L->Z != NULL ? L->Z + b1 * 16 : NULL, L->zm, g, &s1, &z1);
        }
        const int32_t *Cg = C + (size_t)(g - g0) * P * 1024;
        _Pragma("GCC unroll 8") for (int r = 0; r < 8; r++) {
            int rr = 8 * s + r;
            size_t row = (size_t)r0 + rr;
            for (int pass = 0; pass < P; pass++) {
                const int32_t *cr = Cg + (size_t)pass * 1024 + (rr / 16 * 2) * 256 + (rr % 16) * 16;
                vf dv = v_set1_ps(A->d[(row * P + pass) * G + g]);
                a0[r] = v_fmadd_ps(v_cvtepi32_ps(_mm512_loadu_si512(cr)), v_mul_ps(s0, dv), a0[r]);
                a1[r] = v_fmadd_ps(v_cvtepi32_ps(_mm512_loadu_si512(cr + 256)), v_mul_ps(s1, dv), a1[r]);
            }
            if (A->zq == NULL) {  /* (with zq the zero is in the sums) */
                vf sv = v_set1_ps(A->sx[row * G + g]);
                a0[r] = v_fmadd_ps(z0, sv, a0[r]);
                a1[r] = v_fmadd_ps(z1, sv, a1[r]);
            }
        }
    }
    _Pragma("GCC unroll 8") for (int r = 0; r < 8; r++) {
        v_storeu_ps(acc + 32 * (8 * s + r), a0[r]);
        v_storeu_ps(acc + 32 * (8 * s + r) + 16, a1[r]);
    }
}

/* rows [r0, r1) (a multiple of 32 of them) x tile pair t. The work goes in units (a block of 32 rows, a span of
 * AMX_KS groups), in order: while the vector unit scales unit u's sums (its four slices of 8 rows), the tile
 * unit makes unit u + 1's (a quarter of its groups beside each slice), into the other half of C
 * ([2][AMX_KS][P][4][256] int32). acc: [32][32] float scratch. */
static void amx_rows(const layout *L, int t, int G, const acts *A, int k, int P, int r0, int r1, const uint8_t *B,
                     int32_t *C, float *acc, float *y, int ldy, const float *prep) {
    int NE = (G + AMX_KS - 1) / AMX_KS, U = (r1 - r0) / 32 * NE;
    size_t half = (size_t)AMX_KS * P * 1024;
    if (U > 0) amx_sums(A, k, P, G, r0, B, 0, 0, AMX_KS < G ? AMX_KS : G, C);
    for (int u = 0; u < U; u++) {
        int rj = r0 + u / NE * 32, g0 = u % NE * AMX_KS, g1 = g0 + AMX_KS < G ? g0 + AMX_KS : G;
        int rn = r0 + (u + 1) / NE * 32, n0 = (u + 1) % NE * AMX_KS, n1 = n0 + AMX_KS < G ? n0 + AMX_KS : G;
        if (g0 == 0) memset(acc, 0, 32 * 32 * sizeof(float));
        for (int s = 0; s < 4; s++) {
            if (u + 1 < U)
                amx_sums(A, k, P, G, rn, B, n0, n0 + (n1 - n0) * s / 4, n0 + (n1 - n0) * (s + 1) / 4,
                         C + (size_t)((u + 1) & 1) * half);
            amx_scale8(L, t, G, A, P, rj, s, g0, g1, C + (size_t)(u & 1) * half, acc, prep);
        }
        if (g1 == G)
            for (int r = 0; r < 32; r++) memcpy(y + (size_t)(rj + r) * ldy + 32 * t, acc + 32 * r, 32 * sizeof(float));
    }
}

/* q4_gemm's product (not BITS 6) with its rows in blocks of 32 on the tile unit, the rest on the vector tile.
 * Returns -2 when a thread's scratch cannot be allocated (nothing written is then relied on). */
static int amx_gemm(const layout *L, int NT, int G, const acts *A, int k, int m, int P, float *y, int ldy) {
    int RB = (m + AMX_ROWS - 1) / AMX_ROWS, fail = 0;
    const size_t gb = group_bytes(L->bits);
    #pragma omp parallel
    {
        uint8_t *B = aligned_alloc(64, (size_t)G * 1024);
        int32_t *C = aligned_alloc(64, (size_t)2 * AMX_KS * P * 4096);
        float *acc = aligned_alloc(64, 4096);
        float *prep = L->km ? malloc(sizeof(float) * 64 * (size_t)G) : NULL;  /* the KM layout's scales (k_prepare) */
        /* this thread's scratch is missing: its items fail */
        int mine = B == NULL || C == NULL || acc == NULL || (L->km && prep == NULL);
        if (mine) {
            #pragma omp atomic write
            fail = 1;
        }
        tilecfg cfg;
        memset(&cfg, 0, sizeof cfg);
        cfg.palette = 1;
        for (int i = 0; i < 4; i++) { cfg.rows[i] = 16; cfg.colsb[i] = 64; }  /* C: 16 x 16 int32 */
        for (int i = 4; i < 6; i++) { cfg.rows[i] = 16; cfg.colsb[i] = 32; }  /* A: 16 rows x 32 k */
        for (int i = 6; i < 8; i++) { cfg.rows[i] = 8; cfg.colsb[i] = 64; }   /* B: 8 k quads x 16 columns */
        TILE_CFG(&cfg);
        int have = -1;  /* the tile pair whose codes B holds (a thread's items: consecutive blocks of one pair) */
        #pragma omp for schedule(static)
        for (int item = 0; item < NT * RB; item++) {
            if (mine) continue;
            int t = item / RB, r0 = item % RB * AMX_ROWS, r1 = r0 + AMX_ROWS < m ? r0 + AMX_ROWS : m;
            if (have != t) {
                for (int h = 0; h < 2; h++)
                    for (int g = 0; g < G; g++) {
                        vi a[8];
                        const uint8_t *p = L->W + ((size_t)(2 * t + h) * G + g) * gb;
                        switch (L->bits * 2 + (L->lut != NULL)) {
                            case 9: unpack_block(4, 1, L->table, p, a); break;
                            case 10: unpack_block(5, 0, L->table, p, a); break;
                            case 16: unpack_block(8, 0, L->table, p, a); break;
                            default: unpack_block(4, 0, L->table, p, a); break;
                        }
                        if (A->zq != NULL)  /* (c + zm: in -128..127, signed bytes) */
                            for (int c = 0; c < 8; c++) a[c] = _mm512_add_epi8(a[c], _mm512_set1_epi8((char)L->zm));
                        for (int c = 0; c < 8; c++) _mm512_storeu_si512(B + ((size_t)h * G + g) * 512 + 64 * c, a[c]);
                    }
                if (prep != NULL) k_prepare(L, (size_t)(2 * t) * G, G, prep);
                have = t;
            }
            int r = r0 + (r1 - r0) / 32 * 32;
            amx_rows(L, t, G, A, k, P, r0, r, B, C, acc, y, ldy, prep);
            for (; r < r1; r += MT)
                tile_rows(r1 - r < MT ? r1 - r : MT, P, L, (size_t)(2 * t) * G, G, A->q, A->d, A->sx, A->x16, A->zq, k, r,
                          y + 32 * t, ldy, prep);
        }
        TILE_RELEASE();
        free(B); free(C); free(acc); free(prep);
    }
    return fail ? -2 : 0;
}
#endif

/* y [m, n] float32 (row stride ldy) = x [m, k] @ W^T, n a multiple of 32, activations in P = 1
 * or 2 int8 passes; `lut` (4-bit codes only): the 16-byte table of a lookup type, else NULL.
 * Returns -1 on sizes outside that contract, -2 when the activations' scratch cannot be allocated. */
int q4_gemm(const uint8_t *W, const uint16_t *S, const uint16_t *Z, float zm, int n, int k,
            const void *x, int bf16, int m, float *y, int ldy, int P, int bits, const uint8_t *lut) {
    int G = k / 32, NT = n / 32;
    if (!layout_ok(P, bits, lut, Z, zm) || m < 1 || n < 32 || n % 32 || k < 32 || k % 32 || ldy < n) return -1;
    layout L = make_layout(W, S, Z, zm, bits, lut);
    acts A;
    if (quantize_acts(x, bf16, m, k, P, bits % KM_FLAG, zero_int(&L, P), &A)) return -2;
#if defined(MINFER_AMX) && !defined(MINFER_AVX2)
    if (amx_ready && m >= 32 && bits % KM_FLAG != 6) {  /* (Q6_K's two scales a group stay on the vector tile) */
        int rc = amx_gemm(&L, NT, G, &A, k, m, P, y, ldy);
        free(A.q);
        return rc;
    }
#endif
    #pragma omp parallel
    gemm_tiles(&L, NT, G, &A, k, m, P, y, ldy, NULL, NULL);
    free(A.q);
    return 0;
}

/* The chosen experts of an expert tensor packed with each expert on a tile boundary (vnni.py
 * Q4Vnni aligned: expert e's columns start at e * stride, stride a multiple of 32): x [m, k] holds
 * rows grouped by expert, run r being rows rs[r] .. rs[r + 1] - 1 for expert ex[r] (0 <= ex[r] <
 * n_expert); y [m, ldy] gets each row's n columns of its expert (ldy >= n rounded up to 32);
 * `lut` as q4_gemm's. The activations are quantized once for all rows, then one parallel region runs every (run, column
 * tile) pair: the threads share the experts' work, and a row's numbers are those q4_gemm gives it
 * alone (the same tiles, the same order of groups). Returns -1 outside that contract, -2 when the
 * activations' scratch cannot be allocated. */
int q4_gemm_experts(const uint8_t *W, const uint16_t *S, const uint16_t *Z, float zm, int stride, int n,
                    int n_expert, int k, const void *x, int bf16, int m, const int *rs, const int *ex, int runs,
                    float *y, int ldy, int P, int bits, const uint8_t *lut) {
    int G = k / 32, NT = (n + 31) / 32;
    if (!layout_ok(P, bits, lut, Z, zm) || m < 1 || n < 1 || stride % 32 || stride < NT * 32 || k < 32 || k % 32
        || ldy < NT * 32 || runs < 1 || rs[0] != 0 || rs[runs] != m)
        return -1;
    for (int r = 0; r < runs; r++)
        if (ex[r] < 0 || ex[r] >= n_expert || rs[r + 1] <= rs[r]) return -1;
    layout L = make_layout(W, S, Z, zm, bits, lut);
    acts A;
    if (quantize_acts(x, bf16, m, k, P, bits % KM_FLAG, zero_int(&L, P), &A)) return -2;
    #pragma omp parallel for schedule(dynamic, 1)
    for (int item = 0; item < runs * NT; item++) {
        int r = item / NT, t = item % NT;
        size_t b0 = ((size_t)ex[r] * stride / 16 + 2 * (size_t)t) * G;
        for (int r0 = rs[r]; r0 < rs[r + 1]; r0 += MT)
            tile_rows(rs[r + 1] - r0 < MT ? rs[r + 1] - r0 : MT, P, &L, b0, G, A.q, A.d, A.sx, A.x16, A.zq, k, r0,
                      y + 32 * t, ldy, NULL);
    }
    free(A.q);
    return 0;
}

/* ---------------------------------------------------------------- decode attention */

/* e^x for x <= 0 (softmax arguments): 2^(x log2 e) = 2^n 2^f, |f| <= 1/2, 2^f by its Taylor
 * series to degree 7 (relative error < 1e-8 before float rounding), 2^n by vscalefps. */
static inline vf exp_neg(vf x) {
    const vf log2e = v_set1_ps(1.44269504088896341f), ln2 = v_set1_ps(0.693147180559945309f);
    vf t = v_max_ps(v_mul_ps(x, log2e), v_set1_ps(-150.0f));
    vf n = v_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    vf f = v_mul_ps(v_sub_ps(t, n), ln2);  /* e^f, |f| <= ln2 / 2 */
    vf p = v_set1_ps(1.0f / 5040.0f);
    p = v_fmadd_ps(p, f, v_set1_ps(1.0f / 720.0f));
    p = v_fmadd_ps(p, f, v_set1_ps(1.0f / 120.0f));
    p = v_fmadd_ps(p, f, v_set1_ps(1.0f / 24.0f));
    p = v_fmadd_ps(p, f, v_set1_ps(1.0f / 6.0f));
    p = v_fmadd_ps(p, f, v_set1_ps(0.5f));
    p = v_fmadd_ps(p, f, v_set1_ps(1.0f));
    p = v_fmadd_ps(p, f, v_set1_ps(1.0f));
    return v_scalef_ps(p, n);
}

#define MAX_GROUP 16   /* query heads per kv head */
#define MAX_HD 256
#define CHUNK 128      /* keys per task: a row's keys split by its own length only */
#define AHEAD 4        /* value rows prefetched ahead */

/* The scores of 16 keys at once. Slot s of a block of 16 holds key FOLD_KEY(s); the four folds below
 * add the slots' 16 lanes each, pairwise, in the order v_reduce_add_ps adds one vector's lanes (lane i +
 * lane i + 8, then + 4, + 2, + 1: avx512fintrin.h's), and lane l of the result is key l's sum: bit for bit
 * v_reduce_add_ps of that key's vector, in 15 adds and 30 shuffles (AVX-512) for the 16 keys instead of 16
 * reductions.
 * fold8(a, b): lanes 0-7 a's lane i + lane i + 8, lanes 8-15 b's; fold4(c, d) on such vectors: 128-bit
 * quarters [c.q0 + c.q1, c.q2 + c.q3, d.q0 + d.q1, d.q2 + d.q3]; fold2(e, f), per quarter: [e0 + e2,
 * e1 + e3, f0 + f2, f1 + f3]; fold1(g, h), per quarter: [g0 + g1, g2 + g3, h0 + h1, h2 + h3]. */
#define FOLD_KEY(s) (4 * ((s) % 4) + (s) / 4)
#ifdef MINFER_AVX2
INL vf v_fold8(vf a, vf b) { return vf_of(_mm256_add_ps(a.hi, a.lo), _mm256_add_ps(b.hi, b.lo)); }
INL __m256 fold4_8(__m256 lo, __m256 hi) {  /* [lo.q0 + lo.q1, hi.q0 + hi.q1] */
    return _mm256_add_ps(_mm256_permute2f128_ps(lo, hi, 0x31), _mm256_permute2f128_ps(lo, hi, 0x20));
}
INL vf v_fold4(vf c, vf d) { return vf_of(fold4_8(c.lo, c.hi), fold4_8(d.lo, d.hi)); }
INL __m256 fold2_8(__m256 e, __m256 f) {
    __m256d a = _mm256_castps_pd(e), b = _mm256_castps_pd(f);
    return _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(a, b)), _mm256_castpd_ps(_mm256_unpackhi_pd(a, b)));
}
INL vf v_fold2(vf e, vf f) { return vf_of(fold2_8(e.lo, f.lo), fold2_8(e.hi, f.hi)); }
INL __m256 fold1_8(__m256 g, __m256 h) {
    return _mm256_add_ps(_mm256_shuffle_ps(g, h, _MM_SHUFFLE(2, 0, 2, 0)), _mm256_shuffle_ps(g, h, _MM_SHUFFLE(3, 1, 3, 1)));
}
INL vf v_fold1(vf g, vf h) { return vf_of(fold1_8(g.lo, h.lo), fold1_8(g.hi, h.hi)); }
#else
INL vf v_fold8(vf a, vf b) {
    return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)), _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)));
}
INL vf v_fold4(vf c, vf d) {
    return _mm512_add_ps(_mm512_shuffle_f32x4(c, d, _MM_SHUFFLE(3, 1, 3, 1)), _mm512_shuffle_f32x4(c, d, _MM_SHUFFLE(2, 0, 2, 0)));
}
INL vf v_fold2(vf e, vf f) {
    __m512d a = _mm512_castps_pd(e), b = _mm512_castps_pd(f);
    return _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
}
INL vf v_fold1(vf g, vf h) {
    return _mm512_add_ps(_mm512_shuffle_ps(g, h, _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_ps(g, h, _MM_SHUFFLE(3, 1, 3, 1)));
}
#endif

/* Half a block's slots (h8: 0 or 8) for one query head q: slot s's vector of products, key row
 * kb + FOLD_KEY(s) hd times q, summed over q's nv vectors in order (the first a product, then FMAs),
 * folded to two vectors of 4 slots each (fold8, fold4): 8 independent FMA chains */
INL void score_half(const float *kb, int hd, int nv, const float *q, int h8, vf *f0, vf *f1) {
    vf a[8];
    vf qi = v_loadu_ps(q);
    for (int s = 0; s < 8; s++) a[s] = v_mul_ps(v_loadu_ps(kb + (size_t)FOLD_KEY(h8 + s) * hd), qi);
    for (int i = 1; i < nv; i++) {
        qi = v_loadu_ps(q + 16 * i);
        for (int s = 0; s < 8; s++) a[s] = v_fmadd_ps(v_loadu_ps(kb + (size_t)FOLD_KEY(h8 + s) * hd + 16 * i), qi, a[s]);
    }
    *f0 = v_fold4(v_fold8(a[0], a[1]), v_fold8(a[2], a[3]));
    *f1 = v_fold4(v_fold8(a[4], a[5]), v_fold8(a[6], a[7]));
}

/* 16 keys' rows kb [16][hd] against query head q: lane l = v_reduce_add_ps(key l's products) */
INL vf score16(const float *kb, int hd, int nv, const float *q) {
    vf c0, c1, c2, c3;
    score_half(kb, hd, nv, q, 0, &c0, &c1);
    score_half(kb, hd, nv, q, 8, &c2, &c3);
    return v_fold1(v_fold2(c0, c1), v_fold2(c2, c3));
}

/* PV for query heads [j0, j0 + J) and value vectors [i0, i0 + W) (J, W at most 4: the accumulators
 * stay in registers): o[j][i] = sum over keys l in order of p[j][l] V[l][i], one FMA per key */
INL void pv_tile(const float *V, int hd, int L, const float *sc, int Lp, int j0, int J, int i0, int W, float *o) {
    vf acc[4][4];
    for (int j = 0; j < J; j++)
        for (int i = 0; i < W; i++) acc[j][i] = v_setzero_ps();
    for (int l = 0; l < L; l++) {
        const float *vr = V + (size_t)l * hd + 16 * i0;
        if (l + AHEAD < L)  /* the cache streams from memory: fetch a later key's row while this one runs */
            for (int i = 0; i < W; i++) _mm_prefetch((const char *)(vr + (size_t)AHEAD * hd + 16 * i), _MM_HINT_T0);
        vf vv[4];
        for (int i = 0; i < W; i++) vv[i] = v_loadu_ps(vr + 16 * i);
        for (int j = 0; j < J; j++) {
            vf p = v_set1_ps(sc[(size_t)(j0 + j) * Lp + l]);
            for (int i = 0; i < W; i++) acc[j][i] = v_fmadd_ps(p, vv[i], acc[j][i]);
        }
    }
    for (int j = 0; j < J; j++)
        for (int i = 0; i < W; i++) v_storeu_ps(o + (size_t)(j0 + j) * hd + 16 * (i0 + i), acc[j][i]);
}

#define PV_W(J, W) \
    case W: pv_tile(V, hd, L, sc, Lp, j0, J, i0, W, o); break;
#define PV_J(J)                                                                  \
    case J:                                                                      \
        switch (W) { PV_W(J, 1) PV_W(J, 2) PV_W(J, 3) default: PV_W(J, 4) }      \
        break;

/* keys [l0, l1) of one (row, kv head) for its grp query heads: unnormalised weighted values
 * o [grp][hd], the max m [grp] and sum s [grp] of the scores' exponentials. Each score is
 * v_reduce_add_ps of the products' vector (q's 16-lane vectors times the key's: a product, then
 * FMAs in order), times scale, 16 keys at a time (score16); each output lane sums its keys' weighted
 * values in key order, one FMA a key: a (row, head)'s numbers depend on its q and keys only. */
static void attn_part(const float *Q, const float *K, const float *V, int l0, int l1, int hd, int grp,
                      float scale, float softcap, float *sc, float *o, float *mx_out, float *sum_out) {
    int nv = hd / 16, L = l1 - l0, Lp = (L + 15) / 16 * 16;
    float pad[16 * MAX_HD];  /* a last block's rows, the keys past l1 zero (their scores are dropped) */
    const vf vscale = v_set1_ps(scale);
    K += (size_t)l0 * hd;
    V += (size_t)l0 * hd;
    for (int l = 0; l < L; l += 16) {
        const float *kb = K + (size_t)l * hd;
        if (l + 16 > L) {
            memcpy(pad, kb, sizeof(float) * (size_t)(L - l) * hd);
            memset(pad + (size_t)(L - l) * hd, 0, sizeof(float) * (size_t)(l + 16 - L) * hd);
            kb = pad;
        } else if (l + 32 <= L) {  /* the cache streams from memory: fetch the next block's rows */
            for (int i = 0; i < 16 * hd; i += 16) _mm_prefetch((const char *)(kb + 16 * hd + i), _MM_HINT_T0);
        }
        for (int j = 0; j < grp; j++) {
            float *s = sc + (size_t)j * Lp + l;
            v_storeu_ps(s, v_mul_ps(score16(kb, hd, nv, Q + j * hd), vscale));
            if (softcap > 0.0f)
                for (int t = 0; t < 16; t++) s[t] = softcap * tanhf(s[t] / softcap);
        }
    }
    for (int j = 0; j < grp; j++) {
        float *s = sc + (size_t)j * Lp;
        for (int l = L; l < Lp; l++) s[l] = -INFINITY;
        vf mx = v_set1_ps(-INFINITY);
        for (int l = 0; l < Lp; l += 16) mx = v_max_ps(mx, v_loadu_ps(s + l));
        float m = v_reduce_max_ps(mx);
        vf mv = v_set1_ps(m), sum = v_setzero_ps();
        for (int l = 0; l < Lp; l += 16) {
            vf e = exp_neg(v_sub_ps(v_loadu_ps(s + l), mv));
            e = v_mask_blend_ps((unsigned)(l + 16 <= L ? 0xFFFF : (1u << (L - l)) - 1), v_setzero_ps(), e);
            v_storeu_ps(s + l, e);
            sum = v_add_ps(sum, e);
        }
        mx_out[j] = m;
        sum_out[j] = v_reduce_add_ps(sum);
    }
    for (int j0 = 0; j0 < grp; j0 += 4)
        for (int i0 = 0; i0 < nv; i0 += 4) {
            int J = grp - j0 < 4 ? grp - j0 : 4, W = nv - i0 < 4 ? nv - i0 : 4;
            switch (J) { PV_J(1) PV_J(2) PV_J(3) default: PV_J(4) }
        }
}
#undef PV_J
#undef PV_W

/* One query row per sequence against its cached keys: q [B, n_head * hd] float32 (row stride
 * ldq), a layer's cache kc, vc [n_slots, n_kv, n_ctx, hd] float32, row b attends keys
 * starts[b]..lens[b]-1 of slot slots[b] (starts NULL: from 0; 0 <= starts[b] < lens[b] <= n_ctx,
 * 0 <= slots[b] < n_slots: checked); out [B, n_head * hd]. Query head h reads kv head h / (n_head / n_kv).
 * softcap > 0: a score s (scaled) becomes softcap tanh(s / softcap) before the softmax; sinks
 * (NULL: none): head h's logit sinks[h] is one more column of its softmax, with no value row
 * (gpt-oss; ggml_soft_max_add_sinks). Tasks: (row, kv head, chunk of CHUNK keys from starts[b]),
 * merged per (row, kv head) in chunk order: the split depends on the row's own keys only, so a
 * row's arithmetic does not depend on the other rows (prompt rows run here too, each as the decode
 * row at its position; attn_part's arithmetic). hd a multiple of 16, at most 256; n_head /
 * n_kv at most 16. Returns -1 on bad sizes or no memory. */
/* row b's first task first[b] (chunks of CHUNK keys from its start, per kv head); first[B]: the tasks of all rows */
static int attn_first(int B, int n_kv, const int *starts, const int *lens, int *first) {
    first[0] = 0;
    for (int b = 0; b < B; b++) {
        int l0 = starts != NULL ? starts[b] : 0;
        first[b + 1] = first[b] + n_kv * ((lens[b] - l0 + CHUNK - 1) / CHUNK);
    }
    return first[B];
}

/* Inside a parallel region: every task into `part` (grp * (hd + 2) floats per (row, kv head, chunk)),
 * then each (row, query head) merged into out (row stride ldo): two work-shared loops, each ending in
 * the team's barrier. Where the (row, kv head, chunk) units are fewer than the team's threads (a short
 * decode row: one chunk per kv head), a unit's query heads go to several tasks (subgroups of gs heads):
 * a head's numbers are attn_part's for that head whatever its group (its scores, softmax and weighted
 * values are its own), so the split changes the time only. sc: this thread's scores (grp * CHUNK
 * floats; NULL: its tasks are skipped, the caller fails).
 * Where every row has one chunk a kv head (rows of at most CHUNK keys) and no sinks, the tasks write
 * their heads into out and normalise them there, and the merge loop (and its barrier) is skipped: the
 * merge of one chunk is (0 + 1 * o) / (0 + 1 * s), written so, the same bits.
 * qy (NULL: none): each finished head's groups of 32 also quantized as quantize_row (P passes) into the
 * rows' int8 scratch qy, qd, qs, q16 of rows n_head * hd wide (hd a multiple of 32): the step after needs
 * no pass of its own. A group's bytes are its own, so the split by heads gives quantize_rows' bytes. */
static void attn_work(const float *q, int ldq, const float *kc, const float *vc, int n_kv, int n_ctx, int hd,
                      int n_head, const int *slots, const int *starts, const int *lens, int B, float scale,
                      float softcap, const float *sinks, const int *first, float *part, float *sc, float *out,
                      int ldo, int8_t *qy, float *qd, float *qs, int *q16, int P) {
    int grp = n_head / n_kv, per = grp * (hd + 2), U = first[B], threads = omp_get_num_threads();
    int direct = U == B * n_kv && sinks == NULL, width = n_head * hd;
    int subs = U >= threads ? 1 : (threads + U - 1) / U < grp ? (threads + U - 1) / U : grp;
    int gs = (grp + subs - 1) / subs;
    subs = (grp + gs - 1) / gs;
    int T = U * subs, each = T >= 8 * threads ? 4 : 1;
    TEAM_FOR(t, T, 1, "omp for schedule(dynamic, each)",
        if (sc == NULL) continue;
        int u = t / subs, j0 = t % subs * gs, J = grp - j0 < gs ? grp - j0 : gs;
        int b = 0, hi = B - 1;  /* the row of unit u: first[b] <= u < first[b + 1] (every row has units) */
        while (b < hi) {
            int mid = (b + hi + 1) / 2;
            if (first[mid] <= u) b = mid; else hi = mid - 1;
        }
        int chunks = (first[b + 1] - first[b]) / n_kv, h = (u - first[b]) / chunks, c = (u - first[b]) % chunks;
        int l0 = (starts != NULL ? starts[b] : 0) + c * CHUNK, l1 = l0 + CHUNK < lens[b] ? l0 + CHUNK : lens[b];
        size_t base = ((size_t)slots[b] * n_kv + h) * n_ctx * hd;
        float *pt = part + (size_t)u * per;
        float *o = direct ? out + (size_t)b * ldo + (size_t)(h * grp + j0) * hd : pt + (size_t)j0 * hd;
        attn_part(q + (size_t)b * ldq + (size_t)(h * grp + j0) * hd, kc + base, vc + base, l0, l1, hd, J, scale,
                  softcap, sc, o, pt + grp * hd + j0, pt + grp * hd + grp + j0);
        for (int j = 0; direct && j < J; j++) {  /* the one-chunk merge in place */
            float *O = o + (size_t)j * hd, inv = 1.0f / (0.0f + 1.0f * pt[grp * hd + grp + j0 + j]);
            for (int i = 0; i < hd; i++) O[i] = (0.0f + 1.0f * O[i]) * inv;
            if (qy != NULL)
                quantize_row_at(out, 0, (size_t)ldo, width, P, b, qy, qd, qs, q16, NULL, 0,
                                (h * grp + j0 + j) * hd / 32, (h * grp + j0 + j + 1) * hd / 32);
        }
    );
    if (direct) return;
    TEAM_FOR(bj, B * n_head, 0, "omp for schedule(static)",
        int b = bj / n_head, h = bj % n_head / grp, j = bj % grp, chunks = (first[b + 1] - first[b]) / n_kv;
        const float *p0 = part + (size_t)(first[b] + h * chunks) * per;
        float *O = out + (size_t)b * ldo + (size_t)(h * grp + j) * hd;
        float M = sinks != NULL ? sinks[h * grp + j] : -INFINITY;
        for (int c = 0; c < chunks; c++) M = fmaxf(M, p0[(size_t)c * per + grp * hd + j]);
        float S = sinks != NULL ? expf(sinks[h * grp + j] - M) : 0.0f;
        for (int i = 0; i < hd; i++) O[i] = 0.0f;
        for (int c = 0; c < chunks; c++) {
            const float *pc = p0 + (size_t)c * per;
            float f = chunks == 1 && sinks == NULL ? 1.0f : expf(pc[grp * hd + j] - M);
            S += f * pc[grp * hd + grp + j];
            for (int i = 0; i < hd; i++) O[i] += f * pc[j * hd + i];
        }
        float inv = 1.0f / S;
        for (int i = 0; i < hd; i++) O[i] *= inv;
        if (qy != NULL)
            quantize_row_at(out, 0, (size_t)ldo, width, P, b, qy, qd, qs, q16, NULL, 0, (h * grp + j) * hd / 32,
                            (h * grp + j + 1) * hd / 32);
    );
}

/* a thread's attention scores (grp * CHUNK floats), or NULL with *fail set */
static float *attn_scratch(int grp, int *fail) {
    float *sc = malloc(sizeof(float) * (size_t)grp * CHUNK);
    if (sc == NULL) {
        #pragma omp atomic write
        *fail = 1;
    }
    return sc;
}

static int attn_sizes_ok(int n_kv, int n_head, int hd, int n_ctx, float softcap) {
    return n_kv >= 1 && n_head >= 1 && hd >= 16 && hd % 16 == 0 && hd <= MAX_HD && n_ctx >= 1 && softcap >= 0.0f
           && !isinf(softcap) && n_head % n_kv == 0 && n_head / n_kv <= MAX_GROUP;
}

static int attn_rows_ok(int B, int n_slots, int n_ctx, const int *slots, const int *starts, const int *lens) {
    for (int b = 0; b < B; b++)
        if (slots[b] < 0 || slots[b] >= n_slots || lens[b] < 1 || lens[b] > n_ctx
            || (starts != NULL && (starts[b] < 0 || starts[b] >= lens[b])))
            return 0;
    return 1;
}

int attn_decode(const float *q, int ldq, const float *kc, const float *vc, int n_slots, int n_kv, int n_ctx,
                int hd, int n_head, const int *slots, const int *starts, const int *lens, int B, float scale,
                float softcap, const float *sinks, float *out) {
    if (!attn_sizes_ok(n_kv, n_head, hd, n_ctx, softcap) || B < 1 || ldq < n_head * hd
        || !attn_rows_ok(B, n_slots, n_ctx, slots, starts, lens))
        return -1;
    int grp = n_head / n_kv;
    int *first = malloc(sizeof(int) * (B + 1));  /* first task of row b */
    if (first == NULL) return -1;
    int T = attn_first(B, n_kv, starts, lens, first), per = grp * (hd + 2);
    float *part = malloc(sizeof(float) * (size_t)T * per);
    if (part == NULL) { free(first); return -1; }
    int fail = 0;
    #pragma omp parallel
    {
        float *sc = attn_scratch(grp, &fail);
        attn_work(q, ldq, kc, vc, n_kv, n_ctx, hd, n_head, slots, starts, lens, B, scale, softcap, sinks, first, part,
                  sc, out, n_head * hd, NULL, NULL, NULL, NULL, 0);
        free(sc);
    }
    free(part);
    free(first);
    return fail ? -1 : 0;
}

/* ---------------------------------------------------------------- embedding rows */

/* bytes of `width` values of a type embed_rows decodes (-1: another type, or width not whole blocks) */
static long embed_row_bytes(int qtype, int width) {
    if (qtype == 0) return 4L * width;
    if (qtype == 1 || qtype == 30) return 2L * width;
    if (width % 32) return -1;
    int blk = qtype == 2 ? 18 : qtype == 3 ? 20 : qtype == 6 ? 22 : qtype == 7 ? 24 : qtype == 8 ? 34 : 0;
    return blk ? (long)blk * (width / 32) : -1;
}

/* out [n][width] float32 = rows ids[0 .. n) of a tensor's raw rows [n_rows][row_bytes]: F32 (qtype 0), F16 (1),
 * BF16 (30), Q4_0 (2), Q4_1 (3), Q5_0 (6), Q5_1 (7), Q8_0 (8), decoded as quant/reference.py's dequantize
 * (every value a code times the block's float16 scale, plus its float16 min for Q4_1 / Q5_1: the product is
 * exact in float32, so the bits are the reference's whatever the rounding order). A token's embedding row
 * each decode step: the reference's torch ops took 50-100 us a row on a cold cache. -1 on another type or
 * row size, -2 on an id outside 0 .. n_rows - 1 (rows before it written). */
int embed_rows(const uint8_t *raw, long n_rows, long row_bytes, int qtype, const int32_t *ids, int n, int width,
               float *out) {
    if (n < 0 || width < 1 || embed_row_bytes(qtype, width) != row_bytes) return -1;
    uint8_t codes[32];
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= n_rows) return -2;
        const uint8_t *r = raw + (size_t)ids[i] * row_bytes;
        float *o = out + (size_t)i * width;
        if (qtype == 0) {
            memcpy(o, r, sizeof(float) * width);
        } else if (qtype == 1 || qtype == 30) {
            for (int j = 0; j < width; j++) {
                uint16_t h;
                memcpy(&h, r + 2 * j, 2);
                if (qtype == 1) {
                    o[j] = _cvtsh_ss(h);
                } else {
                    uint32_t bits = (uint32_t)h << 16;
                    memcpy(o + j, &bits, 4);
                }
            }
        } else {
            int blk = (int)(row_bytes / (width / 32));
            for (int g = 0; g < width / 32; g++) {
                const uint8_t *b = r + (size_t)g * blk;
                float d = f16(b), *og = o + 32 * g;
                if (qtype == 8) {
                    for (int j = 0; j < 32; j++) og[j] = (float)(int8_t)b[2 + j] * d;
                    continue;
                }
                block_codes(qtype, b, codes);
                if (qtype == 3 || qtype == 7) {  /* code d + min */
                    float m = f16(b + 2);
                    for (int j = 0; j < 32; j++) og[j] = (float)codes[j] * d + m;
                } else {  /* (code - center) d: a zero code stays the reference's signed zero */
                    int center = qtype == 2 ? 8 : 16;
                    for (int j = 0; j < 32; j++) og[j] = (float)(codes[j] - center) * d;
                }
            }
        }
    }
    return 0;
}

/* ---------------------------------------------------------------- greedy picks */

/* out[r] = argmax of row r of x [m][n] (row stride ld): the first index of the largest value, a NaN
 * counting as larger than any number (the first NaN's index): torch.argmax's answer. One vector pass
 * for the maximum (and whether a NaN, or an infinity's inf - inf, is there), then one for the first
 * index holding it; rows with a NaN or an infinity take the scalar rule. -1 on other sizes. */
int argmax_rows(const float *x, int m, int n, int ld, int32_t *out) {
    if (m < 0 || n < 1 || ld < n) return -1;
    for (int r = 0; r < m; r++) {
        const float *xr = x + (size_t)r * ld;
        vf mx = v_set1_ps(-INFINITY), odd = v_setzero_ps();
        int i = 0;
        for (; i + 16 <= n; i += 16) {
            vf v = v_loadu_ps(xr + i);
            mx = v_max_ps(mx, v);
            odd = v_add_ps(odd, v_sub_ps(v, v));  /* NaN once a NaN or an infinity was seen */
        }
        float best = v_reduce_max_ps(mx), bad = v_reduce_add_ps(odd);
        for (; i < n; i++) {
            bad += xr[i] - xr[i];
            if (xr[i] > best) best = xr[i];
        }
        int at = -1;
        if (bad == bad) {  /* the first lane holding the maximum, 16 at a time */
            vf bv = v_set1_ps(best);
            int j = 0;
            for (; at < 0 && j + 16 <= n; j += 16) {
                unsigned hit = v_eq_mask(v_loadu_ps(xr + j), bv);
                if (hit) at = j + __builtin_ctz(hit);
            }
            for (; at < 0 && j < n; j++)
                if (xr[j] == best) at = j;
        }
        if (at < 0) {  /* the scalar rule: the first NaN, else the first largest */
            float b = xr[0];
            at = 0;
            for (int j = 1; j < n && b == b; j++)
                if (xr[j] > b || xr[j] != xr[j]) { b = xr[j]; at = j; }
        }
        out[r] = at;
    }
    return 0;
}

/* ---------------------------------------------------------------- RMSNorm */

/* y [m, d] = x / sqrt(mean(x^2) + eps) * w per row (float32, contiguous, d a multiple of 16):
 * each row's sum of squares in 16 lanes, then the lanes in a fixed order. -1 on other sizes. */
static void rms_norm_row(const float *xr, int d, const float *w, float eps, float *yr) {
    vf acc = v_setzero_ps();
    int d16 = d / 16 * 16;
    for (int i = 0; i < d16; i += 16) {
        vf v = v_loadu_ps(xr + i);
        acc = v_fmadd_ps(v, v, acc);
    }
    float ss = v_reduce_add_ps(acc);
    for (int i = d16; i < d; i++) ss += xr[i] * xr[i];  /* (a row not of whole vectors: its tail after the lanes) */
    float inv = 1.0f / sqrtf(ss / (float)d + eps);
    vf s = v_set1_ps(inv);
    for (int i = 0; i < d16; i += 16)
        v_storeu_ps(yr + i, v_mul_ps(v_mul_ps(v_loadu_ps(xr + i), s), v_loadu_ps(w + i)));
    for (int i = d16; i < d; i++) yr[i] = xr[i] * inv * w[i];
}

int rms_norm(const float *x, int m, int d, const float *w, float eps, float *y) {
    if (m < 0 || d < 1) return -1;
    #pragma omp parallel for schedule(static) if ((size_t)m * d >= 65536)  /* (a row's sums are its own) */
    for (int r = 0; r < m; r++) rms_norm_row(x + (size_t)r * d, d, w, eps, y + (size_t)r * d);
    return 0;
}

/* ---------------------------------------------------------------- RoPE */

/* out [T, n_heads * hd] (contiguous) = x [T, n_heads * hd] (row stride ldx) with pair i of each
 * head turned by token t's angle i: (a, b) -> (a c - b s, a s + b c), c = cs[t, i], s = sn[t, i]
 * (cs, sn [T, n_rot / 2]); "normal" (neox 0) pairs dims (2i, 2i + 1), NEOX (1) pairs (i, i + n_rot / 2);
 * dims from n_rot on pass through. Elementwise: a row's result does not depend on the others.
 * -1 on bad sizes. */
static void rope_head(const float *xp, int hd, int n_rot, int neox, const float *c, const float *s, float *op) {
    int half = n_rot / 2;
    if (neox)
        for (int i = 0; i < half; i++) {
            float a = xp[i], b = xp[i + half];
            op[i] = a * c[i] - b * s[i];
            op[i + half] = a * s[i] + b * c[i];
        }
    else
        for (int i = 0; i < half; i++) {
            float a = xp[2 * i], b = xp[2 * i + 1];
            op[2 * i] = a * c[i] - b * s[i];
            op[2 * i + 1] = a * s[i] + b * c[i];
        }
    for (int i = n_rot; i < hd; i++) op[i] = xp[i];
}

int rope_f32(const float *x, int ldx, int T, int n_heads, int hd, int n_rot, int neox, const float *cs,
             const float *sn, float *out) {
    if (T < 0 || n_heads < 1 || hd < 2 || n_rot < 2 || n_rot > hd || n_rot % 2 || ldx < n_heads * hd) return -1;
    int half = n_rot / 2;
    #pragma omp parallel for schedule(static) if (T >= 16)
    for (int t = 0; t < T; t++)
        for (int h = 0; h < n_heads; h++)
            rope_head(x + (size_t)t * ldx + (size_t)h * hd, hd, n_rot, neox, cs + (size_t)t * half,
                      sn + (size_t)t * half, out + ((size_t)t * n_heads + h) * hd);
    return 0;
}

/* ---------------------------------------------------------------- SwiGLU, GeGLU */

/* sigmoid per lane: 1 / (1 + e^-x) for x >= 0, e^x / (1 + e^x) below, from t = e^-|x| (exp_neg) */
INL vf sigmoid_v(vf x) {
    vf one = v_set1_ps(1.0f), t = exp_neg(v_sub_ps(v_setzero_ps(), v_abs_ps(x)));
    return v_div_ps(v_neg_blend_ps(x, one, t), v_add_ps(one, t));
}

/* act(g) u per lane: kind 0 silu(g) = g sigmoid(g); kind 1 gelu_tanh(g) = g (1 + tanh(a)) / 2 = g sigmoid(2a),
 * a = sqrt(2 / pi) (g + 0.044715 g^3) (ggml_gelu's tanh form) */
INL vf glu_mul(int kind, vf g, vf u) {
    vf z = g;
    if (kind) z = v_mul_ps(v_set1_ps(2.0f * 0.7978845608028654f),
                           v_fmadd_ps(v_mul_ps(v_set1_ps(0.044715f), g), v_mul_ps(g, g), g));
    return v_mul_ps(v_mul_ps(g, sigmoid_v(z)), u);
}

/* y = act(g) u over columns c0 .. c1 of one row, 16 lanes at a time (a short tail through a padded
 * vector: every element the same lane arithmetic, whatever the span) */
static inline void glu_span(int kind, const float *g, const float *u, float *y, int c0, int c1) {
    int i = c0;
    for (; i + 16 <= c1; i += 16) v_storeu_ps(y + i, glu_mul(kind, v_loadu_ps(g + i), v_loadu_ps(u + i)));
    if (i < c1) {
        float a[16] = {0}, b[16] = {0}, o[16];
        memcpy(a, g + i, sizeof(float) * (c1 - i));
        memcpy(b, u + i, sizeof(float) * (c1 - i));
        v_storeu_ps(o, glu_mul(kind, v_loadu_ps(a), v_loadu_ps(b)));
        memcpy(y + i, o, sizeof(float) * (c1 - i));
    }
}

/* y [m, n] (row stride ldy) = act(g) u for g, u [m, n] float32 (row strides ldg, ldu), act silu (kind 0,
 * SwiGLU) or gelu_tanh (1, GeGLU): each element on its own (the decode program's PS_GLU steps run the
 * same code). -1 on bad sizes. */
int glu_f32(int kind, const float *g, int ldg, const float *u, int ldu, int m, int n, float *y, int ldy) {
    if (kind < 0 || kind > 1 || m < 0 || n < 0 || ldg < n || ldu < n || ldy < n) return -1;
    #pragma omp parallel for schedule(static) if ((size_t)m * n >= 65536)
    for (int r = 0; r < m; r++) glu_span(kind, g + (size_t)r * ldg, u + (size_t)r * ldu, y + (size_t)r * ldy, 0, n);
    return 0;
}

/* ---------------------------------------------------------------- the decode step program
 * A decode step of the cpu backend as one call (backends/cpu/native.py compiles the graph into it):
 * a list of steps over buffers made once, run by one team of threads in one parallel region. Each
 * step is a work-shared loop ending in the team's barrier, so the steps run in order with no return
 * to Python and no thread start between them. The steps call the kernels above (the same tiles,
 * rows and heads in the same order), so a row's numbers are what the per-op calls give it and do
 * not depend on the other rows or on the thread count. */
enum { PS_NORM = 1, PS_QUANT, PS_GEMM, PS_ROPE, PS_KV, PS_ATTN, PS_ADD, PS_GLU, PS_GLU_Q, PS_ROW, PS_SCALE, PS_PICK };

typedef struct {
    int op, n, k, ldx, ldy, ldz;   /* widths; row strides in elements */
    int a0, a1, a2, a3, a4, a5;    /* the step's integers (below) */
    float f0, f1;
    void *x, *y, *z, *w, *s, *zz, *b, *lut, *aux0, *aux1;
    int qp;                        /* PS_ATTN: its output's int8 pass (qp passes) folded in: */
    void *q8, *q8d, *q8s, *q816;   /* the scratch q, d, sx, x16 (q8 NULL: none) */
    int kv_head, kv_n, kv_ctx;     /* PS_ROPE: the KV write folded in (kv_n > 0; below) */
    void *kv_v, *kv_k, *kv_vc;     /* (the values' source, the layer's key and value caches) */
    int kv_ldv;
    int g_kind, g_ld;              /* PS_GEMM: the GLU of its two halves folded in (g_out NULL: none; below), */
    void *g_out;                   /* with its int8 pass where q8 is set (qp passes) */
} pstep;

/* head h's hd values of a row at (slot, position) into a layer's cache [n_slots][n_kv][n_ctx][hd] */
static inline void kv_write(float *cache, const float *src, int slot, int pos, int h, int n_kv, int n_ctx, int hd) {
    memcpy(cache + (((size_t)slot * n_kv + h) * n_ctx + pos) * hd, src, sizeof(float) * hd);
}

/* rows B; the rows' cache slots, positions and lengths (int32 [B]) for RoPE, the KV write and attention */
static void pstep_run(const pstep *p, int B, const int *slots, const int *pos, const int *lens, float *sc) {
    switch (p->op) {
    case PS_NORM: {  /* y = rms_norm(x) * w: n wide, eps f0; a2 > 0: each run of a2 values normed alone (the
                      * per-head q / k norms), w of a2 */
        int g = p->a2 > 0 ? p->a2 : p->n, per = p->n / g;
        TEAM_FOR(rh, B * per, 0, "omp for schedule(static)",
            int r = rh / per, h = rh % per;
            rms_norm_row((const float *)p->x + (size_t)r * p->ldx + (size_t)h * g, g, (const float *)p->w, p->f0,
                         (float *)p->y + (size_t)r * p->ldy + (size_t)h * g);
        );
        break;
    }
    case PS_QUANT: {  /* x's k wide rows -> the activations' scratch (y: q, aux0: d, aux1: sx, z: x16), a0
                       * passes; the rows' groups shared out 8 at a time (a row of one decode row spans threads) */
        int G = p->k / 32, parts = (G + 7) / 8;
        TEAM_FOR(rp, B * parts, 0, "omp for schedule(static)",
            int r = rp / parts, g0 = rp % parts * 8, g1 = g0 + 8 < G ? g0 + 8 : G;
            quantize_row_at(p->x, 0, (size_t)p->ldx, p->k, p->a0, r, (int8_t *)p->y, (float *)p->aux0,
                            (float *)p->aux1, (int *)p->z, NULL, 0, g0, g1);
        );
        break;
    }
    case PS_GEMM: {  /* y (ldy) = the scratch's rows (x: q, aux0: d, aux1: sx, z: x16) @ W^T (+ b): n columns,
                      * W, S, Z: w, s, zz; zm f0; bits a0; passes a1; lut. g_out: PS_GLU (kind g_kind) of y's two
                      * halves into g_out (row stride g_ld), and with q8 its int8 pass as PS_GLU_Q's */
        layout L = make_layout((const uint8_t *)p->w, (const uint16_t *)p->s, (const uint16_t *)p->zz, p->f0, p->a0,
                               (const uint8_t *)p->lut);
        acts A = {(int8_t *)p->x, (float *)p->aux0, (float *)p->aux1, (int *)p->z, NULL};
        glu_epi E = {p->g_kind, p->g_ld, p->qp, (float *)p->g_out, (int8_t *)p->q8, (float *)p->q8d, (float *)p->q8s,
                     (int *)p->q816};
        gemm_tiles(&L, p->n / 32, p->k / 32, &A, p->k, B, p->a1, (float *)p->y, p->ldy, (const float *)p->b,
                   p->g_out != NULL ? &E : NULL);
        break;
    }
    case PS_ROPE: {  /* y (contiguous heads, ldy) = x (ldx) turned: a0 heads of a1, a2 rotated, a3 neox; cos /
                      * sin tables w, s [n_ctx][a2 / 2] read at the rows' positions. kv_n > 0: PS_KV folded in,
                      * its keys the turned heads kv_head .. kv_head + kv_n - 1 (written to the cache kv_k by the
                      * item that turned them), its values (kv_v, row stride kv_ldv) kv_n more items */
        int heads = p->a0, hd = p->a1, half = p->a2 / 2, n_kv = p->kv_n, items = heads + n_kv;
        TEAM_FOR(th, B * items, 0, "omp for schedule(static)",
            int t = th / items, h = th % items;
            if (h < heads) {
                float *out = (float *)p->y + (size_t)t * p->ldy + (size_t)h * hd;
                rope_head((const float *)p->x + (size_t)t * p->ldx + (size_t)h * hd, hd, p->a2, p->a3,
                          (const float *)p->w + (size_t)pos[t] * half, (const float *)p->s + (size_t)pos[t] * half,
                          out);
                if (h - p->kv_head >= 0 && h - p->kv_head < n_kv)  /* a key: into the cache as turned */
                    kv_write((float *)p->kv_k, out, slots[t], pos[t], h - p->kv_head, n_kv, p->kv_ctx, hd);
            } else {  /* a value */
                kv_write((float *)p->kv_vc, (const float *)p->kv_v + (size_t)t * p->kv_ldv + (size_t)(h - heads) * hd,
                         slots[t], pos[t], h - heads, n_kv, p->kv_ctx, hd);
            }
        );
        break;
    }
    case PS_KV: {  /* the rows' keys x (ldx) and values z (ldz), a0 kv heads of a1, into the layer's caches w, s
                    * [n_slots][a0][a2][a1] at (slot, position) */
        int n_kv = p->a0, hd = p->a1, n_ctx = p->a2;
        TEAM_FOR(bh, B * n_kv, 0, "omp for schedule(static)",
            int b = bh / n_kv, h = bh % n_kv;
            kv_write((float *)p->w, (const float *)p->x + (size_t)b * p->ldx + (size_t)h * hd, slots[b], pos[b], h, n_kv,
                     n_ctx, hd);
            kv_write((float *)p->s, (const float *)p->z + (size_t)b * p->ldz + (size_t)h * hd, slots[b], pos[b], h, n_kv,
                     n_ctx, hd);
        );
        break;
    }
    case PS_ATTN:  /* y (ldy) = attention of the queries x (ldx) over caches w, s: a0 kv heads, a1 head size, a2
                    * query heads, a3 n_ctx, scale f0, soft-cap f1 (0: none), a4 a sliding window (0: none; aux0:
                    * the rows' first keys); b: the tasks' first indices [B + 1] (prog_run fills them and the
                    * window's first keys before the team starts), zz: their parts */
        attn_work((const float *)p->x, p->ldx, (const float *)p->w, (const float *)p->s, p->a0, p->a3, p->a1, p->a2,
                  slots, p->a4 > 0 ? (const int *)p->aux0 : NULL, lens, B, p->f0, p->f1, NULL, (const int *)p->b,
                  (float *)p->zz, sc, (float *)p->y, p->ldy, (int8_t *)p->q8, (float *)p->q8d, (float *)p->q8s,
                  (int *)p->q816, p->qp);
        break;
    case PS_GLU_Q: {  /* PS_GLU, then the result's groups quantized as PS_QUANT (into zz: q, aux0: d, aux1: sx,
                       * b: x16; a0 passes), 8 groups a work item: one step where two were */
        int G = p->n / 32, parts = (G + 7) / 8;
        TEAM_FOR(rp, B * parts, 0, "omp for schedule(static)",
            int r = rp / parts, g0 = rp % parts * 8, g1 = g0 + 8 < G ? g0 + 8 : G;
            glu_span(p->a3, (const float *)p->x + (size_t)r * p->ldx, (const float *)p->z + (size_t)r * p->ldz,
                     (float *)p->y + (size_t)r * p->ldy, 32 * g0, 32 * g1);
            quantize_row_at(p->y, 0, (size_t)p->ldy, p->n, p->a0, r, (int8_t *)p->zz, (float *)p->aux0,
                            (float *)p->aux1, (int *)p->b, NULL, 0, g0, g1);
        );
        break;
    }
    case PS_ROW:  /* a row at a time, n wide: a1 & 1: y = x + z; a1 & 2: s (row stride a3) = rms_norm(that sum, or
                   * x) * w, eps f0; a1 & 4: the norm's row (or the sum's) quantized as PS_QUANT (zz, aux0, aux1, b;
                   * a0 passes). For narrow rows: one step where two or three were */
        TEAM_FOR(r, B, 0, "omp for schedule(static)",
            const float *src = (const float *)p->x;
            size_t ld = (size_t)p->ldx;
            if (p->a1 & 1) {
                const float *x = src + (size_t)r * ld, *z = (const float *)p->z + (size_t)r * p->ldz;
                float *y = (float *)p->y + (size_t)r * p->ldy;
                for (int i = 0; i < p->n; i++) y[i] = x[i] + z[i];
                src = (const float *)p->y, ld = (size_t)p->ldy;
            }
            if (p->a1 & 2) {
                rms_norm_row(src + (size_t)r * ld, p->n, (const float *)p->w, p->f0, (float *)p->s + (size_t)r * p->a3);
                src = (const float *)p->s, ld = (size_t)p->a3;
            }
            if (p->a1 & 4)
                quantize_row_at(src, 0, ld, p->n, p->a0, r, (int8_t *)p->zz, (float *)p->aux0, (float *)p->aux1,
                                (int *)p->b, NULL, 0, 0, p->n / 32);
        );
        break;
    case PS_PICK: {  /* y int32 [B] = each row's argmax of x (ldx) over n columns, argmax_rows' answer (the first
                      * largest, a NaN the largest): a0 parts of the columns, each part's first maximum (z: its value,
                      * w: its index) by the threads while the logits are in their caches, then each row's parts
                      * in column order (a later part wins only with a larger value, or with the first NaN) */
        int parts = p->a0, n = p->n, per = (n + parts - 1) / parts;
        float *pv = (float *)p->z;
        int32_t *pi = (int32_t *)p->w;
        TEAM_FOR(rp, B * parts, 0, "omp for schedule(static)",
            int r = rp / parts, c0 = rp % parts * per, c1 = c0 + per < n ? c0 + per : n;
            const float *xr = (const float *)p->x + (size_t)r * p->ldx;
            int32_t at = 0;
            if (c1 > c0) argmax_rows(xr + c0, 1, c1 - c0, c1 - c0, &at);
            pi[rp] = c0 + at;
            pv[rp] = c1 > c0 ? xr[c0 + at] : -INFINITY;  /* (an empty part never wins: parts < n / per) */
        );
        TEAM_FOR(r, B, 0, "omp for schedule(static)",
            int best = r * parts;
            for (int q = best + 1; q < (r + 1) * parts && pv[best] == pv[best]; q++)
                if (pv[q] != pv[q] || pv[q] > pv[best]) best = q;
            ((int32_t *)p->y)[r] = pi[best];
        );
        break;
    }
    case PS_ADD:  /* y = x + z, n wide */
    case PS_SCALE:  /* y = x f0, n wide */
    case PS_GLU: {  /* y = act(x) z, n wide: a3 0 SwiGLU, 1 GeGLU */
        int n = p->n, chunks = (n + 255) / 256;
        TEAM_FOR(rc, B * chunks, 0, "omp for schedule(static)",
            int r = rc / chunks, c0 = rc % chunks * 256, c1 = c0 + 256 < n ? c0 + 256 : n;
            const float *x = (const float *)p->x + (size_t)r * p->ldx;
            const float *z = p->op == PS_SCALE ? NULL : (const float *)p->z + (size_t)r * p->ldz;
            float *y = (float *)p->y + (size_t)r * p->ldy;
            if (p->op == PS_ADD)
                for (int i = c0; i < c1; i++) y[i] = x[i] + z[i];
            else if (p->op == PS_SCALE)
                for (int i = c0; i < c1; i++) y[i] = x[i] * p->f0;
            else
                glu_span(p->a3, x, z, y, c0, c1);
        );
        break;
    }
    }
}

/* prog_profile(times): each later prog_run writes, from thread 0, the time (omp_get_wtime, s) its team
 * starts at times[0] and the end of its step i (after the step's barrier) at times[i + 1]; NULL: off.
 * For bench/studies/cpu_step_profile.py: where a decode step's time goes per step and thread count. */
static double *prog_times;
void prog_profile(double *times) { prog_times = times; }

/* Run a program of n steps for B rows (slots, pos int32 [B]; lens int32 [B]: filled with pos + 1, the rows'
 * key counts; n_slots / n_ctx: the cache's, to check them; grp: the most query heads per kv head of its attention steps). -1 on rows outside the cache, -2 when
 * a thread's scratch cannot be allocated (nothing is run then). */
int prog_run(const pstep *steps, int n, int B, const int *slots, const int *pos, int *lens, int n_slots,
             int n_ctx, int grp) {
    if (B < 1 || grp < 1 || grp > MAX_GROUP) return -1;
    for (int b = 0; b < B; b++) lens[b] = pos[b] + 1;  /* (a decode row attends its keys up to its own) */
    if (!attn_rows_ok(B, n_slots, n_ctx, slots, NULL, lens)) return -1;
    for (int i = 0; i < n; i++)  /* each attention step's first keys and tasks: they depend on the rows' lengths */
        if (steps[i].op == PS_ATTN) {
            int *starts = steps[i].a4 > 0 ? (int *)steps[i].aux0 : NULL;
            for (int b = 0; starts != NULL && b < B; b++) starts[b] = lens[b] > steps[i].a4 ? lens[b] - steps[i].a4 : 0;
            attn_first(B, steps[i].a0, starts, lens, (int *)steps[i].b);
        }
    /* the steps' loop counters (TEAM_FOR) and one more for the team's end, each on cache lines of its own, zeroed;
     * the threads' attention scores. Made before the team starts: a thread starts its steps without waiting for
     * the others (one the kernel has not run yet joins late, and finds the items of the steps before taken) */
    size_t n_ctr = (size_t)n * TEAM_LOOPS_PER_STEP + 1, per_sc = (size_t)grp * CHUNK;
    int nth = omp_get_max_threads();
    team_ctr *ctrs = aligned_alloc(128, sizeof(team_ctr) * n_ctr);  /* (128: the adjacent-line prefetcher's pairs) */
    float *scs = malloc(sizeof(float) * per_sc * (size_t)nth);
    if (ctrs == NULL || scs == NULL) {
        free(ctrs);
        free(scs);
        return -2;
    }
    memset(ctrs, 0, sizeof(team_ctr) * n_ctr);
    #pragma omp parallel num_threads(nth)
    {
        double *times = omp_get_thread_num() == 0 ? prog_times : NULL;
        if (times != NULL) times[0] = omp_get_wtime();
        team = ctrs;
        for (int i = 0; i < n; i++) {
            pstep_run(steps + i, B, slots, pos, lens, scs + per_sc * (size_t)omp_get_thread_num());
            if (times != NULL) times[i + 1] = omp_get_wtime();  /* (thread 0 has seen the step's items done) */
        }
        /* every thread checks in (spinning, then asleep) before libgomp's own barrier ends the region: its
         * spin (GOMP_SPINCOUNT) would hold the core a late thread needs */
        team_done(ctrs + n_ctr - 1, omp_get_num_threads(), 1);
        team = NULL;
    }
    free(ctrs);
    free(scs);
    return 0;
}
