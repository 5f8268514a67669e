"""G-HIN2Vec (thesis chapter 3): unsupervised graph-level embeddings of a cardholder's heterogeneous ego graph.

``graph.py`` builds the heterogeneous ego graph from the project's dynamic ego-graph state, ``model.py`` holds the
encoder and the double-triplet loss, ``embed.py`` the one embedding function used by batch features and the
incremental path, ``federated/`` the Flower app triad that trains it, ``publish.py`` the registry artifact.
"""
