"""Six Codeforces-style problems written for this repository: the local stand-in for ``open-r1/codeforces``
(config ``verifiable-prompts``) in the Codeforces recipe at ``scale=tiny``, and the problems the ``cf_code`` tests
judge.

Rows carry the dataset's columns (``id``, ``contest_id``, ``index``, ``time_limit``, ``memory_limit``, statement
fields, ``examples``, ``official_tests``, ``input_mode``, ``generated_checker``, ``executable``, ``generated_tests``
as a count, ``prompt``, ``language``), one row per problem and language (``cpp`` and ``python``, as
``verifiable-prompts`` has both). The generated tests live where Open-R1 reads them, one parquet file per contest
(``generated_tests/test_cases_{contest:04d}.parquet``: ``problem_id``, ``test_case_i``, ``input``, ``output``), so
``cf_code`` reads them through its ``tests_folder`` exactly as it reads the real ones.

Each problem has hand-written official inputs, a seeded generator for the generated ones, and two reference
solutions: the Python one defines every expected output (it is run here to write them), the C++ one must agree
(tests/verifiers/test_codeforces.py judges both on every test). Problem 9001/B has several valid answers and a
Python checker in Open-R1's ``generated_checker`` form (``checker.py input correct_output output``, prints 1 or 0);
9002/B reads ``input.txt`` and writes ``output.txt`` (``input_mode: file``).

The files are written on first use into the local cache, as tiny models are (:func:`folder`:
``<cache>/data/<digest>``, core/models/loading.py ``cached_build``; ``RLR_CACHE_DIR`` moves the cache), the digest
covering this module's source and the seed, so an edited problem is written to a new folder. ``python -m
core.data.codeforces_tiny`` prints that folder (writing it if needed); ``python -m core.data.codeforces_tiny DIR``
writes the files into ``DIR``. The prompt text is ours (same layout as the dataset's: statement,
limits, formats, examples, the fenced-block instruction), not a copy of Open-R1's.
"""
from __future__ import annotations

import hashlib
import json
import random
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

SEED = 2026
LANGUAGES = ("cpp", "python")
CONTESTS = {"9001": "Tiny Round 1 (written for this repository)", "9002": "Tiny Round 2 (written for this repository)"}
CONTEST_START = 1767225600  # 2026-01-01 00:00 UTC, a placeholder date for the contest_start column


@dataclass(frozen=True)
class Problem:
    id: str
    title: str
    description: str
    input_format: str
    output_format: str
    note: str
    editorial: str
    rating: int
    tags: tuple[str, ...]
    official_inputs: tuple[str, ...]
    generate: Callable[[random.Random], list[str]]  # the generated tests' inputs
    python: str  # reference solution; its outputs are the expected outputs
    cpp: str  # reference solution
    checker: str | None = None
    input_mode: str = "stdio"
    time_limit: float = 1.0
    memory_limit: float = 256.0


def _sums(rng: random.Random) -> list[str]:
    # Every generated test holds a sum beyond 32 bits, so an `int` solution fails all of them.
    out = []
    for _ in range(3):
        pairs = [(rng.randint(-10**18, 10**18), rng.randint(-10**18, 10**18)) for _ in range(rng.randint(1, 4))]
        pairs.append((10**18, 10**18 - rng.randint(0, 10**6)))
        out.append(f"{len(pairs)}\n" + "".join(f"{a} {b}\n" for a, b in pairs))
    return out


def _derangements(rng: random.Random) -> list[str]:
    return [f"{n}\n" for n in (rng.randint(100, 500) * 2, rng.randint(100, 500) * 2 + 1, 1000)]


def _fibonacci(rng: random.Random) -> list[str]:
    # Every generated test has an index near 10^18, so the O(n) loop runs out of time on each of them.
    return [f"{k}\n" + "".join(f"{rng.randint(10**17, 10**18)}\n" for _ in range(k)) for k in (1, 3, 10)]


def _thirds(rng: random.Random) -> list[str]:
    out = []
    for _ in range(3):
        nums = [str(rng.randint(1, 9)) + "".join(rng.choice("0123456789") for _ in range(rng.randint(50, 500)))
                for _ in range(rng.randint(3, 6))]
        out.append(f"{len(nums)}\n" + "".join(n + "\n" for n in nums))
    return out


def _minimum(rng: random.Random) -> list[str]:
    out = []
    for n in (100, 300, 1000):
        xs = [rng.randint(-10**12, 10**12) for _ in range(n)]
        out.append(f"{n}\n{' '.join(map(str, xs))}\n")
    return out


def _brackets(rng: random.Random) -> list[str]:
    out = []
    for _ in range(3):
        words = ["".join(rng.choice("()") for _ in range(rng.randint(100, 600))) for _ in range(rng.randint(3, 6))]
        out.append(f"{len(words)}\n" + "".join(w + "\n" for w in words))
    return out


CHECKER_9001B = '''import sys


def accepted(test_input, correct, output):
    n = int(test_input.split()[0])
    if correct.split() == ["-1"]:
        return output.split() == ["-1"]
    try:
        p = [int(x) for x in output.split()]
    except ValueError:
        return False
    return sorted(p) == list(range(1, n + 1)) and all(v != i for i, v in enumerate(p, 1))


texts = []
for name in sys.argv[1:4]:
    with open(name) as f:
        texts.append(f.read())
print(1 if accepted(*texts) else 0)
'''

PROBLEMS = (
    Problem(
        id="9001/A", title="Two Sums", rating=800, tags=("implementation", "math"),
        description="You are given t pairs of integers a and b. For each pair, print a + b.",
        input_format="The first line contains t (1 <= t <= 10). Each of the next t lines contains two integers a and "
                     "b (-10^18 <= a, b <= 10^18).",
        output_format="Print t lines: the i-th line is the sum of the i-th pair.",
        note="The sums can exceed 32 bits.", editorial="Read the numbers as 64-bit integers: |a + b| <= 2 * 10^18.",
        official_inputs=("2\n1 2\n-5 5\n", "3\n100 200\n-7 -8\n0 0\n"), generate=_sums,
        python="import sys\nd = sys.stdin.read().split()\n"
               "print('\\n'.join(str(int(d[i]) + int(d[i + 1])) for i in range(1, 2 * int(d[0]), 2)))\n",
        cpp="#include <cstdio>\nint main() {\n  int t;\n  scanf(\"%d\", &t);\n  while (t--) {\n    long long a, b;\n"
            "    scanf(\"%lld %lld\", &a, &b);\n    printf(\"%lld\\n\", a + b);\n  }\n}\n"),
    Problem(
        id="9001/B", title="No Fixed Points", rating=1000, tags=("constructive algorithms",),
        description="Print a permutation p of 1, 2, ..., n such that p_i != i for every i, or -1 if there is none.",
        input_format="One integer n (1 <= n <= 1000).",
        output_format="n distinct integers from 1 to n separated by spaces, with p_i != i; or -1. Any valid "
                      "permutation is accepted.",
        note="For n = 3 both \"2 3 1\" and \"3 1 2\" are correct.",
        editorial="Shift by one (p_i = i + 1, p_n = 1), or swap neighbours and rotate the last three when n is odd. "
                  "n = 1 has no answer.",
        official_inputs=("1\n", "2\n", "3\n", "6\n"), generate=_derangements, checker=CHECKER_9001B,
        python="n = int(input())\nprint(-1 if n == 1 else ' '.join(str(i % n + 1) for i in range(1, n + 1)))\n",
        cpp="#include <cstdio>\nint p[1001];\nint main() {\n  int n;\n  scanf(\"%d\", &n);\n"
            "  if (n == 1) { puts(\"-1\"); return 0; }\n"
            "  for (int i = 1; i + 1 <= n; i += 2) { p[i] = i + 1; p[i + 1] = i; }\n"
            "  if (n % 2) { p[n - 2] = n - 1; p[n - 1] = n; p[n] = n - 2; }\n"
            "  for (int i = 1; i <= n; i++) printf(\"%d%c\", p[i], i == n ? '\\n' : ' ');\n}\n"),
    Problem(
        id="9001/C", title="Far Fibonacci", rating=1500, tags=("math", "matrices"),
        description="F_1 = F_2 = 1 and F_k = F_(k-1) + F_(k-2). Answer t queries: F_n modulo 10^9 + 7.",
        input_format="The first line contains t (1 <= t <= 10); each of the next t lines contains n "
                      "(1 <= n <= 10^18).",
        output_format="For each query, F_n modulo 1000000007 on its own line.",
        note="A loop up to n is far too slow for n = 10^18.",
        editorial="Fast doubling: F_2k = F_k (2 F_(k+1) - F_k), F_(2k+1) = F_k^2 + F_(k+1)^2; O(log n) per query.",
        official_inputs=("3\n1\n2\n10\n", "2\n50\n90\n"), generate=_fibonacci,
        python="import sys\nM = 10**9 + 7\n\n\ndef fib(n):\n    if n == 0:\n        return 0, 1\n"
               "    a, b = fib(n >> 1)\n    c, d = a * (2 * b - a) % M, (a * a + b * b) % M\n"
               "    return (d, (c + d) % M) if n & 1 else (c, d)\n\n\n"
               "d = sys.stdin.read().split()\nprint('\\n'.join(str(fib(int(x))[0]) for x in d[1:1 + int(d[0])]))\n",
        cpp="#include <cstdio>\ntypedef unsigned long long u;\nconst u M = 1000000007ULL;\n"
            "void fib(u n, u &f, u &g) {\n  if (!n) { f = 0; g = 1; return; }\n  u a, b;\n  fib(n >> 1, a, b);\n"
            "  u c = a * ((2 * b + M - a) % M) % M, d = (a * a + b * b) % M;\n"
            "  if (n & 1) { f = d; g = (c + d) % M; } else { f = c; g = d; }\n}\n"
            "int main() {\n  int t;\n  scanf(\"%d\", &t);\n  while (t--) {\n    u n, f, g;\n"
            "    scanf(\"%llu\", &n);\n    fib(n, f, g);\n    printf(\"%llu\\n\", f);\n  }\n}\n"),
    Problem(
        id="9002/A", title="Divisible by Three", rating=800, tags=("math", "strings"),
        description="For each of t positive integers, given by their decimal digits, say whether it is divisible "
                    "by 3.",
        input_format="The first line contains t (1 <= t <= 10); each of the next t lines holds an integer of at "
                     "most 1000 digits without leading zeros.",
        output_format="For each integer print YES if it is divisible by 3 and NO otherwise (any letter case).",
        note="The numbers do not fit in 64 bits.",
        editorial="A number and its digit sum have the same remainder modulo 3.",
        official_inputs=("3\n3\n10\n123456789\n", "2\n1000000000000000000000002\n7\n"), generate=_thirds,
        python="import sys\nd = sys.stdin.read().split()\n"
               "print('\\n'.join('YES' if sum(map(int, s)) % 3 == 0 else 'NO' for s in d[1:1 + int(d[0])]))\n",
        cpp="#include <cstdio>\nchar s[1005];\nint main() {\n  int t;\n  scanf(\"%d\", &t);\n  while (t--) {\n"
            "    scanf(\"%1004s\", s);\n    int r = 0;\n    for (char *c = s; *c; c++) r = (r + *c - '0') % 3;\n"
            "    puts(r ? \"NO\" : \"YES\");\n  }\n}\n"),
    Problem(
        id="9002/B", title="Minimum in a File", rating=800, tags=("implementation",), input_mode="file",
        description="Find the smallest of n integers. This problem reads input.txt and writes output.txt.",
        input_format="input.txt: the first line contains n (1 <= n <= 5000), the second n integers of absolute "
                     "value at most 10^12.",
        output_format="output.txt: the smallest of the n integers.",
        note="Standard input and output are not used.", editorial="One pass with a 64-bit minimum.",
        official_inputs=("3\n5 -2 7\n", "1\n1000000000000\n"), generate=_minimum,
        python="with open('input.txt') as f:\n    d = f.read().split()\n"
               "with open('output.txt', 'w') as f:\n    f.write(f'{min(map(int, d[1:1 + int(d[0])]))}\\n')\n",
        cpp="#include <cstdio>\nint main() {\n  FILE *in = fopen(\"input.txt\", \"r\"), *out = fopen(\"output.txt\", "
            "\"w\");\n  int n;\n  fscanf(in, \"%d\", &n);\n  long long m = 0, x;\n"
            "  for (int i = 0; i < n; i++) { fscanf(in, \"%lld\", &x); if (!i || x < m) m = x; }\n"
            "  fprintf(out, \"%lld\\n\", m);\n}\n"),
    Problem(
        id="9002/C", title="Bracket Repair", rating=1100, tags=("greedy", "strings"),
        description="For each bracket string, find the smallest number of brackets to insert (anywhere) to make it "
                    "a balanced bracket sequence.",
        input_format="The first line contains t (1 <= t <= 10); each of the next t lines holds a non-empty string "
                     "of '(' and ')' of length at most 1000.",
        output_format="For each string, the smallest number of insertions.",
        note="\"())\" needs one \"(\"; \")(\" needs two brackets.",
        editorial="Scan left to right with a balance: a ')' at balance 0 needs an inserted '('; the final balance "
                  "needs as many ')'.",
        official_inputs=("3\n())\n)(\n(())\n", "2\n(((\n()()\n"), generate=_brackets,
        python="import sys\n\n\ndef need(s):\n    bal = add = 0\n    for c in s:\n        if c == '(':\n"
               "            bal += 1\n        elif bal:\n            bal -= 1\n        else:\n            add += 1\n"
               "    return add + bal\n\n\nd = sys.stdin.read().split()\n"
               "print('\\n'.join(str(need(s)) for s in d[1:1 + int(d[0])]))\n",
        cpp="#include <cstdio>\nchar s[1005];\nint main() {\n  int t;\n  scanf(\"%d\", &t);\n  while (t--) {\n"
            "    scanf(\"%1004s\", s);\n    int bal = 0, add = 0;\n"
            "    for (char *c = s; *c; c++) { if (*c == '(') bal++; else if (bal) bal--; else add++; }\n"
            "    printf(\"%d\\n\", add + bal);\n  }\n}\n"),
)


def expected_output(problem: Problem, test_input: str) -> str:
    """The Python reference's output on ``test_input`` (our own program, run directly, in a scratch directory)."""
    with tempfile.TemporaryDirectory(prefix="rlr-cf-tiny-") as tmp:
        file_mode = problem.input_mode == "file"
        if file_mode:
            Path(tmp, "input.txt").write_text(test_input)
        run = subprocess.run([sys.executable, "-I", "-c", problem.python], input="" if file_mode else test_input,
                             capture_output=True, text=True, timeout=60, cwd=tmp, check=False)
        if run.returncode != 0:
            raise RuntimeError(f"reference of {problem.id} failed on {test_input[:60]!r}: {run.stderr[-500:]}")
        return Path(tmp, "output.txt").read_text() if file_mode else run.stdout


def tests(problem: Problem, inputs) -> list[dict]:
    return [{"input": x, "output": expected_output(problem, x)} for x in inputs]


def generated_inputs(seed: int = SEED) -> dict[str, list[str]]:
    """Each problem's generated test inputs, from its own seeded stream (adding a problem changes no other's)."""
    return {p.id: p.generate(random.Random(f"{seed}:{p.id}")) for p in PROBLEMS}


def prompt(problem: Problem, language: str, examples: list[dict]) -> str:
    io = ("read input.txt and write output.txt" if problem.input_mode == "file"
          else "read standard input and write standard output")
    name = {"cpp": "C++17", "python": "Python 3"}[language]
    shown = "".join(f"```input\n{e['input']}```\n```output\n{e['output']}```\n" for e in examples)
    return (f"Solve the following competitive programming problem in {name}. Your program must {io}, and print "
            f"nothing else.\n\nPut your final solution in a single code block:\n```{language}\n<your code here>\n"
            f"```\n\n# Problem\n\n{problem.description}\n\n## Constraints\n"
            f"Time limit per test: {_amount(problem.time_limit, 'second')}\n"
            f"Memory limit per test: {_amount(problem.memory_limit, 'megabyte')}\n\n"
            f"## Input Format\n{problem.input_format}\n\n## Output Format\n{problem.output_format}\n\n"
            f"## Examples\n{shown}\n## Note\n{problem.note}\n")


def _amount(value: float, unit: str) -> str:
    return f"{value:g} {unit}{'' if value == 1 else 's'}"


def build(seed: int = SEED) -> tuple[list[dict], dict[str, list[dict]]]:
    """(rows, generated tests by problem id): the dataset rows, one per problem and language, and their tests."""
    inputs = generated_inputs(seed)
    generated = {p.id: tests(p, inputs[p.id]) for p in PROBLEMS}
    rows = []
    for p in PROBLEMS:
        official = tests(p, p.official_inputs)
        contest, index = p.id.split("/")
        for language in LANGUAGES:
            rows.append({
                "id": p.id, "aliases": [], "contest_id": contest, "contest_name": CONTESTS[contest],
                "contest_type": "CF", "contest_start": CONTEST_START, "contest_start_year": 2026, "index": index,
                "time_limit": p.time_limit, "memory_limit": p.memory_limit, "title": p.title,
                "description": p.description, "input_format": p.input_format, "output_format": p.output_format,
                "interaction_format": None, "note": p.note, "examples": official[:1], "editorial": p.editorial,
                "rating": p.rating, "tags": list(p.tags), "testset_size": len(official), "official_tests": official,
                "official_tests_complete": True, "input_mode": p.input_mode, "generated_checker": p.checker,
                "executable": True, "generated_tests": len(generated[p.id]),
                "prompt": prompt(p, language, official[:1]), "language": language})
    return rows, generated


def folder(seed: int = SEED, build: bool = True) -> Path:
    """The folder holding ``train.jsonl`` and ``generated_tests/`` (cf_code's ``tests_folder``), written by
    :func:`write` the first time it is asked for (once per machine and module version; concurrent callers build it
    once, atomically); ``build=False`` only names it (the ``${codeforces_tiny:}`` resolver: a config that is resolved
    but never reads the tiny problems writes nothing)."""
    from core.models.loading import cache_entry, cached_build

    key = {"name": "codeforces_tiny", "seed": seed, "module": hashlib.sha256(Path(__file__).read_bytes()).hexdigest()}
    return cached_build("data", key, lambda out: write(out, seed)) if build else cache_entry("data", key)


def write(folder: Path, seed: int = SEED) -> list[Path]:
    """Write ``train.jsonl`` and ``generated_tests/test_cases_{contest:04d}.parquet`` under ``folder``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows, generated = build(seed)
    folder = Path(folder)
    (folder / "generated_tests").mkdir(parents=True, exist_ok=True)
    written = [folder / "train.jsonl"]
    written[0].write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    for contest in CONTESTS:
        table = [{"problem_id": pid, "test_case_i": i, "input": t["input"], "output": t["output"]}
                 for pid, ts in generated.items() if pid.split("/")[0] == contest for i, t in enumerate(ts)]
        path = folder / "generated_tests" / f"test_cases_{int(contest):04d}.parquet"
        pq.write_table(pa.Table.from_pylist(table), path)
        written.append(path)
    return written


if __name__ == "__main__":
    from core.errors import printed_help

    if printed_help(sys.argv[1:], __doc__):
        pass
    elif len(sys.argv) > 1:
        print("\n".join(str(path) for path in write(Path(sys.argv[1]))))
    else:
        print(folder())
