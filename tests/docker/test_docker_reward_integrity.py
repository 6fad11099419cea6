"""The reward-integrity attacks of tests/tasks/reward_integrity/ against docker sandboxes.

The suite's attack tests are collected here a second time with `provider` a docker provider on the
private engine (and `harbor_base` its base image, so the Harbor tasks' Dockerfiles build offline):
code planted in the system and the workdir, plugins registered there, git's configuration, pytest
steered by links at the root, a task environment pointing into the agent's places, a forged count
of cases; each must score as the honest failed attempt does. Filling the container's storage runs
on a second engine whose data root is a small tmpfs (the session engine's is the host's disk).
Without the verifier's own user and pristine system (`DockerProvider.separates_verifier` off) a
planted `/usr/bin/python3` forges a full pass: the isolation is what stops it. (The base image has
no compiler: `plant_preloaded_library` fails before it plants anything there.)
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from private_dockerd import BASE_IMAGE, PrivateDockerd, docker_config
from tasks.reward_integrity.attacks import ATTACKS, FILL_INODES, HONEST, TESTS, oracle_run
from tasks.reward_integrity.test_bounded_count import (
    test_a_forged_count_is_bounded_by_the_test_files,  # noqa: F401
)
from tasks.reward_integrity.test_failures import (
    test_the_artifact_pack_cannot_be_laundered_into_an_infra_error,  # noqa: F401
)
from tasks.reward_integrity.test_harbor_runners import (  # collected again with the fixtures below
    test_git_runs_no_program_the_agents_repository_names,  # noqa: F401
    test_harbor_pytest_loads_nothing_the_agent_planted,  # noqa: F401
    test_task_environment_into_agent_dirs_runs_nothing_planted,  # noqa: F401
)
from tasks.reward_integrity.test_planted_code import (  # noqa: F401
    test_attack_scores_as_an_honest_failure,
    test_honest_attempts,
)

from t1.config.sandbox import ShellConfig
from t1.sandbox.docker.docker_provider import DockerProvider
from t1.sandbox.ssh.ssh_sandbox import SshSandbox
from t1.sandbox.types import SandboxRequest, ShellRole
from t1.tasks.image.docker_build import EnvironmentBuilder
from t1.tasks.verify.oracle import RunStatus


@pytest.fixture
def provider(docker_provider: DockerProvider) -> DockerProvider:
    """The suite's `provider`: a docker one (256 MiB, 64 processes per container)."""
    return docker_provider


@pytest.fixture
def harbor_base() -> str:
    """The Harbor tasks' FROM image: the private engine's base image (nothing is pulled)."""
    return BASE_IMAGE


@pytest.fixture(scope="module")
def small_dockerd() -> Iterator[PrivateDockerd]:
    """A second private engine whose data root (the containers' writable layers) is a tmpfs of 20,000 inodes: a
    container's storage a solution can fill here, where the session engine's is the host's disk. Its folder is
    outside pytest's base temp (which a later pytest run removes), as the session engine's."""
    engine = PrivateDockerd(Path(tempfile.mkdtemp(prefix="t1-dockerd-small-")),
                            data_tmpfs="size=768m,nr_inodes=20000,mode=0711")
    engine.start()
    try:
        engine.import_base_image()
        yield engine
    finally:
        engine.stop()


async def test_filling_the_containers_storage_is_the_attempts_failure(small_dockerd: PrivateDockerd,
                                                                      tmp_path: Path) -> None:
    """A solution that fills its container's storage with empty files until it refuses one: the verifier works on
    tmpfs mounts of its own (/tests, /logs/verifier, its toolchain, its uploads staged there), and the attempt
    scores as an honest failure, never an infra error."""
    provider = DockerProvider(docker_config(small_dockerd, memory_mb=256, pids=64), ShellConfig(command_timeout_s=60),
                              images=EnvironmentBuilder)
    try:
        run = await oracle_run(provider, tmp_path / "fill", FILL_INODES)
    finally:
        await provider.close()
    assert run.status is not RunStatus.INFRA_ERROR and not run.resolved, run.as_json()
    assert (run.reward, run.report.passed, run.report.total) == HONEST, (
        run.why,
        run.detail,
        run.report.output_tail[-800:],
    )


async def test_the_provider_separates_the_verifier(provider: DockerProvider) -> None:
    await provider.start()
    assert provider.separates_verifier


async def test_without_the_isolation_a_planted_python_forges_the_reward(
    provider: DockerProvider, tmp_path: Path
) -> None:
    await provider.start()
    provider.separates_verifier = False  # what the provider did before: the verifier logs in as the agent
    forged = await oracle_run(provider, tmp_path / "forged", ATTACKS["plant_python3"])
    assert forged.resolved and forged.reward == 5.0, forged.as_json()


async def test_the_agent_cannot_reach_the_verifiers_dirs(provider: DockerProvider) -> None:
    box = await provider.create(SandboxRequest())
    assert isinstance(box, SshSandbox) and box.separates_verifier
    try:
        agent, verifier = await box.open_shell(), await box.open_shell(role=ShellRole.VERIFIER)
        await verifier.write_file("/tests/test_outputs.py", TESTS.encode())
        who = await verifier.run("id -u; echo $$")
        uid, verifier_pid = who.output.split()
        assert uid == "64999"
        seen = await agent.run("cat /tests/test_outputs.py; ls /tests /logs/verifier /tmp/.t1-verifier; "
                               f"cat /proc/{verifier_pid}/environ; kill -STOP {verifier_pid}; "
                               "umount /tests; mv /tests /tests-gone; rm -rf /logs/verifier")
        assert seen.exit_code != 0 and "test_answer" not in seen.output, seen.output
        assert seen.output.count("Permission denied") >= 5, seen.output
        assert (await verifier.run("echo alive; ls /tests")).output.split() == ["alive", "test_outputs.py"]
    finally:
        await provider.destroy(box)


async def test_the_verifier_runs_the_system_as_setup_left_it(provider: DockerProvider) -> None:
    box = await provider.create(SandboxRequest())
    assert isinstance(box, SshSandbox)
    pristine = provider.server.pristine[box.id]
    try:
        agent = await box.open_shell()
        setup = await agent.run("mkdir -p /usr/local/bin && printf '#!/bin/sh\\necho from-setup\\n' > "
                                "/usr/local/bin/t1-tool && "
                                "chmod 755 /usr/local/bin/t1-tool && rm /usr/bin/od && mkdir -p /opt/t1 && echo setup "
                                "> /opt/t1/data")
        assert setup.exit_code == 0, setup.output
        await box.end_setup()
        acted = await agent.run("printf '#!/bin/sh\\necho from-agent\\n' > /usr/local/bin/t1-tool; cp /usr/bin/cat "
                                "/usr/bin/od; "
                                "echo agent > /opt/t1/data; echo mine > /app/work.txt")
        assert acted.exit_code == 0, acted.output
        verifier = await box.open_shell(role=ShellRole.VERIFIER)
        seen = await verifier.run("t1-tool; test -e /usr/bin/od && echo od-present || echo od-gone; cat /opt/t1/data "
                                  "/app/work.txt")
        assert seen.output.split() == ["from-setup", "od-gone", "setup", "mine"], seen.output
        assert pristine.layers.setup_copy.is_dir()
    finally:
        await provider.destroy(box)
    assert not pristine.layers.setup_copy.exists()  # the engine removed it with the container's layer


SHOCKER = r'''
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)

class Handle(ctypes.Structure):
    _fields_ = [("handle_bytes", ctypes.c_uint), ("handle_type", ctypes.c_int), ("f_handle", ctypes.c_uint * 2)]

opened = []
for path in ("/etc/hostname", "/etc/resolv.conf", "/etc/hosts"):
    try:
        mount_fd = os.open(path, os.O_RDONLY)
    except OSError:
        continue
    root = Handle(8, 1, (ctypes.c_uint * 2)(2, 0))  # ext4's root directory: inode 2, generation 0
    fd = libc.open_by_handle_at(mount_fd, ctypes.byref(root), os.O_RDONLY | os.O_DIRECTORY)
    if fd >= 0:
        opened.append(f"{path}: {sorted(os.listdir(f'/proc/self/fd/{fd}'))[:5]}")
    else:
        opened.append(f"{path}: errno {ctypes.get_errno()}")
print("\n".join(opened))
'''


async def test_verifier_sessions_hold_no_capability_of_the_hosts(provider: DockerProvider) -> None:
    """The "shocker" escape on the real engine: `open_by_handle_at` through a host file bound into the container
    (its /etc/hostname) opens the host's root directory with CAP_DAC_READ_SEARCH in the host's user namespace.
    Verifier sessions have a user namespace of their own, so their capabilities stop at the container's files."""
    box = await provider.create(SandboxRequest())
    try:
        verifier = await box.open_shell(role=ShellRole.VERIFIER)
        await verifier.write_file("/tmp/.t1-verifier/shocker.py", SHOCKER.encode())
        probe = await verifier.run("python3 /tmp/.t1-verifier/shocker.py; grep -E '^Cap(Eff|Bnd)' /proc/self/status; "
                                   "cat /proc/self/uid_map")
        assert "errno" in probe.output and "['" not in probe.output, probe.output  # EPERM: no host-wide capability
        uid_map = probe.output.strip().splitlines()[-1].split()
        assert uid_map[:2] == ["0", "0"] and uid_map[2] != "4294967295", probe.output  # a user namespace of its own
        mine = await verifier.run("echo ok > /app/verifier-wrote && chown 1000 /app/verifier-wrote && stat -c %u "
                                  "/app/verifier-wrote")
        assert mine.output.split() == ["1000"], mine.output  # its file capabilities still work on the container's files
    finally:
        await provider.destroy(box)
