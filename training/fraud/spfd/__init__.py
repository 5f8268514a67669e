"""FED-SPFD (issue 39): share–private federated fraud detection for banks that hold different columns.

A shared encoder over the columns every bank has (trained federated, its embeddings aligned to the federation's
first- and second-order statistics), a private autoencoder per bank over that bank's own columns (kept at the
bank), and a classifier over both; published per serving bank as kind ``fraud-spfd``. See docs/fraud.md,
"Heterogeneous banks: FED-SPFD (issue 39)".
"""
