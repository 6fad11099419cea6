"""Loading Terminal-Bench 1 and Harbor task folders: fields, defaults, datasets, and errors naming file and field."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from t1.config.tasks import TasksConfig
from t1.sandbox.needs import NeedsImageError, NeedsNetworkError
from t1.tasks.formats.dataset import load_dataset, load_named_set, load_task
from t1.tasks.image.base_images import SYSTEM_PATH, image_env
from t1.tasks.image.dockerfile import parse_dockerfile
from t1.tasks.image.dockerplan import build_plan
from t1.tasks.needs.validate import check_task
from t1.tasks.spec import MultiStepStrategy, TaskFormat, TaskParseError, VerifierKind


def test_tb1_with_only_test_outputs(fixtures: Path) -> None:
    spec = load_task(fixtures / "tb1-word-count")
    assert spec.format is TaskFormat.TB1 and spec.id == "tb1-word-count"
    assert spec.instruction.startswith("The file /app/words.txt")
    assert spec.verifier.kind is VerifierKind.PYTEST and spec.verifier.run_tests_sh is None
    assert spec.verifier.timeout_sec == 60.0 and spec.agent_timeout_sec == 120.0
    assert spec.metadata.difficulty == "easy" and spec.metadata.tags == ("coreutils", "sorting")
    assert spec.environment.dockerfile is not None and spec.environment.compose_file is not None
    assert spec.solution is not None and spec.solution.script.name == "solution.sh"
    assert ("TEST_DIR", "/tests") in spec.verifier.env


def test_tb1_defaults_descriptions_and_solution_yaml(fixtures: Path) -> None:
    spec = load_task(fixtures / "tb1-run-tests")
    assert spec.instruction.startswith("Create /app/hello.txt")
    assert spec.verifier.kind is VerifierKind.RUN_TESTS_SH
    assert spec.agent_timeout_sec == 360.0 and spec.verifier.timeout_sec == 60.0  # Terminal-Bench 1 defaults
    assert spec.solution is not None and spec.solution.commands == ("echo 'hello, terminal' > /app/hello.txt",)


def test_harbor_fields(fixtures: Path) -> None:
    spec = load_task(fixtures / "harbor-csv-report")
    env = spec.environment
    assert spec.format is TaskFormat.HARBOR and spec.verifier.kind is VerifierKind.TEST_SH
    assert env.workdir == "/app" and env.allow_internet is False and env.memory_mb == 1024 and env.cpus == 1
    assert env.docker_image == "ghcr.io/t1-fixtures/csv-report:1" and env.files_dir is None
    assert env.env == (("REPORT_NAME", "totals"),) and env.healthcheck is not None
    assert env.healthcheck.command == "test -f /app/sales.csv" and env.healthcheck.retries == 3
    assert spec.verifier.env == (("EXPECTED_ROWS", "3"),) and spec.verifier.timeout_sec == 120.0
    assert spec.solution is not None and spec.solution.env == (("ROUNDING", "2"),)
    assert spec.metadata.category == "data-processing" and spec.metadata.difficulty == "medium"


def test_harbor_multistep(fixtures: Path) -> None:
    spec = load_task(fixtures / "harbor-multistep")
    assert spec.id == "t1-fixtures__notes-multistep" and spec.multi_step_strategy is MultiStepStrategy.MEAN
    assert [s.name for s in spec.steps] == ["init", "extend"]
    init, extend = spec.steps
    assert init.min_reward == (("reward", 1.0),) and extend.min_reward == (("reward", 0.5),)
    assert extend.agent_timeout_sec == 60.0 and extend.healthcheck is not None
    assert extend.workdir_files is not None and (extend.workdir_files / "seed.txt").is_file()
    assert init.verifier.tests_dir.parts[-3:] == ("steps", "init", "tests")
    assert init.verifier.timeout_sec == 60.0 and init.solution is not None
    assert spec.environment.workdir is None and spec.environment.allow_internet is False


def _copy(fixtures: Path, name: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(fixtures / name, tmp_path / name))


@pytest.mark.parametrize(("edit", "field", "problem"), [
    ("[agent]\ntimeout_sec = 'soon'\n", "agent.timeout_sec", "expected a number"),
    ("[environment]\nallow_internet = 'no'\n", "environment.allow_internet", "expected true or false"),
    ("[environment]\nmemory = 'lots'\n", "environment.memory", "expected a size"),
    ("multi_step_reward_strategy = 'max'\n", "multi_step_reward_strategy", "expected 'mean' or 'final'"),
    ("[verifier]\nenv = ['A=1']\n", "verifier.env", "expected a table"),
    ("[[steps]]\nname = 'ghost'\n", "steps[0].name", "folder steps/<name>/ is missing"),
])
def test_harbor_errors_name_file_and_field(fixtures: Path, tmp_path: Path, edit: str, field: str, problem: str) -> None:
    root = tmp_path / "bad"
    root.mkdir()
    (root / "instruction.md").write_text("do it\n")
    shutil.copytree(fixtures / "harbor-csv-report" / "tests", root / "tests")
    (root / "task.toml").write_text(edit)
    with pytest.raises(TaskParseError) as err:
        load_task(root)
    assert err.value.file == str(root / "task.toml") and err.value.field_name == field
    assert problem in err.value.problem and str(root / "task.toml") in str(err.value)


def test_tb1_errors(fixtures: Path, tmp_path: Path) -> None:
    root = _copy(fixtures, "tb1-word-count", tmp_path)
    (root / "task.yaml").write_text("difficulty: easy\n")
    with pytest.raises(TaskParseError, match=r"task.yaml: instruction: required field is missing"):
        load_task(root)
    (root / "task.yaml").write_text("instruction: x\nmax_test_timeout_sec: -1\n")
    with pytest.raises(TaskParseError, match=r"max_test_timeout_sec: must be > 0"):
        load_task(root)
    (root / "task.yaml").write_text("instruction: [unclosed\n")
    with pytest.raises(TaskParseError, match=r"line \d+, column \d+: invalid YAML"):
        load_task(root)
    (root / "task.yaml").write_text("instruction: x\n")
    (root / "tests" / "test_outputs.py").unlink()
    with pytest.raises(TaskParseError, match=r"test_outputs.py: tests: file is missing"):
        load_task(root)


def test_missing_pieces(fixtures: Path, tmp_path: Path) -> None:
    with pytest.raises(TaskParseError, match="not a task folder"):
        load_task(tmp_path)
    root = _copy(fixtures, "harbor-csv-report", tmp_path)
    (root / "tests" / "test.sh").unlink()
    with pytest.raises(TaskParseError, match=r"test.sh: tests: file is missing"):
        load_task(root)


def test_dataset_and_named_set(fixtures: Path, tmp_path: Path) -> None:
    specs = load_dataset([fixtures])
    assert [s.root.name for s in specs] == sorted(p.name for p in fixtures.iterdir() if p.is_dir())
    checks = [check_task(s, str(s.root)) for s in specs]
    assert all(not c.needs and not c.problems for c in checks)
    cfg = TasksConfig.model_validate({"sets": {"fx": {"path": str(fixtures), "limit": 2},
                                               "gen": {"path": str(tmp_path / "gen"), "synth": 3, "split": "eval"}}})
    assert len(load_named_set(cfg, "fx")) == 2
    generated = load_named_set(cfg, "gen")
    assert len(generated) == 3 and {s.metadata.split for s in generated} == {"eval"}
    with pytest.raises(KeyError, match=r"not in tasks\.sets"):
        load_named_set(cfg, "nope")


def test_dockerfile_parse_forms(tmp_path: Path) -> None:
    ok = tmp_path / "Dockerfile"
    ok.write_text("# comment\nFROM debian:12 AS base\nWORKDIR /app\nENV A=1 B=\"two words\"\nENV C 3\n"
                  "COPY --chown=root a.txt b/ /app/\nRUN echo one \\\n  && echo two\nRUN [\"echo\", \"x y\"]\n"
                  "RUN <<EOF\nset -e\n# not a comment to Docker\nUSER inside-heredoc\nEOF\n")
    steps = parse_dockerfile(ok)
    assert [s.keyword for s in steps] == ["FROM", "WORKDIR", "ENV", "ENV", "COPY", "RUN", "RUN", "RUN"]
    assert steps[4].args == ("a.txt", "b/", "/app/") and steps[4].flag("chown") == "root"
    assert steps[5].args == ("echo one  && echo two",) and steps[5].line == 7
    assert steps[6].args == ("echo", "x y") and steps[6].json_form
    assert steps[7].heredocs[0].body == "set -e\n# not a comment to Docker\nUSER inside-heredoc\n"


def test_dockerfile_plan_container_semantics(tmp_path: Path) -> None:
    df = tmp_path / "Dockerfile"
    df.write_text("ARG BASE=ghcr.io/laude-institute/t-bench/python-3-13:20250620\nFROM ${BASE}\nARG NAME=world\n"
                  "ENV GREETING=\"hello ${NAME}\" D=/srv\nCOPY a.txt ./\nWORKDIR ${D}\nWORKDIR sub\n"
                  "COPY --chown=1000:1000 --chmod=0755 a.txt b/ ./\nCOPY <<EOF /etc/motd\nhi\nEOF\n"
                  "RUN python3 - <<PY\nprint(1<<3)\nPY\nUSER nobody\nSHELL [\"/bin/bash\", \"-c\"]\n"
                  "RUN echo $GREETING\nEXPOSE 80\nCMD [\"sleep\", \"infinity\"]\n")
    plan = build_plan(df)
    assert plan.workdir == "/srv/sub" and plan.user == "nobody"
    # the image's own environment first (T1's table), then the Dockerfile's ENV; ARG does not survive into the image
    assert dict(plan.env) == {**dict(image_env("ghcr.io/laude-institute/t-bench/python-3-13:20250620")),
                              "GREETING": "hello world", "D": "/srv"}
    copy, *_ = plan.steps
    assert copy.args == ("a.txt", "/app/")  # t-bench base images: WORKDIR /app before any WORKDIR line
    acts = [(s.action, s.args) for s in plan.steps]
    assert ("COPY", ("a.txt", "b/", "/srv/sub/")) in acts and ("WRITE", ("/etc/motd", "hi\n")) in acts
    run_py, run_echo = plan.run_lines()
    assert run_py.args == ("python3 - <<PY\nprint(1<<3)\nPY",) and run_py.user is None
    assert run_echo.user == "nobody" and run_echo.shell == ("/bin/bash", "-c") and ("NAME", "world") in run_echo.env
    assert plan.skipped == ("line 18: EXPOSE", "line 19: CMD")
    plain = tmp_path / "Plain"
    plain.write_text("FROM ubuntu:24.04\nCOPY x /\n")
    assert build_plan(plain).workdir == "/"
    for bad, err, why in (("ENTRYPOINT /e.sh", NeedsImageError, "ENTRYPOINT /e.sh \\(shell form\\)"),
                          ("COPY --from=build /x /y", NeedsImageError, "--from"),
                          ("RUN --mount=type=secret,id=x true", NeedsImageError, "mount"),
                          ("FROM debian:12", NeedsImageError, "multi-stage"),
                          ("ADD https://x.example/a.tgz /a", NeedsNetworkError, "URL"),
                          ("FOO bar", NeedsImageError, "FOO cannot be replayed")):
        df.write_text(f"FROM debian:12\n{bad}\n")
        with pytest.raises(err, match=why) as info:
            build_plan(df)
        assert "line 2" in str(info.value)


def test_images_whose_content_the_task_needs_are_refused_by_name(tmp_path: Path) -> None:
    """SWE-bench's and DevEval's images carry what their tests run (a repo in a conda env, test tools): the host
    cannot stand in for them, so FROM names the line and the image; the plain t-bench images still replay."""
    df = tmp_path / "Dockerfile"
    for image, why in (("swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest", "SWE-bench evaluation image"),
                       ("ghcr.io/laude-institute/t-bench/deveval:latest", "DevEval's image"),
                       ("docker.io/swebench/sweb.eval.x86_64.django_1776_django-11099", "SWE-bench")):
        df.write_text(f"# a comment\nFROM {image}\nRUN true\n")
        with pytest.raises(NeedsImageError, match=why) as info:
            build_plan(df)
        assert str(info.value).startswith(f"Dockerfile line 2: FROM {image}: ")
    df.write_text("FROM ghcr.io/laude-institute/t-bench/deveval-like:1\nRUN true\n")  # a prefix is not the image
    assert build_plan(df).workdir == "/app"


def test_tb1_parser_t1_lacks_is_refused_not_malformed(fixtures: Path, tmp_path: Path) -> None:
    """A Terminal-Bench parser other than pytest (swebench, ...) is a needs_feature naming the field (validate exit 1),
    not a parse error (exit 2): the task is well formed, T1 cannot read its verifier's output."""
    from t1.tasks.needs.validate import EXIT_CODES, CheckStatus, check_task

    root = _copy(fixtures, "tb1-word-count", tmp_path)
    text = (root / "task.yaml").read_text()
    (root / "task.yaml").write_text(text.replace("parser_name: pytest", "") + "parser_name: swebench\n")
    check = check_task(load_task(root), str(root))
    assert check.status is CheckStatus.WILL_NOT_RUN and EXIT_CODES[check.status] == 1
    assert [str(n) for n in check.needs][:1] == [
        "needs_feature: task.yaml parser_name = 'swebench': T1 reads the results of pytest only"]


def test_a_base_image_starts_with_its_environment(tmp_path: Path) -> None:
    """`ENV PATH="/opt/x/bin:${PATH}"` keeps the image's PATH (it expanded to nothing, and the next RUN lost
    /usr/bin)."""
    df = tmp_path / "Dockerfile"
    df.write_text('FROM python:3.12-slim\nENV PATH="/opt/x/bin:${PATH}" V=$PYTHON_VERSION\nRUN cp a b\n')
    plan = build_plan(df)
    env = dict(plan.env)
    assert env["PATH"] == "/opt/x/bin:/usr/local/bin:" + SYSTEM_PATH and ("PATH", env["PATH"]) in plan.steps[0].env
    assert (env["LANG"], env["PYTHON_VERSION"], env["V"]) == ("C.UTF-8", "3.12", "3.12") and len(env["GPG_KEY"]) == 40
    df.write_text('FROM debian:12\nENV PATH=/root/.local/bin:$PATH\n')
    assert dict(build_plan(df).env)["PATH"] == "/root/.local/bin:" + SYSTEM_PATH
    assert image_env("ubuntu:24.04") == (("PATH", SYSTEM_PATH),) and image_env("python") == image_env("python:latest")
