"""Give a Dockerfile's instructions their meaning: the replay plan a local sandbox runs (pure).

Container semantics, as `docker build` applies them:
- FROM: the base image sets the starting WORKDIR/USER/ENV (t1.tasks.image.base_images);
  an image the host cannot stand in for (one whose own content the task needs, such
  as SWE-bench's; a language image whose toolchain the host lacks; one outside the
  table) and a second FROM (multi-stage build) need an image.
- ARG (before or after FROM, with defaults) and ENV are expanded in FROM, WORKDIR,
  ENV, COPY/ADD, USER ($VAR, ${VAR}, ${VAR:-default}, ${VAR:+alt}); RUN sees both as
  environment variables (ENV wins), and only ENV survives into the agent's shells.
- WORKDIR is joined onto the previous one and created; USER sets who runs later
  RUN lines and is the agent's default user; SHELL sets the shell of RUN's shell form.
- COPY/ADD honour --chown and --chmod; ADD unpacks local tar archives; a heredoc
  source (`COPY <<EOF /path`) writes a file; RUN heredocs run as scripts.
- LABEL, MAINTAINER, EXPOSE, VOLUME, STOPSIGNAL, CMD, HEALTHCHECK and ONBUILD do not
  change the filesystem or the shell the agent gets (Harbor and Terminal-Bench
  replace the command with their own), so they are recorded and skipped.
- ENTRYPOINT is recorded (exec form) for t1.tasks.image.entrypoint, which runs a plain
  script (one that ends by exec-ing "$@") as the sandbox's first process and refuses
  any other; the shell form wraps no command and is refused here. COPY --from,
  --parents/--exclude, RUN --mount other than a cache, and unknown instructions
  cannot be replayed: NeedsImageError naming the line. ADD of a URL
  is a download: NeedsNetworkError naming it.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from dataclasses import dataclass, replace
from pathlib import Path

from t1.sandbox.needs import NeedsImageError, NeedsNetworkError
from t1.tasks.image.base_images import image_env, lookup, stand_in_refusal
from t1.tasks.image.dockerfile import DockerStep, parse_dockerfile
from t1.tasks.spec import Env

DEFAULT_SHELL = ("/bin/sh", "-c")
SKIPPED = ("LABEL", "MAINTAINER", "EXPOSE", "VOLUME", "STOPSIGNAL", "CMD", "HEALTHCHECK", "ONBUILD")
_VAR = re.compile(r"\\\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::([-+])([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)")
_COPY_FLAGS = ("chown", "chmod", "link")
_ADD_FLAGS = ("chown", "chmod", "link")


@dataclass(frozen=True, slots=True)
class ReplayStep:
    """One action for the sandbox: WORKDIR (create), COPY/ADD (place files), WRITE (heredoc file), RUN."""

    action: str
    line: int
    args: tuple[str, ...]  # WORKDIR: (dir,); COPY/ADD: (*sources, dest); WRITE: (dest, content); RUN: (script,)
    cwd: str = "/"
    env: Env = ()
    user: str | None = None
    shell: tuple[str, ...] = DEFAULT_SHELL
    chown: str | None = None
    chmod: str | None = None
    text: str = ""  # the instruction as written, for reports

    def label(self) -> str:
        """How reports name this step: `Dockerfile line N: <its first line>` (setup failures, needs, validate)."""
        first = self.text.splitlines()[0] if self.text else self.action
        return f"Dockerfile line {self.line}: {first[:120]}"


@dataclass(frozen=True, slots=True)
class DockerPlan:
    """What replaying a Dockerfile does, and the state it leaves for the agent's shells."""

    base: str
    steps: tuple[ReplayStep, ...]
    workdir: str
    env: Env
    user: str | None
    skipped: tuple[str, ...] = ()  # 'line N: KEYWORD' for the instructions that were recorded and skipped
    entrypoint: tuple[str, ...] = ()  # ENTRYPOINT's exec form (the last one), run by t1.tasks.image.entrypoint
    entrypoint_label: str = ""  # `Dockerfile line N: ENTRYPOINT ...`, for reports

    def run_lines(self) -> tuple[ReplayStep, ...]:
        return tuple(s for s in self.steps if s.action == "RUN")

    def tests_files(self) -> tuple[ReplayStep, ...]:
        """The COPY/ADD/heredoc steps that place files under /tests: the verifier's own, placed by its shell."""
        return tuple(s for s in self.steps if _into_tests(s))

    def without_tests_files(self) -> DockerPlan:
        return replace(self, steps=tuple(s for s in self.steps if not _into_tests(s)))


TESTS_DIR = "/tests"


def _into_tests(step: ReplayStep) -> bool:
    if step.action not in ("COPY", "ADD", "WRITE"):
        return False
    dest = posixpath.normpath(step.args[0] if step.action == "WRITE" else step.args[-1])
    return dest == TESTS_DIR or dest.startswith(TESTS_DIR + "/")


def expand(text: str, variables: dict[str, str]) -> str:
    """Dockerfile variable substitution ($VAR, ${VAR}, ${VAR:-word}, ${VAR:+word}, \\$ for a literal $)."""
    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "\\$":
            return "$"
        name = m.group(1) or m.group(4)
        value = variables.get(name)
        if m.group(2) == "-":
            return value if value else m.group(3)
        if m.group(2) == "+":
            return m.group(3) if value else ""
        return value or ""
    return _VAR.sub(sub, text)


def _env_pairs(step: DockerStep, variables: dict[str, str], where: str) -> list[tuple[str, str]]:
    rest = step.args[0] if step.args else ""
    parts = shlex.split(rest)
    if parts and "=" not in parts[0]:
        if len(parts) < 2:
            raise NeedsImageError(f"{where}: ENV needs KEY VALUE or KEY=VALUE")
        return [(parts[0], expand(rest.split(None, 1)[1].strip(), variables))]
    out = []
    for p in parts:
        key, sep, value = p.partition("=")
        if not sep or not key:
            raise NeedsImageError(f"{where}: ENV entry {p!r} is not KEY=VALUE")
        out.append((key, expand(value, variables)))
    return out


def _check_flags(step: DockerStep, allowed: tuple[str, ...], where: str) -> None:
    for name, value in step.flags:
        if name not in allowed:
            raise NeedsImageError(f"{where}: {step.keyword} --{name} needs an image build")
        if name == "mount" and not value.startswith("type=cache"):
            raise NeedsImageError(f"{where}: RUN --mount={value} needs an image build (only cache mounts replay)")


class _State:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.base: str | None = None
        self.args: dict[str, str] = {}
        self.env: dict[str, str] = {}
        self.cwd = "/"
        self.user: str | None = None
        self.shell: tuple[str, ...] = DEFAULT_SHELL
        self.steps: list[ReplayStep] = []
        self.skipped: list[str] = []
        self.entrypoint: tuple[str, ...] = ()
        self.entrypoint_label = ""

    @property
    def variables(self) -> dict[str, str]:
        return {**self.args, **self.env}

    def where(self, step: DockerStep) -> str:
        return f"{self.path.name} line {step.line}"

    def emit(self, action: str, step: DockerStep, args: tuple[str, ...], *,
             chown: str | None = None, chmod: str | None = None) -> None:
        self.steps.append(ReplayStep(action, step.line, args, cwd=self.cwd, env=tuple(self.variables.items()),
                                     user=self.user, shell=self.shell, chown=chown, chmod=chmod, text=step.text))


def _from(st: _State, step: DockerStep, where: str) -> None:
    if st.base is not None:
        raise NeedsImageError(f"{where}: a second FROM (multi-stage build) needs an image build")
    image = expand(step.args[0], st.args) if step.args else "scratch"
    st.base = image
    refusal = stand_in_refusal(image)
    if refusal:
        raise NeedsImageError(f"{where}: FROM {image}: {refusal}; this task needs that image")
    entry = lookup(image)
    assert entry is not None, image
    st.cwd, st.user = entry.workdir, entry.user
    st.env.update(dict(image_env(image)))  # PATH and the image's own ENV: `ENV PATH=/x:$PATH` keeps /usr/bin


def _copy(st: _State, step: DockerStep, where: str) -> None:
    _check_flags(step, _COPY_FLAGS if step.keyword == "COPY" else _ADD_FLAGS, where)
    words = [expand(w, st.variables) for w in step.args]
    if len(words) < 2:
        raise NeedsImageError(f"{where}: {step.keyword} needs at least one source and a destination")
    *sources, dest = words
    full = posixpath.normpath(posixpath.join(st.cwd, dest))
    dest = full + "/" if (dest.endswith("/") or dest in (".", "..")) and full != "/" else full
    chown, chmod = step.flag("chown"), step.flag("chmod")
    heredoc_sources = [s for s in sources if s.startswith("<<")]
    if heredoc_sources:
        if len(sources) != 1 or len(step.heredocs) != 1:
            raise NeedsImageError(f"{where}: {step.keyword} with several heredoc sources needs an image build")
        st.emit("WRITE", step, (dest, step.heredocs[0].body), chown=chown, chmod=chmod)
        return
    if step.keyword == "ADD" and any("://" in s or s.startswith("git@") for s in sources):
        raise NeedsNetworkError(f"{where}: ADD {sources[0]} downloads a URL, and the sandbox is offline")
    st.emit(step.keyword, step, (*sources, dest), chown=chown, chmod=chmod)


def _run(st: _State, step: DockerStep, where: str) -> None:
    _check_flags(step, ("mount", "network", "security"), where)
    if step.json_form:
        script = shlex.join(step.args)
    else:
        script = step.args[0] if step.args else ""
        if step.heredocs and re.fullmatch(r"<<-?([\"']?)[A-Za-z_][A-Za-z0-9_]*\1", script.strip()):
            script = step.heredocs[0].body  # `RUN <<EOF`: the body is the script
        elif step.heredocs:
            script += "".join(f"\n{h.body}{h.delimiter}" for h in step.heredocs)
    st.emit("RUN", step, (script,))


def build_plan(path: Path) -> DockerPlan:
    """The replay plan of a Dockerfile, or NeedsImageError / NeedsNetworkError naming the line."""
    st = _State(path)
    for step in parse_dockerfile(path):
        where, kw = st.where(step), step.keyword
        if kw != "FROM" and kw != "ARG" and st.base is None:
            raise NeedsImageError(f"{where}: {kw} before FROM")
        if kw == "FROM":
            _from(st, step, where)
        elif kw == "ARG":
            for word in step.args:
                name, sep, default = word.partition("=")
                st.args[name] = expand(default, st.variables) if sep else st.args.get(name, "")
        elif kw == "ENV":
            st.env.update(_env_pairs(step, st.variables, where))
        elif kw == "WORKDIR":
            st.cwd = posixpath.normpath(posixpath.join(st.cwd, expand(" ".join(step.args), st.variables)))
            st.emit("WORKDIR", step, (st.cwd,))
        elif kw == "USER":
            st.user = expand(step.args[0], st.variables).split(":", 1)[0] if step.args else None
        elif kw == "SHELL":
            if not step.json_form or not step.args:
                raise NeedsImageError(f"{where}: SHELL needs the JSON form, e.g. [\"/bin/bash\", \"-c\"]")
            st.shell = step.args
        elif kw in ("COPY", "ADD"):
            _copy(st, step, where)
        elif kw == "RUN":
            _run(st, step, where)
        elif kw in SKIPPED:
            st.skipped.append(f"line {step.line}: {kw}")
        elif kw == "ENTRYPOINT":
            if not step.json_form or not step.args:
                raise NeedsImageError(f"{where}: ENTRYPOINT {' '.join(step.args)[:80]} (shell form) runs instead of "
                                      "the container's command; this task needs an image")
            st.entrypoint = tuple(expand(a, st.variables) for a in step.args)
            st.entrypoint_label = f"{where}: ENTRYPOINT {' '.join(step.args)[:80]}"
        else:
            raise NeedsImageError(f"{where}: instruction {kw} cannot be replayed in a local sandbox; "
                                  "this task needs an image")
    return DockerPlan(base=st.base or "scratch", steps=tuple(st.steps), workdir=st.cwd,
                      env=tuple(st.env.items()), user=st.user, skipped=tuple(st.skipped),
                      entrypoint=st.entrypoint, entrypoint_label=st.entrypoint_label)


def plan_or_none(path: Path | None) -> DockerPlan | None:
    """The plan of a Dockerfile that can be replayed; None without one, or when it needs an image or a download."""
    if path is None:
        return None
    try:
        return build_plan(path)
    except (NeedsImageError, NeedsNetworkError):
        return None
