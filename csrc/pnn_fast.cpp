// The pnn_fast operator library: every schema, registered once.  Each op's kernels are registered
// per backend by csrc/cpu/<op>_cpu.cpp (TORCH_LIBRARY_IMPL CPU) and csrc/cuda/<op>_cuda.cu (CUDA);
// its fake (meta) implementation and, for most ops, its autograd by pnn_fast/ops/<op>.py; the
// autograd of the two ops on every BPR step (embedding_bpr, gathered_norm) is in csrc/autograd.cpp.
//
// Shapes: B rows, C candidates, d embedding size, I items, n points; ids are int64.  The
// thresholds are in the accumulation dtype (float32 for float16/bfloat16/float32 inputs).
#include <torch/library.h>

#ifdef TORCH_EXTENSION_NAME
// Built as the Python module pnn_fast._C (torch.utils.cpp_extension defines TORCH_EXTENSION_NAME):
// a module whose import runs the registrations below, with one function, simd_level.  Plain C API
// only, so the extension can be built against the limited API (one abi3 wheel for every Python).
#include <Python.h>

#include "common/checks.h"
#include "cpu/simd.h"

namespace {
// pnn_fast._C.simd_level(): the instruction set the CPU kernels run with ("avx512", "avx2" or
// "baseline"), for the benchmarks' reports and the variant tests.
PyObject* simd_level_name(PyObject*, PyObject*) {
  static const char* const names[] = {"baseline", "avx2", "avx512"};
  return PyUnicode_FromString(names[pnn_fast::simd_level()]);
}

// pnn_fast._C.host_read_count(): the read-backs the ops' checks made that synchronise on a device.
PyObject* host_read_count(PyObject*, PyObject*) { return PyLong_FromLongLong(pnn_fast::host_read_count()); }

// pnn_fast._C.input_error_message(code, bound): the text of a deferred input error (checks.h).
PyObject* input_error_message(PyObject*, PyObject* args) {
  long long code = 0, bound = 0;
  if (!PyArg_ParseTuple(args, "LL", &code, &bound)) return nullptr;
  try {
    return PyUnicode_FromString(pnn_fast::input_error_message(code, bound).c_str());
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_ValueError, e.what());
    return nullptr;
  }
}

PyMethodDef module_methods[] = {
    {"simd_level", simd_level_name, METH_NOARGS, "The instruction set of the CPU kernels."},
    {"host_read_count", host_read_count, METH_NOARGS, "Read-backs of the ops' checks that synchronise a device."},
    {"input_error_message", input_error_message, METH_VARARGS, "The text of a deferred input error."},
    {nullptr, nullptr, 0, nullptr}};
}  // namespace

extern "C" PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, module_methods};
  return PyModule_Create(&module_def);
}
#endif

TORCH_LIBRARY(pnn_fast, m) {
  // (hard int64 [B]: argmax_j of the score over U_b, smallest j on ties, -1 if U_b is empty;
  //  num_unlabeled int64 [B]: |U_b|)
  m.def(
      "hard_negative_argmax(Tensor user_emb, Tensor item_table, Tensor users, Tensor pos_items, "
      "Tensor candidates, Tensor known_indptr, Tensor known_indices) -> (Tensor, Tensor)");
  // num_unlabeled int64 [B]: |U_b|, without scoring (the embeddings only fix device and dtype)
  m.def(
      "count_unlabeled(Tensor user_emb, Tensor item_table, Tensor users, Tensor pos_items, Tensor candidates, "
      "Tensor known_indptr, Tensor known_indices) -> Tensor");
  // (neutral [B, d], negative [B, d], num_neutral int64 [B], num_negative int64 [B], threshold, cutoff,
  //  hard int64 [B], saved_members int32 [B, capacity], saved_ends int32 [B, 2]): the class means
  // (0 for an empty class) of the candidates' item rows, the negative class being the k[b] lowest
  // (score, j) of U_b (k clamped to [0, |U_b|]), which are those <= (threshold, cutoff) (cutoff -1
  // when none): the selection state the backward reads; from the same scores, the hard negative
  // of hard_negative_argmax; and, for a shared list, the candidates each row's backward scatters
  // to, in two groups (entries [0, e0) and [e0, e1) of the row, (e0, e1) = saved_ends[b], or
  // (-1, -1) when they exceed capacity: the backward then rescores the row).  The CPU kernel saves
  // them; the CUDA kernel rescores every row and leaves saved_ends at -1.
  m.def(
      "class_centroids_fwd(Tensor user_emb, Tensor item_table, Tensor users, Tensor pos_items, "
      "Tensor candidates, Tensor known_indptr, Tensor known_indices, Tensor k, int capacity) "
      "-> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
  // grad_item_table [I, d]
  m.def(
      "class_centroids_bwd(Tensor grad_neutral, Tensor grad_negative, Tensor user_emb, Tensor item_table, "
      "Tensor users, Tensor pos_items, Tensor candidates, Tensor known_indptr, Tensor known_indices, "
      "Tensor threshold, Tensor cutoff, Tensor num_neutral, Tensor num_negative, Tensor saved_members, "
      "Tensor saved_ends) -> Tensor");
  // (rank [B], constrain [B]) in user_emb's dtype: L_rank and L_constrain of each row from its class
  // centroids (pnn_rows.h's class_terms_row): user_emb, pos_emb, neutral, negative, noise_pos and
  // noise_neg float [B, d], valid bool [B] (|U_b| > 0), num_negative int64 [B]
  m.def(
      "class_terms_fwd(Tensor user_emb, Tensor pos_emb, Tensor neutral, Tensor negative, Tensor noise_pos, "
      "Tensor noise_neg, Tensor valid, Tensor num_negative) -> (Tensor, Tensor)");
  // (grad_user_emb, grad_pos_emb, grad_neutral, grad_negative) [B, d] given grad_rank and grad_constrain [B]
  m.def(
      "class_terms_bwd(Tensor grad_rank, Tensor grad_constrain, Tensor user_emb, Tensor pos_emb, Tensor neutral, "
      "Tensor negative, Tensor noise_pos, Tensor noise_neg, Tensor valid, Tensor num_negative) "
      "-> (Tensor, Tensor, Tensor, Tensor)");
  // log mean_{i != j} exp(-t ||x_i - x_j||^2) of x [n, d]: a 0-dim tensor (0 when n < 2), the float64
  // log-sum-exp over all ordered pairs, and with `save` (CPU only) the pairs' exponentials for the
  // backward: each row's max m_i [n] and exp(l_ij - m_i) over j > i packed row after row
  // [n (n - 1) / 2], in x's accumulation dtype (both empty without `save`).  With keep (bool [n]), the
  // same over the kept rows only, as if x were x[keep] (its n the kept count, a prefix of the saved
  // tensors), in fixed shapes: the distinct items of a step without their count read on the host
  m.def("pairwise_uniformity_fwd(Tensor x, float t, bool save, Tensor? keep=None) -> (Tensor, Tensor, Tensor, Tensor)");
  // grad_x [n, d] given the 0-dim grad and the forward's outputs (empty saved ones: computed again);
  // 0 in the rows that keep leaves out
  m.def("pairwise_uniformity_bwd(Tensor grad, Tensor x, float t, Tensor total, Tensor saved_row_max, "
        "Tensor saved_exps, Tensor? keep=None) -> Tensor");
  // [B] in x's accumulation dtype: log sum_j exp(scale x[b, j] - shift[j]) over the j with excluded[b, j] false (a
  // sampled softmax's denominator over each row's negatives or one shared pool; shift [M], the logQ
  // correction, and excluded bool [B, M] may be absent); -inf for a row with nothing left
  m.def("masked_logsumexp_fwd(Tensor x, float scale, Tensor? shift=None, Tensor? excluded=None) -> Tensor");
  // grad_x [B, M] given grad [B] and the forward's output lse (both in the accumulation dtype):
  // grad[b] scale exp(l[b, j] - lse[b]), 0 where excluded
  m.def("masked_logsumexp_bwd(Tensor grad, Tensor x, float scale, Tensor? shift, Tensor? excluded, Tensor lse) "
        "-> Tensor");

  // Table lookups of a training step (the sampler, BPR and RecBole's L2 term).
  // int64 [B, K]: for float32 uniform [B, K] in [0, 1), the floor(u * (num_items - N_u))-th item not known to users[b]
  m.def("unknown_items(Tensor known_indptr, Tensor known_indices, Tensor users, Tensor uniform, int num_items) "
        "-> Tensor");
  // int64 [B, L]: a uniform random subset of min(N_u, L) of users[b]'s known items (Floyd's algorithm on
  // the float32 draws uniform [B, L] in [0, 1)), then -1 in the remaining slots
  m.def("history_sample(Tensor known_indptr, Tensor known_indices, Tensor users, Tensor uniform) -> Tensor");
  // (loss, coef, norms): loss = the mean over b, k of softplus(x_bk), x_bk = <U[users_b], I[neg_bk]> -
  // <U[users_b], I[pos_b]>, plus reg_weight (||U[users]||_F + ||I[pos_items]||_F + ||I[neg_items]||_F) / B
  // (RecBole's EmbLoss of the three gathered matrices), a 0-dim tensor; coef [B, K] (accumulation dtype) =
  // softplus'(x_bk) / (B K) = d loss / d x_bk; norms [3] (accumulation dtype) = those three norms, computed
  // only when reg_weight != 0 (zeros otherwise)
  m.def("embedding_bpr_fwd(Tensor user_table, Tensor item_table, Tensor users, Tensor pos_items, Tensor neg_items, "
        "float reg_weight) -> (Tensor, Tensor, Tensor)");
  // (grad_user_table [U, d], grad_item_table [I, d]) given the 0-dim grad and the forward's coef and norms
  m.def("embedding_bpr_bwd(Tensor grad, Tensor coef, Tensor norms, Tensor user_table, Tensor item_table, "
        "Tensor users, Tensor pos_items, Tensor neg_items, float reg_weight) -> (Tensor, Tensor)");
  // || table[ids] ||_F, the Frobenius norm of the gathered rows: a 0-dim tensor
  m.def("gathered_norm_fwd(Tensor table, Tensor ids) -> Tensor");
  // grad_table [n, d] given the 0-dim grad and the forward's output
  m.def("gathered_norm_bwd(Tensor grad, Tensor table, Tensor ids, Tensor output) -> Tensor");
  // (output [B, K] in rows' dtype, squared_norms): output <rows[b], table[ids[b, k]]> (the attention's
  // logits), or with unit_table <rows[b], table[ids[b, k]] / max(||table[ids[b, k]]||, 1e-12)> (sampled
  // softmax's cosines), whose backward reads the rows' squared norms, [B, K] in the accumulation dtype
  // ([0] without unit_table)
  m.def("gathered_dots_fwd(Tensor rows, Tensor table, Tensor ids, bool unit_table) -> (Tensor, Tensor)");
  // (grad_rows [B, d], grad_table [n, d]) given grad [B, K] and the forward's outputs
  m.def("gathered_dots_bwd(Tensor grad, Tensor rows, Tensor table, Tensor ids, Tensor output, "
        "Tensor squared_norms, bool unit_table) -> (Tensor, Tensor)");
  // [n, d] in x's dtype: x / max(||x||, 1e-12) row by row, F.normalize(x, dim=-1)
  m.def("unit_rows_fwd(Tensor x) -> Tensor");
  // grad_x [n, d] given grad [n, d]
  m.def("unit_rows_bwd(Tensor grad, Tensor x) -> Tensor");
  // (values [B, k] in scores' dtype, columns int64 [B, k]): each row's k best columns, best first,
  // equal scores by ascending column, a column of an exclusion set of user rows[b] scoring -inf;
  // exclusion sets are CSR (indptr, indices) over users, sorted within a row; a NaN score that is
  // not excluded is an error (the evaluator's full ranking)
  m.def("masked_topk(Tensor scores, Tensor rows, Tensor[] exclude_indptr, Tensor[] exclude_indices, int k) "
        "-> (Tensor, Tensor)");
  // (values [T, k] in user_rows' dtype, columns int64 [T, k]): masked_topk of user_rows @ item_table.T
  // (user_rows [T, d], item_table [I, d]) without the [T, I] scores, items block_items at a time (0:
  // the op's choice); CPU only (the evaluator's full ranking over large catalogs)
  m.def("dot_topk(Tensor user_rows, Tensor item_table, Tensor rows, Tensor[] exclude_indptr, "
        "Tensor[] exclude_indices, int k, int block_items) -> (Tensor, Tensor)");
  // bool [B, K]: whether columns[b, k] is among the indices of row rows[b] of a CSR (indptr, indices),
  // each row sorted ascending (the evaluator's relevance of the ranked items)
  m.def("rows_contain(Tensor indptr, Tensor indices, Tensor rows, Tensor columns) -> Tensor");

  // [n, d] in x's dtype: (addend + A @ x) / divisor for the CSR matrix A (indptr [n + 1], indices [nnz]
  // < m, values [nnz]), x [m, d] and addend [n, d] (none: 0), each row's products summed in stored
  // order (the graph models' propagation).  Not differentiable: models/graph.py's layer_mean and
  // sparse_matmul give the backward as products of the transpose
  m.def("csr_spmm(Tensor indptr, Tensor indices, Tensor values, Tensor x, Tensor? addend=None, float divisor=1.0) "
        "-> Tensor");

  // bool [B, K]: whether scores[b, j] is among the k[b] lowest of its row (0 <= k[b] <= K), in
  // torch.sort's order with equal scores by ascending column: a stable argsort's first k[b] (SL's
  // split of its sampled negatives into PNN's classes)
  m.def("lowest_k_mask(Tensor scores, Tensor k) -> Tensor");

  // int64 [2]: (code, bound) of the first deferred input error on like's device (0, 0 when none),
  // which it clears (csrc/common/checks.h; pnn_fast.check_kernel_inputs reads it)
  m.def("take_input_error(Tensor like) -> Tensor");
  // ids (a new tensor, ids' shape and dtype) with each entry outside [0, bound) clamped into it, which
  // records the deferred input error "<op>: <name> has ids outside [0, bound)": the losses'
  // validate="deferred" check of their id arguments, with no read-back
  m.def("ids_in_range(Tensor ids, int bound, str op, str name) -> Tensor");
}
