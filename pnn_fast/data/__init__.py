"""Datasets: loaders for common implicit-feedback formats, RecBole's split, synthetic data.

>>> from pnn_fast.data import load_dataset, synthetic_dataset
>>> data = load_dataset("../shared/data/ml-100k")        # doctest: +SKIP
>>> print(synthetic_dataset().summary())                  # doctest: +SKIP
"""
from .dataset import DataFormatError, Dataset
from .loaders import load_dataset
from .locate import default_data_dir
from .split import random_share_by_user, random_split_by_user, split_counts
from .synthetic import synthetic_dataset

__all__ = [
    "DataFormatError",
    "Dataset",
    "default_data_dir",
    "load_dataset",
    "random_share_by_user",
    "random_split_by_user",
    "split_counts",
    "synthetic_dataset",
]
