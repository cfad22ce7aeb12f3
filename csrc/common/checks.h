// Argument checks and input preparation shared by the CPU and CUDA entry points (host code).
#pragma once

#include <cmath>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/OpMathType.h>
#include <ATen/ops/aminmax.h>
#include <ATen/ops/zeros.h>

#include "common/pnn_rows.h"
#include "common/topk_row.h"

namespace pnn_fast {

// The dtype kernels accumulate in (float for half/bfloat16): also the dtype of the thresholds.
inline at::ScalarType opmath_dtype(at::ScalarType dtype) {
  return dtype == at::kDouble ? at::kDouble : at::kFloat;
}

inline void check_same_device(const char* op, const at::Tensor& ref, const char* ref_name, const at::Tensor& x,
                              const char* name) {
  TORCH_CHECK(x.device() == ref.device(), op, ": ", name, " is on ", x.device(), " but ", ref_name, " is on ",
              ref.device(), "; put all inputs on one device");
}

// x must be `dtype` with `sizes` (a -1 entry matches any size), on the device of ref (named ref_name).
inline void check_tensor(const char* op, const at::Tensor& ref, const at::Tensor& x, const char* name,
                         at::ScalarType dtype, at::IntArrayRef sizes, const char* ref_name = "user_emb") {
  check_same_device(op, ref, ref_name, x, name);
  TORCH_CHECK(x.scalar_type() == dtype, op, ": ", name, " must be ", dtype, ", got ", x.scalar_type());
  bool ok = x.dim() == static_cast<int64_t>(sizes.size());
  for (int64_t i = 0; ok && i < x.dim(); ++i) ok = sizes[i] < 0 || x.size(i) == sizes[i];
  TORCH_CHECK(ok, op, ": ", name, " must have shape ", sizes, " (-1: any), got ", x.sizes());
}

// Contiguous, checked inputs of the per-row ops (the tensors keep the raw pointers alive).
struct RowInputs {
  at::Tensor user_emb, item_table, users, pos_items, candidates, known_indptr, known_indices;
  int64_t rows = 0;
  int64_t num_candidates = 0;
  int64_t dim = 0;
  bool shared = true;
};

inline RowInputs prepare_row_inputs(const char* op, const at::Tensor& user_emb, const at::Tensor& item_table,
                                    const at::Tensor& users, const at::Tensor& pos_items,
                                    const at::Tensor& candidates, const at::Tensor& known_indptr,
                                    const at::Tensor& known_indices) {
  TORCH_CHECK(user_emb.dim() == 2 && at::isFloatingType(user_emb.scalar_type()), op,
              ": user_emb must be a floating-point [B, d] tensor, got ", user_emb.scalar_type(), " ",
              user_emb.sizes());
  const int64_t rows = user_emb.size(0);
  const int64_t dim = user_emb.size(1);
  check_tensor(op, user_emb, item_table, "item_table", user_emb.scalar_type(), {-1, dim});
  check_tensor(op, user_emb, users, "users", at::kLong, {rows});
  check_tensor(op, user_emb, pos_items, "pos_items", at::kLong, {rows});
  TORCH_CHECK(candidates.dim() == 1 || candidates.dim() == 2, op,
              ": candidates must be [C] (shared) or [B, C] (per row), got ", candidates.sizes());
  if (candidates.dim() == 2) {
    check_tensor(op, user_emb, candidates, "candidates", at::kLong, {rows, -1});
  } else {
    check_tensor(op, user_emb, candidates, "candidates", at::kLong, {-1});
  }
  // the CPU kernels hold a row's candidate positions in int32 (CandidateSet, RowScan::members)
  TORCH_CHECK(candidates.size(-1) < (int64_t{1} << 31), op, ": a row must have fewer than 2^31 candidates, got ",
              candidates.size(-1));
  check_tensor(op, user_emb, known_indptr, "known_indptr", at::kLong, {-1});
  check_tensor(op, user_emb, known_indices, "known_indices", at::kLong, {-1});
  RowInputs in;
  in.user_emb = user_emb.contiguous();
  in.item_table = item_table.contiguous();
  in.users = users.contiguous();
  in.pos_items = pos_items.contiguous();
  in.candidates = candidates.contiguous();
  in.known_indptr = known_indptr.contiguous();
  in.known_indices = known_indices.contiguous();
  in.rows = rows;
  in.dim = dim;
  in.shared = candidates.dim() == 1;
  in.num_candidates = candidates.size(candidates.dim() - 1);
  return in;
}

// False while `t`'s CUDA stream is capturing a CUDA graph (checks.cpp): a read-back would
// end the capture with an error, and a replayed graph runs no host code at all.  The checks that
// still read back (check_partition, the evaluator's NaN test) then do not run: they run on eager
// calls, and on the warm-up call that torch.compile's CUDA graphs (mode="reduce-overhead") make
// before capturing.
bool host_read_back_allowed(const at::Tensor& t);

// Every read-back of a check that would synchronise on a device adds one (pnn_fast._C.host_read_count,
// which the no-host-read test reads: a dispatch mode sees the reads of Python, not those in here).
void count_host_read();
int64_t host_read_count();

// The text of deferred input error `code` (record_input_error), with its range when bound >= 0.
std::string input_error_message(int64_t code, int64_t bound);

// ---------------------------------------------------------------------------------------------
// Deferred input errors.  The ops of a training step test their inputs on the device and never read
// the answer back: on CUDA each read-back is a synchronisation, and a step made 7 to 13 of them.  A
// bad input records an error in a per-device flag, and the op goes on with a safe stand-in (an id
// clamped into range), so the kernel stays inside its inputs; its output is then wrong until the
// error is read, by pnn_fast.check_kernel_inputs() (a loss's check(), the trainer once an epoch).
// On the CPU the test reads CPU memory directly, which costs no synchronisation, and skips the
// stand-in's copy when the input is good.  The flag keeps the first error until it is taken.

// Record, in the flag of bad's device, error `what` of op (bad: a 0-dim bool tensor, true when the
// input is bad; bound >= 0: the ids' range [0, bound) to name, -1: none).  No read-back on CUDA.
void record_input_error(const char* op, const char* what, const at::Tensor& bad, int64_t bound = -1);

// ids (any shape), contiguous, with every entry outside [0, bound) recorded as an error of op
// ("<name> has <noun> outside [0, bound)") and clamped into range.
at::Tensor ids_in_range(const char* op, const at::Tensor& ids, int64_t bound, const char* name,
                        const char* noun = "ids");

// Id ranges checked now, with one read-back (counted): for the ops outside a loss step (the
// evaluator's masked_topk and rows_contain, the graph models' csr_spmm), whose callers read their
// results back anyway.  A device-side assert would leave the CUDA context unusable, hence the host.
inline void check_ids_below(const char* op, const at::Tensor& ids, int64_t bound, const char* name) {
  if (ids.numel() == 0 || !host_read_back_allowed(ids)) return;
  count_host_read();  // counted on every device: on CUDA this read synchronises
  const auto [low, high] = at::aminmax(ids);
  TORCH_CHECK(!low.lt(0).logical_or_(high.ge(bound)).item<bool>(), op, ": ", name,
              " has ids outside [0, ", bound, ")");
}

// That indptr (int64, 1-D, on the device) partitions indices: it rises from 0 to indices.numel().
// Synchronises on CUDA (and so steps aside while a CUDA graph is captured, as the id checks do).
inline void check_partition(const char* op, const at::Tensor& indptr, const at::Tensor& indices,
                            const std::string& indptr_name, const std::string& indices_name) {
  TORCH_CHECK_VALUE(indptr.numel() >= 1, op, ": ", indptr_name, " is empty (it needs num_rows + 1 entries)");
  if (!host_read_back_allowed(indptr)) return;
  count_host_read();
  // the three conditions folded on the device into one flag: one read-back, not three
  const at::Tensor partition = indptr[0].eq(0)
                                   .logical_and_(indptr[-1].eq(indices.numel()))
                                   .logical_and_((indptr.slice(0, 1) >= indptr.slice(0, 0, -1)).all());
  TORCH_CHECK_VALUE(partition.item<bool>(), op, ": ", indptr_name, " must rise from 0 to the length of ",
                    indices_name, " (", indices.numel(), ")");
}

// Contiguous, checked exclusion sets of the evaluator's top-k ops, with the rows (users) that
// look them up (the tensors keep the raw pointers of `sets` alive).
struct ExclusionInputs {
  at::Tensor rows;
  std::vector<at::Tensor> indptr, indices;
  ExclusionSets sets;
};

// Shapes, dtypes and devices (like `like`, named like_name in errors), user ids within every set,
// and each indptr a valid partition of its indices.  Not checked, each an O(nnz) pass per call:
// that exclusion rows are sorted (a precondition, as for known_indices).  Synchronises on CUDA.
inline ExclusionInputs prepare_exclusions(const char* op, const at::Tensor& like, const char* like_name,
                                          const at::Tensor& rows, at::TensorList exclude_indptr,
                                          at::TensorList exclude_indices) {
  check_tensor(op, like, rows, "rows", at::kLong, {like.size(0)}, like_name);
  TORCH_CHECK_VALUE(exclude_indptr.size() == exclude_indices.size(), op, ": exclude_indptr has ",
                    exclude_indptr.size(), " tensors but exclude_indices ", exclude_indices.size());
  TORCH_CHECK_VALUE(exclude_indptr.size() <= kMaxExcludeSets, op, ": at most ", kMaxExcludeSets,
                    " exclusion sets, got ", exclude_indptr.size());
  ExclusionInputs in;
  in.rows = rows.contiguous();
  for (size_t s = 0; s < exclude_indptr.size(); ++s) {
    check_tensor(op, like, exclude_indptr[s], "exclude_indptr", at::kLong, {-1}, like_name);
    check_tensor(op, like, exclude_indices[s], "exclude_indices", at::kLong, {-1}, like_name);
    const at::Tensor indptr = exclude_indptr[s].contiguous(), indices = exclude_indices[s].contiguous();
    const std::string set = "[" + std::to_string(s) + "]";
    check_partition(op, indptr, indices, "exclude_indptr" + set, "exclude_indices" + set);
    check_ids_below(op, in.rows, indptr.numel() - 1, "rows");
    // (an exclude_indices entry outside [0, I) never matches a column, so it is harmless: not checked)
    in.sets.indptr[s] = indptr.data_ptr<int64_t>();
    in.sets.indices[s] = indices.data_ptr<int64_t>();
    in.indptr.push_back(indptr);
    in.indices.push_back(indices);
  }
  in.sets.sets = static_cast<int>(exclude_indptr.size());
  return in;
}

// Contiguous, checked inputs of masked_topk: scores a floating-point [B, I], k in [1, I], and the
// exclusions as prepare_exclusions checks them.
struct MaskedTopkInputs {
  at::Tensor scores;
  ExclusionInputs exclusions;
};

inline MaskedTopkInputs prepare_masked_topk(const char* op, const at::Tensor& scores, const at::Tensor& rows,
                                            at::TensorList exclude_indptr, at::TensorList exclude_indices,
                                            int64_t k) {
  TORCH_CHECK(scores.dim() == 2 && at::isFloatingType(scores.scalar_type()), op,
              ": scores must be a floating-point [B, I] tensor, got ", scores.scalar_type(), " ", scores.sizes());
  TORCH_CHECK_VALUE(k >= 1 && k <= scores.size(1), op, ": k must lie in [1, I] = [1, ", scores.size(1), "], got ", k);
  return {scores.contiguous(), prepare_exclusions(op, scores, "scores", rows, exclude_indptr, exclude_indices)};
}

// Contiguous, checked inputs of rows_contain.  columns is row b's columns at column_row_stride * b:
// a shared list broadcast to every row (expand, stride 0: SL's pool) is read in place, not copied
// into [B, K] (a 46 MB copy a step for Gowalla's mixed negatives at B = 2048).
struct RowsContainInputs {
  at::Tensor indptr, indices, rows, columns;
  int64_t column_row_stride;
};

// Shapes, dtypes and devices, then the values as deferred input errors, with no read-back (SL's
// shared pool asks it every step): rows clamped into the CSR, and a broken partition of indices by
// indptr recorded, the kernels clamping each row's span into the indices (clamped_row_span).  Not
// checked (an O(nnz) pass per call): that each row's indices ascend, the op's precondition.
inline RowsContainInputs prepare_rows_contain(const char* op, const at::Tensor& indptr, const at::Tensor& indices,
                                              const at::Tensor& rows, const at::Tensor& columns) {
  TORCH_CHECK(columns.dim() == 2 && columns.scalar_type() == at::kLong, op,
              ": columns must be an int64 [B, K] tensor, got ", columns.scalar_type(), " ", columns.sizes());
  check_tensor(op, columns, rows, "rows", at::kLong, {columns.size(0)}, "columns");
  check_tensor(op, columns, indptr, "indptr", at::kLong, {-1}, "columns");
  check_tensor(op, columns, indices, "indices", at::kLong, {-1}, "columns");
  TORCH_CHECK_VALUE(indptr.numel() >= 1, op, ": indptr is empty (it needs num_rows + 1 entries)");
  const bool shared_list = columns.size(0) > 1 && columns.stride(0) == 0 && columns.stride(1) == 1;
  RowsContainInputs in{indptr.contiguous(), indices.contiguous(), rows.contiguous(),
                       shared_list ? columns : columns.contiguous(), shared_list ? 0 : columns.size(1)};
  const at::Tensor broken = in.indptr[0].ne(0)
                                .logical_or_(in.indptr[-1].ne(in.indices.numel()))
                                .logical_or_((in.indptr.slice(0, 1) < in.indptr.slice(0, 0, -1)).any());
  record_input_error(op, "indptr must rise from 0 to the length of indices", broken);
  in.rows = ids_in_range(op, in.rows, in.indptr.numel() - 1, "rows");
  return in;
}

// Contiguous, checked inputs of lowest_k_mask: floating-point scores [B, K] (K < 2^31, the
// selection's columns are int32) and int64 k [B], clamped into [0, K] (a k outside it is a deferred
// input error).
struct LowestKInputs {
  at::Tensor scores, k;
};

inline LowestKInputs prepare_lowest_k_mask(const char* op, const at::Tensor& scores, const at::Tensor& k) {
  TORCH_CHECK(scores.dim() == 2 && at::isFloatingType(scores.scalar_type()), op,
              ": scores must be a floating-point [B, K] tensor, got ", scores.scalar_type(), " ", scores.sizes());
  check_tensor(op, scores, k, "k", at::kLong, {scores.size(0)}, "scores");
  const int64_t count = scores.size(1);
  TORCH_CHECK(count < (int64_t{1} << 31), op, ": a row must have fewer than 2^31 scores, got ", count);
  // a k of K is allowed (every score), so the range of the ids test is [0, K + 1)
  return {scores.contiguous(), ids_in_range(op, k, count + 1, "k", "values")};
}

// The ids of the per-row ops, each in range (deferred input errors, clamped).
inline void check_id_ranges(const char* op, RowInputs& in) {
  in.users = ids_in_range(op, in.users, in.known_indptr.numel() - 1, "users");
  in.pos_items = ids_in_range(op, in.pos_items, in.item_table.size(0), "pos_items");
  in.candidates = ids_in_range(op, in.candidates, in.item_table.size(0), "candidates");
}

// Contiguous, checked inputs of the table-lookup ops (embedding_bpr, gathered_norm): float
// tables [n, d] of one dtype and device, int64 ids.
struct EmbeddingBprInputs {
  at::Tensor user_table, item_table, users, pos_items, neg_items;
  int64_t rows = 0;
  int64_t negatives = 0;
  int64_t dim = 0;
  double reg_weight = 0;
};

inline void check_table(const char* op, const at::Tensor& table, const char* name) {
  TORCH_CHECK(table.dim() == 2 && at::isFloatingType(table.scalar_type()), op, ": ", name,
              " must be a floating-point [n, d] tensor, got ", table.scalar_type(), " ", table.sizes());
}

// masked_logsumexp's inputs, contiguous: x float [B, M]; shift, when given, [M] of x's dtype;
// excluded, when given, bool [B, M]; all on x's device.  Undefined tensors stand for the absent ones.
struct MaskedLogsumexpInputs {
  at::Tensor x, shift, excluded;
};

inline MaskedLogsumexpInputs prepare_masked_logsumexp(const char* op, const at::Tensor& x, double scale,
                                                      const std::optional<at::Tensor>& shift,
                                                      const std::optional<at::Tensor>& excluded) {
  TORCH_CHECK(x.dim() == 2 && at::isFloatingType(x.scalar_type()), op,
              ": x must be a floating-point [B, M] tensor, got ", x.scalar_type(), " ", x.sizes());
  TORCH_CHECK_VALUE(std::isfinite(scale), op, ": scale must be finite, got ", scale);
  MaskedLogsumexpInputs in{x.contiguous(), {}, {}};
  if (shift.has_value()) {
    check_tensor(op, x, *shift, "shift", x.scalar_type(), {x.size(1)}, "x");
    in.shift = shift->contiguous();
  }
  if (excluded.has_value()) {
    check_tensor(op, x, *excluded, "excluded", at::kBool, {x.size(0), x.size(1)}, "x");
    in.excluded = excluded->contiguous();
  }
  return in;
}

// masked_logsumexp_bwd's inputs: the forward's, then grad and lse, each [B] in x's accumulation dtype.
inline MaskedLogsumexpInputs prepare_masked_logsumexp_bwd(const char* op, const at::Tensor& grad, const at::Tensor& x,
                                                          double scale, const std::optional<at::Tensor>& shift,
                                                          const std::optional<at::Tensor>& excluded,
                                                          const at::Tensor& lse) {
  MaskedLogsumexpInputs in = prepare_masked_logsumexp(op, x, scale, shift, excluded);
  check_tensor(op, in.x, grad, "grad", opmath_dtype(in.x.scalar_type()), {in.x.size(0)}, "x");
  check_tensor(op, in.x, lse, "lse", opmath_dtype(in.x.scalar_type()), {in.x.size(0)}, "x");
  return in;
}

// user_table [U, d], item_table [I, d], users and pos_items int64 [B], neg_items int64 [B, K], and a
// finite reg_weight >= 0.
inline EmbeddingBprInputs prepare_embedding_bpr(const char* op, const at::Tensor& user_table, const at::Tensor& item_table,
                                          const at::Tensor& users, const at::Tensor& pos_items,
                                          const at::Tensor& neg_items, double reg_weight) {
  check_table(op, user_table, "user_table");
  TORCH_CHECK(std::isfinite(reg_weight) && reg_weight >= 0, op, ": reg_weight must be finite and >= 0, got ",
              reg_weight);
  EmbeddingBprInputs in;
  in.reg_weight = reg_weight;
  in.rows = users.numel();
  in.dim = user_table.size(1);
  in.negatives = neg_items.dim() == 2 ? neg_items.size(1) : -1;
  check_tensor(op, user_table, item_table, "item_table", user_table.scalar_type(), {-1, in.dim}, "user_table");
  check_tensor(op, user_table, users, "users", at::kLong, {in.rows}, "user_table");
  check_tensor(op, user_table, pos_items, "pos_items", at::kLong, {in.rows}, "user_table");
  check_tensor(op, user_table, neg_items, "neg_items", at::kLong, {in.rows, -1}, "user_table");
  in.user_table = user_table.contiguous();
  in.item_table = item_table.contiguous();
  in.users = users.contiguous();
  in.pos_items = pos_items.contiguous();
  in.neg_items = neg_items.contiguous();
  return in;
}

// The ids of embedding_bpr in range (deferred input errors, clamped): the forward's and the backward's.
inline void clamp_bpr_ids(const char* op, EmbeddingBprInputs& in) {
  in.users = ids_in_range(op, in.users, in.user_table.size(0), "users");
  in.pos_items = ids_in_range(op, in.pos_items, in.item_table.size(0), "pos_items");
  in.neg_items = ids_in_range(op, in.neg_items, in.item_table.size(0), "neg_items");
}

// Checked, contiguous inputs of the per-user draw ops (unknown_items, history_sample): the known
// items' CSR (int64 indptr [U + 1], indices), users int64 [B] and uniform float32 [B, K], on one device.
struct KnownDraws {
  at::Tensor indptr, indices, users, uniform;
  int64_t rows = 0, per_row = 0, num_users = 0;
};

inline KnownDraws prepare_known_draws(const char* op, const at::Tensor& known_indptr,
                                      const at::Tensor& known_indices, const at::Tensor& users,
                                      const at::Tensor& uniform) {
  check_tensor(op, known_indptr, known_indices, "known_indices", at::kLong, {-1}, "known_indptr");
  check_tensor(op, known_indptr, users, "users", at::kLong, {-1}, "known_indptr");
  check_tensor(op, known_indptr, uniform, "uniform", at::kFloat, {users.numel(), -1}, "known_indptr");
  return {known_indptr.contiguous(), known_indices.contiguous(), users.contiguous(), uniform.contiguous(),
          uniform.size(0), uniform.size(1), known_indptr.numel() - 1};
}

// The values of checked draws, as deferred input errors (no read-back): users in range (clamped),
// every draw in [0, 1) (NaN fails) and, when num_items is given (unknown_items), an unknown item
// left for every drawing user.  The kernels turn a bad draw into a position inside the row
// (rank_of_uniform), so that the output is wrong but in bounds until the error is read.
inline void check_draw_values(const char* op, KnownDraws& in, int64_t num_items = -1) {
  in.users = ids_in_range(op, in.users, in.num_users, "users");
  if (in.uniform.numel() == 0) return;
  at::Tensor bad = in.uniform.ge(0).logical_and_(in.uniform.lt(1)).logical_not_().any();
  if (num_items < 0) {
    record_input_error(op, "uniform must lie in [0, 1)", bad);
    return;
  }
  const at::Tensor known = in.indptr.index_select(0, in.users + 1) - in.indptr.index_select(0, in.users);
  bad.logical_or_(known.ge(num_items).any());
  record_input_error(op, "uniform must lie in [0, 1) and every user must have an unknown item", bad);
}

// table float [n, d], ids int64 [m], on one device.
inline void check_gathered_norm(const char* op, const at::Tensor& table, const at::Tensor& ids) {
  check_table(op, table, "table");
  check_tensor(op, table, ids, "ids", at::kLong, {-1}, "table");
}

// Raw pointers and sizes of checked embedding_bpr inputs, for the kernels of both backends.
template <typename scalar_t>
struct BprBatch {
  const scalar_t* user_table;  // [U, d]
  const scalar_t* item_table;  // [I, d]
  const int64_t* users;        // [B]
  const int64_t* pos_items;    // [B]
  const int64_t* neg_items;    // [B, K]
  int64_t rows, negatives, dim, num_users, num_items;
  bool regularize;             // reg_weight != 0: the EmbLoss term is computed
};

template <typename scalar_t>
BprBatch<scalar_t> bpr_batch(const EmbeddingBprInputs& in) {
  return {in.user_table.data_ptr<scalar_t>(),
          in.item_table.data_ptr<scalar_t>(),
          in.users.data_ptr<int64_t>(),
          in.pos_items.data_ptr<int64_t>(),
          in.neg_items.data_ptr<int64_t>(),
          in.rows,
          in.negatives,
          in.dim,
          in.user_table.size(0),
          in.item_table.size(0),
          in.reg_weight != 0};
}

// The forward's norms [3] (accumulation dtype), checked and contiguous, for the backward.
inline at::Tensor checked_bpr_norms(const char* op, const EmbeddingBprInputs& in, const at::Tensor& norms,
                                    at::ScalarType acc_dtype) {
  check_tensor(op, in.user_table, norms, "norms", acc_dtype, {3}, "user_table");
  return norms.contiguous();
}

// rows [B, d] and table [n, d] of one floating dtype and device, ids int64 [B, K].
inline void check_gathered_dots(const char* op, const at::Tensor& rows, const at::Tensor& table,
                                const at::Tensor& ids) {
  check_table(op, rows, "rows");
  check_tensor(op, rows, table, "table", rows.scalar_type(), {-1, rows.size(1)}, "rows");
  check_tensor(op, rows, ids, "ids", at::kLong, {rows.size(0), -1}, "rows");
}

// gathered_dots' forward state under unit_table, for its backward: output [B, K] in rows' dtype and
// squared_norms [B, K] in the accumulation dtype; returns output, contiguous.
inline at::Tensor checked_unit_dot_state(const char* op, const at::Tensor& rows, const at::Tensor& output,
                                         const at::Tensor& squared_norms, int64_t B, int64_t K) {
  check_tensor(op, rows, output, "output", rows.scalar_type(), {B, K}, "rows");
  check_tensor(op, rows, squared_norms, "squared_norms", opmath_dtype(rows.scalar_type()), {B, K}, "rows");
  return output.contiguous();
}

// Contiguous, checked inputs of class_terms: float [B, d] user_emb, pos_emb, neutral, negative,
// noise_pos and noise_neg of one dtype and device, bool [B] valid, int64 [B] num_negative.
struct ClassTermsInputs {
  at::Tensor user_emb, pos_emb, neutral, negative, noise_pos, noise_neg, valid, num_negative;
};

inline ClassTermsInputs prepare_class_terms(const char* op, const at::Tensor& user_emb, const at::Tensor& pos_emb,
                                            const at::Tensor& neutral, const at::Tensor& negative,
                                            const at::Tensor& noise_pos, const at::Tensor& noise_neg,
                                            const at::Tensor& valid, const at::Tensor& num_negative) {
  check_table(op, user_emb, "user_emb");
  const int64_t rows = user_emb.size(0), dim = user_emb.size(1);
  const std::pair<const at::Tensor*, const char*> rows_d[] = {
      {&pos_emb, "pos_emb"}, {&neutral, "neutral"}, {&negative, "negative"}, {&noise_pos, "noise_pos"},
      {&noise_neg, "noise_neg"}};
  for (const auto& [x, name] : rows_d) check_tensor(op, user_emb, *x, name, user_emb.scalar_type(), {rows, dim});
  check_tensor(op, user_emb, valid, "valid", at::kBool, {rows});
  check_tensor(op, user_emb, num_negative, "num_negative", at::kLong, {rows});
  return {user_emb.contiguous(), pos_emb.contiguous(), neutral.contiguous(), negative.contiguous(),
          noise_pos.contiguous(), noise_neg.contiguous(), valid.contiguous(), num_negative.contiguous()};
}

template <typename scalar_t>
ClassTermsBatch<scalar_t> class_terms_batch(const ClassTermsInputs& in) {
  return {in.user_emb.data_ptr<scalar_t>(), in.pos_emb.data_ptr<scalar_t>(), in.neutral.data_ptr<scalar_t>(),
          in.negative.data_ptr<scalar_t>(), in.noise_pos.data_ptr<scalar_t>(), in.noise_neg.data_ptr<scalar_t>(),
          in.valid.data_ptr<bool>(), in.num_negative.data_ptr<int64_t>(), in.user_emb.size(0), in.user_emb.size(1)};
}

// The [B] upstream gradient `name` of a per-row output, checked, in the accumulation dtype.
inline at::Tensor row_output_grad(const char* op, const ClassTermsInputs& in, const at::Tensor& grad,
                                  const char* name) {
  check_tensor(op, in.user_emb, grad, name, in.user_emb.scalar_type(), {in.user_emb.size(0)});
  return grad.to(opmath_dtype(in.user_emb.scalar_type())).contiguous();
}

// The 0-dim upstream gradient of a scalar loss, on the device of `ref`, in the accumulation dtype.
inline at::Tensor scalar_grad(const char* op, const at::Tensor& ref, const at::Tensor& grad) {
  check_same_device(op, ref, "the inputs", grad, "grad");
  TORCH_CHECK(grad.numel() == 1, op, ": grad must hold one value, got ", grad.sizes());
  return grad.reshape({}).to(opmath_dtype(ref.scalar_type()));
}

template <typename scalar_t>
RowBatch<scalar_t> row_batch(const RowInputs& in) {
  return RowBatch<scalar_t>{in.user_emb.data_ptr<scalar_t>(),
                            in.item_table.data_ptr<scalar_t>(),
                            in.users.data_ptr<int64_t>(),
                            in.pos_items.data_ptr<int64_t>(),
                            in.candidates.data_ptr<int64_t>(),
                            in.known_indptr.data_ptr<int64_t>(),
                            in.known_indices.data_ptr<int64_t>(),
                            in.rows,
                            in.num_candidates,
                            in.dim,
                            in.shared ? 0 : in.num_candidates,
                            in.known_indptr.numel() - 1,
                            in.item_table.size(0)};
}

// Per-row state tensors ([B] thresholds, cutoffs, sizes, counts) checked and made contiguous.
inline at::Tensor row_state(const char* op, const RowInputs& in, const at::Tensor& x, const char* name,
                            at::ScalarType dtype) {
  check_tensor(op, in.user_emb, x, name, dtype, {in.rows});
  return x.contiguous();
}

// [B, d] gradients of a per-row output, in user_emb's dtype.
inline at::Tensor row_grad(const char* op, const RowInputs& in, const at::Tensor& x, const char* name) {
  check_tensor(op, in.user_emb, x, name, in.user_emb.scalar_type(), {in.rows, in.dim});
  return x.contiguous();
}

// grad[b] / max(count[b], 1) in the accumulation dtype ([B, d]): the gradient each member of a
// class receives from its centroid (the mean over count members).
inline at::Tensor per_member_grad(const char* op, const RowInputs& in, const at::Tensor& grad, const char* grad_name,
                                  const at::Tensor& count, const char* count_name) {
  const at::ScalarType acc_dtype = opmath_dtype(in.user_emb.scalar_type());
  const at::Tensor members = row_state(op, in, count, count_name, at::kLong).clamp_min(1).unsqueeze(1);
  return (row_grad(op, in, grad, grad_name).to(acc_dtype) / members.to(acc_dtype)).contiguous();
}

// class_centroids' saved scatter groups: int32 [B, capacity] candidate indices, and their int32
// [B, 2] ends (-1: not saved).  The forward's output, after checking the capacity it was given.
inline at::Tensor saved_members_output(const char* op, const RowInputs& in, int64_t capacity) {
  TORCH_CHECK(capacity >= 0, op, ": capacity must be >= 0, got ", capacity);
  // zeros: the entries past a row's groups are never read, but an output is deterministic
  return at::zeros({in.rows, capacity}, in.users.options().dtype(at::kInt));
}

// The backward's check of the forward's saved groups (shapes and dtypes; the CPU kernel, which
// reads them, also checks their values).
inline void check_saved_members(const char* op, const RowInputs& in, const at::Tensor& saved_members,
                                const at::Tensor& saved_ends) {
  check_tensor(op, in.user_emb, saved_members, "saved_members", at::kInt, {in.rows, -1});
  check_tensor(op, in.user_emb, saved_ends, "saved_ends", at::kInt, {in.rows, 2});
}

}  // namespace pnn_fast
