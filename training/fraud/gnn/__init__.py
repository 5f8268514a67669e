"""Supervised federated GNN fraud variants on each bank's transaction graph: FedAvg-GNN and FedRPDA.

Modules (import them directly; this package re-exports nothing, so reading the config imports no torch):

* :mod:`.config`: ``fraud.gnn`` settings;
* :mod:`.graph`: the bank's transaction graph from the fraud feature rows (past-only typed edges);
* :mod:`.model`: the GNN (GraphSAGE mean per relation) and its input transform;
* :mod:`.rpda`: the paper's pieces (risk intensity, dynamic weights, augmentation, prototypes, L_P);
* :mod:`.task`, :mod:`.client_app`, :mod:`.server_app`: the Flower app triad;
* :mod:`.loopback`: the same apps in one process; :mod:`.trainer`: runs the jobs;
* :mod:`.artifact`: the trained model, its threshold and its registry form;
* :mod:`.study`: ``fedfraud eval variants``.
"""
