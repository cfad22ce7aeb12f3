// SIMD evaluation of the score / distance chains of pnn_rows.h for many vectors at once.
//
// Vectors are stored transposed in tiles of kTile, so one SIMD register holds element k of
// several vectors and each lane runs exactly the scalar chain acc = term(a_k, v_k, acc), one
// fused multiply-add per step as on CUDA: the result does not depend on the lane, the tile, the
// instruction set or the backend, only the speed does.  x86-64 builds pick AVX-512 (for several
// query vectors per pass) or AVX2 + FMA at run time when the CPU has them (simd_level); everything
// else uses 16-byte vectors with a per-lane std::fma (one instruction on AArch64; a slow but exact
// library call on x86 without FMA).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#include "common/pnn_rows.h"

#if defined(__GNUC__) || defined(__clang__)
#define PNN_SIMD_VECTORS 1
#if defined(__x86_64__) || defined(__i386__)
#define PNN_SIMD_AVX2_DISPATCH 1
#endif
#endif

namespace pnn_fast {

// The widest instruction set the CPU kernels use: the CPU's, capped by the environment variable
// PNN_FAST_SIMD_LEVEL ("avx2" or "baseline", the build's own), so that one machine can run every
// variant (tests/test_simd_variants.py compares their bits).  ATEN_CPU_CAPABILITY would also switch
// ATen's own kernels, whose reductions then round differently.  Read once.
enum SimdLevel : int { kSimdBaseline = 0, kSimdAvx2 = 1, kSimdAvx512 = 2 };

inline SimdLevel simd_level() {
  static const SimdLevel level = [] {
    SimdLevel found = kSimdBaseline;
#ifdef PNN_SIMD_AVX2_DISPATCH
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
      found = __builtin_cpu_supports("avx512f") ? kSimdAvx512 : kSimdAvx2;
    }
#endif
    const char* cap = std::getenv("PNN_FAST_SIMD_LEVEL");
    if (cap != nullptr && std::strcmp(cap, "baseline") == 0) found = kSimdBaseline;
    if (cap != nullptr && std::strcmp(cap, "avx2") == 0) found = std::min(found, kSimdAvx2);
    return found;
  }();
  return level;
}

// Vectors per tile (lanes evaluated together): 8 independent AVX2 accumulators, enough chains
// in flight to keep both FMA ports busy despite the 4-cycle latency of each step.
constexpr int64_t kTile = 64;

#ifdef PNN_SIMD_VECTORS
#define PNN_ALWAYS_INLINE __attribute__((always_inline)) inline
#else
#define PNN_ALWAYS_INLINE inline
#endif

// The fused multiply-add of a chain step on kBytes-wide vectors (or scalars in a scalar build).
template <int kBytes>
struct VectorFma {
  template <typename V>
  PNN_ALWAYS_INLINE V operator()(V a, V b, V c) const {
    if constexpr (std::is_arithmetic_v<V>) {
      return std::fma(a, b, c);
    } else {
      using lane_t = std::remove_reference_t<decltype(a[0])>;
#ifdef PNN_SIMD_AVX2_DISPATCH
      if constexpr (kBytes == 32 && sizeof(lane_t) == 4) return __builtin_ia32_vfmaddps256(a, b, c);
      if constexpr (kBytes == 32 && sizeof(lane_t) == 8) return __builtin_ia32_vfmaddpd256(a, b, c);
      // all lanes (mask of ones), the current rounding mode (_MM_FROUND_CUR_DIRECTION)
      if constexpr (kBytes == 64 && sizeof(lane_t) == 4) return __builtin_ia32_vfmaddps512_mask(a, b, c, 0xFFFF, 4);
      if constexpr (kBytes == 64 && sizeof(lane_t) == 8) return __builtin_ia32_vfmaddpd512_mask(a, b, c, 0xFF, 4);
#endif
      for (int lane = 0; lane < kBytes / static_cast<int>(sizeof(lane_t)); ++lane) a[lane] = std::fma(a[lane], b[lane], c[lane]);
      return a;
    }
  }
};

// A last tile with at most this many vectors is evaluated on its first kShortLanes lanes only: a
// row of a few sampled candidates would otherwise pay for 64 lanes (and their zeroing) to use 8.
constexpr int64_t kShortLanes = 8;

// out[r][j] for each of kRows vectors a[r] and the first kLanes lanes j of the tiles
// [tile_begin, tile_end) of `tiles` (d x kTile values per tile), with kBytes-wide vectors (kBytes =
// sizeof(acc_t): scalar code).  A pass covers kVecs vectors of lanes of a tile, kRows * kVecs
// accumulators in registers.  Several rows per pass share each tile value loaded, so the tiles
// stream from cache kRows times less often (one row at a time, the loads, not the multiply-adds,
// bound the chains).  Every lane runs the same chain whatever kRows, kVecs and kBytes are, so the
// results are the same bits.
template <int kBytes, int64_t kLanes, int64_t kRows, int64_t kVecs, typename acc_t, typename Term>
PNN_ALWAYS_INLINE void tile_chains(const acc_t* const* a, const acc_t* tiles, int64_t d, int64_t tile_begin,
                                   int64_t tile_end, Term term, acc_t* const* out) {
#ifdef PNN_SIMD_VECTORS
  typedef acc_t vec __attribute__((vector_size(kBytes)));
#else
  static_assert(kBytes == sizeof(acc_t), "scalar build");
  using vec = acc_t;
#endif
  constexpr int64_t width = kBytes / static_cast<int64_t>(sizeof(acc_t));
  constexpr int64_t pass_lanes = kVecs * width;
  static_assert(kLanes % pass_lanes == 0 && kLanes <= kTile, "whole passes over the lanes evaluated");
  for (int64_t tile = tile_begin; tile < tile_end; ++tile) {
    for (int64_t lane0 = 0; lane0 < kLanes; lane0 += pass_lanes) {
      const acc_t* t = tiles + tile * d * kTile + lane0;
      vec acc[kRows][kVecs] = {};
      for (int64_t k = 0; k < d; ++k) {
        vec ak[kRows];
        for (int64_t r = 0; r < kRows; ++r) {
          ak[r] = vec{};
          ak[r] += a[r][k];  // broadcast
        }
        for (int64_t q = 0; q < kVecs; ++q) {
          vec x;
          std::memcpy(&x, t + k * kTile + q * width, sizeof x);
          for (int64_t r = 0; r < kRows; ++r) acc[r][q] = term(ak[r], x, acc[r][q], VectorFma<kBytes>{});
        }
      }
      for (int64_t r = 0; r < kRows; ++r) std::memcpy(out[r] + tile * kTile + lane0, acc[r], sizeof acc[r]);
    }
  }
}

// One row's tile_chains, all kLanes lanes in one pass.
template <int kBytes, int64_t kLanes, typename acc_t, typename Term>
PNN_ALWAYS_INLINE void row_tile_chains(const acc_t* a, const acc_t* tiles, int64_t d, int64_t tile_begin,
                                       int64_t tile_end, Term term, acc_t* out) {
  constexpr int64_t width = kBytes / static_cast<int64_t>(sizeof(acc_t));
  tile_chains<kBytes, kLanes, 1, kLanes / width>(&a, tiles, d, tile_begin, tile_end, term, &out);
}

#ifdef PNN_SIMD_AVX2_DISPATCH
template <int64_t kLanes, typename acc_t, typename Term>
__attribute__((target("avx2,fma"))) void tile_chains_avx2(const acc_t* a, const acc_t* tiles, int64_t d,
                                                      int64_t tile_begin, int64_t tile_end, Term term, acc_t* out) {
  row_tile_chains<32, kLanes>(a, tiles, d, tile_begin, tile_end, term, out);
}
#endif

template <int64_t kLanes, typename acc_t, typename Term>
void tile_chains_dispatch(const acc_t* a, const acc_t* tiles, int64_t d, int64_t tile_begin, int64_t tile_end,
                          Term term, acc_t* out) {
  if (tile_begin >= tile_end) return;
#ifdef PNN_SIMD_AVX2_DISPATCH
  if (simd_level() >= kSimdAvx2) return tile_chains_avx2<kLanes>(a, tiles, d, tile_begin, tile_end, term, out);
#endif
#ifdef PNN_SIMD_VECTORS
  row_tile_chains<16, kLanes>(a, tiles, d, tile_begin, tile_end, term, out);
#else
  row_tile_chains<sizeof(acc_t), kLanes>(a, tiles, d, tile_begin, tile_end, term, out);
#endif
}

#ifdef PNN_SIMD_AVX2_DISPATCH
// 32 registers of 64 bytes: 4 rows x 4 vectors of accumulators
template <typename acc_t, typename Term>
__attribute__((target("avx512f"))) void tile_chains_rows_avx512(const acc_t* const* a, const acc_t* tiles, int64_t d,
                                                               int64_t tile_begin, int64_t tile_end, Term term,
                                                               acc_t* const* out) {
  tile_chains<64, kTile, 4, 4>(a, tiles, d, tile_begin, tile_end, term, out);
}

// 16 registers of 32 bytes: 2 rows x 4 vectors
template <typename acc_t, typename Term>
__attribute__((target("avx2,fma"))) void tile_chains_rows_avx2(const acc_t* const* a, const acc_t* tiles, int64_t d,
                                                              int64_t tile_begin, int64_t tile_end, Term term,
                                                              acc_t* const* out) {
  tile_chains<32, kTile, 2, 4>(a, tiles, d, tile_begin, tile_end, term, out);
}
#endif

// tile_chains over the first rows of a[0, rows) in groups of the widest instruction set's row
// count, every lane of each tile; returns how many rows it did (the rest, fewer than a group, are
// left to tile_chains_dispatch).
template <typename acc_t, typename Term>
int64_t tile_chains_rows_dispatch(const acc_t* const* a, int64_t rows, const acc_t* tiles, int64_t d,
                                  int64_t tile_begin, int64_t tile_end, Term term, acc_t* const* out) {
  int64_t r = 0;
#ifdef PNN_SIMD_AVX2_DISPATCH
  if (simd_level() == kSimdAvx512) {
    for (; r + 4 <= rows; r += 4) tile_chains_rows_avx512(a + r, tiles, d, tile_begin, tile_end, term, out + r);
    return r;
  }
  if (simd_level() == kSimdAvx2) {
    for (; r + 2 <= rows; r += 2) tile_chains_rows_avx2(a + r, tiles, d, tile_begin, tile_end, term, out + r);
    return r;
  }
#endif
#ifdef PNN_SIMD_VECTORS
  for (; r + 2 <= rows; r += 2) tile_chains<16, kTile, 2, 4>(a + r, tiles, d, tile_begin, tile_end, term, out + r);
#endif
  return r;
}

// Runs body(), compiled for AVX-512 or AVX2 on CPUs that have them (simd_level()) and for the build's
// baseline (SSE2 on x86-64) elsewhere: body must be a lambda marked PNN_INLINE_LAMBDA, so that it is
// inlined into each caller and its loops vectorise with that caller's instruction set.  Only for loops
// whose results do not depend on the vector width: element-wise multiplies and adds in a fixed order
// (-ffp-contract=off: no FMA even where AVX-512 has it), so every variant gives the same bits.
#ifdef PNN_SIMD_VECTORS
#define PNN_INLINE_LAMBDA __attribute__((always_inline))
#else
#define PNN_INLINE_LAMBDA
#endif

#ifdef PNN_SIMD_AVX2_DISPATCH
template <typename Body>
__attribute__((target("avx2"))) void run_avx2(const Body& body) {
  body();
}

template <typename Body>
__attribute__((target("avx512f"))) void run_avx512(const Body& body) {
  body();
}
#endif

template <typename Body>
void run_widest(const Body& body) {
#ifdef PNN_SIMD_AVX2_DISPATCH
  if (simd_level() == kSimdAvx512) return run_avx512(body);
  if (simd_level() == kSimdAvx2) return run_avx2(body);
#endif
  body();
}

// A set of vectors of length d in acc_t, transposed in tiles of kTile: element k of vector j
// is at ((j / kTile) * d + k) * kTile + j % kTile; the padding of the last tile is zero.
template <typename acc_t>
class TiledVectors {
 public:
  // Vector j := table[ids[j]] (or table[j] when ids is null), for j < count; table is [*, d].
  // Only the padding lanes that lane_sums evaluates are zeroed: a load per row of a few sampled
  // candidates must not clear a whole tile.
  template <typename scalar_t>
  void load(const scalar_t* table, const int64_t* ids, int64_t count, int64_t d) {
    dim_ = d;
    tiles_ = (count + kTile - 1) / kTile;
    const int64_t last = count - (tiles_ - 1) * kTile;  // vectors in the last tile
    short_last_ = tiles_ > 0 && last <= kShortLanes;
    data_.resize(tiles_ * d * kTile);
    if (tiles_ > 0) {
      acc_t* tile = data_.data() + (tiles_ - 1) * d * kTile;
      const int64_t evaluated = short_last_ ? kShortLanes : kTile;
      for (int64_t k = 0; k < d; ++k) std::fill(tile + k * kTile + last, tile + k * kTile + evaluated, acc_t(0));
    }
    for (int64_t j = 0; j < count; ++j) {
      const scalar_t* v = table + (ids != nullptr ? ids[j] : j) * d;
      acc_t* dst = data_.data() + (j / kTile) * d * kTile + j % kTile;
      for (int64_t k = 0; k < d; ++k) dst[k * kTile] = acc_t(v[k]);
    }
  }

  // Entries of the `out` buffer of lane_sums.
  int64_t padded_count() const { return tiles_ * kTile; }

  // out[j] = the chain acc = term(a[k], v_j[k], acc), k = 0..d-1, from acc = 0 (the chain of
  // pnn_fast::sequential_sum), for every vector j >= first (and some before it, from the start of
  // its tile); the padding entries of `out` past the last vector are unspecified.
  template <typename Term>
  void lane_sums(const acc_t* a, Term term, acc_t* out, int64_t first = 0) const {
    const int64_t full = tiles_ - (short_last_ ? 1 : 0);
    tile_chains_dispatch<kTile>(a, data_.data(), dim_, first / kTile, full, term, out);
    if (short_last_) tile_chains_dispatch<kShortLanes>(a, data_.data(), dim_, tiles_ - 1, tiles_, term, out);
  }

  // lane_sums for each of rows vectors a[r], into out[r]: the same values, several rows per pass
  // over the tiles (tile_chains_rows_dispatch).
  template <typename Term>
  void lane_sums_rows(const acc_t* const* a, int64_t rows, Term term, acc_t* const* out, int64_t first = 0) const {
    const int64_t full = tiles_ - (short_last_ ? 1 : 0), tile_begin = first / kTile;
    int64_t r = 0;
    if (tile_begin < full) r = tile_chains_rows_dispatch(a, rows, data_.data(), dim_, tile_begin, full, term, out);
    for (; r < rows; ++r) tile_chains_dispatch<kTile>(a[r], data_.data(), dim_, tile_begin, full, term, out[r]);
    if (!short_last_) return;
    for (r = 0; r < rows; ++r) tile_chains_dispatch<kShortLanes>(a[r], data_.data(), dim_, tiles_ - 1, tiles_, term, out[r]);
  }

 private:
  std::vector<acc_t> data_;
  int64_t dim_ = 0;
  int64_t tiles_ = 0;
  bool short_last_ = false;  // the last tile holds at most kShortLanes vectors
};

// Lanes of a fixed width for the row reductions below: every instruction set adds in the same order.
constexpr int64_t kSumLanes = 16;

// sum_j v[j] over kSumLanes lanes, then the tail, then the lanes in order (inlined into the
// run_widest bodies, so that it vectorises with their instruction set).
template <typename acc_t>
inline __attribute__((always_inline)) acc_t lane_sum(const acc_t* v, int64_t n) {
  acc_t lanes[kSumLanes] = {};
  int64_t j = 0;
  for (; j + kSumLanes <= n; j += kSumLanes) {
    for (int64_t l = 0; l < kSumLanes; ++l) lanes[l] += v[j + l];
  }
  acc_t sum = 0;
  for (; j < n; ++j) sum += v[j];
  for (int64_t l = 0; l < kSumLanes; ++l) sum += lanes[l];
  return sum;
}

// max_j v[j] (-inf for none; a max is exact in any order).
template <typename acc_t>
inline __attribute__((always_inline)) acc_t lane_max(const acc_t* v, int64_t n) {
  acc_t lanes[kSumLanes];
  for (int64_t l = 0; l < kSumLanes; ++l) lanes[l] = neg_infinity<acc_t>();
  int64_t j = 0;
  for (; j + kSumLanes <= n; j += kSumLanes) {
    for (int64_t l = 0; l < kSumLanes; ++l) lanes[l] = v[j + l] > lanes[l] ? v[j + l] : lanes[l];
  }
  acc_t best = neg_infinity<acc_t>();
  for (; j < n; ++j) best = v[j] > best ? v[j] : best;
  for (int64_t l = 0; l < kSumLanes; ++l) best = lanes[l] > best ? lanes[l] : best;
  return best;
}

}  // namespace pnn_fast
