"""The framing protocol's pure parts: frame scanning over arbitrary chunking, capping, cleaning."""

from __future__ import annotations

import itertools
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from t1.sandbox.ssh.framing import (
    CappedOutput,
    FrameScanner,
    Token,
    clean_output,
    command_body,
    init_body,
    supervisor_command,
    token_message,
)


def _frame(token: Token, code: int, cwd: str = "/app") -> bytes:
    return token.marker + f"{code} {cwd}\n".encode()


@settings(max_examples=200, deadline=None)
@given(output=st.binary(max_size=3000), cuts=st.lists(st.integers(min_value=0, max_value=4000), max_size=8))
def test_frames_are_found_whatever_the_chunking(output: bytes, cuts: list[int]) -> None:
    token = Token.new()
    stream = output + _frame(token, 3) + b"next-command-bytes"
    scanner = FrameScanner(token, cap_bytes=1 << 20)
    points = sorted({min(c, len(stream)) for c in cuts} | {0, len(stream)})
    for a, b in itertools.pairwise(points):
        scanner.feed(stream[a:b])
    assert scanner.frame is not None and scanner.frame.exit_code == 3 and scanner.frame.cwd == "/app"
    assert scanner.output.total_bytes == len(output)
    scanner.reset()
    assert scanner.frame is None
    scanner.feed(_frame(token, 0))
    assert scanner.output.render() == "next-command-bytes" and scanner.frame is not None


def test_death_frames_and_lookalikes() -> None:
    token = Token.new()
    scanner = FrameScanner(token, cap_bytes=4096)
    other = Token.new()
    scanner.feed(_frame(other, 0) + token.left.encode() + b" " + token.right.encode() + b"\n")
    assert scanner.frame is None
    scanner.feed(token.marker + b"X137\n")
    assert scanner.frame is not None and scanner.frame.worker_died and scanner.frame.exit_code == 137


@given(st.lists(st.binary(min_size=1, max_size=5000), max_size=20), st.integers(min_value=256, max_value=4096))
def test_capped_output_keeps_head_and_tail(chunks: list[bytes], cap: int) -> None:
    out = CappedOutput(cap)
    for chunk in chunks:
        out.add(chunk)
    data = b"".join(chunks)
    assert out.total_bytes == len(data) and out.truncated == (len(data) > cap)
    if not out.truncated:
        assert out.render() == clean_output(data)
    assert len(out._head) + len(out._tail) <= cap + 2 * cap  # bounded whatever the input


def test_clean_output_strips_ansi_controls_and_bad_utf8() -> None:
    raw = b"\x1b[1;32mgreen\x1b[0m \x1b]0;t\x07ok\x1b(B\r\nbar 10%\rbar 100%\n\xff\x00\x07end"
    assert clean_output(raw) == "green ok\nbar 100%\n\ufffdend"


def test_tokens_reach_only_the_supervisor() -> None:
    token = Token.new()
    assert token.left not in supervisor_command() and token.right not in supervisor_command()
    body = init_body("/app") + command_body("echo hi")  # everything the worker (and so the agent) gets
    assert token.left not in body and token.right not in body
    assert token_message(token) == f"{token.left} {token.right}\n".encode()
    assert "'it'\\''s'" in command_body("it's")


_SHOWN_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f]")

_TERMINAL_BYTES = st.lists(
    st.sampled_from([b"a", b"\xc3\xa9", b"\xff", b"\n", b"\t", b"\r", b"\r\n", b"\x1b", b"\x1b[1;31m", b"\x1b]0;t\x07",
                     b"\x1b(B", b"\x00", b"\x07", b"\x08", b"\x7f", b"[", b"m"]),
    max_size=40,
).map(b"".join)


@given(st.one_of(st.binary(max_size=200), _TERMINAL_BYTES))
def test_clean_output_leaves_no_terminal_controls(raw: bytes) -> None:
    cleaned = clean_output(raw)
    assert _SHOWN_CONTROLS.search(cleaned) is None
    if not re.search(rb"[\x00-\x08\x0b-\x1f\x7f]", raw):
        assert cleaned == raw.decode("utf-8", "replace")


def test_status_line_without_end_is_an_error() -> None:
    token = Token.new()
    scanner = FrameScanner(token, cap_bytes=4096)
    scanner.feed(b"out" + token.marker + b"0 /a")
    assert scanner.frame is None
    with pytest.raises(ValueError, match="status line too long"):
        scanner.feed(b"x" * 70000)
