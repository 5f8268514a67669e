"""Training side: data loaders, anomaly GNN, federated apps, fraud model, tokenizer, registry."""
