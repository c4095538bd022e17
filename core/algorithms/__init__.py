"""Algorithms: advantage estimators, policy losses and KL, reward shaping, the KL controller (registries keyed
by the config groups ``advantage``, ``loss``, ``kl`` and ``train.shaping``)."""
