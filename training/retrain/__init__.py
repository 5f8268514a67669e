"""The MLOps loop of issue 13: scheduled federated retraining, drift, and the promotion policy.

``config``   the ``retrain:`` section of ``fedfraud.yaml``
``drift``    PSI of each fraud-model input and score against the champion's training reference
``cycle``    one federated retrain cycle (anomaly GNN, then fraud model) registered as the challenger
``policy``   challenger vs champion on the same labelled transactions; promote only when better
``schedule`` the cron schedule (APScheduler) and the drift trigger that start cycles
"""
