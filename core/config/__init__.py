"""Configuration: validation before any model is built, the ``scale`` group, and the frozen run config."""
