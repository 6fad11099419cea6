"""Synth families that build, run and fix programs: a C++ project with a broken build, a buggy Python script."""

from __future__ import annotations

import random

from t1.tasks.synth.base import SynthTask, dedent, renamed
from t1.tasks.synth.words import word, words

_OPS = {
    "sum": ("long long r = 0; for (long long x : v) r += x; return r;", lambda v: sum(v)),
    "max": ("long long r = v[0]; for (long long x : v) if (x > r) r = x; return r;", lambda v: max(v)),
    "sumsq": ("long long r = 0; for (long long x : v) r += x * x; return r;", lambda v: sum(x * x for x in v)),
    "range": ("long long lo = v[0], hi = v[0]; for (long long x : v) { if (x < lo) lo = x; if (x > hi) hi = x; } "
              "return hi - lo;",
              lambda v: max(v) - min(v)),
}
_GOOD_MAKEFILE = """CXX ?= g++
CXXFLAGS ?= -O1 -Wall -Iinclude
build/{prog}: build/main.o build/lib.o
\t$(CXX) $(CXXFLAGS) -o $@ $^
build/%.o: src/%.cpp include/lib.h
\tmkdir -p build
\t$(CXX) $(CXXFLAGS) -c -o $@ $<
test: build/{prog}
\tbash tests/check.sh
clean:
\trm -rf build
.PHONY: test clean
"""


def build_test(rng: random.Random, difficulty: str) -> SynthTask:
    prog = f"{word(rng)}calc"
    op = rng.choice(sorted(_OPS))
    body, fn = _OPS[op]
    bugs = rng.sample(["include", "link", "mkdir"], k={"easy": 1, "medium": 2, "hard": 3}[difficulty])
    makefile = _GOOD_MAKEFILE.format(prog=prog)
    if "include" in bugs:
        makefile = makefile.replace("-Iinclude", "-Iinc")
    if "link" in bugs:
        makefile = makefile.replace("build/main.o build/lib.o\n\t$(CXX) $(CXXFLAGS) -o $@ $^",
                                    "build/main.o build/lib.o\n\t$(CXX) $(CXXFLAGS) -o $@ build/main.o")
    if "mkdir" in bugs:
        makefile = makefile.replace("\tmkdir -p build\n", "")
    sample = [rng.randint(-50, 90) for _ in range(5)]
    files = {
        "proj/include/lib.h": "#pragma once\n#include <vector>\nlong long combine(const std::vector<long long>& v);\n",
        "proj/src/lib.cpp": f'#include "lib.h"\nlong long combine(const std::vector<long long>& v) {{ {body} }}\n',
        "proj/src/main.cpp": dedent("""
            #include <cstdio>
            #include <cstdlib>
            #include "lib.h"
            int main(int argc, char** argv) {
                if (argc < 2) { std::fprintf(stderr, "usage: %s N...\\n", argv[0]); return 2; }
                std::vector<long long> v;
                for (int i = 1; i < argc; ++i) v.push_back(std::atoll(argv[i]));
                std::printf("%lld\\n", combine(v));
                return 0;
            }
            """),
        "proj/Makefile": makefile,
        "proj/tests/check.sh": f'set -e\nout=$(./build/{prog} {" ".join(map(str, sample))})\n'
                               f'[ "$out" = "{fn(sample)}" ]\necho check ok\n',
    }
    hidden = [[rng.randint(-1000, 1000) for _ in range(rng.randint(1, 8))] for _ in range(3)]
    instruction = dedent(f"""
        The C++ project in /app/proj does not build. Fix its Makefile (not the C++ sources) so that `make` in
        /app/proj builds build/{prog} from src/main.cpp and src/lib.cpp, and `make test` passes.
        Then install the program as /app/bin/{prog} (an executable copy).
        """)
    tests = dedent(f"""
        import os, subprocess
        BIN = "/app/proj/build/{prog}"

        def test_make_builds():
            r = subprocess.run(["make", "-C", "/app/proj", "clean", "build/{prog}"], capture_output=True, timeout=120)
            assert r.returncode == 0, r.stderr

        def test_make_test():
            r = subprocess.run(["make", "-C", "/app/proj", "test"], capture_output=True, timeout=120)
            assert r.returncode == 0, r.stderr

        def test_installed():
            assert os.access("/app/bin/{prog}", os.X_OK)

        def test_sources_unchanged():
            assert "{body[:30]}" in open("/app/proj/src/lib.cpp").read()
        """)
    for i, v in enumerate(hidden):
        tests += dedent(f"""

            def test_output_{i}():
                r = subprocess.run(["/app/bin/{prog}", *map(str, {v!r})], capture_output=True, text=True, timeout=20)
                assert r.stdout.strip() == "{fn(v)}"
            """)
    solution = (f"cd proj\ncat > Makefile <<'EOF'\n{_GOOD_MAKEFILE.format(prog=prog)}EOF\n"
                f"make\nmake test\nmkdir -p /app/bin\ncp build/{prog} /app/bin/{prog}\n")
    task = SynthTask("build_test", difficulty, "build-systems", instruction, tests, solution, files)
    return renamed(task, dict(zip(("proj", "combine", "lib", "check"), words(rng, 4), strict=True)))


_SUMMARIZE = '''"""Summarize salaries per department: python3 summarize.py INPUT.csv OUTPUT.json"""
import csv
import json
import sys


def main(src, dst):
    with open(src, newline="") as f:
        rows = list(csv.reader(f, delimiter=","))
    depts = {}
    for name, dept, salary in rows[1:]:
        d = depts.setdefault(dept, {"count": 0, "total": 0})
        d["count"] += 1
        d["total"] += int(salary)
    for d in depts.values():
        d["avg"] = round(d["total"] / d["count"], 2)
    with open(dst, "w") as f:
        json.dump(dict(sorted(depts.items())), f, indent=2)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
'''
_BUGS = {
    "offbyone": ("rows[1:]", "rows[2:]"),
    "intdiv": ('round(d["total"] / d["count"], 2)', 'd["total"] // d["count"]'),
    "delimiter": ('delimiter=","', 'delimiter=";"'),
    "count": ('d["count"] += 1', 'd["count"] = 1'),
}


def _summary(rows: list[tuple[str, str, int]]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for _, dept, salary in rows:
        d = out.setdefault(dept, {"count": 0, "total": 0})
        d["count"] += 1
        d["total"] += salary
    for d in out.values():
        d["avg"] = round(d["total"] / d["count"], 2)
    return dict(sorted(out.items()))


def _rows(rng: random.Random) -> list[tuple[str, str, int]]:
    depts = [word(rng) for _ in range(3)]
    return [(f"{word(rng)}{i}", rng.choice(depts), rng.randint(30000, 90000)) for i in range(rng.randint(6, 12))]


def debug_script(rng: random.Random, difficulty: str) -> SynthTask:
    bugs = rng.sample(sorted(_BUGS), k={"easy": 2, "medium": 3, "hard": 4}[difficulty])
    broken = _SUMMARIZE
    for b in bugs:
        good, bad = _BUGS[b]
        broken = broken.replace(good, bad)
    data = _rows(rng)
    csv_text = "name,dept,salary\n" + "".join(f"{n},{d},{s}\n" for n, d, s in data)
    instruction = dedent("""
        /app/tool/summarize.py should read a CSV (name,dept,salary with a header row) and write a JSON object
        mapping each department (sorted) to {"count", "total", "avg"} where avg is total/count rounded to 2
        decimals. It has bugs. Fix the script (keep its command line: python3 summarize.py INPUT.csv OUTPUT.json),
        then run it on /app/data/staff.csv to write /app/out/summary.json.
        """)
    tests = dedent(f"""
        import json, subprocess

        def _run(tmp_path, rows):
            src, dst = tmp_path / "in.csv", tmp_path / "out.json"
            src.write_text("name,dept,salary\\n" + "".join(f"{{n}},{{d}},{{s}}\\n" for n, d, s in rows))
            subprocess.run(["python3", "/app/tool/summarize.py", str(src), str(dst)], check=True, timeout=30)
            return json.loads(dst.read_text())

        def test_summary_file():
            assert json.load(open("/app/out/summary.json")) == {_summary(data)!r}
        """)
    for i in range(3):
        rows = _rows(rng)
        tests += dedent(f"""

            def test_hidden_{i}(tmp_path):
                assert _run(tmp_path, {rows!r}) == {_summary(rows)!r}
            """)
    solution = (f"cat > tool/summarize.py <<'EOF'\n{_SUMMARIZE}EOF\nmkdir -p out\n"
                "python3 tool/summarize.py data/staff.csv out/summary.json\n")
    task = SynthTask("debug_script", difficulty, "debugging", instruction, tests, solution,
                     {"tool/summarize.py": broken, "data/staff.csv": csv_text})
    tokens = ("summarize", "tool", "staff", "dept", "salary", "summary", "depts")
    return renamed(task, dict(zip(tokens, words(rng, len(tokens)), strict=True)))
