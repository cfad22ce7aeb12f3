"""pnn_fast: positive-neutral-negative (PNN) learning for implicit-feedback recommenders.

A fast, drop-in implementation of the RecSys'24 PNN loss with fused C++/CUDA kernels and a
pure-PyTorch reference backend of identical semantics (docs/semantics.md).
"""
from ._extension import build_info
from .known import KnownPositives
from .losses import BPRLoss, DNSLoss, PNNLoss, UserAwareAttention, embedding_bpr

__version__ = "0.1.0"

__all__ = ["BPRLoss", "DNSLoss", "KnownPositives", "PNNLoss", "UserAwareAttention", "build_info", "embedding_bpr",
           "__version__"]
