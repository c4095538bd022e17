"""C++ judge cost (``verifiers.cpp.run_cpp``): one sandbox session per sample, compile once, then every test.

Prints the median session time of 3 runs for an A+B program: with <cstdio> and with <bits/stdc++.h> (what Open-R1's
``add_includes`` / ``patch_code`` prepend), 1 and 100 tests, with a Python checker, and without ``-static``.
"""
from __future__ import annotations

import statistics
import time

BITS = "#include <bits/stdc++.h>\nint main(){long long a,b;std::cin>>a>>b;std::cout<<a+b;}\n"
CSTDIO = '#include <cstdio>\nint main(){long long a,b;scanf("%lld%lld",&a,&b);printf("%lld",a+b);}\n'
CHECKER = "import sys\nprint(int(open(sys.argv[2]).read().split() == open(sys.argv[3]).read().split()))\n"


def _case(name: str, source: str, n: int, **kw) -> None:
    from verifiers.cpp import run_cpp

    runs, res = [], None
    for _ in range(3):
        t0 = time.monotonic()
        res = run_cpp(source, [{"input": "1 2", "output": "3"}] * n, **kw)
        runs.append(time.monotonic() - t0)
        assert res.all_passed, res
    print(f"{name:34s} tests={n:4d}  session {statistics.median(runs):5.2f} s  "
          f"program wall per test {1000 * statistics.mean(res.wall_s):4.1f} ms", flush=True)


def main() -> None:
    from verifiers.cpp import PISTON_FLAGS, default_flags

    print("flags:", " ".join(default_flags()))
    _case("<cstdio>", CSTDIO, 1)
    _case("<bits/stdc++.h>", BITS, 1)
    _case("<bits/stdc++.h>", BITS, 100)
    _case("<bits/stdc++.h>, Python checker", BITS, 100, checker=CHECKER)
    _case("<bits/stdc++.h>, without -static", BITS, 100, compile_flags=PISTON_FLAGS)


if __name__ == "__main__":
    main()
