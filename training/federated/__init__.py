"""Federated training of the anomaly model with Flower (FedProx), simulated on Ray; and its centralized baseline.

Also the Flower helpers every ServerApp here shares (:mod:`fedfraud.training.federated.grid`). Import from the
modules themselves; this package re-exports nothing, so reading the config (``fedfraud.training.federated.config``)
does not import torch or flwr.
"""
