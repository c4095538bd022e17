"""The C++ judge (``verifiers.cpp``): real g++ runs in the code sandbox. Verdicts, limits, checkers, batches, and
hostile programs that must not pass. Programs use <cstdio> (a <bits/stdc++.h> compile costs ~1.5 s here)."""
from __future__ import annotations

import shutil
import tempfile
import time

import pytest

from verifiers import _cpp_runner, get_verifier
from verifiers.cpp import run_cpp
from verifiers.sandbox import isolation

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed: the C++ judge needs it")

AB = '#include <cstdio>\nint main(){long long a,b;scanf("%lld %lld",&a,&b);printf("%lld\\n",a+b);}\n'
ECHO = "#include <cstdio>\nint main(){int c;while((c=getchar())!=EOF)putchar(c);}\n"
# One binary, one behaviour per input word, so one compile covers several verdicts.
MODES = r"""#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <unistd.h>
#include <vector>
int main(){
  char m[32]={0}; if(scanf("%31s",m)!=1) return 9;
  if(!strcmp(m,"loop")){volatile unsigned long x=0; for(;;) x++;}
  if(!strcmp(m,"sleep")) sleep(1000);
  if(!strcmp(m,"vector")){std::vector<int> v(200000000); v[7]=1; printf("%d\n",v[7]);}
  if(!strcmp(m,"touch")) for(;;){char*p=(char*)malloc(1<<20); memset(p,1,1<<20);}
  if(!strcmp(m,"segv")){volatile int*p=0; *p=1;}
  if(!strcmp(m,"exit1")) return 1;
  if(!strcmp(m,"throw")) throw std::runtime_error("boom");
  if(!strcmp(m,"bomb")) for(;;) fork();
  if(!strcmp(m,"recurse")){struct F{static long f(long n){volatile char pad[64]; pad[0]=1; return n?f(n-1)+pad[0]:0;}};
    if(F::f(2000000)!=2000000) return 5;}  // ~140 MB of stack: the stack limit is the memory limit
  static char b[1<<20];
  if(!strcmp(m,"bigfile")){FILE*f=fopen("big.bin","wb"); for(int i=0;i<1024;i++) fwrite(b,1,sizeof b,f);}
  puts("42");
}
"""


def _fence(code: str) -> str:
    return "```cpp\n" + code + "```"


def test_correct_and_wrong_answers():
    tests = [{"input": "1 2", "output": "3"}, {"input": "5 7\n", "output": "12"}, {"input": "1 1", "output": "3"}]
    res = run_cpp(AB, tests)
    assert res.compile == "OK" and res.verdicts == ["OK", "OK", "WA"]
    assert (res.passed, res.total) == (2, 3) and res.fraction == pytest.approx(2 / 3) and not res.all_passed
    assert len(res.cpu_s) == 3 and all(0 <= t < 1 for t in res.cpu_s)


def test_file_input_mode():  # old Codeforces problems: input.txt / output.txt (Piston's INPUT_MODE=file)
    files = ('#include <cstdio>\nint main(){FILE*i=fopen("input.txt","r"),*o=fopen("output.txt","w");'
             'int a,b; fscanf(i,"%d%d",&a,&b); fprintf(o,"%d\\n",a+b);}\n')
    assert run_cpp(files, [{"input": "1 2", "output": "3"}], input_mode="file").verdicts == ["OK"]


def test_batches_stop_after_the_first_failing_batch():
    tests = [{"input": f"{i} 0", "output": str(i if i != 3 else -1)} for i in range(1, 6)]  # test 3 is wrong
    expect = {-1: ["OK", "OK", "WA", "OK", "OK"], 1: ["OK", "OK", "WA", "SKIPPED", "SKIPPED"],
              2: ["OK", "OK", "WA", "OK", "SKIPPED"]}
    for batch_size, verdicts in expect.items():
        assert run_cpp(AB, tests, batch_size=batch_size).verdicts == verdicts, batch_size


def test_time_limits_are_bounded():
    """A busy loop ends by CPU time (its wall clock is generous, so a loaded machine cannot turn it into a wall-clock
    TLE), a sleeping program by the wall clock."""
    t0 = time.monotonic()
    busy = run_cpp(MODES, [{"input": "loop", "output": "42"}, {"input": "ok", "output": "42"}], time_limit_s=0.5,
                   wall_limit_s=20.0)
    assert busy.verdicts == ["TLE", "OK"] and busy.cpu_s[0] >= 0.5
    asleep = run_cpp(MODES, [{"input": "sleep", "output": "42"}], time_limit_s=0.5, wall_limit_s=1.0)
    assert asleep.verdicts == ["TLE"] and asleep.cpu_s[0] < 0.5
    assert time.monotonic() - t0 < 20.0 + 1.0 + 10.0  # bounded even on a loaded machine


def test_memory_and_runtime_errors():
    modes = {"vector": "MLE", "touch": "MLE", "segv": "RE", "exit1": "RE", "throw": "RE", "ok": "OK"}
    res = run_cpp(MODES, [{"input": m, "output": "42"} for m in modes], memory_mb=64)
    assert dict(zip(modes, res.verdicts)) == modes
    assert run_cpp(MODES, [{"input": "recurse", "output": "42"}], memory_mb=512).verdicts == ["OK"]
    big_array = '#include <cstdio>\nint a[1<<28];\nint main(){a[5]=1;printf("%d",a[5]);}\n'  # 1 GiB of .bss
    assert run_cpp(big_array, [{"input": "", "output": "1"}], memory_mb=64).verdicts == ["MLE"]


def test_compile_error_is_reported_and_truncated():
    res = run_cpp("int main(){ return x; }\n", [{"input": "", "output": ""}] * 2)
    assert res.compile == "CE" and res.verdicts == ["CE", "CE"] and "not declared" in res.compile_output
    flood = "int main(){\n" + "undefined_name_%d;\n" * 2000 % tuple(range(2000)) + "}\n"
    assert len(run_cpp(flood, [{"input": "", "output": ""}]).compile_output) < 4200


# (output, answer, compare, equal): the three comparison rules, run directly on the runner's functions.
COMPARISONS = [
    (b"3\n", b"3", "tokens", True),
    (b"  1   2\n\n3 \r\n", b"1 2 3", "tokens", True),
    (b"1 2", b"1 2 3", "tokens", False),
    (b"1 2 3 4", b"1 2 3", "tokens", False),
    (b"yes", b"YES", "tokens", False),
    (b"1\x0b2", b"1 2", "tokens", False),  # testlib's blanks are space, tab, CR, LF only
    (b"yes\nNo", b"YES NO", "piston", True),
    (b"yesterday", b"YESTERDAY", "piston", False),
    (b"1\n2\nextra", b"1\n2", "lines", True),  # Open-R1 `code`: zip over lines
    (b"1 2", b"1  2", "lines", False),
    (b"5", b"\n5", "lines", False),  # the answer is not stripped as a whole: its leading blank line is compared
]


def test_comparison_rules():
    assert len(COMPARISONS) == 11
    for out, ans, mode, equal in COMPARISONS:
        assert _cpp_runner.COMPARE[mode](out, ans) is equal, (out, ans, mode)


def test_token_comparison_end_to_end_accepts_extra_whitespace():
    tests = [{"input": "  1\t2 \n\n 3\n\n", "output": "1 2 3"}, {"input": "1 2", "output": "1 2 3"}]
    assert run_cpp(ECHO, tests).verdicts == ["OK", "WA"]


PERM_CHECKER = r"""#include <cstdio>
#include <vector>
// testlib order: input output answer; accepts any permutation of 1..n
int main(int argc, char** argv){
  if(argc != 4) return 3;
  FILE* in = fopen(argv[1], "r"); FILE* out = fopen(argv[2], "r"); FILE* ans = fopen(argv[3], "r");
  int n; if(!in || !out || !ans || fscanf(in, "%d", &n) != 1) return 3;
  int first; if(fscanf(ans, "%d", &first) != 1) return 3;  // an empty answer file: the checker fails
  std::vector<int> seen(n + 1, 0);
  for(int i = 0; i < n; i++){ int x; if(fscanf(out, "%d", &x) != 1 || x < 1 || x > n || seen[x]++) return 1; }
  int extra; return fscanf(out, "%d", &extra) == 1 ? 2 : 0;
}
"""
REVERSE = '#include <cstdio>\nint main(){int n;scanf("%d",&n);for(int i=n;i>=1;i--)printf("%d ",i);}\n'


def test_cpp_checker_accepts_any_permutation():
    tests = [{"input": "3", "output": "1 2 3"}, {"input": "4", "output": "1 2 3 4"}, {"input": "2", "output": ""}]
    res = run_cpp(REVERSE, tests, checker=PERM_CHECKER, checker_lang="cpp")
    assert res.verdicts == ["OK", "OK", "FAIL"]
    assert run_cpp(REVERSE, tests[:1]).verdicts == ["WA"]  # the default comparison wants 1 2 3
    wrong = '#include <cstdio>\nint main(){puts("1 1 3");}\n'
    assert run_cpp(wrong, tests[:1], checker=PERM_CHECKER, checker_lang="cpp").verdicts == ["WA"]
    broken = run_cpp(REVERSE, tests[:1], checker="int main(){ nope }", checker_lang="cpp")
    assert broken.verdicts == ["FAIL"] and "nope" in broken.checker_error


# Open-R1's generated_checker convention (Piston `codeforces` run): checker.py input correct_output output -> "1".
FLOAT_CHECKER = """import os, sys
inp, ans, out = sys.argv[1:4]
assert os.path.basename(ans) == "correct_output.txt"
print(1 if abs(float(open(out).read()) - float(open(ans).read())) <= 1e-6 else 0)
"""
THIRD = '#include <cstdio>\nint main(){double x;scanf("%lf",&x);printf("%.7f\\n",x/3);}\n'


def test_python_checker_float_tolerance():
    tests = [{"input": "1", "output": "0.333333333"}, {"input": "2", "output": "0.666666666"},
             {"input": "3", "output": "1.5"}]
    res = run_cpp(THIRD, tests, checker=FLOAT_CHECKER, checker_lang="python")
    assert res.verdicts == ["OK", "OK", "WA"]
    raising = run_cpp(THIRD, tests[:1], checker="raise SystemExit(0)\n")  # exit 0 without printing 1
    assert raising.verdicts == ["WA"]


def test_code_cpp_verifier():
    fn = get_verifier("code_cpp")
    cases = [{"input": "1 2", "output": "3"}, {"input": "2 2", "output": "4"}]
    half = '#include <iostream>\nint main(){int a,b;std::cin>>a>>b;std::cout<<(a==1?a+b:0);}\n'
    comps = ["text\n" + _fence("garbage") + "\nfinal:\n" + _fence(AB), _fence(half), "no code", _fence("int main(){")]
    out = fn(comps, verification_info=[{"test_cases": cases}] * 4, time_limit=[1.0] * 4, memory_limit=[64] * 4)
    assert out == [1.0, 0.5, 0.0, 0.0]
    assert fn([_fence(AB)], test_cases=[[]]) == [None]
    assert fn([_fence(AB)], test_cases=[cases], checker=["int main(){ nope }"], checker_lang="cpp") == [None]


# Hostile programs: each gives a wrong answer (or none) after its trick, and must not pass.
FIND_SECRET = r"""#include <cctype>
#include <cstdio>
#include <string>
#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>
static std::string blob;
static void slurp(const std::string& p){ int fd = open(p.c_str(), O_RDONLY | O_NONBLOCK); if(fd < 0) return;
  char b[65536]; ssize_t n; while((n = read(fd, b, sizeof b)) > 0) blob.append(b, n); close(fd); }
static void memory(const std::string& proc){  // every readable mapping of the process, through its mem file
  FILE* maps = fopen((proc + "/maps").c_str(), "r"); int mem = open((proc + "/mem").c_str(), O_RDONLY); char line[512];
  while(maps && mem >= 0 && fgets(line, sizeof line, maps)){ unsigned long a, b; char perm[8];
    if(sscanf(line, "%lx-%lx %7s", &a, &b, perm) == 3 && perm[0] == 'r' && b - a < (64ul << 20)){
      std::string buf(b - a, 0); ssize_t n = pread(mem, &buf[0], b - a, a); if(n > 0) blob.append(buf.data(), n); } } }
int main(){
  int ppid = 0; FILE* st = fopen("/proc/self/stat", "r");  // the runner's pid as /proc names it (maybe the host's)
  if(st && fscanf(st, "%*d (%*[^)]) %*c %d", &ppid) != 1) ppid = 0;
  for(std::string proc : {std::string("/proc/1"), "/proc/" + std::to_string(ppid)}){
    for(const char* f : {"/environ", "/cmdline", "/fd/0", "/fd/1"}) slurp(proc + f);
    if(DIR* d = opendir((proc + "/fd").c_str())){ while(dirent* e = readdir(d)) slurp(proc + "/fd/" + e->d_name); }
    memory(proc); }
  for(const char* p : {"cpp_job.json", "../cpp_job.json", "/mnt/sbx/cpp_job.json", "../stdout.txt"}) slurp(p);
  for(size_t i = blob.find("SECRET"); i != std::string::npos; i = blob.find("SECRET", i + 1)){
    size_t j = i + 6; while(j < blob.size() && isdigit((unsigned char)blob[j])) j++;
    if(j > i + 6){ printf("%s\n", blob.substr(i, j - i).c_str()); return 0; } }
  puts("none");
}
"""
FAKE_RESULT = (r'#include <cstdio>' '\n'
               r'int main(){puts("{\"compile\": \"OK\", \"tests\": [{\"verdict\": \"OK\", \"cpu_s\": 0, '
               r'\"wall_s\": 0, \"rss_kb\": 0}]}"); puts("0123456789abcdef0123456789abcdef"); return 0;}' '\n')
KILL_PARENT = ('#include <csignal>\n#include <cstdio>\n#include <unistd.h>\n'
               'int main(){kill(getppid(),SIGKILL); kill(1,SIGKILL); kill(-1,SIGKILL); puts("wrong");}\n')
HOOK = "import os\\nprint(1)\\nos._exit(0)\\n"
PLANT_HOOKS = ('#include <cstdio>\n#include <initializer_list>\n#include <sys/stat.h>\n'
               'void put(const char* p){FILE* f=fopen(p,"w"); '
               f'if(f){{fputs("{HOOK}", f); fclose(f);}}}}\n'
               'int main(){for(const char* d : {"..", "/tmp", "."}){char p[256]; '
               'snprintf(p,256,"%s/usercustomize.py",d); put(p); snprintf(p,256,"%s/sitecustomize.py",d); put(p);}\n'
               'mkdir("../.local",0777); mkdir("../.local/lib",0777); mkdir("../.local/lib/python3.11",0777);\n'
               'mkdir("../.local/lib/python3.11/site-packages",0777);\n'
               'put("../.local/lib/python3.11/site-packages/usercustomize.py"); mkdir("../chk",0777);\n'
               'put("../chk/checker.py"); put("../checker.py"); puts("wrong");}\n')


def test_program_cannot_read_the_expected_output():
    tests = [{"input": "go", "output": "SECRET4242"}]
    res = run_cpp(FIND_SECRET, tests, memory_mb=512)
    assert res.compile == "OK" and res.verdicts == ["WA"]


def test_fake_verdict_on_stdout_is_just_wrong_output():
    res = run_cpp(FAKE_RESULT, [{"input": "", "output": "42"}] * 2)
    assert res.compile == "OK" and res.verdicts == ["WA", "WA"]


@pytest.mark.skipif(isolation()["level"] == "guard", reason="without a PID namespace kill(-1) reaches the caller")
def test_killing_the_runner_does_not_pass():
    res = run_cpp(KILL_PARENT, [{"input": "", "output": "42"}, {"input": "", "output": "wrong"}])
    assert res.verdicts == ["WA", "OK"]  # PID 1 of its namespace: the signals are dropped and the next test runs


def test_planted_python_hooks_do_not_fool_the_checker():
    exact = "import sys\nprint(1 if open(sys.argv[3]).read().split() == open(sys.argv[2]).read().split() else 0)\n"
    res = run_cpp(PLANT_HOOKS, [{"input": "", "output": "42"}] * 2, checker=exact)
    assert res.verdicts == ["WA"] * 2


@pytest.mark.skipif(isolation()["level"] == "guard", reason="without a PID namespace a fork bomb is not contained")
def test_fork_bomb_is_contained_and_cleaned_up_between_tests():
    t0 = time.monotonic()
    res = run_cpp(MODES, [{"input": m, "output": "42"} for m in ("bomb", "ok")], time_limit_s=0.5, wall_limit_s=1.0)
    assert time.monotonic() - t0 < 1.0 + 1.0 + 8.0
    assert res.verdicts[0] in ("TLE", "RE") and res.verdicts[1] == "OK"  # all of the bomb was killed and reaped


def test_huge_file_and_nothing_left_behind(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # run_python's session dirs go here: it must end empty
    res = run_cpp(MODES, [{"input": m, "output": "42"} for m in ("bigfile", "ok")], output_mb=8)
    assert res.verdicts == ["OLE", "OK"]
    assert run_cpp("int main(){ return x; }\n", [{"input": "", "output": ""}]).compile == "CE"
    assert list(tmp_path.iterdir()) == []
