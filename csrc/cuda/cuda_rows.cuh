// CUDA thread mapping of the per-row kernels: one block of kThreads threads per row.  The math is
// pnn_rows.h (shared with the CPU kernels); this file only distributes it over threads.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/macros/Macros.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "common/pnn_rows.h"

namespace pnn_fast {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

// Shared-memory bytes a block may use on the current device (the opt-in maximum).
inline int64_t max_shared_memory_per_block() {
  int device = 0, bytes = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  return bytes;
}

// The dynamic shared memory `kernel` may request: the device's opt-in maximum per block minus the
// kernel's static shared memory as ptxas laid it out, which aligns each struct (to 16 bytes) and
// so can exceed the sum of their sizeof.
template <typename Kernel>
int64_t dynamic_shared_budget(Kernel kernel) {
  cudaFuncAttributes attributes;
  C10_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
  return max_shared_memory_per_block() - static_cast<int64_t>(attributes.sharedSizeBytes);
}

// Sum over the block (every thread gets the result); `scratch` holds kWarps values.
template <typename T>
__device__ T block_sum(T value, T* scratch) {
  for (int offset = 16; offset > 0; offset /= 2) value += __shfl_down_sync(0xffffffffu, value, offset);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = value;
  __syncthreads();
  T total = 0;
  for (int w = 0; w < kWarps; ++w) total += scratch[w];
  return total;
}

// The sum of `value` over the 32 lanes of a warp, in every lane.
template <typename T>
__device__ T warp_total(T value) {
  for (int offset = 16; offset > 0; offset /= 2) value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

// The largest `value` over the 32 lanes of a warp, in every lane (a NaN is kept only where no lane
// is compared above it, as the CPU's lane_max; the sums that follow carry it).
template <typename T>
__device__ T warp_max(T value) {
  for (int offset = 16; offset > 0; offset /= 2) {
    const T other = __shfl_xor_sync(0xffffffffu, value, offset);
    value = other > value ? other : value;
  }
  return value;
}

// pnn_rows.h's SerialRowSum for a warp that owns one row: lane l takes k = l, l + 32, ... (coalesced
// loads), and a total reaches every lane by shuffles.  Call from all 32 lanes together.
struct WarpRowSum {
  int lane;

  template <typename acc_t, typename Term>
  __device__ __forceinline__ acc_t total(int64_t d, Term term) const {
    acc_t acc = acc_t(0);
    for (int64_t k = lane; k < d; k += 32) acc = term(k, acc);
    return warp_total(acc);
  }

  static constexpr int64_t stride = 32;
  __device__ int64_t first() const { return lane; }
};

// Exclusive prefix count of `flag` over the block in thread order, and the block's total.
__device__ inline int block_exclusive_count(bool flag, int* scratch, int& total) {
  const unsigned ballot = __ballot_sync(0xffffffffu, flag);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) scratch[warp] = __popc(ballot);
  __syncthreads();
  int before = __popc(ballot & ((1u << lane) - 1u));
  total = 0;
  for (int w = 0; w < kWarps; ++w) {
    if (w < warp) before += scratch[w];
    total += scratch[w];
  }
  return before;
}

// sequential_sum (pnn_rows.h) with 16-byte loads where both rows allow them (float or double,
// d a multiple of the vector width, 16-byte aligned rows): the same chain of terms over k = 0..d-1,
// so the same bits, with a quarter (float) or half (double) of the load instructions.  In the row
// kernels each thread of a warp walks its own candidate's row, so every load instruction touches
// 32 rows' cache lines; fewer, wider loads are what keeps that pattern affordable.
template <typename scalar_t>
struct Vector16;
template <>
struct Vector16<float> {
  using type = float4;
  static constexpr int width = 4;
};
template <>
struct Vector16<double> {
  using type = double2;
  static constexpr int width = 2;
};

template <typename acc_t, typename scalar_t, typename Term>
__device__ __forceinline__ acc_t chain_sum(const scalar_t* a, const scalar_t* b, int64_t d, Term term) {
  if constexpr (std::is_same<scalar_t, float>::value || std::is_same<scalar_t, double>::value) {
    using Traits = Vector16<scalar_t>;
    const bool aligned = ((reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b)) % 16) == 0;
    if (aligned && d % Traits::width == 0) {
      const auto* a_vec = reinterpret_cast<const typename Traits::type*>(a);
      const auto* b_vec = reinterpret_cast<const typename Traits::type*>(b);
      acc_t acc = acc_t(0);
      for (int64_t q = 0; q < d / Traits::width; ++q) {
        const auto x = a_vec[q], y = b_vec[q];
        acc = term(acc_t(x.x), acc_t(y.x), acc);
        acc = term(acc_t(x.y), acc_t(y.y), acc);
        if constexpr (Traits::width == 4) {
          acc = term(acc_t(x.z), acc_t(y.z), acc);
          acc = term(acc_t(x.w), acc_t(y.w), acc);
        }
      }
      return acc;
    }
  }
  return sequential_sum<acc_t>(a, b, d, term);
}

// The score of row's candidate j: the DotTerm chain of the user and the candidate's embedding.
template <typename scalar_t, typename acc_t>
__device__ __forceinline__ acc_t row_score(const Row<scalar_t, acc_t>& row, int64_t j) {
  return chain_sum<acc_t>(row.user, row.embedding(j), row.dim, DotTerm{});
}

// Candidate j's score: the row's precomputed scores[j] (for_each_score_tile) when given, else row_score.
template <typename scalar_t, typename acc_t>
__device__ __forceinline__ acc_t candidate_score(const Row<scalar_t, acc_t>& row, const acc_t* scores, int64_t j) {
  return scores != nullptr ? scores[j] : row_score(row, j);
}

// One side of a pair tile: its row r is base + (index ? index[r] : r) * d.
template <typename scalar_t>
struct TileSide {
  const scalar_t* base;
  const int64_t* index;  // nullptr: the rows in order
  __device__ const scalar_t* row(int64_t r, int64_t d) const { return base + (index != nullptr ? index[r] : r) * d; }
};

// out[r, c] = the chain of `term` over k = 0..d-1 (pnn_rows.h sequential_sum) of left row row0 + r
// and right row c: for DotTerm the same bits as row_score, for SquaredDiffTerm as the CPU's distances.
// A GEMM in the classic shared-memory form but with no split of k: a block computes kChainTile x
// kChainTile entries from panels of kChainDepth dims of both sides, each thread 4 x 4 of them (rows
// ty + 16 i, columns tx + 16 j: coalesced panel reads and writes).  It replaces the row kernels'
// one thread per column walking that column's row: uncoalesced, and repeated for every row.
constexpr int kChainTile = 64;
constexpr int kChainDepth = 16;
constexpr int kChainSide = 16;  // threads per side of a block: 16 x 16 = 256
static_assert(kChainSide * kChainSide == kThreads && kChainSide * 4 == kChainTile, "chain tile layout");

template <typename scalar_t, typename acc_t, typename Term>
__global__ void chain_tile_kernel(TileSide<scalar_t> left, TileSide<scalar_t> right, int64_t d, int64_t row0,
                                  int64_t num_rows, int64_t num_columns, Term term, acc_t* out) {
  // + 1: the staging writes (consecutive threads, consecutive dims) fall in different banks
  __shared__ acc_t left_panel[kChainDepth][kChainTile + 1];
  __shared__ acc_t right_panel[kChainDepth][kChainTile + 1];
  const int64_t tile_row = static_cast<int64_t>(blockIdx.y) * kChainTile;
  const int64_t tile_column = static_cast<int64_t>(blockIdx.x) * kChainTile;
  const int tx = threadIdx.x % kChainSide, ty = threadIdx.x / kChainSide;
  acc_t acc[4][4];
  for (int i = 0; i < 4; ++i) {
    for (int j = 0; j < 4; ++j) acc[i][j] = acc_t(0);
  }
  for (int64_t k0 = 0; k0 < d; k0 += kChainDepth) {
    for (int e = threadIdx.x; e < kChainTile * kChainDepth; e += kThreads) {
      const int r = e / kChainDepth, kk = e % kChainDepth;
      const int64_t row = tile_row + r, column = tile_column + r, k = k0 + kk;
      left_panel[kk][r] = row < num_rows && k < d ? acc_t(left.row(row0 + row, d)[k]) : acc_t(0);
      right_panel[kk][r] = column < num_columns && k < d ? acc_t(right.row(column, d)[k]) : acc_t(0);
    }
    __syncthreads();
    const int depth = static_cast<int>(d - k0 < kChainDepth ? d - k0 : kChainDepth);
    for (int kk = 0; kk < depth; ++kk) {
      acc_t a[4], b[4];
      for (int i = 0; i < 4; ++i) a[i] = left_panel[kk][ty + kChainSide * i];
      for (int j = 0; j < 4; ++j) b[j] = right_panel[kk][tx + kChainSide * j];
      for (int i = 0; i < 4; ++i) {
        for (int j = 0; j < 4; ++j) acc[i][j] = term(a[i], b[j], acc[i][j]);
      }
    }
    __syncthreads();
  }
  for (int i = 0; i < 4; ++i) {
    const int64_t row = tile_row + ty + kChainSide * i;
    if (row >= num_rows) continue;
    for (int j = 0; j < 4; ++j) {
      const int64_t column = tile_column + tx + kChainSide * j;
      if (column < num_columns) out[row * num_columns + column] = acc[i][j];
    }
  }
}

// The rows of `left` against the columns of `right`, a tile of rows at a time into one reused
// buffer: for each tile chain_tile_kernel, then rows_of_tile(row0, tile) with the tile's [rows,
// columns] view, whose row kernel reads (or rewrites) it.  A tile is sized by the device's waves
// (chain_tile_rows), not as a fixed share of the rows: an eighth of B = 2048 rows against 2,048
// columns launched 128 chain blocks on 132 SMs, under one wave, and 256 row blocks after each.
constexpr int kChainWaves = 2;
constexpr int64_t kMaxChainBufferBytes = int64_t{64} << 20;

// Rows a tile: the fewest (whole kChainTile blocks of them) whose chain_tile_kernel grid fills
// kChainWaves waves of the device (its SMs times the blocks an SM holds at once) and whose row
// kernel, one block a row, gets kChainWaves blocks an SM; at most all rows and a buffer of
// kMaxChainBufferBytes.
template <typename Kernel>
int64_t chain_tile_rows(Kernel chain_kernel, int64_t rows, int64_t columns, int64_t acc_bytes) {
  int device = 0, sms = 0, resident = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, chain_kernel, kThreads, 0));
  const int64_t column_blocks = (columns + kChainTile - 1) / kChainTile;
  const int64_t chain_blocks = int64_t{kChainWaves} * sms * std::max(resident, 1);
  const int64_t for_chain = (chain_blocks + column_blocks - 1) / column_blocks * kChainTile;
  const int64_t for_rows = int64_t{kChainWaves} * sms;
  const int64_t most_rows = std::max<int64_t>(1, kMaxChainBufferBytes / (columns * acc_bytes));
  return std::min({std::max(for_chain, for_rows), most_rows, rows});
}

template <typename acc_t, typename scalar_t, typename Term, typename RowsOfTile>
void for_each_chain_tile(TileSide<scalar_t> left, TileSide<scalar_t> right, int64_t d, int64_t rows,
                         int64_t columns, Term term, const at::TensorOptions& acc_options, RowsOfTile rows_of_tile) {
  if (rows == 0 || columns == 0) return;
  const int64_t tile = chain_tile_rows(chain_tile_kernel<scalar_t, acc_t, Term>, rows, columns,
                                       static_cast<int64_t>(sizeof(acc_t)));
  const at::Tensor buffer = at::empty({tile, columns}, acc_options);
  for (int64_t row0 = 0; row0 < rows; row0 += tile) {
    const int64_t num_rows = std::min(tile, rows - row0);
    const dim3 grid(static_cast<unsigned int>((columns + kChainTile - 1) / kChainTile),
                    static_cast<unsigned int>((num_rows + kChainTile - 1) / kChainTile));
    chain_tile_kernel<scalar_t, acc_t, Term><<<grid, kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
        left, right, d, row0, num_rows, columns, term, buffer.data_ptr<acc_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    rows_of_tile(row0, buffer.narrow(0, 0, num_rows));
  }
}

// for_each_chain_tile of a batch's rows against its shared candidate list: the scores.
template <typename scalar_t, typename acc_t, typename RowsOfTile>
void for_each_score_tile(const RowBatch<scalar_t>& batch, const at::TensorOptions& acc_options,
                         RowsOfTile rows_of_tile) {
  for_each_chain_tile<acc_t>(TileSide<scalar_t>{batch.user_emb, nullptr},
                             TileSide<scalar_t>{batch.item_table, batch.candidates}, batch.dim, batch.num_rows,
                             batch.num_candidates, DotTerm{}, acc_options, rows_of_tile);
}

// A shared candidate list sorted by item (at::sort, once a call): sorted_items[p] is the item at
// position positions[p] of the list.
struct SortedList {
  const int64_t* sorted_items;
  const int64_t* positions;
};

// Bytes of a labeled bitmap of `count` candidates (one bit each, in 32-bit words).
inline int64_t labeled_bitmap_bytes(int64_t count) { return (count + 31) / 32 * 4; }

__device__ __forceinline__ bool bit_is_set(const unsigned* bits, int64_t j) {
  return (bits[j >> 5] >> (j & 31)) & 1u;
}

// Sets in `labeled` (the row's bitmap in shared memory) the bit of every position of the shared
// list that is not in U_b: whose item is the row's positive or a known positive of its user.  Each
// of those items is looked up in the sorted list (O((|known| + 1) log C) a row), where
// Row::unlabeled would search the known list once per candidate (O(C log |known|)); the same set.
// Call from every thread of the block; returns after a barrier.
template <typename scalar_t, typename acc_t>
__device__ void mark_labeled(const Row<scalar_t, acc_t>& row, SortedList list, int64_t count, unsigned* labeled) {
  for (int64_t w = threadIdx.x; w < (count + 31) / 32; w += blockDim.x) labeled[w] = 0u;
  __syncthreads();
  for (int64_t t = threadIdx.x; t <= row.num_known; t += blockDim.x) {
    const int64_t item = t < row.num_known ? row.known[t] : row.pos_item;
    int64_t lo = 0, n = count;  // the first p with sorted_items[p] >= item
    while (n > 0) {
      const int64_t half = n >> 1;
      if (list.sorted_items[lo + half] < item) {
        lo += half + 1;
        n -= half + 1;
      } else {
        n = half;
      }
    }
    for (int64_t p = lo; p < count && list.sorted_items[p] == item; ++p) {
      const int64_t j = list.positions[p];
      atomicOr(&labeled[j >> 5], 1u << (j & 31));
    }
  }
  __syncthreads();
}

// Row::key, with U_b read off the row's labeled bitmap when there is one.
template <typename scalar_t, typename acc_t>
__device__ __forceinline__ typename KeyOf<acc_t>::type row_key(const Row<scalar_t, acc_t>& row, const unsigned* labeled,
                                                              int64_t j, acc_t score) {
  using key_t = typename KeyOf<acc_t>::type;
  if (labeled == nullptr) return row.key(j, score);
  return bit_is_set(labeled, j) ? key_t(kExcludedKey) : order_key(score);
}

// Keys (pnn_rows.h order_key, kExcludedKey outside U_b) of one row's candidates, scored by
// candidate_score, U_b from the row's `labeled` bitmap (mark_labeled) when given.  kCached keeps
// the keys in dynamic shared memory (filled once); otherwise every read recomputes the key: the
// slower path for rows longer than the shared-memory plan.
template <typename scalar_t, typename acc_t, bool kCached>
struct RowKeys {
  using key_t = typename KeyOf<acc_t>::type;
  const Row<scalar_t, acc_t>& row;
  key_t* cache;
  int64_t count;
  const acc_t* scores = nullptr;
  const unsigned* labeled = nullptr;

  __device__ key_t compute(int64_t j) const {
    return row_key(row, labeled, j, candidate_score(row, scores, j));
  }

  // Fills the cache (call from every thread of the block before reading).
  __device__ void prepare() const {
    if constexpr (kCached) {
      for (int64_t j = threadIdx.x; j < count; j += blockDim.x) cache[j] = compute(j);
      __syncthreads();
    }
  }

  __device__ key_t operator()(int64_t j) const {
    if constexpr (kCached) {
      return cache[j];
    } else {
      return compute(j);
    }
  }
};

// Block state of a hard-negative search.
template <typename key_t>
struct HardShared {
  key_t keys[kThreads];
  int64_t index[kThreads];
  int64_t counts[kThreads];
};

// (argmax_{j in U_b} key with the smallest j on ties or -1, |U_b|) of one row, over the block;
// every thread returns the same values.
template <typename Keys, typename key_t>
__device__ void block_hard_negative(const Keys& keys, int64_t count, HardShared<key_t>& sh, int64_t& hard,
                                    int64_t& num_unlabeled) {
  key_t best_key = 0;
  int64_t best = -1, mine = 0;
  for (int64_t j = threadIdx.x; j < count; j += blockDim.x) {
    const key_t key = keys(j);
    if (key == key_t(kExcludedKey)) continue;
    ++mine;
    if (hard_better(key, j, best_key, best)) {
      best_key = key;
      best = j;
    }
  }
  sh.keys[threadIdx.x] = best_key;
  sh.index[threadIdx.x] = best;
  sh.counts[threadIdx.x] = mine;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) {
      const int other = threadIdx.x + stride;
      if (hard_better(sh.keys[other], sh.index[other], sh.keys[threadIdx.x], sh.index[threadIdx.x])) {
        sh.keys[threadIdx.x] = sh.keys[other];
        sh.index[threadIdx.x] = sh.index[other];
      }
      sh.counts[threadIdx.x] += sh.counts[other];
    }
    __syncthreads();
  }
  hard = sh.index[0];
  num_unlabeled = sh.counts[0];
  __syncthreads();  // sh may be reused right after
}

// Block state of a bottom-k selection.
template <typename key_t>
struct SelectShared {
  unsigned int histogram[kRadixSize];
  int64_t scratch[kWarps];
  int counts[kWarps];
  key_t prefix;
  int64_t rank;
  int64_t cutoff;
};

// The row's bottom-k state (pnn_rows.h, in_bottom_k) for k clamped to [0, |U_b|], by radix
// select over the block; returns |U_b|.  Every thread returns the same values.
template <typename Keys, typename key_t>
__device__ int64_t block_bottom_k(const Keys& keys, int64_t count, int64_t k, SelectShared<key_t>& sh,
                                  key_t& threshold_key, int64_t& cutoff) {
  int64_t mine = 0;
  for (int64_t j = threadIdx.x; j < count; j += blockDim.x) mine += keys(j) != key_t(kExcludedKey);
  const int64_t num_unlabeled = block_sum(mine, sh.scratch);
  int64_t rank = k < 0 ? 0 : (k > num_unlabeled ? num_unlabeled : k);
  threshold_key = 0;
  cutoff = -1;
  if (rank == 0) return num_unlabeled;

  key_t prefix = 0;
  for (int shift = KeyBits<key_t>::value - kRadixBits; shift >= 0; shift -= kRadixBits) {
    for (int i = threadIdx.x; i < kRadixSize; i += blockDim.x) sh.histogram[i] = 0;
    __syncthreads();
    // Aggregated per warp: the lanes with the same digit add their count once.  Scores of one row
    // share their sign and most exponent bits, so the first pass's digits are nearly all equal, and
    // one shared atomic a lane would serialise the block on a single counter.  The loop is uniform
    // over the block (every lane takes every step), as __match_any_sync needs.
    for (int64_t base = 0; base < count; base += blockDim.x) {
      const int64_t j = base + threadIdx.x;
      int digit = -1;
      if (j < count) {
        const key_t key = keys(j);
        if (key != key_t(kExcludedKey) && radix_prefix_matches(key, prefix, shift)) digit = radix_digit(key, shift);
      }
      const unsigned peers = __match_any_sync(0xffffffffu, digit);
      if (digit >= 0 && static_cast<int>(threadIdx.x % 32) == __ffs(peers) - 1) {
        atomicAdd(&sh.histogram[digit], static_cast<unsigned>(__popc(peers)));
      }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      sh.prefix = prefix | (static_cast<key_t>(radix_pick(sh.histogram, rank)) << shift);
      sh.rank = rank;
    }
    __syncthreads();
    prefix = sh.prefix;
    rank = sh.rank;
  }
  // the rank-th candidate (in j order) among those whose key equals the threshold
  if (threadIdx.x == 0) sh.cutoff = -1;
  int64_t seen = 0;
  for (int64_t base = 0; base < count; base += blockDim.x) {
    const int64_t j = base + threadIdx.x;
    const bool equal = j < count && keys(j) == prefix;
    int total = 0;
    const int before = block_exclusive_count(equal, sh.counts, total);
    if (equal && seen + before + 1 == rank) sh.cutoff = j;
    seen += total;
    __syncthreads();
    if (sh.cutoff >= 0) break;
  }
  threshold_key = prefix;
  cutoff = sh.cutoff;
  return num_unlabeled;
}

// Launches `kernel` with `shared_bytes` of dynamic shared memory, raising the per-kernel limit
// above the default 48 KiB when needed.
template <typename Kernel, typename... Args>
void launch_rows(Kernel kernel, int64_t rows, int64_t shared_bytes, Args... args) {
  if (rows == 0) return;
  if (shared_bytes > 48 * 1024) {
    C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(shared_bytes)));
  }
  kernel<<<static_cast<unsigned int>(rows), kThreads, shared_bytes, c10::cuda::getCurrentCUDAStream()>>>(args...);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// The table-lookup ops (unknown_items, history_sample, embedding_bpr, gathered_norm,
// gathered_dots) map one thread to one row or one (row, column): flat launches of kFlatThreads.
constexpr int kFlatThreads = 256;

// Launches `kernel` on `threads` threads in blocks of kFlatThreads (nothing when there are none).
template <typename Kernel, typename... Args>
void launch_flat(Kernel kernel, int64_t threads, Args... args) {
  if (threads == 0) return;
  const auto blocks = static_cast<unsigned int>((threads + kFlatThreads - 1) / kFlatThreads);
  kernel<<<blocks, kFlatThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(args...);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace pnn_fast
