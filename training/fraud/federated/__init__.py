"""Federated XGBoost fraud model as a Flower app (task / client_app / server_app) run on Ray simulation."""
