// Every CUDA op, compiled as one translation unit. Each op keeps its own file (csrc/cuda/<op>_cuda.cu);
// compiling them together means torch's headers go through nvcc's host compiler and its device
// compiler (once per GPU architecture) once in all, not once per op.
// tests/test_build.py checks that every op file is listed here.
#include "cuda/class_centroids_cuda.cu"
#include "cuda/class_terms_cuda.cu"
#include "cuda/count_unlabeled_cuda.cu"
#include "cuda/csr_spmm_cuda.cu"
#include "cuda/embedding_bpr_cuda.cu"
#include "cuda/gathered_dots_cuda.cu"
#include "cuda/gathered_norm_cuda.cu"
#include "cuda/hard_negative_argmax_cuda.cu"
#include "cuda/lowest_k_mask_cuda.cu"
#include "cuda/masked_logsumexp_cuda.cu"
#include "cuda/history_sample_cuda.cu"
#include "cuda/masked_topk_cuda.cu"
#include "cuda/pairwise_uniformity_cuda.cu"
#include "cuda/rows_contain_cuda.cu"
#include "cuda/unit_rows_cuda.cu"
#include "cuda/unknown_items_cuda.cu"
