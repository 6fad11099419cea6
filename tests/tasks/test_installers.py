"""The offline installer rule (offline_pkgs) and the installer finder (installers): pure parts and host checks."""

from __future__ import annotations

from pathlib import Path

from t1.tasks import offline_pkgs as op
from t1.tasks.needs.installers import find_installs, missing_on_host


def test_argument_parsing() -> None:
    assert op.apt_packages(["install", "-y", "-o", "Dpkg::Options::=--force-confnew", "curl", "-t", "bookworm",
                            "git=1:2.39", "libssl-dev:amd64"]) == ["curl", "git", "libssl-dev"]
    assert op.pip_requirements(["-q", "--index-url", "https://x/simple", "pandas>=2", "pyyaml[extra]==6", "-e",
                                "./local"]) == ["pandas>=2", "pyyaml[extra]==6", "./local"]
    assert [op.dist_name(r) for r in ("pandas>=2", "PyYAML[x]==6", "./local", "git+https://h/r", "")] == [
        "pandas", "PyYAML", None, None, None]
    assert op.uv_with(["--with", "pytest==8.4.1", "--with=a,b", "-w", "c", "pytest"]) == [
        "pytest==8.4.1",
        "a",
        "b",
        "c",
    ]


def test_requirement_files_are_read(tmp_path: Path) -> None:
    (tmp_path / "base.txt").write_text("# pinned\npyyaml==6.0\n")
    (tmp_path / "req.txt").write_text("-r base.txt\nsurely-absent-dist>=1 # comment\n\n")
    assert op.pip_requirements(["-r", str(tmp_path / "req.txt")]) == ["pyyaml==6.0", "surely-absent-dist>=1"]
    assert op.pip_missing(["pyyaml==6.0", "surely-absent-dist>=1", "pytest-json-ctrf==0.3.5"]) == ["surely-absent-dist"]


def test_find_installs_in_real_scripts() -> None:
    text = ("apt-get update && apt-get install -y --no-install-recommends curl coq-absent \\\n"
            "  && python3 -m pip install --break-system-packages numpy-absent && uv pip install pyyaml\n"
            "curl -LsSf https://astral.sh/uv/0.9.7/install.sh | sh\nwget -qO- https://get.example.org/x.sh | bash\n"
            "uvx --with pytest==8.4.1 pytest /tests -rA\nif true; then uv add polars; fi\n")
    found = find_installs(text)
    assert [(i.kind, i.packages) for i in found] == [
        ("apt", ("curl", "coq-absent")), ("pip", ("numpy-absent",)), ("pip", ("pyyaml",)),
        ("offline", ("wget could not download https://get.example.org/x.sh (the sandbox is offline)",)),
        ("pip", ("pytest==8.4.1", "pytest")), ("pip", ("polars",))]
    assert missing_on_host(found[0]) == ["coq-absent"] and missing_on_host(found[1]) == ["numpy-absent"]
    assert missing_on_host(found[4]) == []  # T1 ships pytest; the stand-ins count it as present
    assert missing_on_host(found[3]) == list(found[3].packages)  # a download offline is always missing
    assert find_installs("echo 'unterminated") == []  # shell bashlex cannot parse falls back to plain splitting


def test_requirement_files_named_in_the_container_are_read_from_the_task_folder(tmp_path: Path) -> None:
    """`pip install -r requirements.txt` names a file in the built image: validate reads the copy a COPY line put
    there (Docker's rules for directory sources and trailing-slash destinations), never a file in its own cwd, and
    predicts nothing for a file no COPY wrote (a RUN line may make it; the run says what it lacked)."""
    from t1.tasks.formats.dataset import load_task
    from t1.tasks.image.context_files import host_copy
    from t1.tasks.image.dockerplan import build_plan
    from t1.tasks.needs.predict import package_needs

    root = tmp_path / "t"
    (root / "src" / "docs").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "src" / "requirements.txt").write_text("surely-absent-from-src\npytest\n")
    (root / "src" / "docs" / "requirements.txt").write_text("surely-absent-from-docs\n")
    (root / "extra.txt").write_text("surely-absent-extra\n")
    (root / "task.yaml").write_text("instruction: x\n")
    (root / "tests" / "test_outputs.py").write_text("def test_x():\n    assert True\n")
    (root / "run-tests.sh").write_text("pip install -r docs/requirements.txt\npip install -r made-by-run.txt\n")
    (root / "Dockerfile").write_text("FROM python:3.13\nWORKDIR /app\nCOPY src/ ./\nCOPY extra.txt /opt/reqs/\n"
                                     "RUN pip install -r requirements.txt\nRUN pip install -r /opt/reqs/extra.txt\n")
    plan = build_plan(root / "Dockerfile")
    assert host_copy(plan, root, "requirements.txt", "/app") == root / "src" / "requirements.txt"
    assert host_copy(plan, root, "/opt/reqs/extra.txt", "/") == root / "extra.txt"
    assert host_copy(plan, root, "/opt/reqs/other.txt", "/") is None and host_copy(plan, root, "x", "/app") is None
    (tmp_path / "requirements.txt").write_text("never-read\n")  # validate's own cwd holds nothing of the task
    needs = [n.what for n in package_needs(load_task(root))]
    offline = "(the sandbox is offline)"
    assert needs == [
        f"Dockerfile line 5: RUN pip install -r requirements.txt: pip packages not on this host: "
        f"surely-absent-from-src {offline}",
        f"Dockerfile line 6: RUN pip install -r /opt/reqs/extra.txt: pip packages not on this host: "
        f"surely-absent-extra {offline}",
        f"verifier: pip packages not on this host: surely-absent-from-docs {offline}"]
