"""Generated shell-session text (commands, outputs, paths, JSON, tool calls) to train a tokenizer on.

Used by `init_model` when no task corpus is given; deterministic for a seed.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator

_WORDS = [
    "build",
    "test",
    "run",
    "config",
    "data",
    "src",
    "lib",
    "main",
    "util",
    "server",
    "client",
    "model",
    "task",
    "result",
    "output",
    "error",
    "file",
    "path",
    "user",
    "home",
    "log",
    "cache",
    "tmp",
    "value",
    "index",
    "count",
    "total",
    "check",
    "parse",
    "read",
    "write",
    "list",
    "update",
    "delete",
    "create",
    "install",
    "package",
    "version",
    "report",
    "verify",
    "fix",
    "debug",
]
_EXTS = ("py", "txt", "json", "sh", "md", "yaml", "toml", "csv", "log", "c", "rs", "go")
_CMDS = (
    "ls -la {p}", "cat {p}", "grep -rn {w} {d}", "find {d} -name '*.{e}'", "python3 {p}",
    "mkdir -p {d}", "cd {d} && make", "wc -l {p}", "head -n {n} {p}", "tail -n {n} {p}",
    "echo '{w}' > {p}", "sed -i 's/{w}/{w2}/g' {p}", "pip install {w}", "git status",
    "git diff {p}", "pytest -q {d}", "chmod +x {p}", "cp {p} {p2}", "mv {p} {p2}", "rm -f {p}",
    "curl -s http://localhost:{port}/{w}", "jq '.{w}' {p}", "sort {p} | uniq -c", "du -sh {d}",
)


def _path(rng: random.Random) -> str:
    parts = [rng.choice(_WORDS) for _ in range(rng.randint(1, 4))]
    return "/" + "/".join(["app", *parts]) + "." + rng.choice(_EXTS)


def _dir(rng: random.Random) -> str:
    return "/" + "/".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 3)))


def _command(rng: random.Random) -> str:
    return rng.choice(_CMDS).format(
        p=_path(rng), p2=_path(rng), d=_dir(rng), e=rng.choice(_EXTS), w=rng.choice(_WORDS),
        w2=rng.choice(_WORDS), n=rng.randint(1, 100), port=rng.randint(1024, 9999),
    )


def _output(rng: random.Random) -> str:
    kind = rng.randrange(4)
    if kind == 0:
        return "\n".join(f"-rw-r--r-- 1 root root {rng.randint(0, 99999):>6} Jan {rng.randint(1, 28):>2} "
                         f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d} {_path(rng)}"
                         for _ in range(rng.randint(1, 6)))
    if kind == 1:
        obj = {rng.choice(_WORDS): rng.choice([rng.randint(0, 1000), rng.choice(_WORDS), True, None])
               for _ in range(rng.randint(1, 5))}
        return json.dumps(obj, indent=rng.choice([None, 2]))
    if kind == 2:
        return (f"Traceback (most recent call last):\n  File \"{_path(rng)}\", line {rng.randint(1, 500)}\n"
                f"{rng.choice(['KeyError', 'ValueError', 'FileNotFoundError'])}: {rng.choice(_WORDS)}")
    return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 20)))


def _turn(rng: random.Random) -> str:
    cmd = _command(rng)
    call = json.dumps({"name": "bash", "arguments": {"command": cmd}})
    return (f"<|im_start|>assistant\nI will run {cmd.split()[0]}.\n<tool_call>\n{call}\n</tool_call><|im_end|>\n"
            f"<|im_start|>user\n<tool_response>\n{_output(rng)}\n</tool_response><|im_end|>\n")


def shell_corpus(seed: int, num_docs: int = 2000) -> Iterator[str]:
    """Yield num_docs short multi-turn shell sessions in ChatML with bash tool calls."""
    rng = random.Random(seed)
    for _ in range(num_docs):
        head = f"<|im_start|>user\nPlease {rng.choice(_WORDS)} the {rng.choice(_WORDS)} in {_dir(rng)}.<|im_end|>\n"
        yield head + "".join(_turn(rng) for _ in range(rng.randint(1, 4)))


def curriculum_corpus(seed: int, long_tier: bool = False) -> Iterator[str]:
    """Shell sessions, the tool-call prompt the policy sees (so its tools block is few tokens), and the
    learnable curriculum's training-split instructions and commands as tool calls; `long_tier`: its long tier's
    too (what their files show), with the compaction request, the notes and summaries shaped as the teacher's."""
    import jinja2

    from t1.agent.formats import FormatName, get_format
    from t1.model.chat_template import CHAT_TEMPLATE
    from t1.tasks.synth.curriculum import curriculum_texts

    yield from shell_corpus(seed)
    fmt = get_format(FormatName.TOOL_CALLS)
    env = jinja2.Environment()
    env.filters["tojson"] = lambda v: json.dumps(v, ensure_ascii=False)
    template = env.from_string(CHAT_TEMPLATE)
    for i, text in enumerate(curriculum_texts(2000, seed)):
        if i % 20 == 0:  # the prompt: the same text every episode; some copies are enough for its merges
            yield template.render(messages=fmt.first_messages(text), tools=fmt.tools, add_generation_prompt=True)
        call = json.dumps({"name": "bash", "arguments": {"command": text}})
        yield f"{text}\n<tool_call>\n{call}\n</tool_call><|im_end|>\n"
    if long_tier:
        yield from _long_tier_corpus(seed)


def _long_tier_corpus(seed: int) -> Iterator[str]:
    """The long tier's texts as tool calls, and per 10 of them a compaction request and a teacher-shaped summary
    in a note (the words of t1.agent.compaction and t1.agent.scripted)."""
    from t1.agent.compaction import NOTE_HEAD, SUMMARY_REQUEST
    from t1.agent.scripted import STILL_NEEDED
    from t1.tasks.synth.curriculum import long_tier_texts

    done: list[str] = []
    for i, text in enumerate(long_tier_texts(400, seed)):
        call = json.dumps({"name": "bash", "arguments": {"command": text}})
        yield f"{text}\n<tool_call>\n{call}\n</tool_call><|im_end|>\n"
        done.append(text)
        if i % 10 == 9:
            summary = f"I ran {len(done)} commands, the last: {done[-1]}. {STILL_NEEDED} next: {done[0].split()[-1]}"
            yield (f"<|im_start|>user\n{SUMMARY_REQUEST}<|im_end|>\n<|im_start|>assistant\n{summary}<|im_end|>\n"
                   f"{NOTE_HEAD} Your summary of them:]\n{summary}\n"
                   "[Continue the task from the current state of the machine.]")
            done.clear()
