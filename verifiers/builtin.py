from verifiers import code, codeforces, compose, cpp, format, gsm8k, ifeval, math, math_sources  # noqa: F401
