"""Evaluation as the sources evaluate: ``python -m recipes.eval`` (docs/eval.md).

``estimators``: pass@k (Chen et al. 2021) and avg@k; ``schema``: the typed eval config; ``sets``: named
evaluation sets, their gold answers and verifiers; ``sampling``: n completions per problem through the rollout
engines, stop sequences, scores; ``checks``: everything refused before a model is loaded.
"""
