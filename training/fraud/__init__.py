"""Central fraud model that stacks the federated anomaly score (thesis §4.6.3, Table 4.2)."""
