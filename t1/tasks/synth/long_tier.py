"""The curriculum's long tier: tasks whose reference solution types 12-40 commands, one a turn, where a value
an early step shows is needed late, so an episode whose context is compacted must carry it across.

Three families, in the curriculum's vocabulary (so the `learn` preset's tokenizer has their words) and with its
bash verifiers (one reward.json entry per check, so the count reward rises step by step):

- `file_chain`: a chain of 11-30 files in `chain/`, each naming the next; the first file names the target, the
  last holds the code. The target is shown once, by the first command, and written by the last. Shortcut: the
  chain's `index.txt` names its end.
- `job_queue`: 6-10 jobs, one shown at a time by `bash next.sh`, each done with one command; the first call
  also prints the ticket to write when the queue is empty (`bash left.sh` lists what remains). Shortcut: after
  the first call, `bash batch.sh`, which does every job from `queue.txt` (a listing of the jobs and their values).
- `staged_start`: a service brought up by `bash svc.sh init` (its log prints a key), then 5-8 stages in an
  order only each stage's output names, each confirmed with the word its bare call prints, some of which
  first need a config file their error names (and how to make it), then `bash svc.sh start KEY` with the key
  the first step showed. Shortcut: after init, `bash auto.sh`, which confirms each stage of `stages.txt` (the
  stages of the last start, each with its word and config) without its bare call.

Each shortcut is 3-4 commands (so it ends before a compaction, and a walk never meets a shortcut's steps) and
rests on a listing (`index.txt`, `queue.txt`, `stages.txt`) that is current in a quarter of the tasks and stale
(an old end, old values, old words) in the rest (STALE_PERCENT); the instruction names none of them and only the
robust walk tells current from stale, so only the reward shows whether the shortcut paid. The teacher types it
where it is right (`synthesize_curriculum(shortcut_copies=k)`), so a policy imitating the teacher takes it blind.

`synthesize_curriculum(..., families=LONG_TIER)` writes them; `tasks.sets.<name>.synth_kind: long` selects them.
`early_value` names, from a task's files, the value its first step shows and its last step needs (the file_chain
target, the job_queue ticket, the staged_start key): what a compaction summary must carry.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from itertools import pairwise

from t1.tasks.synth.base import SynthTask
from t1.tasks.synth.curriculum_kit import (
    CODES,
    CONFS,
    DIRS,
    FILES,
    FOLDERS,
    TARGETS,
    TOOLS,
    WORDS,
    CurriculumFamily,
    checks_script,
    code_word,
)

STALE_PERCENT = 75  # tasks whose shortcut's listing is stale (file_chain's index.txt names an old end of the chain)
# file_chain's files: one folder, a name of one token each. The folder is the same in every task, so a path copies
# as its one `/name` token (`chain/owl.txt`: chain, /owl, .txt); a folder drawn per task was copied at chance by the
# learn preset's model (109 of 1,034 hops right in a warm start's eval transcripts: 1 in 8 folders).
CHAIN_DIR = "chain"
CHAIN_NAMES = FILES + FOLDERS + WORDS + DIRS  # 36: a chain of up to 30 links and its stale end
NEEDS_CONFIG_PERCENT = 40  # staged_start stages that first fail naming a missing config file


def _long(family: str, instruction: str, files: dict[str, str], checks: str, turns: list[str],
          setup: str = "", executable: tuple[str, ...] = (), shortcut: list[str] | None = None) -> SynthTask:
    return SynthTask(family=family, difficulty="long", category="curriculum-long", instruction=instruction,
                     files=files, setup=setup, executable=executable, check_sh=checks, turns=tuple(turns),
                     shortcut=tuple(shortcut or ()), agent_timeout_sec=900.0, verifier_timeout_sec=30.0)


def file_chain(rng: random.Random) -> SynthTask:
    """Walk a chain of files to its end; write the end's code to the target the first file named."""
    length = rng.randint(11, 30)
    paths = [f"{CHAIN_DIR}/{name}.txt" for name in CHAIN_NAMES]
    chain = rng.sample(paths, length + 1)  # + 1: the stale end, outside the chain
    *links, stale_end = chain
    target, code = rng.choice(TARGETS), code_word(rng)
    old_code = rng.choice([c for c in CODES if c != code])
    files = {links[0]: f"target: {target}\nnext: {links[1]}\n"}
    files |= {p: f"next: {n}\n" for p, n in pairwise(links[1:])}
    files[links[-1]] = f"code: {code}\n"
    files[stale_end] = f"code: {old_code}\n"
    stale = _stale(rng)
    files["index.txt"] = f"end: {stale_end if stale else links[-1]}\n"
    instruction = (f"Start at {links[0]}. Each file names the next file; the first also names a target. "
                   "The last file holds a code. Write that code to the target file (its name plus .txt).")
    checks = checks_script(f"target_exists test -f /app/{target}.txt",
                     f"code_written grep -qx {code} /app/{target}.txt",
                     f"code_alone test \"$(cat /app/{target}.txt)\" = {code}")
    turns = [f"cat {p}" for p in links] + [f"echo {code} > {target}.txt"]
    end = stale_end if stale else links[-1]
    shortcut_code = old_code if stale else code
    return _long("file_chain", instruction, files, checks, turns,
                 shortcut=[f"cat {links[0]}", "cat index.txt", f"cat {end}", f"echo {shortcut_code} > {target}.txt"])


def job_queue(rng: random.Random) -> SynthTask:
    """Do every job of a queue shown one at a time, then write the ticket the first call printed."""
    n = rng.randint(6, 10)
    jobs = rng.sample(WORDS, n)
    values = [code_word(rng) for _ in jobs]
    ticket, done = code_word(rng), rng.choice(TARGETS)
    queue = "".join(f"{j} {v}\n" for j, v in zip(jobs, values, strict=True))
    # next.sh: the first pending job (its output file missing or wrong); the ticket only on the first call
    next_sh = ("#!/bin/bash\ncd /app\n"
               f"if [ ! -f .queue-seen ]; then touch .queue-seen; echo \"ticket: {ticket} (write it to "
               f"{done}.txt when the queue is empty)\"; fi\n"
               "while read -r job value; do\n"
               "  if [ \"$(cat out/$job.txt 2>/dev/null)\" != \"$value\" ]; then\n"
               "    echo \"job $job: write $value to out/$job.txt\"; exit 0\n  fi\n"
               "done < .queue\necho \"queue empty\"\n")
    left_sh = ("#!/bin/bash\ncd /app\nwhile read -r job value; do\n"
               "  [ \"$(cat out/$job.txt 2>/dev/null)\" = \"$value\" ] || echo \"$job\"\n"
               "done < .queue\n")
    instruction = ("Work through the job queue: `bash next.sh` shows the next job. Do each job. "
                   "When the queue is empty, write the ticket to the file it names.")
    checks = checks_script(*(f"job_{j} grep -qx {v} /app/out/{j}.txt" for j, v in zip(jobs, values, strict=True)),
                     f"ticket_written grep -qx {ticket} /app/{done}.txt")
    turns: list[str] = []
    for j, v in zip(jobs, values, strict=True):
        turns += ["bash next.sh", f"echo {v} > out/{j}.txt"]
    turns += ["bash next.sh", f"echo {ticket} > {done}.txt"]
    # batch.sh: every job's value from queue.txt, a listing of the queue that may be stale; it says nothing of which
    batch_sh = ("#!/bin/bash\ncd /app\nmkdir -p out\nn=0\nwhile read -r job value; do\n"
                "  echo \"$value\" > out/$job.txt; n=$((n+1))\ndone < queue.txt\necho \"batch: $n jobs written\"\n")
    listing = "".join(f"{j} {v}\n" for j, v in zip(jobs, _stale_copy(rng, values, list(CODES)), strict=True))
    return _long("job_queue", instruction, {".queue": queue, "next.sh": next_sh, "left.sh": left_sh,
                                            "batch.sh": batch_sh, "queue.txt": listing}, checks,
                 turns, setup="mkdir -p /app/out\n", executable=("next.sh", "left.sh", "batch.sh"),
                 shortcut=["bash next.sh", "bash batch.sh", f"echo {ticket} > {done}.txt"])


def staged_start(rng: random.Random) -> SynthTask:
    """Bring a service up stage by stage, in the order each stage names, then start it with the init's key.

    A stage called bare prints its confirmation word; called with that word it is done. Some stages first
    fail naming a config file they need."""
    stages = rng.sample(TOOLS, rng.randint(5, 8))
    key = code_word(rng)
    confirm = {s: rng.choice(WORDS) for s in stages}
    needs = {s: rng.choice(CONFS) for s in stages if rng.randrange(100) < NEEDS_CONFIG_PERCENT}
    order = " ".join(stages)
    word_case = "".join(f"  {s}) word={w} ;;\n" for s, w in confirm.items())
    conf_case = "".join(f"  {s}) need={c} ;;\n" for s, c in needs.items())
    svc = ("#!/bin/bash\ncd /app\nmkdir -p state\n"
           f"order=({order})\n"
           "next_stage() { for s in \"${order[@]}\"; do [ -f state/$s ] || { echo $s; return; }; done; }\n"
           "case \"$1\" in\n"
           f"  init) touch state/.init; echo \"init done, key: {key}\"; echo \"next stage: ${{order[0]}}\" ;;\n"
           "  start)\n"
           "    [ -z \"$(next_stage)\" ] || { echo \"error: stage $(next_stage) not done\"; exit 1; }\n"
           f"    [ \"$2\" = {key} ] || {{ echo \"error: wrong key\"; exit 1; }}\n"
           "    touch state/running; echo running ;;\n"
           "  *)\n"
           "    [ -f state/.init ] || { echo \"error: run init first\"; exit 1; }\n"
           "    [ \"$1\" = \"$(next_stage)\" ] || { echo \"error: next stage is $(next_stage)\"; exit 1; }\n"
           f"    word=\"\"; need=\"\"\n    case \"$1\" in\n{word_case}    esac\n"
           f"    case \"$1\" in\n{conf_case}    esac\n"
           "    if [ -n \"$need\" ] && [ ! -f $need.cfg ]; then\n"
           "      echo \"error: missing $need.cfg (touch $need.cfg)\"; exit 1\n    fi\n"
           "    if [ \"$2\" != \"$word\" ]; then echo \"confirm with: bash svc.sh $1 $word\"; exit 1; fi\n"
           "    touch state/$1; n=$(next_stage)\n"
           "    if [ -n \"$n\" ]; then echo \"$1 done, next stage: $n\"; else echo \"$1 done, ready to start\"; fi ;;\n"
           "esac\n")
    instruction = "Bring the service up with svc.sh: run `bash svc.sh init`, then each stage it names, then start it."
    checks = checks_script(*(f"stage_{s} test -f /app/state/{s}" for s in stages), "running test -f /app/state/running")
    turns = ["bash svc.sh init"]
    for s in stages:
        if s in needs:
            turns += [f"bash svc.sh {s}", f"touch {needs[s]}.cfg"]
        turns += [f"bash svc.sh {s}", f"bash svc.sh {s} {confirm[s]}"]
    turns.append(f"bash svc.sh start {key}")
    # auto.sh: each stage of stages.txt (the last start's stages, words and configs, which may be stale) in turn
    listing = "".join(f"{s} {w} " + (f"{needs[s]}.cfg" if s in needs else "-") + "\n"
                      for s, w in zip(stages, _stale_copy(rng, [confirm[s] for s in stages], list(WORDS)), strict=True))
    auto_sh = ("#!/bin/bash\ncd /app\nwhile read -r stage word conf; do\n"
               "  [ \"$conf\" = - ] || touch \"$conf\"\n  bash svc.sh \"$stage\" \"$word\"\ndone < stages.txt\n")
    return _long("staged_start", instruction, {"svc.sh": svc, "auto.sh": auto_sh, "stages.txt": listing}, checks,
                 turns, executable=("svc.sh", "auto.sh"),
                 shortcut=["bash svc.sh init", "bash auto.sh", f"bash svc.sh start {key}"])


def _stale(rng: random.Random) -> bool:
    """Whether this task's shortcut listing is stale (STALE_PERCENT of the tasks)."""
    return rng.randrange(100) < STALE_PERCENT


def _stale_copy(rng: random.Random, values: list[str], pool: list[str]) -> list[str]:
    """A listing of `values` as a shortcut reads it: the values themselves in 100 - STALE_PERCENT of the tasks,
    else old ones: each replaced (by another of `pool`) with even odds, at least one."""
    if not _stale(rng):
        return list(values)
    old = [i for i in range(len(values)) if rng.random() < 0.5] or [rng.randrange(len(values))]
    return [rng.choice([p for p in pool if p != v]) if i in old else v for i, v in enumerate(values)]


LONG_TIER: dict[str, CurriculumFamily] = {
    "file_chain": file_chain,
    "job_queue": job_queue,
    "staged_start": staged_start,
}

# Where each family's files hold the value its first step shows and its last step needs.
_EARLY_VALUE = {
    "file_chain": re.compile(r"^target: (\S+)$", re.M),           # the first file of the chain
    "job_queue": re.compile(r"ticket: (\S+) \(write it to"),      # next.sh's first call
    "staged_start": re.compile(r"init done, key: (\S+?)\\?\""),   # svc.sh init's log
}


def early_value(family: str, files: Mapping[str, str]) -> str | None:
    """The value a long-tier task's first step shows and its last step needs, read from its files (the task
    folder's environment/files); None for a family outside the long tier or files that do not hold it."""
    pattern = _EARLY_VALUE.get(family)
    found = (m.group(1) for text in files.values() if pattern is not None and (m := pattern.search(text)))
    return next(found, None)
