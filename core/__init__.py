"""The thin shared core: rollout, advantage, loss, ZeRO wrapper and their helpers.

Every module is plain functions plus name-keyed registries; recipes in ``recipes/`` call them.
"""
