"""The offline installer rule (offline_pkgs) and the installer finder (installers): pure parts and host checks."""

from __future__ import annotations

from pathlib import Path

from t1.tasks import offline_pkgs as op
from t1.tasks.installers import Install, find_installs, missing_on_host


def test_argument_parsing() -> None:
    assert op.apt_packages(["install", "-y", "-o", "Dpkg::Options::=--force-confnew", "curl", "-t", "bookworm",
                            "git=1:2.39", "libssl-dev:amd64"]) == ["curl", "git", "libssl-dev"]
    assert op.pip_requirements(["-q", "--index-url", "https://x/simple", "pandas>=2", "pyyaml[extra]==6", "-e",
                                "./local"]) == ["pandas>=2", "pyyaml[extra]==6", "./local"]
    assert [op.dist_name(r) for r in ("pandas>=2", "PyYAML[x]==6", "./local", "git+https://h/r", "")] == [
        "pandas", "PyYAML", None, None, None]
    assert op.uv_with(["--with", "pytest==8.4.1", "--with=a,b", "-w", "c", "pytest"]) == ["pytest==8.4.1", "a", "b", "c"]


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
        ("pip", ("pytest==8.4.1", "pytest")), ("pip", ("polars",)), ("fetch", ("https://get.example.org/x.sh",))]
    assert missing_on_host(found[0]) == ["coq-absent"] and missing_on_host(found[1]) == ["numpy-absent"]
    assert missing_on_host(found[3]) == []  # T1 ships pytest; the stand-ins count it as present
    assert missing_on_host(Install("fetch", ("https://get.example.org/x.sh",), "")) == ["https://get.example.org/x.sh"]
    assert find_installs("echo 'unterminated") == []  # shell bashlex cannot parse falls back to plain splitting
