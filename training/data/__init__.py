"""Transaction data: CSV loaders, the synthetic generator and bank partitioning."""
