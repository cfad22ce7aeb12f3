"""pnn_fast: positive-neutral-negative (PNN) learning for implicit-feedback recommenders.

A fast, drop-in implementation of the RecSys'24 PNN loss with fused C++/CUDA kernels and a
pure-PyTorch reference backend of identical semantics (docs/semantics.md).
"""
from ._checks import check_kernel_inputs
from ._extension import build_info
from ._version import __version__
from .attention import UserAwareAttention
from .csr import CSR
from .known import KnownPositives
from .losses import BPRLoss, DNSLoss, PNNLoss, SampledSoftmaxLoss, embedding_bpr
from .sampling import sample_unknown
from .softmax_losses import BilateralSoftmaxLoss, PairwiseSoftmaxLoss, SoftmaxLossAtK

__all__ = ["BPRLoss", "BilateralSoftmaxLoss", "CSR", "DNSLoss", "KnownPositives", "PNNLoss", "PairwiseSoftmaxLoss",
           "SampledSoftmaxLoss", "SoftmaxLossAtK", "UserAwareAttention", "build_info", "check_kernel_inputs",
           "embedding_bpr", "sample_unknown", "__version__"]
