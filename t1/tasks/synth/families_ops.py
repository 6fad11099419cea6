"""Synth families of operations and long projects: managing a background service, a multi-step data pipeline."""

from __future__ import annotations

import csv
import io
import random
from typing import Any

from t1.tasks.synth.base import SynthStep, SynthTask, dedent, renamed
from t1.tasks.synth.words import word, words


def process_service(rng: random.Random, difficulty: str) -> SynthTask:
    svc = word(rng)
    stopped_code = rng.choice([3, 4, 7])
    worker = dedent(f"""
        #!/bin/bash
        # The {svc} worker: writes a heartbeat (a counter) a few times a second.
        mkdir -p /app/svc/run
        n=0
        while true; do
          n=$((n + 1)); echo "$n" > /app/svc/run/heartbeat.tmp && mv -f /app/svc/run/heartbeat.tmp /app/svc/run/heartbeat
          sleep {rng.choice(["0.1", "0.15", "0.2"])}
        done
        """)  # noqa: E501
    instruction = dedent(f"""
        /app/svc/worker.sh is the {svc} worker, a long-running process. Write an executable control script
        /app/svc/ctl.sh with these sub-commands:
        - `start`: start worker.sh in the background, detached from the caller's terminal and output (its output
          goes to /app/svc/log/worker.log), write its PID to /app/svc/run/worker.pid, exit 0. If it is already
          running, do not start a second one; print `already running` and exit 0.
        - `status`: if the process in the PID file is alive print `running PID` and exit 0; otherwise print
          `stopped` and exit {stopped_code}.
        - `stop`: stop the worker (it must be gone when the command returns), remove the PID file, exit 0
          (also when it was not running).
        - `restart`: stop then start.
        """)
    tests = dedent(f"""
        import os, subprocess, time
        import pytest
        CTL = "/app/svc/ctl.sh"
        PIDFILE = "/app/svc/run/worker.pid"

        def ctl(cmd):
            return subprocess.run([CTL, cmd], capture_output=True, text=True, timeout=20)

        def alive(pid):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return False
            try:
                return open(f"/proc/{{pid}}/stat").read().split()[2] != "Z"
            except OSError:
                return False

        @pytest.fixture(autouse=True)
        def _stopped():
            if os.access(CTL, os.X_OK):
                ctl("stop")
            yield
            if os.access(CTL, os.X_OK):
                ctl("stop")

        def test_status_when_stopped():
            r = ctl("status")
            assert r.returncode == {stopped_code} and "stopped" in r.stdout

        def test_start_writes_pid():
            assert ctl("start").returncode == 0
            pid = int(open(PIDFILE).read())
            assert alive(pid)
            r = ctl("status")
            assert r.returncode == 0 and f"running {{pid}}" in r.stdout

        def beat():
            try:
                return int(open("/app/svc/run/heartbeat").read())
            except (OSError, ValueError):
                return None

        def test_heartbeat_advances():
            ctl("start")
            deadline = time.time() + 10
            while beat() is None and time.time() < deadline:
                time.sleep(0.1)
            first = beat()
            assert first is not None
            while (beat() or 0) <= first and time.time() < deadline:
                time.sleep(0.1)
            assert (beat() or 0) > first

        def test_single_instance():
            ctl("start")
            pid = int(open(PIDFILE).read())
            r = ctl("start")
            assert r.returncode == 0 and "already running" in r.stdout
            assert int(open(PIDFILE).read()) == pid

        def test_stop():
            ctl("start")
            pid = int(open(PIDFILE).read())
            assert ctl("stop").returncode == 0
            assert not alive(pid) and not os.path.exists(PIDFILE)
        """)
    if difficulty != "easy":
        tests += dedent("""

            def test_restart_changes_pid():
                ctl("start")
                pid = int(open(PIDFILE).read())
                assert ctl("restart").returncode == 0
                new = int(open(PIDFILE).read())
                assert new != pid and alive(new) and not alive(pid)
            """)
    solution = dedent(f"""
        mkdir -p svc/run svc/log
        cat > svc/ctl.sh <<'EOF'
        #!/bin/bash
        PIDFILE=/app/svc/run/worker.pid
        running() {{ [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; }}
        case "$1" in
          start)
            if running; then echo "already running"; exit 0; fi
            mkdir -p /app/svc/run /app/svc/log
            setsid nohup bash /app/svc/worker.sh > /app/svc/log/worker.log 2>&1 < /dev/null &
            echo $! > "$PIDFILE"; exit 0;;
          status)
            if running; then echo "running $(cat "$PIDFILE")"; exit 0; fi
            echo stopped; exit {stopped_code};;
          stop)
            if running; then pid=$(cat "$PIDFILE"); kill "$pid"
              for i in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
              kill -9 "$pid" 2>/dev/null; fi
            rm -f "$PIDFILE"; exit 0;;
          restart) "$0" stop; "$0" start;;
          *) echo "usage: $0 start|stop|status|restart" >&2; exit 2;;
        esac
        EOF
        chmod +x svc/ctl.sh
        """)
    task = SynthTask("process_service", difficulty, "system-administration", instruction, tests, solution,
                     {"svc/worker.sh": worker}, executable=("svc/worker.sh",))
    names = words(rng, 4)
    return renamed(task, {"svc": names[0], "worker": names[1], "ctl": names[2], "heartbeat": names[3]})


def _pipeline_data(rng: random.Random) -> tuple[dict[str, str], list[dict[str, Any]], list[str]]:
    cats = words(rng, 3)
    ids = rng.sample(range(1, 900), rng.randint(12, 20))
    rows = [{"id": i, "sku": f"{word(rng)[:4].upper()}-{i}", "category": rng.choice(cats), "qty": rng.randint(0, 40)}
            for i in ids]
    chunks: dict[str, str] = {}
    n_chunks = 3
    for c in range(n_chunks):
        part = [*rows[c::n_chunks], rows[(c + 1) % len(rows)]]  # each batch repeats a row of the next one
        buf = io.StringIO()
        w = csv.DictWriter(buf, ["id", "sku", "category", "qty"], lineterminator="\n")
        w.writeheader()
        w.writerows(part)
        chunks[f"incoming/batch-{c + 1}.csv"] = buf.getvalue()
    return chunks, sorted(rows, key=lambda r: int(r["id"])), cats


def long_horizon(rng: random.Random, difficulty: str) -> SynthTask:
    chunks, rows, cats = _pipeline_data(rng)
    merged = "id,sku,category,qty\n" + "".join(f"{r['id']},{r['sku']},{r['category']},{r['qty']}\n" for r in rows)
    report = {
        c: {
            "items": sum(r["category"] == c for r in rows),
            "qty": sum(int(r["qty"]) for r in rows if r["category"] == c),
        }
        for c in sorted(cats)
    }
    report = {c: v for c, v in report.items() if v["items"]}
    p = "/app/project"
    merge_py = ("import csv, glob\nrows = {}\nfor f in sorted(glob.glob('/app/incoming/*.csv')):\n"
                "    for r in csv.DictReader(open(f)):\n        rows[int(r['id'])] = r\n"
                "with open('/app/project/data/all.csv', 'w') as out:\n    out.write('id,sku,category,qty\\n')\n"
                "    for i in sorted(rows):\n        r = rows[i]\n"
                "        out.write(f\"{r['id']},{r['sku']},{r['category']},{r['qty']}\\n\")\n")
    load_py = ("import csv, sqlite3, os\ndb_path = '/app/project/data/inv.db'\nif os.path.exists(db_path):\n"
               "    os.remove(db_path)\n"
               "db = sqlite3.connect(db_path)\ndb.execute('CREATE TABLE items (id INTEGER PRIMARY KEY, sku TEXT, "
               "category TEXT, qty INTEGER)')\n"
               "rows = [(int(r['id']), r['sku'], r['category'], int(r['qty'])) for r in "
               "csv.DictReader(open('/app/project/data/all.csv'))]\n"
               "db.executemany('INSERT INTO items VALUES (?, ?, ?, ?)', rows)\ndb.commit()\n")
    report_py = ("import json, sqlite3, os\nos.makedirs('/app/project/out', exist_ok=True)\n"
                 "db = sqlite3.connect('/app/project/data/inv.db')\n"
                 "rep = {c: {'items': n, 'qty': q} for c, n, q in db.execute('SELECT category, COUNT(*), SUM(qty) FROM "
                 "items GROUP BY category ORDER BY category')}\n"
                 "json.dump(rep, open('/app/project/out/report.json', 'w'), indent=2)\n")
    makefile = ("all: out/report.json\ndata/all.csv: src/merge.py\n\tpython3 src/merge.py\n"
                "data/inv.db: data/all.csv src/load.py\n\tpython3 src/load.py\n"
                "out/report.json: data/inv.db src/report.py\n\tpython3 src/report.py\n"
                "clean:\n\trm -rf out data/inv.db data/all.csv\n.PHONY: all clean\n")

    def py(name: str, code: str) -> str:
        return f"mkdir -p {p}/src {p}/data {p}/out\ncat > {p}/src/{name} <<'EOF'\n{code}EOF\npython3 {p}/src/{name}\n"

    head = "import json, os, sqlite3, subprocess\n\n"
    t_merge = (f"def test_merged_csv():\n    assert open('{p}/data/all.csv').read() == {merged!r}\n\n\n"
               f"def test_merge_script():\n    assert os.path.isfile('{p}/src/merge.py')\n")
    t_load = (f"def test_db_rows():\n    db = sqlite3.connect('{p}/data/inv.db')\n"
              f"    assert db.execute('SELECT COUNT(*), SUM(qty) FROM items').fetchone() == ({len(rows)}, "
              f"{sum(int(r['qty']) for r in rows)})\n\n\n"
              f"def test_db_ids():\n    db = sqlite3.connect('{p}/data/inv.db')\n"
              "    assert [r[0] for r in db.execute('SELECT id FROM items ORDER BY id')] == "
              f"{[r['id'] for r in rows]!r}\n")
    t_report = f"def test_report():\n    assert json.load(open('{p}/out/report.json')) == {report!r}\n"
    t_make = (f"def test_make_rebuilds():\n    r = subprocess.run(['make', '-C', '{p}', 'clean', 'all'], "
              "capture_output=True, timeout=120)\n"
              f"    assert r.returncode == 0, r.stderr\n    assert json.load(open('{p}/out/report.json')) == "
              f"{report!r}\n\n\n"
              f"def test_make_clean():\n    subprocess.run(['make', '-C', '{p}', 'clean'], capture_output=True, "
              "timeout=60)\n"
              f"    gone = os.path.isfile('{p}/Makefile') and not os.path.exists('{p}/out/report.json')\n"
              f"    subprocess.run(['make', '-C', '{p}', 'all'], capture_output=True, timeout=120)\n    assert gone\n")
    t_git = (f"def test_git_commit():\n    r = subprocess.run(['git', '-C', '{p}', 'log', '--format=%s'], "
             "capture_output=True, text=True)\n"
             "    assert 'pipeline v1' in r.stdout.split('\\n')\n\n\n"
             f"def test_gitignore():\n    r = subprocess.run(['git', '-C', '{p}', 'ls-files'], capture_output=True, "
             "text=True)\n"
             "    files = r.stdout.split()\n    assert 'src/merge.py' in files and 'Makefile' in files\n"
             "    assert not any(f.startswith('out/') or f.endswith('.db') for f in files)\n")
    steps = [
        SynthStep("merge", f"Merge the CSV batches in /app/incoming into {p}/data/all.csv: one header "
                  "(id,sku,category,qty), each id once (later batches win), rows sorted by id. Write the merge "
                  f"as a Python script {p}/src/merge.py and run it.", head + t_merge, py("merge.py", merge_py)),
        SynthStep("load", f"Write {p}/src/load.py that (re)creates the SQLite database {p}/data/inv.db with a "
                  "table items(id INTEGER PRIMARY KEY, sku TEXT, category TEXT, qty INTEGER) holding all.csv; run it.",
                  head + t_merge + "\n\n" + t_load, py("load.py", load_py)),
        SynthStep("report", f"Write {p}/src/report.py that writes {p}/out/report.json: an object mapping each "
                  "category (sorted) to {\"items\": number of items, \"qty\": total qty}, read from inv.db; run it.",
                  head + t_load + "\n\n" + t_report, py("report.py", report_py)),
        SynthStep("make", f"Add {p}/Makefile with targets all (builds out/report.json through data/all.csv and "
                  "data/inv.db from the scripts), and clean (removes out/, data/inv.db and data/all.csv).",
                  head + t_report + "\n\n" + t_make, f"cat > {p}/Makefile <<'EOF'\n{makefile}EOF\nmake -C {p} all\n"),
    ]
    if difficulty == "hard":
        steps.append(SynthStep(
            "git", f"Make {p} a git repository with a .gitignore excluding out/ and *.db, and commit everything "
            "else with the message `pipeline v1`.", head + t_make + "\n\n" + t_git,
            f"cd {p}\ngit init -q\nprintf 'out/\\n*.db\\n' > .gitignore\ngit add -A\n"
            "git -c user.name=T1 -c user.email=t1@example.com commit -qm 'pipeline v1'\n"))
    intro = (f"A small inventory pipeline is built in {len(steps)} steps under {p}. Raw batches are in /app/incoming.")
    task = SynthTask("long_horizon", difficulty, "software-engineering", intro, files=chunks,
                     steps=tuple(steps), agent_timeout_sec=1800.0)
    tokens = ("project", "incoming", "merge", "inv", "items", "sku", "category", "qty", "report", "batch")
    return renamed(task, dict(zip(tokens, words(rng, len(tokens)), strict=True)))
