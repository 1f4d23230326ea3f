// Causal flash attention on the CPU, float32, as an XLA FFI handler (models/attention/cpu_flash.py).
//
// out[b, t, h] = sum_j softmax_j(scale * q[b, t, h] . k[b, j, g]) v[b, j, g] over the keys j <= t (and
// t - j < window where window > 0), g = h / (H / G): grouped-query keys and values are read in place.
// One work item is (row b, key-value group g, block of `qb` queries) for every query head of the group;
// the items are shared by the caller's thread and XLA's intra-op thread pool, the largest first. An item
// walks its key blocks of `kb` keys, each read from memory once for all the group's heads, with an online
// softmax in base 2 (log2(e) folded into the scale): per head, S = Q K^T by a register-blocked kernel that
// also keeps each row's running maximum, then P = 2^(S - m) with its row sums, then O += P V. Q, S, O
// and one block of K and V stay in the core's caches; nothing T x T exists.
//
// Moved positions (Self-Extend, Dual Chunk Attention, ReRoPE: posenc/rotary.py): q and k come in R
// variants (1 to 3), each rotated at other positions; a query t and a key j take their logit from variant
// r = [d >= thr0] + [d >= thr1] (the first R - 1 thresholds, increasing), d = qc[t] - kc[j] for integer
// coordinates qc, kc given by the caller (positions for Self-Extend, chunk indices for DCA). A block of
// keys whose pairs all fall in one variant is computed as without variants; only a block that straddles
// a threshold computes its logits once per variant it holds and picks each entry's.
//
// Layouts (prepared by the caller, cpu_flash.py): q [R, B, T, H, D]; k in panels of PW keys,
// [R, B, G, Tp / PW, D, PW] (a panel's D x PW block contiguous, so the QK kernel reads it from L1);
// v [B, G, Tp, Dv]; qc [B, T] and kc [B, Tp], int32; out [B, T, H, Dv]. Tp: keys padded with zeros to a multiple of kb (the padding lies
// after every query: the causal mask removes it); Dv a multiple of the vector width VW; kb a multiple of
// PW. Vector code uses GCC / Clang vector extensions, so one source serves AVX-512, AVX2, SSE and NEON;
// the widths below follow the instruction set the compiler targets (-march=native).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <memory>
#include <thread>
#include <type_traits>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

#if defined(__AVX512F__)
constexpr int VW = 16, QK_MR = 6, QK_NV = 4, PV_MR = 6, PV_NV = 4;  // 32 vector registers: 24 accumulators
#elif defined(__AVX__)
constexpr int VW = 8, QK_MR = 6, QK_NV = 2, PV_MR = 6, PV_NV = 2;  // 16 registers: 12 accumulators
#else
constexpr int VW = 4, QK_MR = 6, QK_NV = 2, PV_MR = 6, PV_NV = 2;
#endif
constexpr int PW = QK_NV * VW;  // keys per panel of K: the width of one QK kernel call
constexpr int KC = 128;         // keys per PV kernel call: their rows of V stay in L1

typedef float vf __attribute__((vector_size(VW * 4)));
typedef float vfu __attribute__((vector_size(VW * 4), aligned(4)));
typedef int32_t vi __attribute__((vector_size(VW * 4)));

static inline vf load(const float* p) { return *(const vfu*)p; }
static inline void store(float* p, vf x) { *(vfu*)p = x; }
static inline vf splat(float x) {
#if defined(__AVX512F__)
  return _mm512_set1_ps(x);
#elif defined(__AVX__)
  return _mm256_set1_ps(x);
#elif defined(__SSE__)
  return _mm_set1_ps(x);
#else
  return vf{} + x;
#endif
}
static inline vf select(vi mask, vf a, vf b) { return (vf)(((vi)a & mask) | ((vi)b & ~mask)); }
static inline vf vmax(vf a, vf b) {
#if defined(__AVX512F__)
  return _mm512_max_ps(a, b);
#elif defined(__AVX__)
  return _mm256_max_ps(a, b);
#elif defined(__SSE__)
  return _mm_max_ps(a, b);
#else
  return select(a > b, a, b);
#endif
}
static inline float hmax(vf x) {
  float m = x[0];
  for (int e = 1; e < VW; ++e) m = std::max(m, x[e]);
  return m;
}
static inline float hsum(vf x) {
  float s = x[0];
  for (int e = 1; e < VW; ++e) s += x[e];
  return s;
}

// 2^f for |f| <= 1/2: a polynomial of degree 6 fitted to 2^f with relative weights (its own error below
// 2e-9; in float32 arithmetic, about 1 ulp)
static inline vf exp2_reduced(vf f) {
  vf p = splat(1.5347281388034553e-04f);
  p = p * f + splat(1.3399943689334321e-03f);
  p = p * f + splat(9.618483499896397e-03f);
  p = p * f + splat(5.550328738067381e-02f);
  p = p * f + splat(2.4022646940965128e-01f);
  p = p * f + splat(6.931472057614433e-01f);
  return p * f + splat(1.0000000005474103f);
}

// 2^x, 0 for x < -126 (and for x = -inf: no subnormal result): x = n + f with n an integer and
// |f| <= 1/2, 2^n put into the exponent.
static inline vf exp2v(vf x) {
#if defined(__AVX512F__)
  const __m512 lowest = _mm512_set1_ps(-126.0f);
  __m512 xc = _mm512_max_ps(x, lowest);
  __m512 n = _mm512_roundscale_ps(xc, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __mmask16 normal = _mm512_cmp_ps_mask(x, lowest, _CMP_GE_OQ);
  return _mm512_maskz_scalef_ps(normal, exp2_reduced(xc - n), n);
#else
  const vf lowest = splat(-126.0f), magic = splat(12582912.0f);  // 1.5 * 2^23: x + magic rounds x
  vf xc = vmax(x, lowest);
  vf r = xc + magic;
  vf n = r - magic;
  vi ni = (vi)r - (vi)magic;
  vf out = (vf)((vi)exp2_reduced(xc - n) + (ni << 23));
  return select(x < lowest, splat(0.0f), out);
#endif
}

// C[MR x NV*VW] = A[MR x kd] B[kd x NV*VW] (+ C where `accumulate`); with `M`, each row's running
// maximum (one vector per row) takes the tile's entries too; with `ref` (each row's reference) C gets
// 2^(entry - ref) instead of the entry, and `sums` (one vector per row) their sum: the softmax's
// exponentials computed while the tile is still in registers.
template <int MR, int NV>
static inline void tile(const float* __restrict A, long lda, const float* __restrict B, long ldb, float* __restrict C,
                        long ldc, int kd, bool accumulate, float* __restrict M, const float* __restrict ref,
                        float* __restrict sums) {
  vf acc[MR][NV];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = accumulate ? load(C + r * ldc + v * VW) : splat(0.0f);
  for (int p = 0; p < kd; ++p) {
    vf b[NV];
    for (int v = 0; v < NV; ++v) b[v] = load(B + p * ldb + v * VW);
    for (int r = 0; r < MR; ++r) {
      vf a = splat(A[r * lda + p]);
      for (int v = 0; v < NV; ++v) acc[r][v] += a * b[v];
    }
  }
  for (int r = 0; r < MR; ++r) {
    if (M) {
      vf mx = load(M + r * VW);
      for (int v = 0; v < NV; ++v) mx = vmax(mx, acc[r][v]);
      store(M + r * VW, mx);
    }
    if (ref) {
      const vf base = splat(ref[r]);
      vf sum = load(sums + r * VW);
      for (int v = 0; v < NV; ++v) {
        vf e = exp2v(acc[r][v] - base);
        store(C + r * ldc + v * VW, e);
        sum += e;
      }
      store(sums + r * VW, sum);
    } else {
      for (int v = 0; v < NV; ++v) store(C + r * ldc + v * VW, acc[r][v]);
    }
  }
}

// `tile` over `rows` rows: MR at a time, then the rest.
template <int MR, int NV>
static void tile_rows(int rows, const float* A, long lda, const float* B, long ldb, float* C, long ldc, int kd,
                      bool accumulate, float* M = nullptr, const float* ref = nullptr, float* sums = nullptr) {
  int r = 0;
  auto vec = [](float* x, int row) { return x ? x + row * VW : nullptr; };
  auto one = [&](auto rows_here) {
    tile<decltype(rows_here)::value, NV>(A + r * lda, lda, B, ldb, C + r * ldc, ldc, kd, accumulate, vec(M, r),
                                          ref ? ref + r : nullptr, vec(sums, r));
  };
  for (; r + MR <= rows; r += MR) one(std::integral_constant<int, MR>());
  switch (rows - r) {
    case 0: break;
    case 1: one(std::integral_constant<int, 1>()); break;
    case 2: one(std::integral_constant<int, 2>()); break;
    case 3: one(std::integral_constant<int, 3>()); break;
    case 4: one(std::integral_constant<int, 4>()); break;
    default: one(std::integral_constant<int, 5>()); break;
  }
}

struct Shape {
  long B, T, H, G, D, Dv, Tp;
  long qb, kb, window;  // window 0: every earlier key
  float scale;          // times log2(e): logits in base 2
  long R, thr[2];       // variants of q and k, and the coordinate differences at which the next one starts
};

// The variant of the pairs whose coordinates differ by d.
static inline int variant(const Shape& s, long d) { return (s.R > 1 && d >= s.thr[0]) + (s.R > 2 && d >= s.thr[1]); }

// One item's scratch: for each of the group's query heads, Q (qb x D, one per variant), O (qb x Dv), the
// reference maximum m and sum l (qb each); shared by the heads, S / P (qb x kb), a second S2 for blocks of
// several variants, the row maxima M and the row sums E of one block (qb x VW each).
struct Scratch {
  std::vector<float> data;
  float *Q, *O, *m, *l, *S, *S2, *M, *E;
  Scratch(const Shape& s, long heads)
      : data(heads * s.qb * (s.R * s.D + s.Dv + 2) + 2 * s.qb * s.kb + 2 * s.qb * VW) {
    Q = data.data();
    O = Q + s.R * heads * s.qb * s.D;
    m = O + heads * s.qb * s.Dv;
    l = m + heads * s.qb;
    S = l + heads * s.qb;
    S2 = S + s.qb * s.kb;
    M = S2 + s.qb * s.kb;
    E = M + s.qb * VW;
  }
};

// A block's exponentials are taken from each row's reference m while its logits are computed (`tile`
// with `ref`), which may lie below the block's maximum: up to LAG (base 2) below it, m stays, else it is
// raised to that maximum after the block (l and O scaled down with it), so every value stays below
// 2^LAG times its final size; a block more than REDO above m (its exponentials might overflow) is
// computed again from its maximum, as the first block of a row is.
constexpr float LAG = 8.0f, REDO = 64.0f;

// One query head's rows against one block of keys (k0 .. k0 + width): S = Q K^T with each row's
// maximum, masked where `masked`, the online softmax's update of m, l and O, then O += P V.
static void pv(const Shape& s, long rows, long k0, long width, const float* vbg, const float* P, float* O) {
  for (long c = 0; c < width; c += KC) {
    const int kc = (int)std::min<long>(KC, width - c);
    long d = 0;
    for (; d + PV_NV * VW <= s.Dv; d += PV_NV * VW)
      tile_rows<PV_MR, PV_NV>(rows, P + c, s.kb, vbg + (k0 + c) * s.Dv + d, s.Dv, O + d, s.Dv, kc, true);
    for (; d < s.Dv; d += VW)
      tile_rows<PV_MR, 1>(rows, P + c, s.kb, vbg + (k0 + c) * s.Dv + d, s.Dv, O + d, s.Dv, kc, true);
  }
}

// A block whose every logit is kept (no mask), for rows that have a reference already: the exponentials
// taken in the QK kernel's registers (see LAG). False where a row's maximum lies more than REDO above
// its reference: nothing was changed, and the caller computes the block in two passes.
static bool fused_block(const Shape& s, long rows, long k0, long width, const float* kbg, const float* vbg,
                        const float* Q, float* O, float* m, float* l, float* S, float* M, float* E) {
  for (long r = 0; r < rows; ++r) {
    store(M + r * VW, splat(-INFINITY));
    store(E + r * VW, splat(0.0f));
  }
  for (long c = 0; c < width; c += PW)
    tile_rows<QK_MR, QK_NV>(rows, Q, s.D, kbg + (k0 + c) * s.D, PW, S + c, s.kb, s.D, false, M, m, E);
  for (long r = 0; r < rows; ++r)
    if (hmax(load(M + r * VW)) > m[r] + REDO) return false;
  pv(s, rows, k0, width, vbg, S, O);
  for (long r = 0; r < rows; ++r) {
    l[r] += hsum(load(E + r * VW));
    const float top = hmax(load(M + r * VW));
    if (top > m[r] + LAG) {
      const float corr = std::exp2(m[r] - top);
      float* Or = O + r * s.Dv;
      for (long d = 0; d < s.Dv; d += VW) store(Or + d, load(Or + d) * splat(corr));
      l[r] *= corr;
      m[r] = top;
    }
  }
  return true;
}

// S for a block whose pairs fall in variants lo .. hi (lo < hi): each variant's logits computed, each
// entry taken from its own (Qv, Kv: the head's queries and the group's keys of each variant).
static void mixed_logits(const Shape& s, long r0, long rows, long k0, long width, int lo, int hi,
                         const int32_t* qc, const int32_t* kc, float* const* Qv, const float* const* Kv, float* S,
                         float* S2) {
  for (int r = lo; r <= hi; ++r) {
    float* dst = r == lo ? S : S2;
    for (long c = 0; c < width; c += PW)
      tile_rows<QK_MR, QK_NV>(rows, Qv[r], s.D, Kv[r] + (k0 + c) * s.D, PW, dst + c, s.kb, s.D, false);
    if (r == lo) continue;
    for (long i = 0; i < rows; ++i) {
      const long a = qc[r0 + i];
      float* Si = S + i * s.kb;
      const float* S2i = S2 + i * s.kb;
      for (long j = 0; j < width; ++j)
        if (variant(s, a - kc[k0 + j]) == r) Si[j] = S2i[j];
    }
  }
}

// One head's rows against one block of keys: its logits (unless `computed`: S holds them, and the block
// is `masked`), the online softmax's update, O += P V.
static void block(const Shape& s, long r0, long rows, long k0, long width, bool masked, bool computed,
                  const float* kbg, const float* vbg, float* Q, float* O, float* m, float* l, float* S, float* M,
                  float* E) {
  if (!computed && !masked && std::all_of(m, m + rows, [](float x) { return x > -INFINITY; }) &&
      fused_block(s, rows, k0, width, kbg, vbg, Q, O, m, l, S, M, E))
    return;
  for (long r = 0; r < rows; ++r) store(M + r * VW, splat(-INFINITY));
  if (!computed)
    for (long c = 0; c < width; c += PW)
      tile_rows<QK_MR, QK_NV>(rows, Q, s.D, kbg + (k0 + c) * s.D, PW, S + c, s.kb, s.D, false, M);
  for (long r = 0; r < rows; ++r) {
    float* Sr = S + r * s.kb;
    float* Or = O + r * s.Dv;
    vf mx = load(M + r * VW);
    if (masked) {  // keys after the query (the diagonal), or before its window
      const long t = r0 + r;
      const long lo = s.window > 0 ? std::max(0L, t - s.window + 1 - k0) : 0, hi = t + 1 - k0;
      for (long j = 0; j < width; ++j)
        if (j < lo || j >= hi) Sr[j] = -INFINITY;
      mx = splat(-INFINITY);
      for (long j = 0; j < width; j += VW) mx = vmax(mx, load(Sr + j));
    }
    const float mnew = std::max(m[r], hmax(mx));
    if (mnew == -INFINITY) {  // no key of this block in the row's window (nor before it)
      std::fill(Sr, Sr + width, 0.0f);
      continue;
    }
    const float corr = std::exp2(m[r] - mnew);
    const vf mv = splat(mnew);
    vf sum = splat(0.0f);
    for (long j = 0; j < width; j += VW) {
      vf p = exp2v(load(Sr + j) - mv);
      store(Sr + j, p);
      sum += p;
    }
    l[r] = l[r] * corr + hsum(sum);
    m[r] = mnew;
    if (corr != 1.0f)
      for (long d = 0; d < s.Dv; d += VW) store(Or + d, load(Or + d) * splat(corr));
  }
  pv(s, rows, k0, width, vbg, S, O);
}

// Item `idx`: one row b, one key-value group g, one block of qb queries, for each of the group's query
// heads; each block of keys and values is read once from memory and used by all of them.
static void item(const Shape& s, const float* q, const float* kp, const float* v, const int32_t* qc,
                 const int32_t* kc, float* out, long idx, Scratch& w) {
  const long blocks = (s.T + s.qb - 1) / s.qb, per_block = s.B * s.G, heads = s.H / s.G;
  const long i = blocks - 1 - idx / per_block;  // the latest query blocks (the most keys) first
  const long b = (idx % per_block) / s.G, g = idx % s.G;
  const long r0 = i * s.qb, rows = std::min(s.qb, s.T - r0), last = r0 + rows - 1;
  for (long x = 0; x < s.R; ++x)
    for (long e = 0; e < heads; ++e) {
      const long h = g * heads + e;
      for (long r = 0; r < rows; ++r) {
        const float* src = q + (((x * s.B + b) * s.T + r0 + r) * s.H + h) * s.D;
        float* dst = w.Q + ((x * heads + e) * s.qb + r) * s.D;
        for (long d = 0; d < s.D; ++d) dst[d] = src[d] * s.scale;
      }
    }
  std::fill(w.m, w.m + heads * s.qb, -INFINITY);
  std::fill(w.l, w.l + heads * s.qb, 0.0f);
  std::fill(w.O, w.O + heads * s.qb * s.Dv, 0.0f);
  const float* kbgs[3];  // this group's keys, per variant
  for (long x = 0; x < s.R; ++x) kbgs[x] = kp + ((x * s.B + b) * s.G + g) * s.D * s.Tp;
  const float* vbg = v + (b * s.G + g) * s.Tp * s.Dv;
  const int32_t *qcb = qc + b * s.T, *kcb = kc + b * s.Tp;
  const long qlo = s.R > 1 ? *std::min_element(qcb + r0, qcb + r0 + rows) : 0;
  const long qhi = s.R > 1 ? *std::max_element(qcb + r0, qcb + r0 + rows) : 0;
  const long first = s.window > 0 ? std::max(0L, r0 - s.window + 1) / PW * PW : 0;
  for (long k0 = first; k0 <= last; k0 += s.kb) {
    const long width = (std::min(s.kb, last + 1 - k0) + PW - 1) / PW * PW;  // within Tp
    const bool masked = k0 + width - 1 > r0 || (s.window > 0 && k0 <= last - s.window);
    int lo = 0, hi = 0;  // the variants this block's pairs fall in (keys after the last query do not count)
    if (s.R > 1) {
      const long end = std::min(k0 + width, last + 1);
      lo = variant(s, qlo - *std::max_element(kcb + k0, kcb + end));
      hi = variant(s, qhi - *std::min_element(kcb + k0, kcb + end));
    }
    for (long e = 0; e < heads; ++e) {
      float* Qv[3];
      for (long x = 0; x < s.R; ++x) Qv[x] = w.Q + (x * heads + e) * s.qb * s.D;
      if (lo != hi) mixed_logits(s, r0, rows, k0, width, lo, hi, qcb, kcb, Qv, kbgs, w.S, w.S2);
      block(s, r0, rows, k0, width, masked || lo != hi, lo != hi, kbgs[lo], vbg, Qv[lo], w.O + e * s.qb * s.Dv,
            w.m + e * s.qb, w.l + e * s.qb, w.S, w.M, w.E);
    }
  }
  for (long e = 0; e < heads; ++e) {
    const long h = g * heads + e;
    for (long r = 0; r < rows; ++r) {
      float* dst = out + ((b * s.T + r0 + r) * s.H + h) * s.Dv;
      const float* src = w.O + (e * s.qb + r) * s.Dv;
      const float inv = 1.0f / w.l[e * s.qb + r];
      for (long d = 0; d < s.Dv; ++d) dst[d] = src[d] * inv;
    }
  }
}

// The items of one call, claimed one at a time by the caller and by the pool's threads. A thread counts
// itself `active` before it claims, so that the caller, once every item is claimed, waits for exactly
// the threads still working; a task that starts later claims nothing (the state is shared, not on the
// caller's stack).
struct Work {
  Shape s;
  const float *q, *kp, *v;
  const int32_t *qc, *kc;
  float* out;
  long n;
  std::atomic<long> next{0}, active{0};

  void run() {
    active.fetch_add(1);
    if (next.load() < n) {
      Scratch scratch(s, s.H / s.G);
      for (long idx = next.fetch_add(1); idx < n; idx = next.fetch_add(1)) item(s, q, kp, v, qc, kc, out, idx, scratch);
    }
    active.fetch_sub(1);
  }
};

static ffi::Error FlashAttentionImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> kp,
                                     ffi::Buffer<ffi::F32> v, ffi::Buffer<ffi::S32> qc, ffi::Buffer<ffi::S32> kc,
                                     ffi::ResultBuffer<ffi::F32> out, float scale, int64_t qb, int64_t kb,
                                     int64_t window, int64_t thr0, int64_t thr1) {
  auto qd = q.dimensions(), kd = kp.dimensions(), vd = v.dimensions(), qcd = qc.dimensions(), kcd = kc.dimensions();
  if (qd.size() != 5 || kd.size() != 6 || vd.size() != 4 || qcd.size() != 2 || kcd.size() != 2 || kd[5] != PW)
    return ffi::Error::InvalidArgument("flash attention: q, k panels, v or coordinates of the wrong rank, or k not "
                                       "in panels of PW");
  auto work = std::make_shared<Work>();
  work->s = Shape{qd[1], qd[2], qd[3], kd[2], qd[4], vd[3], kd[3] * PW, qb, kb, window,
                  scale * 1.4426950408889634f, qd[0], {thr0, thr1}};
  const Shape& s = work->s;
  if (kd[0] != s.R || s.R < 1 || s.R > 3 || (s.R == 3 && thr1 <= thr0) || kd[1] != s.B || kd[4] != s.D ||
      vd[0] != s.B || vd[1] != s.G || vd[2] != s.Tp || qcd[0] != s.B || qcd[1] != s.T || kcd[0] != s.B ||
      kcd[1] != s.Tp || s.H % s.G != 0 || s.Tp < s.T || s.Tp % kb != 0 || kb % PW != 0 || s.Dv % VW != 0 || qb < 1)
    return ffi::Error::InvalidArgument("flash attention: inconsistent shapes (see flash_attention.cc's layouts)");
  work->q = q.typed_data();
  work->kp = kp.typed_data();
  work->v = v.typed_data();
  work->qc = qc.typed_data();
  work->kc = kc.typed_data();
  work->out = out->typed_data();
  work->n = s.B * s.G * ((s.T + qb - 1) / qb);
  const long helpers = std::min<long>(pool.num_threads(), work->n) - 1;
  for (long t = 0; t < helpers; ++t) pool.Schedule([work] { work->run(); });
  work->run();
  while (work->active.load() != 0) std::this_thread::yield();
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(lx_flash_attention, FlashAttentionImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<float>("scale")
                                  .Attr<int64_t>("qb")
                                  .Attr<int64_t>("kb")
                                  .Attr<int64_t>("window")
                                  .Attr<int64_t>("thr0")
                                  .Attr<int64_t>("thr1"));

// What the caller must know of this build: keys per panel, floats per vector.
extern "C" int lx_flash_panel_width() { return PW; }
extern "C" int lx_flash_vector_width() { return VW; }
