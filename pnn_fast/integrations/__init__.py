"""Drop-ins for other recommender frameworks, one module each; none is imported by ``pnn_fast``.

``pnn_fast.integrations.recbole``: RecBole 1.2.1 models trained with PNNLoss or DNSLoss
(docs/recbole.md). Each module needs its framework installed and says which when it is not.
"""
