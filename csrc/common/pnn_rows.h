// Per-row math of the PNN kernels, shared by the CPU (.cpp) and CUDA (.cu) sources.
//
// Everything that decides a result lives here as inline __host__ __device__ code: the score of
// a candidate, the known-positive lookup, the total order used for argmax and bottom-k, the
// radix-select steps, class membership and the log-sum-exp merge.  The CPU kernels call the
// same functions, so the CPU test suite covers the logic the CUDA kernels run; only the thread
// mapping differs between the backends.
//
// Determinism contract: a score is always the chain of `sequential_sum` below, one fixed order
// of operations, so (i) two candidates that are the same item get bit-identical scores and (ii)
// a backward pass that recomputes scores recovers exactly the class membership of the forward.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define PNN_HD __host__ __device__
#else
#define PNN_HD
#endif

// The chain terms below run inside the CPU's target("avx2,fma") tile loops (cpu/simd.h) with
// vector arguments: a term that is not inlined there would be compiled without AVX2 and could
// not take the AVX2 fused multiply-add, which gcc refuses at -O0 (DEBUG=1). So force it.
#if defined(__CUDACC__)
#define PNN_HD_FORCE_INLINE __host__ __device__ __forceinline__
#elif defined(__GNUC__)
#define PNN_HD_FORCE_INLINE __attribute__((always_inline)) inline
#else
#define PNN_HD_FORCE_INLINE inline
#endif

namespace pnn_fast {

// ---------------------------------------------------------------------------------------------
// Arithmetic

// a * b + c for the sums that decide no tie or class (dot_wide): an fma on the device, a
// multiply and an add on the host (-ffp-contract=off), where the compiler vectorises it freely.
template <typename T>
PNN_HD inline T madd(T a, T b, T c) {
#ifdef __CUDA_ARCH__
  return fma(a, b, c);
#else
  return a * b + c;
#endif
}

template <typename acc_t>
PNN_HD inline acc_t exp_(acc_t x) {
#ifdef __CUDA_ARCH__
  return exp(x);
#else
  return std::exp(x);
#endif
}

template <typename acc_t>
PNN_HD inline acc_t log_(acc_t x) {
#ifdef __CUDA_ARCH__
  return log(x);
#else
  return std::log(x);
#endif
}

template <typename acc_t>
PNN_HD inline acc_t sqrt_(acc_t x) {
#ifdef __CUDA_ARCH__
  return sqrt(x);
#else
  return std::sqrt(x);
#endif
}

template <typename acc_t>
PNN_HD inline acc_t neg_infinity() {
  return -static_cast<acc_t>(INFINITY);
}

// a * b + c rounded once: the step of the chains below on every backend, so that a CUDA thread
// and a CPU SIMD lane (cpu/simd.h's VectorFma) give the same bits.  On the host std::fma; the
// CPU sources are compiled with -ffp-contract=off, so the compiler fuses nothing else.
struct FusedMultiplyAdd {
  template <typename T>
  PNN_HD T operator()(T a, T b, T c) const {
#ifdef __CUDA_ARCH__
    return fma(a, b, c);
#else
    return std::fma(a, b, c);
#endif
  }
};

// A score or a distance is one sequential chain over k = 0..d-1 (acc = term(a_k, b_k, acc)),
// each step one fused multiply-add.  A CUDA thread runs the chain as written; the CPU kernels
// run the same chain for 64 candidates at once, one per SIMD lane (cpu/simd.h), so every
// candidate gets the same bits whichever backend, kernel, tile or lane computes it.  The terms
// take the fused multiply-add as an argument so that the CPU can apply them to vector types.
struct DotTerm {
  template <typename T, typename Fused = FusedMultiplyAdd>
  PNN_HD_FORCE_INLINE T operator()(T x, T y, T acc, Fused fused = {}) const { return fused(x, y, acc); }
};

struct SquaredDiffTerm {
  template <typename T, typename Fused = FusedMultiplyAdd>
  PNN_HD_FORCE_INLINE T operator()(T x, T y, T acc, Fused fused = {}) const {
    const T diff = x - y;
    return fused(diff, diff, acc);
  }
};

template <typename acc_t, typename scalar_t, typename Term>
PNN_HD inline acc_t sequential_sum(const scalar_t* a, const scalar_t* b, int64_t d, Term term) {
  acc_t acc = acc_t(0);
  for (int64_t k = 0; k < d; ++k) acc = term(acc_t(a[k]), acc_t(b[k]), acc);
  return acc;
}

// How a backend takes a row's sums over k = 0..d-1 and walks its entries, so that the per-row
// functions below are written once for both.  SerialRowSum is one thread over the whole row: a sum
// is 8 interleaved partial sums combined by a fixed tree, the same result on every run and thread
// count (independent chains let the CPU overlap the additions and vectorise them instead of waiting
// out one add latency per element).  CUDA's WarpRowSum (cuda/cuda_rows.cuh) gives lane l the k = l
// mod 32 and adds the lanes by shuffles: the same terms in another order, so the backends agree to
// rounding.  Neither is sequential_sum's single chain: for values that decide no ties or classes.
struct SerialRowSum {
  // sum over k of the terms folded by term(k, acc) -> acc
  template <typename acc_t, typename Term>
  PNN_HD_FORCE_INLINE acc_t total(int64_t d, Term term) const {
    constexpr int kLanes = 8;
    acc_t lane[kLanes] = {};
    int64_t k = 0;
    for (; k + kLanes <= d; k += kLanes) {
      for (int l = 0; l < kLanes; ++l) lane[l] = term(k + l, lane[l]);
    }
    for (int l = 0; k < d; ++k, ++l) lane[l] = term(k, lane[l]);
    return ((lane[0] + lane[4]) + (lane[1] + lane[5])) + ((lane[2] + lane[6]) + (lane[3] + lane[7]));
  }

  // the entries a thread writes: k = first(), first() + stride, ... (a plain loop, not a callback, so
  // that the CPU's loop keeps its __restrict__ outputs and vectorises)
  static constexpr int64_t stride = 1;
  PNN_HD int64_t first() const { return 0; }
};

// <a, b> by SerialRowSum: for the lookup ops, whose scores decide no ties or classes.
template <typename acc_t, typename scalar_t>
PNN_HD inline acc_t dot_wide(const scalar_t* a, const scalar_t* b, int64_t d) {
  return SerialRowSum{}.total<acc_t>(d, [=](int64_t k, acc_t acc) { return madd(acc_t(a[k]), acc_t(b[k]), acc); });
}

// ---------------------------------------------------------------------------------------------
// Known positives: user u's items are indices[indptr[u]:indptr[u+1]], strictly increasing.

// One step of the branch-free binary search below: of [at, at + n) with half = n / 2, the part
// that can hold x (the select compiles to a conditional move / predicated op).  The CPU's
// lockstep searches (cpu/cpu_rows.h unlabeled_flags) take the same steps.
PNN_HD inline const int64_t* search_step(const int64_t* at, int64_t half, int64_t x) {
  return at[half] <= x ? at + half : at;
}

PNN_HD inline bool sorted_contains(const int64_t* sorted, int64_t n, int64_t x) {
  if (n <= 0) return false;
  while (n > 1) {
    const int64_t half = n >> 1;
    sorted = search_step(sorted, half, x);
    n -= half;
  }
  return *sorted == x;
}

// Row `row`'s span [first, first + count) of a CSR's indices (nnz of them), clamped into [0, nnz]:
// a broken indptr (a deferred input error, which the op records) never reads outside the indices.
PNN_HD inline void clamped_row_span(const int64_t* indptr, int64_t row, int64_t nnz, int64_t& first, int64_t& count) {
  const int64_t low = indptr[row] < 0 ? 0 : (indptr[row] > nnz ? nnz : indptr[row]);
  const int64_t high = indptr[row + 1] < low ? low : (indptr[row + 1] > nnz ? nnz : indptr[row + 1]);
  first = low;
  count = high - low;
}

// The rank-th (0-based) item id that is NOT in sorted[0:n] (a user's known items): uniform
// sampling of unknown items draws rank in [0, num_items - n) and maps it here.  The answer is
// rank + m, m = #{i : sorted[i] - i <= rank}; sorted[i] - i (the unknown ids below sorted[i]) is
// non-decreasing, so m is one binary search, branch-free as sorted_contains's: its steps depend on
// n alone, so the draws of one user take the same steps (lockstep on the CPU, no divergence in a warp).
// One step, with m known to lie in [at, at + n] and half = n / 2: the new start of that span, whose
// length becomes n - half (m > at + half when sorted[at + half] - (at + half) <= rank, else m <= at + half).
PNN_HD inline int64_t unknown_step(const int64_t* sorted, int64_t at, int64_t half, int64_t rank) {
  return sorted[at + half] - (at + half) <= rank ? at + half : at;
}

// m from the position `at` the steps ended on (n down to 1): m is at or at + 1.
PNN_HD inline int64_t unknown_from_last(const int64_t* sorted, int64_t at, int64_t rank) {
  return rank + at + (sorted[at] - at <= rank ? 1 : 0);
}

PNN_HD inline int64_t unknown_by_rank(const int64_t* sorted, int64_t n, int64_t rank) {
  if (n <= 0) return rank;
  int64_t at = 0;
  while (n > 1) {
    const int64_t half = n >> 1;
    at = unknown_step(sorted, at, half, rank);
    n -= half;
  }
  return unknown_from_last(sorted, at, rank);
}

// Rank among `free` items of a uniform draw u in [0, 1), as torch computes (u * free).long() in
// float32, clamped to free - 1 against the rounding of u * free up to free.  A bad draw (negative,
// NaN) gives rank 0, a position inside the row: the ops record it as a deferred input error.
PNN_HD inline int64_t rank_of_uniform(float u, int64_t free) {
  if (!(u > 0.0f)) return 0;
  const int64_t rank = static_cast<int64_t>(u * static_cast<float>(free));
  return rank < free - 1 ? rank : free - 1;
}

// Floyd's record of the positions taken so far, by a scan of those written: O(size) a lookup
// and no memory (the CUDA kernel's choice; the CPU keeps a bitmap, see history_sample_cpu.cpp).
struct ScannedPositions {
  PNN_HD bool contains(int64_t t, const int64_t* taken, int64_t count) const {
    for (int64_t m = 0; m < count; ++m) {
      if (taken[m] == t) return true;
    }
    return false;
  }
  PNN_HD void add(int64_t) {}
};

// Floyd's algorithm: `size` distinct positions of [0, n), every such subset equally likely, from
// `size` uniform draws u[i] in [0, 1) (all of [0, n) in order when n <= size).  Step i considers
// j = n - size + i and takes t = rank_of_uniform(u[i], j + 1), or j itself when t was taken at an
// earlier step (`seen`: contains(t, out, i) and add(t), any record of the taken positions).
// Writes min(n, size) positions to out[0..) and returns that count.
template <typename Seen>
PNN_HD inline int64_t floyd_positions(int64_t n, int64_t size, const float* u, int64_t* out, Seen& seen) {
  if (n <= size) {
    for (int64_t i = 0; i < n; ++i) out[i] = i;
    return n;
  }
  for (int64_t i = 0; i < size; ++i) {
    const int64_t j = n - size + i;
    int64_t t = rank_of_uniform(u[i], j + 1);
    if (seen.contains(t, out, i)) t = j;  // j itself is new: every earlier step took below j
    seen.add(t);
    out[i] = t;
  }
  return size;
}

// ---------------------------------------------------------------------------------------------
// The BPR pair term softplus(x), x = s_neg - s_pos, and its derivative from one exp, as torch
// computes them (F.softplus: x itself above the threshold 20, log1p(exp(x)) below).

template <typename acc_t>
struct SoftplusValueGrad {
  acc_t value, grad;
};

template <typename acc_t>
PNN_HD inline SoftplusValueGrad<acc_t> softplus_value_grad(acc_t x) {
  if (x > acc_t(20)) return {x, acc_t(1)};
  const acc_t e = exp_(x);
#ifdef __CUDA_ARCH__
  return {log1p(e), e / (acc_t(1) + e)};
#else
  return {std::log1p(e), e / (acc_t(1) + e)};
#endif
}

// One row b of embedding_bpr, for users_b's row u, pos_b's row p and the K rows neg[0..K) of
// item_table: returns sum_k softplus(x_bk) and writes coef[k] = softplus'(x_bk) / pairs.  With
// `squares` (RecBole's EmbLoss term), also adds |u|^2, |p|^2 and sum_k |n_k|^2 to squares[0..3).
template <typename acc_t, typename scalar_t>
PNN_HD inline acc_t bpr_row(const scalar_t* u, const scalar_t* p, const scalar_t* item_table, const int64_t* neg,
                            int64_t K, int64_t d, acc_t pairs, acc_t* coef, acc_t* squares) {
  const acc_t pos_score = dot_wide<acc_t>(u, p, d);
  acc_t sum = 0;
  for (int64_t k = 0; k < K; ++k) {
    const scalar_t* n = item_table + neg[k] * d;
    const auto term = softplus_value_grad(dot_wide<acc_t>(u, n, d) - pos_score);
    sum += term.value;
    coef[k] = term.grad / pairs;
    if (squares != nullptr) squares[2] += dot_wide<acc_t>(n, n, d);
  }
  if (squares != nullptr) {
    squares[0] += dot_wide<acc_t>(u, u, d);
    squares[1] += dot_wide<acc_t>(p, p, d);
  }
  return sum;
}

// d (reg_weight * norm / rows) / d row = scale * row for a row of the gathered matrix whose
// Frobenius norm is `norm`, times the upstream gradient: scale = grad * reg_weight / (rows * norm),
// and 0 at the origin (torch's norm backward).
template <typename acc_t>
PNN_HD inline acc_t norm_grad_scale(acc_t grad, acc_t reg_weight, int64_t rows, acc_t norm) {
  return norm > acc_t(0) ? grad * reg_weight / (acc_t(rows) * norm) : acc_t(0);
}

// ---------------------------------------------------------------------------------------------
// L_rank and L_constrain of one row from its class centroids (the class_terms op), as
// backends/reference.py's class_terms defines them:
//   rank       = valid ? softplus(<u, c_neu> - <u, p>) + [n_neg > 0] softplus(<u, c_neg> - <u, c_neu>) : 0
//   constrain  = valid && n_neg > 0 ? || z_pos * p / D(p) - z_neg * c_neg / D(c_neg) ||^2 : 0
// with D(x) = max(||x||, eps), F.normalize's denominator.  One row's inputs are d-vectors.

// F.normalize's eps (backends/rows.py's NORM_EPS)
constexpr double kNormEps = 1e-12;

template <typename scalar_t>
struct ClassTermsRow {
  const scalar_t* user;       // u
  const scalar_t* pos;        // p, the positive item's row
  const scalar_t* neutral;    // c_neu
  const scalar_t* negative;   // c_neg
  const scalar_t* noise_pos;  // z_pos
  const scalar_t* noise_neg;  // z_neg
  int64_t d;
  bool valid;                 // |U_b| > 0
  bool has_negative;          // n_neg > 0
};

// The row's three scores and the two norms that F.normalize divides by.
template <typename acc_t>
struct ClassTermsScores {
  acc_t pos, neutral, negative;  // <u, p>, <u, c_neu>, <u, c_neg>
  acc_t pos_norm, negative_norm;  // ||p||, ||c_neg||
};

// RowSum: SerialRowSum on the CPU, a warp's WarpRowSum on CUDA (every lane gets the totals).
template <typename acc_t, typename scalar_t, typename RowSum>
PNN_HD inline ClassTermsScores<acc_t> class_terms_scores(const ClassTermsRow<scalar_t>& r, RowSum sum) {
  const auto dot = [&](const scalar_t* a, const scalar_t* b) {
    return sum.template total<acc_t>(r.d, [=](int64_t k, acc_t acc) { return madd(acc_t(a[k]), acc_t(b[k]), acc); });
  };
  return {dot(r.user, r.pos), dot(r.user, r.neutral), dot(r.user, r.negative), sqrt_(dot(r.pos, r.pos)),
          sqrt_(dot(r.negative, r.negative))};
}

template <typename acc_t>
PNN_HD inline acc_t normalize_denominator(acc_t norm) {
  return norm > acc_t(kNormEps) ? norm : acc_t(kNormEps);
}

// The unit_rows op, y = x / D(x) row by row (F.normalize(x, dim=-1)), backward
//   dx = dy / D - [||x|| >= eps] x <dy, x> / D^3
// (D = ||x|| wherever the indicator is 1).  Both backends get a row's sums, ||x||^2 and <dy, x>,
// their own way (CPU: dot_wide; CUDA: a warp's lanes, then shuffles), then apply these.

// D, from the row's ||x||^2 (the kernels multiply by 1 / D where F.normalize divides: within an ulp)
template <typename acc_t>
PNN_HD inline acc_t unit_row_denominator(acc_t squared_norm) {
  return normalize_denominator(sqrt_(squared_norm));
}

template <typename acc_t>
struct UnitRowBackward {
  acc_t inv_denom;  // 1 / D
  acc_t radial;     // <dy, x> / D^3, or 0 below eps (clamp_min passes the gradient at the bound)
};

template <typename acc_t>
PNN_HD inline UnitRowBackward<acc_t> unit_row_backward(acc_t squared_norm, acc_t grad_dot_x) {
  const acc_t norm = sqrt_(squared_norm);
  const acc_t inv = acc_t(1) / normalize_denominator(norm);
  return {inv, norm >= acc_t(kNormEps) ? grad_dot_x * inv * inv * inv : acc_t(0)};
}

template <typename acc_t>
PNN_HD_FORCE_INLINE acc_t unit_row_grad_entry(const UnitRowBackward<acc_t>& c, acc_t dy, acc_t x) {
  return dy * c.inv_denom - c.radial * x;
}

// gathered_dots with unit_table: y = <r, v / D(v)> for a gathered table row v, so that a cosine needs
// no unit copy of the table (a table-sized pass each way).  Forward y = <r, v> / D, keeping ||v||^2.
// Backward, given dy: dr = dy v / D, and dv is unit_rows' backward of the unit row's gradient dy r,
// whose <., v> is dy <r, v> = dy y D; so from the forward's y and ||v||^2 alone,
//   dr += scale v,   dv = scale r - radial v.
template <typename acc_t>
PNN_HD inline acc_t unit_dot(acc_t dot_rv, acc_t squared_norm) {
  return dot_rv * (acc_t(1) / unit_row_denominator(squared_norm));
}

template <typename acc_t>
struct UnitDotBackward {
  acc_t scale;   // dy / D
  acc_t radial;  // dy y / D^2, or 0 below eps (as unit_row_backward's)
};

template <typename acc_t>
PNN_HD inline UnitDotBackward<acc_t> unit_dot_backward(acc_t dy, acc_t y, acc_t squared_norm) {
  const acc_t norm = sqrt_(squared_norm);
  const acc_t inv = acc_t(1) / normalize_denominator(norm);
  return {dy * inv, norm >= acc_t(kNormEps) ? dy * y * inv * inv : acc_t(0)};
}

// Entry k of the clamp gap z_pos * p / D(p) - z_neg * c_neg / D(c_neg), given 1 / D(p) and 1 / D(c_neg)
// (a multiplication where F.normalize divides: within an ulp, and a division per entry was most of
// the op's time).
template <typename acc_t, typename scalar_t>
PNN_HD_FORCE_INLINE acc_t clamp_gap(const ClassTermsRow<scalar_t>& r, int64_t k, acc_t inv_pos_denom,
                                    acc_t inv_neg_denom) {
  return acc_t(r.noise_pos[k]) * (acc_t(r.pos[k]) * inv_pos_denom) -
         acc_t(r.noise_neg[k]) * (acc_t(r.negative[k]) * inv_neg_denom);
}

// One call's [B, d] inputs (contiguous) and [B] row flags, as raw pointers for both backends.
template <typename scalar_t>
struct ClassTermsBatch {
  const scalar_t *user, *pos, *neutral, *negative, *noise_pos, *noise_neg;
  const bool* valid;
  const int64_t* num_negative;
  int64_t rows, d;

  PNN_HD ClassTermsRow<scalar_t> row(int64_t b) const {
    const int64_t at = b * d;
    return {user + at, pos + at, neutral + at, negative + at, noise_pos + at, noise_neg + at, d, valid[b],
            num_negative[b] > 0};
  }
};

template <typename acc_t, typename scalar_t, typename RowSum>
PNN_HD inline void class_terms_row(const ClassTermsRow<scalar_t>& r, RowSum sum, acc_t& rank, acc_t& constrain) {
  rank = constrain = acc_t(0);
  if (!r.valid) return;
  const ClassTermsScores<acc_t> s = class_terms_scores<acc_t>(r, sum);
  rank = softplus_value_grad(s.neutral - s.pos).value;
  if (!r.has_negative) return;
  rank += softplus_value_grad(s.negative - s.neutral).value;
  const acc_t inv_pos = acc_t(1) / normalize_denominator(s.pos_norm);
  const acc_t inv_neg = acc_t(1) / normalize_denominator(s.negative_norm);
  constrain = sum.template total<acc_t>(r.d, [&](int64_t k, acc_t acc) {
    const acc_t gap = clamp_gap(r, k, inv_pos, inv_neg);
    return madd(gap, gap, acc);
  });
}

// The gradients of grad_rank * rank + grad_constrain * constrain w.r.t. u, p, c_neu and c_neg,
// written (not added) to the d-vectors grad_*, which alias nothing else.  F.normalize's backward,
// for y = x / D(x): dx = dy / D - [||x|| >= eps] x <dy, x> / (D^2 ||x||) (clamp_min passes the
// gradient at the bound).  A whole row (the validity and class flags) takes one branch, so a
// warp's lanes stay together.
template <typename acc_t, typename scalar_t, typename RowSum, typename out_t>
PNN_HD inline void class_terms_row_backward(const ClassTermsRow<scalar_t>& r, RowSum sum, acc_t grad_rank,
                                            acc_t grad_constrain, out_t* __restrict__ grad_user,
                                            out_t* __restrict__ grad_pos, out_t* __restrict__ grad_neutral,
                                            out_t* __restrict__ grad_negative) {
  if (!r.valid) {
    for (int64_t k = sum.first(); k < r.d; k += sum.stride) {
      grad_user[k] = grad_pos[k] = grad_neutral[k] = grad_negative[k] = out_t(0);
    }
    return;
  }
  const ClassTermsScores<acc_t> s = class_terms_scores<acc_t>(r, sum);
  // d rank / d of the three scores, times grad_rank
  const acc_t first = softplus_value_grad(s.neutral - s.pos).grad;
  const acc_t second = r.has_negative ? softplus_value_grad(s.negative - s.neutral).grad : acc_t(0);
  const acc_t d_pos = -grad_rank * first, d_neutral = grad_rank * (first - second), d_negative = grad_rank * second;
  // the clamp term: d constrain / d (p / D(p)) = 2 g z_pos gap, d / d (c_neg / D(c_neg)) = -2 g z_neg gap,
  // and the projections <dy, x> of the normalize backward
  const acc_t inv_pos = acc_t(1) / normalize_denominator(s.pos_norm);
  const acc_t inv_neg = acc_t(1) / normalize_denominator(s.negative_norm);
  const acc_t twice = acc_t(2) * (r.has_negative ? grad_constrain : acc_t(0));
  acc_t pos_projection = 0, neg_projection = 0;
  if (r.has_negative) {
    pos_projection = sum.template total<acc_t>(r.d, [&](int64_t k, acc_t acc) {
      return acc + twice * acc_t(r.noise_pos[k]) * clamp_gap(r, k, inv_pos, inv_neg) * acc_t(r.pos[k]);
    });
    neg_projection = -sum.template total<acc_t>(r.d, [&](int64_t k, acc_t acc) {
      return acc + twice * acc_t(r.noise_neg[k]) * clamp_gap(r, k, inv_pos, inv_neg) * acc_t(r.negative[k]);
    });
  }
  // <dy, x> / (D^2 ||x||) = <dy, x> / D^3 where ||x|| >= eps (then D = ||x||)
  const acc_t pos_radial = s.pos_norm >= acc_t(kNormEps) ? pos_projection * inv_pos * inv_pos * inv_pos : acc_t(0);
  const acc_t neg_radial = s.negative_norm >= acc_t(kNormEps) ? neg_projection * inv_neg * inv_neg * inv_neg : acc_t(0);
  // without a negative class `twice` is 0, so the gap drops out (no branch: the loop vectorises)
  for (int64_t k = sum.first(); k < r.d; k += sum.stride) {
    const acc_t u = acc_t(r.user[k]), p = acc_t(r.pos[k]), c_neg = acc_t(r.negative[k]);
    const acc_t gap = clamp_gap(r, k, inv_pos, inv_neg);
    const acc_t d_unit_pos = twice * acc_t(r.noise_pos[k]) * gap, d_unit_neg = -twice * acc_t(r.noise_neg[k]) * gap;
    grad_user[k] = out_t(d_pos * p + d_neutral * acc_t(r.neutral[k]) + d_negative * c_neg);
    grad_pos[k] = out_t(d_pos * u + d_unit_pos * inv_pos - pos_radial * p);
    grad_neutral[k] = out_t(d_neutral * u);
    grad_negative[k] = out_t(d_negative * u + d_unit_neg * inv_neg - neg_radial * c_neg);
  }
}

// ---------------------------------------------------------------------------------------------
// Total order of scores.  Scores map to unsigned keys whose integer order is the order of
// torch.sort: -0.0 equals +0.0 and every NaN is one value above +inf.  Key 0 is never produced
// (it would be a negative NaN, and NaNs are canonicalised), so kExcludedKey marks candidates
// that are not in the unlabeled set.

template <typename acc_t>
struct KeyOf;
template <>
struct KeyOf<float> {
  using type = uint32_t;
};
template <>
struct KeyOf<double> {
  using type = uint64_t;
};

template <typename key_t>
struct KeyBits {
  static constexpr int value = 8 * static_cast<int>(sizeof(key_t));
};

constexpr uint32_t kExcludedKey = 0;

// Branch-free integer selects only (no floating-point compares, whose NaN handling compiles to
// branches), so that CPU loops over candidates vectorise and do not mispredict on the sign of
// the score.  |s| == 0 and |s| > inf (NaN) are read off the magnitude bits.
PNN_HD inline uint32_t order_key(float s) {
  uint32_t bits;
#ifdef __CUDA_ARCH__
  bits = __float_as_uint(s);
#else
  std::memcpy(&bits, &s, sizeof bits);
#endif
  const uint32_t magnitude = bits & 0x7FFFFFFFu;
  bits = magnitude == 0u ? 0u : bits;  // -0.0 -> +0.0
  const uint32_t flip = static_cast<uint32_t>(static_cast<int32_t>(bits) >> 31) | 0x80000000u;
  return magnitude > 0x7F800000u ? 0xFFFFFFFFu : bits ^ flip;  // negative: ~bits, positive: bits | sign
}

PNN_HD inline uint64_t order_key(double s) {
  uint64_t bits;
#ifdef __CUDA_ARCH__
  bits = static_cast<uint64_t>(__double_as_longlong(s));
#else
  std::memcpy(&bits, &s, sizeof bits);
#endif
  const uint64_t magnitude = bits & 0x7FFFFFFFFFFFFFFFull;
  bits = magnitude == 0ull ? 0ull : bits;
  const uint64_t flip = static_cast<uint64_t>(static_cast<int64_t>(bits) >> 63) | 0x8000000000000000ull;
  return magnitude > 0x7FF0000000000000ull ? ~0ull : bits ^ flip;
}

// Inverse of order_key on its image.
template <typename acc_t>
PNN_HD inline acc_t key_to_score(typename KeyOf<acc_t>::type key) {
  using key_t = typename KeyOf<acc_t>::type;
  constexpr key_t sign = key_t(1) << (KeyBits<key_t>::value - 1);
  const key_t bits = (key & sign) ? (key & ~sign) : ~key;
  acc_t s;
#ifdef __CUDA_ARCH__
  if constexpr (sizeof(acc_t) == 4) {
    s = __uint_as_float(static_cast<unsigned int>(bits));
  } else {
    s = __longlong_as_double(static_cast<long long>(bits));
  }
#else
  std::memcpy(&s, &bits, sizeof s);
#endif
  return s;
}

// The hard negative is the largest key, the smallest j among equal keys; j < 0 means "none".
template <typename key_t>
PNN_HD inline bool hard_better(key_t key_a, int64_t j_a, key_t key_b, int64_t j_b) {
  return j_a >= 0 && (j_b < 0 || key_a > key_b || (key_a == key_b && j_a < j_b));
}

// ---------------------------------------------------------------------------------------------
// Bottom-k selection state.  The k lowest (key, j) pairs of a row's unlabeled candidates are
// exactly those <= (threshold key, cutoff) in lexicographic order, so two numbers per row let
// any later pass recompute the negative class.  cutoff < 0 encodes an empty class (k = 0).

template <typename key_t>
PNN_HD inline bool in_bottom_k(key_t key, int64_t j, key_t threshold_key, int64_t cutoff) {
  return cutoff >= 0 && (key < threshold_key || (key == threshold_key && j <= cutoff));
}

enum RowClass : int8_t { kNotUnlabeled = 0, kNeutral = 1, kNegative = 2 };

// Class of candidate j from its key (kExcludedKey outside U_b) and the row's bottom-k state.
template <typename key_t>
PNN_HD inline RowClass classify_key(key_t key, int64_t j, key_t threshold_key, int64_t cutoff) {
  if (key == key_t(kExcludedKey)) return kNotUnlabeled;
  return in_bottom_k(key, j, threshold_key, cutoff) ? kNegative : kNeutral;
}

// How class_centroids forms a row's two class sums.  With a shared candidate list most candidates
// of a row are in U_b, so the larger class is summed by difference: all candidates minus the
// labeled ones minus the smaller class, O(labeled + smaller class) d-vectors a row instead of
// O(C).  Rows whose labeled candidates outnumber U_b, and per-row lists, sum both classes directly.
struct RowPlan {
  bool by_difference;  // larger class = all candidates - labeled - smaller class
  RowClass smaller;    // the class summed directly when by_difference
  RowClass larger;
};

PNN_HD inline RowPlan plan_row(bool shared, int64_t num_candidates, int64_t num_neutral, int64_t num_negative) {
  const int64_t unlabeled = num_neutral + num_negative;
  const RowClass smaller = num_negative <= num_neutral ? kNegative : kNeutral;
  return {shared && num_candidates - unlabeled <= unlabeled, smaller, smaller == kNegative ? kNeutral : kNegative};
}
// Radix select, most significant digit first: each pass histograms the digit at `shift` of the
// keys that match the digits chosen so far, then picks the digit holding the rank-th key.
constexpr int kRadixBits = 8;
constexpr int kRadixSize = 1 << kRadixBits;

template <typename key_t>
PNN_HD inline int radix_digit(key_t key, int shift) {
  return static_cast<int>((key >> shift) & key_t(kRadixSize - 1));
}

// Whether `key` agrees with `prefix` on every digit above `shift` (all keys do on the first pass).
template <typename key_t>
PNN_HD inline bool radix_prefix_matches(key_t key, key_t prefix, int shift) {
  const int high = shift + kRadixBits;
  return high >= KeyBits<key_t>::value || (key >> high) == (prefix >> high);
}

// Digit of the rank-th (1-based) key of the histogram; `rank` becomes its rank within that digit.
template <typename count_t>
PNN_HD inline int radix_pick(const count_t* histogram, int64_t& rank) {
  int digit = 0;
  while (digit < kRadixSize - 1 && rank > static_cast<int64_t>(histogram[digit])) {
    rank -= static_cast<int64_t>(histogram[digit]);
    ++digit;
  }
  return digit;
}

// ---------------------------------------------------------------------------------------------
// Log-sum-exp in the streaming form (max, sum of exp(x - max)); the empty set is (-inf, 0).

template <typename acc_t>
struct LogSumExp {
  acc_t max;
  acc_t sum;
};

template <typename acc_t>
PNN_HD inline LogSumExp<acc_t> lse_empty() {
  return {neg_infinity<acc_t>(), acc_t(0)};
}

template <typename acc_t>
PNN_HD inline LogSumExp<acc_t> lse_merge(LogSumExp<acc_t> a, LogSumExp<acc_t> b) {
  if (b.max == neg_infinity<acc_t>()) return a;  // exp(-inf) = 0, and -inf - (-inf) would be NaN
  if (a.max == neg_infinity<acc_t>()) return b;
  if (a.max < b.max) {
    const LogSumExp<acc_t> tmp = a;
    a = b;
    b = tmp;
  }
  return {a.max, a.sum + b.sum * exp_(b.max - a.max)};
}

// Adds the term exp(x), x a logit.
template <typename acc_t>
PNN_HD inline void lse_add(LogSumExp<acc_t>& state, acc_t x) {
  state = lse_merge(state, LogSumExp<acc_t>{x, acc_t(1)});
}

template <typename acc_t>
PNN_HD inline acc_t lse_value(LogSumExp<acc_t> state) {
  return state.max + log_(state.sum);
}

// masked_logsumexp: lse_b = log sum_{j not excluded} exp(l_bj), l_bj = scale x_bj - shift_j (the log
// of a softmax's denominator over each row's negatives or over one pool that the rows share; shift,
// the logQ correction, may be absent).  Backward: dx_bj = dy_b scale exp(l_bj - lse_b) for the
// entries not excluded, 0 for the others.  Both backends take a row's largest logit first, then
// sum exp(l - largest), as torch.logsumexp does.

// Entry j's logit when kept, given its shift (0 without one).
template <typename acc_t, typename scalar_t>
PNN_HD_FORCE_INLINE acc_t kept_logit(scalar_t x, acc_t scale, acc_t shift) {
  return scale * acc_t(x) - shift;
}

// Entry j's logit, -inf when excluded (a term of 0 in the sum, never the largest).
template <typename acc_t, typename scalar_t>
PNN_HD_FORCE_INLINE acc_t masked_logit(scalar_t x, acc_t scale, const scalar_t* shift, int64_t j, bool excluded) {
  return excluded ? neg_infinity<acc_t>() : kept_logit(x, scale, shift ? acc_t(shift[j]) : acc_t(0));
}

// What a row's logits are offset by before their exponentials: the largest, unless it is infinite
// (then 0: a row of -inf sums zeros, or a NaN that the result keeps).
template <typename acc_t>
PNN_HD_FORCE_INLINE acc_t lse_offset(acc_t largest) {
  return largest == neg_infinity<acc_t>() || largest == -neg_infinity<acc_t>() ? acc_t(0) : largest;
}

// The row's lse from its largest logit and sum_j exp(l_j - lse_offset(largest)): -inf for a row
// with nothing left, NaN for a row that met a NaN, +inf for a row holding +inf (as torch.logsumexp).
template <typename acc_t>
PNN_HD inline acc_t masked_lse(acc_t largest, acc_t sum) {
  if (largest == -neg_infinity<acc_t>()) return largest;
  if (largest == neg_infinity<acc_t>()) return largest + sum;  // -inf, or NaN from a NaN term
  return largest + log_(sum);
}

// ---------------------------------------------------------------------------------------------
// One call's inputs as raw pointers (all contiguous, ids int64) and the per-row view of them.

template <typename scalar_t>
struct RowBatch {
  const scalar_t* user_emb;      // [B, d]
  const scalar_t* item_table;    // [I, d]
  const int64_t* users;          // [B]
  const int64_t* pos_items;      // [B]
  const int64_t* candidates;     // [C] shared by all rows, or [B, C]
  const int64_t* known_indptr;   // [num_users + 1]
  const int64_t* known_indices;  // [nnz]
  int64_t num_rows;              // B
  int64_t num_candidates;        // C
  int64_t dim;                   // d
  int64_t candidate_row_stride;  // 0 for shared candidates, C for per-row candidates
  int64_t num_users;             // ids are trusted by the row view: callers check or assert them
  int64_t num_items;
};

template <typename scalar_t, typename acc_t>
struct Row {
  using key_t = typename KeyOf<acc_t>::type;

  const scalar_t* user;
  const scalar_t* item_table;
  const int64_t* candidates;
  const int64_t* known;
  int64_t num_known;
  int64_t pos_item;
  int64_t dim;

  Row() = default;  // an empty view, assigned before use
  PNN_HD Row(const RowBatch<scalar_t>& batch, int64_t b)
      : user(batch.user_emb + b * batch.dim),
        item_table(batch.item_table),
        candidates(batch.candidates + b * batch.candidate_row_stride),
        known(batch.known_indices + batch.known_indptr[batch.users[b]]),
        num_known(batch.known_indptr[batch.users[b] + 1] - batch.known_indptr[batch.users[b]]),
        pos_item(batch.pos_items[b]),
        dim(batch.dim) {}

  PNN_HD int64_t item(int64_t j) const { return candidates[j]; }
  PNN_HD const scalar_t* embedding(int64_t j) const { return item_table + item(j) * dim; }

  // j is in U_b: neither the row's own positive nor a known positive of its user.
  PNN_HD bool unlabeled(int64_t j) const {
    const int64_t it = item(j);
    return it != pos_item && !sorted_contains(known, num_known, it);
  }

  // order_key of candidate j's score for members of U_b, kExcludedKey for the others.
  PNN_HD key_t key(int64_t j, acc_t score) const {
    return unlabeled(j) ? order_key(score) : key_t(kExcludedKey);
  }
};

}  // namespace pnn_fast
