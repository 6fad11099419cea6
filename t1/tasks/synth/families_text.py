"""Synth families of file, text and data work: files and permissions, log processing, CSV/JSON conversion."""

from __future__ import annotations

import csv
import io
import json
import random
from collections import Counter
from typing import Any

from t1.tasks.synth.base import SynthTask, dedent, renamed
from t1.tasks.synth.words import word, words

_N_CHECKS = {"easy": 3, "medium": 4, "hard": 5}


def files_perms(rng: random.Random, difficulty: str) -> SynthTask:
    exts = rng.sample(["log", "txt", "csv", "json", "md", "conf"], k={"easy": 2, "medium": 3, "hard": 4}[difficulty])
    files = {}
    by_ext: dict[str, list[str]] = {}
    for ext in exts:
        names = sorted({f"{word(rng)}-{rng.randint(10, 999)}.{ext}" for _ in range(rng.randint(2, 5))})
        by_ext[ext] = names
        for n in names:
            files[f"inbox/{n}"] = f"{word(rng)} {rng.randint(0, 10**6)}\n"
    tool, secret = word(rng), word(rng)
    files[f"bin/{tool}.sh"] = "#!/bin/bash\necho ok\n"
    files[f"secrets/{secret}.key"] = f"{rng.getrandbits(64):016x}\n"
    link_ext = exts[0]
    manifest = sorted(f"bytype/{e}/{n}" for e, ns in by_ext.items() for n in ns)
    instruction = dedent(f"""
        The folder /app/inbox holds files of several types. Tidy up /app:
        1. Move every file in /app/inbox into /app/bytype/<extension>/ (for example a `.{exts[0]}` file goes to
           /app/bytype/{exts[0]}/). Keep file names. /app/inbox must remain, empty.
        2. The script /app/bin/{tool}.sh must be readable, writable and executable by its owner only (mode 700).
        3. The key /app/secrets/{secret}.key must be readable and writable by its owner only (mode 600).
        4. Create a symbolic link /app/current pointing to the folder /app/bytype/{link_ext}.
        5. Write /app/manifest.txt: the path of every sorted file relative to /app (like bytype/{exts[0]}/NAME),
           one per line, in byte order (LC_ALL=C sort).
        """)
    tests = dedent(f"""
        import os, stat
        BY_EXT = {by_ext!r}

        def _mode(p):
            return stat.S_IMODE(os.stat(p).st_mode)
        """)
    for ext in exts:
        tests += dedent(f"""

            def test_sorted_{ext}():
                assert sorted(os.listdir("/app/bytype/{ext}")) == sorted(BY_EXT[{ext!r}])
            """)
    tests += dedent(f"""

        def test_inbox_empty():
            assert os.path.isdir("/app/inbox") and os.listdir("/app/inbox") == []

        def test_tool_mode():
            assert _mode("/app/bin/{tool}.sh") == 0o700

        def test_secret_mode():
            assert _mode("/app/secrets/{secret}.key") == 0o600

        def test_current_link():
            assert os.path.islink("/app/current")
            assert os.path.realpath("/app/current") == os.path.realpath("/app/bytype/{link_ext}")

        def test_manifest():
            with open("/app/manifest.txt") as f:
                assert f.read().split() == {manifest!r}
        """)
    solution = dedent(f"""
        for f in inbox/*; do ext="${{f##*.}}"; mkdir -p "bytype/$ext"; mv "$f" "bytype/$ext/"; done
        chmod 700 bin/{tool}.sh
        chmod 600 secrets/{secret}.key
        ln -sfn /app/bytype/{link_ext} /app/current
        find bytype -type f | LC_ALL=C sort > manifest.txt
        """)
    task = SynthTask("files_perms", difficulty, "file-operations", instruction, tests, solution, files)
    tokens = ("inbox", "bytype", "current", "manifest", "secrets")
    return renamed(task, dict(zip(tokens, words(rng, len(tokens)), strict=True)))


def _log_lines(rng: random.Random) -> tuple[list[str], list[tuple[str, str, str, int, int, int]]]:
    ips = [f"10.{rng.randint(0, 255)}.{rng.randint(0, 255)}.{rng.randint(1, 254)}" for _ in range(rng.randint(8, 14))]
    ips = sorted(set(ips))
    counts = rng.sample(range(3, 40), len(ips))  # distinct counts: the ranking has no ties
    paths = [f"/{word(rng)}/{word(rng)}" for _ in range(rng.randint(5, 9))]
    records = []
    for ip, c in zip(ips, counts, strict=True):
        for _ in range(c):
            status = rng.choice([200, 200, 200, 201, 301, 404, 500, 503])
            records.append((ip, rng.choice(["GET", "GET", "POST", "PUT"]), rng.choice(paths), status,
                            rng.randint(100, 9000), rng.randint(0, 23)))
    rng.shuffle(records)
    lines = [f'{ip} - - [12/Mar/2025:{h:02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d} +0000] '
             f'"{m} {p} HTTP/1.1" {s} {b}' for ip, m, p, s, b, h in records]
    return lines, records


def text_logs(rng: random.Random, difficulty: str) -> SynthTask:
    lines, records = _log_lines(rng)
    k = rng.randint(3, 5)
    ip_counts = Counter(r[0] for r in records)
    top = [f"{c} {ip}" for ip, c in sorted(ip_counts.items(), key=lambda x: (-x[1], x[0]))[:k]]
    status_counts = sorted(Counter(r[3] for r in records).items())
    error_paths = sorted({r[2] for r in records if r[3] >= 500})
    get_bytes = sum(r[4] for r in records if r[1] == "GET")
    log = f"/app/logs/{word(rng)}.log"
    checks = _N_CHECKS[difficulty]
    parts = [
        (f"/app/report/top_ips.txt: the {k} client IPs with the most requests, as `COUNT IP` lines, most first.",
         f"def test_top_ips():\n    assert open('/app/report/top_ips.txt').read().split('\\n')[:{k}] == {top!r}\n",
         f"awk '{{print $1}}' {log} | sort | uniq -c | sort -k1,1nr -k2,2 | head -n {k} | awk '{{print $1\" \"$2}}' > "
         "report/top_ips.txt\n"),
        ("/app/report/status_counts.csv: header `status,count`, then one row per HTTP status, by status ascending.",
         "def test_status_counts():\n    rows = open('/app/report/status_counts.csv').read().split()\n"
         f"    assert rows == ['status,count'] + {[f'{s},{c}' for s, c in status_counts]!r}\n",
         f"(echo status,count; awk '{{print $9}}' {log} | sort -n | uniq -c | awk '{{print $2\",\"$1}}') > "
         "report/status_counts.csv\n"),
        ("/app/report/error_paths.txt: every distinct request path that got a 5xx status, sorted, one per line.",
         f"def test_error_paths():\n    assert open('/app/report/error_paths.txt').read().split() == {error_paths!r}\n",
         f"awk '$9 >= 500 {{print $7}}' {log} | LC_ALL=C sort -u > report/error_paths.txt\n"),
        ("/app/report/get_bytes.txt: the total response bytes (last field) of all GET requests, as one integer.",
         f"def test_get_bytes():\n    assert open('/app/report/get_bytes.txt').read().strip() == {str(get_bytes)!r}\n",
         f"awk '$6 == \"\\\"GET\" {{s += $10}} END {{print s}}' {log} > report/get_bytes.txt\n"),
        (f"/app/report/lines.txt: the number of lines in {log}.",
         f"def test_line_count():\n    assert open('/app/report/lines.txt').read().strip() == {str(len(lines))!r}\n",
         f"wc -l < {log} | tr -d ' ' > report/lines.txt\n"),
    ][:checks]
    instruction = (f"The web server log {log} is in the common log format. Create the folder /app/report and write:\n"
                   + "".join(f"- {p[0]}\n" for p in parts) + "Do not modify the log.\n")
    original = "\n".join(lines) + "\n"
    tests = "import hashlib\n\n" + "\n\n".join(p[1] for p in parts) + (
        f"\n\ndef test_log_untouched():\n    assert open({log!r}).read() == {original!r}\n")
    solution = "mkdir -p report\n" + "".join(p[2] for p in parts)
    return SynthTask("text_logs", difficulty, "text-processing", instruction, tests, solution,
                     {log.removeprefix("/app/"): original})


def data_conversion(rng: random.Random, difficulty: str) -> SynthTask:
    tags_pool = words(rng, 4)
    items: list[dict[str, Any]] = []
    for i in sorted(rng.sample(range(1, 500), rng.randint(6, 12))):
        items.append({"id": i, "name": f"{word(rng)} {word(rng)}", "qty": rng.randint(0, 50),
                      "price": rng.randint(100, 99999) / 100, "active": rng.random() < 0.6,
                      "tags": sorted(rng.sample(tags_pool, rng.randint(1, 3)))})
    shuffled = items[:]
    rng.shuffle(shuffled)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["id", "name", "qty", "price", "active", "tags"])
    for it in shuffled:
        w.writerow([it["id"], it["name"], it["qty"], f"{it['price']:.2f}", "yes" if it["active"] else "no",
                    "|".join(it["tags"])])
    active_total = f"{sum(round(it['qty'] * it['price'], 2) for it in items if it['active']):.2f}"
    by_tag = {t: sorted(it["id"] for it in items if t in it["tags"]) for t in sorted(tags_pool)}
    by_tag = {t: ids for t, ids in by_tag.items() if ids}
    extra = [{"code": f"{word(rng)[:3].upper()}{rng.randint(10, 99)}", "label": f"{word(rng)}, {word(rng)}",
              "weight": rng.randint(1, 900)} for _ in range(rng.randint(3, 6))]
    extra_csv = io.StringIO()
    ew = csv.writer(extra_csv, lineterminator="\n")
    ew.writerow(["code", "weight", "label"])
    for e in extra:
        ew.writerow([e["code"], e["weight"], e["label"]])
    n = _N_CHECKS[difficulty]
    instruction = dedent("""
        Convert the data under /app/data into the files below (create /app/out):
        - /app/out/items.json: a JSON array of the rows of /app/data/items.csv ordered by id, each an object with
          id (integer), name (string), qty (integer), price (number), active (true for "yes", false for "no") and
          tags (array of strings; the CSV joins them with "|").
        - /app/out/active_total.txt: the sum over active items of qty*price, each product rounded to 2 decimals,
          written with exactly 2 decimals.
        - /app/out/by_tag.json: an object mapping each tag that occurs to the sorted list of item ids carrying it.
        - /app/out/extra.csv: /app/data/extra.json as CSV with the header `code,weight,label`, in the same row
          order, quoted as Python's csv module quotes by default.
        """)
    tests = dedent(f"""
        import json
        ITEMS = {items!r}

        def test_items_json():
            assert json.load(open("/app/out/items.json")) == ITEMS

        def test_items_types():
            data = json.load(open("/app/out/items.json"))
            assert all(isinstance(d["active"], bool) and isinstance(d["qty"], int) for d in data)

        def test_active_total():
            assert open("/app/out/active_total.txt").read().strip() == {active_total!r}
        """)
    if n >= 4:
        tests += f"\n\ndef test_by_tag():\n    assert json.load(open('/app/out/by_tag.json')) == {by_tag!r}\n"
    if n >= 5:
        tests += ("\n\ndef test_extra_csv():\n    assert open('/app/out/extra.csv').read() == "
                  f"{extra_csv.getvalue()!r}\n")
    solution = dedent("""
        mkdir -p out
        python3 - <<'EOF'
        import csv, json
        rows = list(csv.DictReader(open("data/items.csv")))
        items = sorted(({"id": int(r["id"]), "name": r["name"], "qty": int(r["qty"]), "price": float(r["price"]),
                         "active": r["active"] == "yes", "tags": r["tags"].split("|")} for r in rows),
                       key=lambda d: d["id"])
        json.dump(items, open("out/items.json", "w"), indent=1)
        total = sum(round(d["qty"] * d["price"], 2) for d in items if d["active"])
        open("out/active_total.txt", "w").write(f"{total:.2f}\\n")
        tags = sorted({t for d in items for t in d["tags"]})
        json.dump({t: sorted(d["id"] for d in items if t in d["tags"]) for t in tags}, open("out/by_tag.json", "w"))
        with open("out/extra.csv", "w", newline="") as f:
            w = csv.writer(f, lineterminator="\\n")
            w.writerow(["code", "weight", "label"])
            for e in json.load(open("data/extra.json")):
                w.writerow([e["code"], e["weight"], e["label"]])
        EOF
        """)
    files = {"data/items.csv": buf.getvalue(), "data/extra.json": json.dumps(extra, indent=1) + "\n"}
    task = SynthTask("data_conversion", difficulty, "data-processing", instruction, tests, solution, files)
    tokens = ("items", "extra", "by_tag", "active_total", "qty", "price", "tags", "weight", "label", "code")
    return renamed(task, dict(zip(tokens, words(rng, len(tokens)), strict=True)))
