"""Benchmarks (``make bench`` = ``python -m bench``): each ``bench/*_bench.py`` has a ``main()``."""
