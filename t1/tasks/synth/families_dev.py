"""Synth families of developer work: shell scripting, git repair, sqlite, building a C++ program, debugging a script."""

from __future__ import annotations

import random
import shlex

from t1.tasks.synth.base import SynthTask, dedent, renamed
from t1.tasks.synth.words import word, words

_LABELS = {"count": ("count", "n", "lines", "items"), "sum": ("sum", "total", "acc"),
           "min": ("min", "lowest", "smallest", "floor"), "max": ("max", "highest", "largest", "peak")}


def shell_scripting(rng: random.Random, difficulty: str) -> SynthTask:
    name = f"{word(rng)}stat"
    bindir = word(rng)
    ops = rng.sample(["count", "sum", "min", "max"], k={"easy": 2, "medium": 3, "hard": 4}[difficulty])
    labels = [(rng.choice(_LABELS[op]), op) for op in ops]
    sep = rng.choice(["=", ": ", " "])
    usage_code, missing_code = rng.choice([(2, 3), (64, 66), (1, 4), (5, 6)])
    hidden = [[rng.randint(-500, 500) for _ in range(rng.randint(1, 12))] for _ in range(3)]
    shown = ", ".join(f"`{label}{sep}VALUE`" for label, _ in labels)
    instruction = dedent(f"""
        Write an executable bash script /app/{bindir}/{name}.sh. Given the path of a file with one integer per
        line (blank lines ignored), it prints these lines, in this order: {shown}
        ({", ".join(f"{label} = the {op} of the integers" for label, op in labels)}).
        With no argument it prints a usage message to stderr and exits {usage_code}; if the file does not exist it
        prints an error to stderr and exits {missing_code}.
        """)
    tests = dedent(f"""
        import os, subprocess
        SCRIPT = "/app/{bindir}/{name}.sh"
        LABELS = {labels!r}
        OPS = {{"count": len, "sum": sum, "min": min, "max": max}}

        def _run(*args):
            return subprocess.run([SCRIPT, *args], capture_output=True, text=True, timeout=20)

        def _expect(v):
            return "".join(f"{{label}}{sep}{{OPS[op](v)}}\\n" for label, op in LABELS)

        def test_executable():
            assert os.access(SCRIPT, os.X_OK)

        def test_usage():
            r = _run()
            assert r.returncode == {usage_code} and r.stderr.strip() and not r.stdout.strip()

        def test_missing_file():
            r = _run("/nonexistent/{word(rng)}.txt")
            assert r.returncode == {missing_code} and r.stderr.strip()
        """)
    for i, values in enumerate(hidden):
        tests += dedent(f"""

            def test_values_{i}(tmp_path):
                p = tmp_path / "n.txt"
                p.write_text("\\n".join(str(x) for x in {values!r}) + "\\n\\n")
                r = _run(str(p))
                assert r.returncode == 0 and r.stdout == _expect({values!r})
            """)
    awk = {"count": "n", "sum": "s", "min": "mn", "max": "mx"}
    prints = "; ".join(f'print "{label}{sep}" {awk[op]}' for label, op in labels)
    solution = dedent(f"""
        mkdir -p {bindir}
        cat > {bindir}/{name}.sh <<'EOF'
        #!/bin/bash
        if [ $# -lt 1 ]; then echo "usage: $0 FILE" >&2; exit {usage_code}; fi
        if [ ! -f "$1" ]; then echo "no such file: $1" >&2; exit {missing_code}; fi
        awk 'NF {{ v = $1 + 0; n++; s += v; if (n == 1 || v < mn) mn = v; if (n == 1 || v > mx) mx = v }}
             END {{ {prints} }}' "$1"
        EOF
        chmod +x {bindir}/{name}.sh
        """)
    return SynthTask("shell_scripting", difficulty, "scripting", instruction, tests, solution)


def git_repair(rng: random.Random, difficulty: str) -> SynthTask:
    note, branch_msg, version = (
        word(rng),
        f"Add {word(rng)} {word(rng)} support",
        f"{rng.randint(1, 9)}.{rng.randint(0, 20)}",
    )
    note_line = f"{word(rng)} {word(rng)} {rng.randint(0, 9999)}"
    note_text = note_line + "\n"
    cfg_value = rng.randint(100, 999)
    email = f"{word(rng)}@{word(rng)}.example"
    setup = dedent(f"""
        set -e
        mkdir -p repo && cd repo
        git init -q -b main .
        git config user.name "T1 Synth"; git config user.email synth@t1.example
        mkdir notes && printf '%s\\n' {shlex.quote(note_line)} > notes/{note}.md && echo "port={cfg_value}" > config.ini
        git add -A && git commit -qm "Initial import"
        echo "feature" > feature.txt && git add feature.txt && git commit -qm {shlex.quote(branch_msg)}
        echo "more" >> feature.txt && git commit -qam "Polish feature"
        git rm -q notes/{note}.md && git commit -qm "Remove old notes"
        echo "port=0" > config.ini
        """)
    n = {"easy": 3, "medium": 4, "hard": 5}[difficulty]
    asks = [
        (f"Restore notes/{note}.md, deleted by the last commit, with its old content, and commit the restoration.",
         f"def test_note_restored():\n    assert open('/app/repo/notes/{note}.md').read() == {note_text!r}\n"
         f"    assert 'notes/{note}.md' in _git('ls-files')\n",
         f"git checkout HEAD~1 -- notes/{note}.md && git commit -qm 'Restore notes'\n"),
        ("Discard the uncommitted change to config.ini (it must match the last committed version).",
         f"def test_config_clean():\n    assert open('/app/repo/config.ini').read() == 'port={cfg_value}\\n'\n"
         "    assert 'config.ini' not in _git('status', '--porcelain')\n",
         "git checkout -- config.ini\n"),
        (f"Create a branch release-{version} pointing at the commit whose message is \"{branch_msg}\".",
         f"def test_branch():\n    want = _git('log', '--format=%H', '--grep', {branch_msg!r}, "
         "'--fixed-strings').split()[0]\n"
         f"    assert _git('rev-parse', 'release-{version}').strip() == want\n",
         f"git branch release-{version} \"$(git log --format=%H --fixed-strings --grep {branch_msg!r} | head -n1)\"\n"),
        (f"Create an annotated tag v{version} on the final commit of main (after your restoration commit).",
         f"def test_tag():\n    assert _git('cat-file', '-t', 'v{version}').strip() == 'tag'\n"
         f"    assert _git('rev-parse', 'v{version}^{{commit}}') == _git('rev-parse', 'main')\n",
         f"git tag -a v{version} -m 'Release {version}' main\n"),
        (f"Set this repository's user.email to {email} (repository config, not global).",
         f"def test_email():\n    assert _git('config', '--local', 'user.email').strip() == {email!r}\n",
         f"git config --local user.email {email}\n"),
    ]
    chosen = asks[:n]
    instruction = "The git repository /app/repo needs repairs. Working in it with git:\n" + "".join(
        f"{i + 1}. {a[0]}\n" for i, a in enumerate(chosen)) + "Do not rewrite existing history.\n"
    tests = dedent("""
        import subprocess

        def _git(*args):
            return subprocess.run(["git", "-C", "/app/repo", *args], capture_output=True, text=True, timeout=30).stdout

        def test_history_kept():
            assert _git("log", "--format=%s", "main").split("\\n")[-4:-1] == ["Polish feature", BRANCH_MSG, "Initial import"]
        """).replace("BRANCH_MSG", repr(branch_msg))  # noqa: E501
    tests += "\n\n" + "\n\n".join(a[1] for a in chosen)
    solution = "cd repo\n" + "".join(a[2] for a in chosen)
    task = SynthTask("git_repair", difficulty, "version-control", instruction, tests, solution, setup=setup)
    return renamed(task, dict(zip(("repo", "notes", "feature"), words(rng, 3), strict=True)))


def sqlite_task(rng: random.Random, difficulty: str) -> SynthTask:
    cities = words(rng, 4)
    customers = [(i + 1, f"{word(rng).title()} "
                         f"{word(rng).title()}", rng.choice(cities)) for i in range(rng.randint(5, 9))]
    orders = [(j + 1, j % len(customers) + 1 if j < len(customers) else rng.randint(1, len(customers)),
               rng.randint(100, 50000), rng.randint(1, 28)) for j in range(30)]
    totals = {c[0]: sum(o[2] for o in orders if o[1] == c[0]) for c in customers}
    while len(set(totals.values())) != len(totals):  # make totals distinct so the ranking is unique
        k = rng.choice(list(totals))
        orders.append((len(orders) + 1, k, rng.randint(1, 99), 1))
        totals = {c[0]: sum(o[2] for o in orders if o[1] == c[0]) for c in customers}
    top = max(customers, key=lambda c: totals[c[0]])[1]
    city_totals: dict[str, int] = {}
    for c in customers:
        city_totals[c[2]] = city_totals.get(c[2], 0) + totals[c[0]]
    city_rows = [f"{c},{t}" for c, t in sorted(city_totals.items(), key=lambda x: (-x[1], x[0]))]
    threshold = sorted(o[2] for o in orders)[len(orders) // 2]
    vip_cut = sorted(totals.values())[len(totals) // 2]
    vips = sorted(cid for cid, t in totals.items() if t >= vip_cut)
    setup = dedent(f"""
        mkdir -p data && python3 - <<'EOF'
        import sqlite3
        db = sqlite3.connect("data/store.db")
        db.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT, city TEXT)")
        db.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER, amount_cents INTEGER, day INTEGER)")
        db.executemany("INSERT INTO customers VALUES (?, ?, ?)", {customers!r})
        db.executemany("INSERT INTO orders VALUES (?, ?, ?, ?)", {orders!r})
        db.commit()
        EOF
        """)  # noqa: E501
    n = {"easy": 3, "medium": 4, "hard": 5}[difficulty]
    asks = [
        ("/app/out/top_customer.txt: the name of the customer with the largest total order amount.",
         f"def test_top_customer():\n    assert open('/app/out/top_customer.txt').read().strip() == {top!r}\n",
         "open('out/top_customer.txt','w').write(db.execute('SELECT c.name FROM customers c JOIN orders o ON "
         "o.customer_id=c.id GROUP BY c.id ORDER BY SUM(o.amount_cents) DESC LIMIT 1').fetchone()[0] + '\\n')\n"),
        ("/app/out/city_totals.csv: `city,total_cents` rows (no header), by total descending.",
         f"def test_city_totals():\n    assert open('/app/out/city_totals.csv').read().split() == {city_rows!r}\n",
         "open('out/city_totals.csv','w').write(''.join(f'{c},{t}\\n' for c, t in db.execute('SELECT c.city, "
         "SUM(o.amount_cents) t FROM customers c JOIN orders o ON o.customer_id=c.id GROUP BY c.city ORDER BY t DESC, "
         "c.city')))\n"),
        ("An index named idx_orders_customer on orders(customer_id).",
         "def test_index():\n    row = _db().execute(\"SELECT tbl_name, sql FROM sqlite_master WHERE type='index' AND "
         "name='idx_orders_customer'\").fetchone()\n"
         "    assert row and row[0] == 'orders' and 'customer_id' in row[1]\n",
         "db.execute('CREATE INDEX IF NOT EXISTS idx_orders_customer ON orders(customer_id)')\n"),
        (f"A view big_orders selecting the orders with amount_cents >= {threshold}.",
         "def test_view():\n    d = _db()\n    assert d.execute(\"SELECT type FROM sqlite_master WHERE "
         "name='big_orders'\").fetchone() == ('view',)\n"
         "    assert d.execute('SELECT COUNT(*) FROM big_orders').fetchone()[0] == "
         f"{sum(o[2] >= threshold for o in orders)}\n",
         "db.execute('CREATE VIEW IF NOT EXISTS big_orders AS SELECT * FROM orders WHERE amount_cents >= "
         f"{threshold}')\n"),
        (f"A column vip (INTEGER, default 0) on customers, set to 1 for customers whose total is >= {vip_cut} cents.",
         "def test_vip():\n    assert [r[0] for r in _db().execute('SELECT id FROM customers WHERE vip=1 ORDER BY "
         f"id')] == {vips!r}\n",
         "db.execute('ALTER TABLE customers ADD COLUMN vip INTEGER DEFAULT 0')\n"
         "db.execute('UPDATE customers SET vip=1 WHERE id IN (SELECT customer_id FROM orders GROUP BY customer_id "
         f"HAVING SUM(amount_cents) >= {vip_cut})')\n"),
    ][:n]
    instruction = ("The SQLite database /app/data/store.db has tables customers(id, name, city) and "
                   "orders(id, customer_id, amount_cents, day). Using SQL (python3's sqlite3 module is available), "
                   "create /app/out and produce:\n" + "".join(f"- {a[0]}\n" for a in asks)
                   + "Keep all existing rows.\n")
    tests = dedent(f"""
        import sqlite3

        def _db():
            return sqlite3.connect("file:/app/data/store.db?mode=ro", uri=True)

        def test_rows_kept():
            assert _db().execute("SELECT COUNT(*) FROM orders").fetchone()[0] == {len(orders)}
        """) + "\n\n" + "\n\n".join(a[1] for a in asks)
    solution = ("mkdir -p out\npython3 - <<'EOF'\nimport sqlite3\ndb = sqlite3.connect('data/store.db')\n"
                + "".join(a[2] for a in asks) + "db.commit()\nEOF\n")
    task = SynthTask("sqlite", difficulty, "databases", instruction, tests, solution, setup=setup)
    tokens = ("customers", "orders", "amount_cents", "city", "store", "customer_id", "top_customer", "city_totals",
              "idx_orders_customer", "big_orders", "vip", "day")
    return renamed(task, dict(zip(tokens, words(rng, len(tokens)), strict=True)))
