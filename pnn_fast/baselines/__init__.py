"""The paper's competing methods (Table 3) as training objectives.

Importing this package imports every module in it, and each module registers its objectives
with :func:`pnn_fast.objectives.register`, so a new method is one new file.
"""
import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
