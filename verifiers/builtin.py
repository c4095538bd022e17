from verifiers import code, compose, format, gsm8k, math, math_sources  # noqa: F401
