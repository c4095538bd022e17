from verifiers import code, compose, format, gsm8k, ifeval, math, math_sources  # noqa: F401
