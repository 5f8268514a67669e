"""The Feast feature repo: ``definitions.py`` + ``feature_store.yaml``; ``feast apply`` works in this folder."""
