"""The thin shared core, one subpackage per concern (the config groups mirror them):

- ``algorithms``: advantage estimators, policy losses, KL, shaping (``advantage``, ``loss``, ``kl``);
- ``rollout``: sampling engines (``rollout``);
- ``models``: loading, log-prob and padding-free forwards, critic, reward models (``model``);
- ``data``: prompt datasets and preference pairs (``data``);
- ``training``: device and precision, process group, optimiser engines, checkpoints (``optim``, ``zero``);
- ``config``: validation, the ``scale`` group, the frozen run config;
- ``reporting``: metrics and the results table (``logger``).

Every module is plain functions plus name-keyed registries; recipes in ``recipes/`` call them.
"""
