"""Federated anomaly detection on dynamic ego graphs (thesis chapter 4): negatives, GNN + pooling, discriminator.

Anomaly score = 1 − f(q_{t-1}, q_t); high means unusual. Serving uses
:class:`fedfraud.training.anomaly.scorer.AnomalyScorer`. Import from the modules
themselves; this package re-exports nothing, so reading the config
(``fedfraud.training.anomaly.config``) does not import torch.
"""
