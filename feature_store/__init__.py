"""Turns raw transactions into model inputs: schema, encoders, privacy, ego graphs, Feast."""
