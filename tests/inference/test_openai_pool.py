"""OpenAIPool against a real HTTP server on loopback (the OpenAI-compatible stand-in): auth, retries,
failover, refusals, token-level results with routing, text-level chat, and weight updates."""

from __future__ import annotations

import time

import numpy as np
import pytest
from openai_standin import StandIn, experts_of, logprob_of, serve
from pydantic import ValidationError

from t1.config.inference import InferencePoolConfig, OpenAIEndpointConfig
from t1.config.loader import ConfigError, load_config
from t1.inference.openai.openai_pool import EndpointRefused, EndpointUnavailable, OpenAIPool
from t1.inference.openai.openai_transport import retry_after_s
from t1.inference.routing_capture import MoeShape
from t1.inference.types import ChatRequest, FinishReason, GenerateRequest, SamplingParams
from t1.routing.block import sentinel

KEY_ENV = "T1_TEST_OPENAI_KEY"


def pool_cfg(*urls: str, **endpoint: object) -> InferencePoolConfig:
    return InferencePoolConfig.model_validate({
        "retries": 3, "backoff_s": 0.01, "unhealthy_s": 0.05,
        "openai": [{"base_url": u, "model": "tiny", **endpoint} for u in urls]})


def request(prompt: list[int], session: str = "s1", max_tokens: int = 8) -> GenerateRequest:
    return GenerateRequest(
        session, np.asarray(prompt, np.int32), SamplingParams(temperature=1.0, max_tokens=max_tokens)
    )


async def test_token_level_turn_returns_the_servers_ids_logprobs_and_sends_the_key(monkeypatch) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-test")
    s = StandIn(sampler=lambda p: [p[-1] + 1, p[-1] + 2, 0], api_key="sk-test")
    async with serve(s) as url:
        pool = OpenAIPool(pool_cfg(url, api_key_env=KEY_ENV), vocab_size=100)
        try:
            res = await pool(request([5, 6, 7]))
        finally:
            await pool.close()
    assert res.token_ids.tolist() == [8, 9, 0] == s.sampled[0]
    np.testing.assert_allclose(res.logprobs, [logprob_of(t) for t in (8, 9, 0)], rtol=1e-6)
    assert res.finish_reason is FinishReason.STOP and res.prompt_tokens == 3 and res.routing is None
    kind, body = s.bodies[0]
    assert kind == "completions" and body["prompt"] == [5, 6, 7] and body["model"] == "tiny"
    assert body["return_token_ids"] and body["return_tokens_as_token_ids"] and body["logprobs"] == 0
    assert s.headers[0]["authorization"] == "Bearer sk-test"


async def test_a_refused_key_is_a_clear_error_without_retries(monkeypatch) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-wrong")
    s = StandIn(api_key="sk-test")
    async with serve(s) as url:
        pool = OpenAIPool(pool_cfg(url, api_key_env=KEY_ENV), vocab_size=100)
        try:
            with pytest.raises(EndpointRefused, match=f"401.*{KEY_ENV}"):
                await pool(request([1, 2]))
        finally:
            await pool.close()
    assert len(s.bodies) == 1  # a retry cannot fix a key


def test_a_missing_key_variable_is_named() -> None:
    with pytest.raises(ValueError, match="T1_TEST_UNSET_KEY"):
        OpenAIPool(pool_cfg("http://127.0.0.1:9/v1", api_key_env="T1_TEST_UNSET_KEY"))


async def test_429_waits_for_retry_after_then_succeeds() -> None:
    s = StandIn(sampler=lambda p: [4, 0], faults=["429"], retry_after="0.3")
    async with serve(s) as url:
        pool = OpenAIPool(pool_cfg(url), vocab_size=100)
        try:
            t0 = time.monotonic()
            res = await pool(request([1]))
            waited = time.monotonic() - t0
        finally:
            await pool.close()
    assert res.token_ids.tolist() == [4, 0]
    assert waited >= 0.3 and len(s.bodies) == 2
    assert pool.metrics.retries._value.get() == 1


@pytest.mark.parametrize("fault", ["500", "malformed", "missing_fields"])
async def test_server_errors_and_malformed_bodies_are_retried(fault: str) -> None:
    s = StandIn(sampler=lambda p: [4, 0], faults=[fault, fault])
    async with serve(s) as url:
        pool = OpenAIPool(pool_cfg(url), vocab_size=100)
        try:
            res = await pool(request([1]))
        finally:
            await pool.close()
    assert res.token_ids.tolist() == [4, 0] and len(s.bodies) == 3


async def test_persistent_failures_end_as_an_infra_error_naming_the_last_cause() -> None:
    s = StandIn(faults=["500"] * 10)
    async with serve(s) as url:
        pool = OpenAIPool(pool_cfg(url), vocab_size=100)
        try:
            with pytest.raises(EndpointUnavailable, match=r"every attempt.*500"):
                await pool(request([1]))
        finally:
            await pool.close()
    assert len(s.bodies) == 4  # retries: 3


async def test_a_failed_endpoint_fails_over_and_affinity_holds_otherwise() -> None:
    a, b = StandIn(sampler=lambda p: [1, 0]), StandIn(sampler=lambda p: [2, 0])
    async with serve(a) as url_a, serve(b) as url_b:
        pool = OpenAIPool(pool_cfg(url_a, url_b), vocab_size=100)
        try:
            first = await pool(request([9], "s"))
            home = pool.replica_of("s")
            again = await pool(request([9, 1, 0, 5], "s"))
            assert pool.replica_of("s") == home and first.token_ids.tolist() == again.token_ids.tolist()
            (a if home == url_a else b).faults.append("500")
            moved = await pool(request([9, 1, 0, 5, 6], "s"))
        finally:
            await pool.close()
    other = url_b if home == url_a else url_a
    assert pool.replica_of("s") == other
    assert moved.token_ids.tolist() == ([2, 0] if other == url_b else [1, 0])
    assert pool.metrics.failovers._value.get() == 1


async def test_a_server_without_token_ids_is_refused_for_tokens() -> None:
    s = StandIn(sampler=lambda p: [3, 0], faults=["text_only"])
    async with serve(s) as url:
        pool = OpenAIPool(pool_cfg(url), vocab_size=100)
        try:
            with pytest.raises(EndpointRefused, match="no sampled token ids"):
                await pool(request([1]))
        finally:
            await pool.close()


async def test_ids_outside_the_vocabulary_are_malformed() -> None:
    s = StandIn(sampler=lambda p: [500, 0])
    async with serve(s) as url:
        pool = OpenAIPool(pool_cfg(url), vocab_size=100)
        try:
            with pytest.raises(EndpointUnavailable, match=r"token_ids: ids must be in \[0, 100\)"):
                await pool(request([1]))
        finally:
            await pool.close()


async def test_routed_experts_are_checked_and_start_after_the_sessions_known_context() -> None:
    moe = MoeShape(num_layers=2, num_experts=8, top_k=2)
    s = StandIn(sampler=lambda p: [11, 12, 0], moe=(2, 8, 2))
    async with serve(s) as url:
        pool = OpenAIPool(pool_cfg(url), vocab_size=100, moe=moe)
        try:
            first = await pool(request([1, 2, 3, 4], "r"))
            s.bad_routing_row = 1
            second = await pool(request([1, 2, 3, 4, 11, 12, 0, 7, 8], "r"))
        finally:
            await pool.close()
    assert first.routing is not None and first.routing.start == 0 and first.routing.num_tokens == 4 + 3 - 1
    for p in range(6):
        assert first.routing.experts[p].tolist() == [experts_of(p, layer, 8, 2) for layer in range(2)]
    # The second turn asks only for positions after what the first returned (4 prompt + 2 sampled).
    assert s.bodies[1][1]["routed_experts_prompt_start"] == 6
    assert second.routing is not None and second.routing.start == 6 and second.routing.num_tokens == 9 + 3 - 1 - 6
    bad = second.routing.experts[1, 0]
    assert (bad == sentinel(bad.dtype)).all() and pool.routing_defects["duplicate_records"] == 1
    assert second.routing.experts[0].tolist() == [experts_of(6, layer, 8, 2) for layer in range(2)]


async def test_chat_turn_sends_messages_and_tools_and_reads_tool_calls() -> None:
    def reply(messages):
        return {"role": "assistant", "content": "Running it.",
                "tool_calls": [{"id": "c1", "type": "function",
                                "function": {"name": "bash", "arguments": '{"command": "ls /"}'}}]}

    s = StandIn(chat=reply)
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {}}}]
    msgs = ({"role": "system", "content": "sys"}, {"role": "user", "content": "do it"})
    async with serve(s) as url:
        pool = OpenAIPool(pool_cfg(url, api="chat", tool_calls=True))
        try:
            out = await pool.chat(ChatRequest("c", msgs, tools, SamplingParams(max_tokens=50)))
            with pytest.raises(Exception, match="text, not token ids"):
                await pool(request([1]))
        finally:
            await pool.close()
    assert pool.text_level
    assert out.text == 'Running it.\n<tool_call>{"name": "bash", "arguments": {"command": "ls /"}}</tool_call>'
    body = s.bodies[0][1]
    assert body["messages"] == list(msgs) and body["tools"] == tools and body["max_tokens"] == 50
    assert "return_token_ids" not in body  # standard fields only: hosted APIs take the body as it is


async def test_weight_updates_drive_vllms_dev_endpoints_in_order_and_stamp_versions() -> None:
    s = StandIn(sampler=lambda p: [5, 0])
    async with serve(s) as url:
        pool = OpenAIPool(pool_cfg(url, weight_updates="vllm_dev"), vocab_size=100)
        try:
            assert (await pool(request([1]))).policy_version == 0
            done = await pool.update_weights("/weights/v3", 3)
            after = await pool(request([1]))
        finally:
            await pool.close()
    assert done.updated == (url,) and after.policy_version == 3 and (after.token_versions == 3).all()
    assert [p for p, _ in s.admin] == ["/pause", "/collective_rpc", "/collective_rpc", "/reset_prefix_cache",
                                      "/update_weight_version", "/resume"]
    assert s.admin[0][1] == {"mode": "wait"}
    assert s.admin[1][1] == {"method": "reload_weights", "kwargs": {"weights_path": "/weights/v3"}}
    assert s.admin[2][1] == {"method": "t1_refresh_moe_kernels"} and s.weight_version == "3"


async def test_weight_updates_are_refused_without_a_weight_api() -> None:
    s = StandIn()
    async with serve(s, dev_mode=False) as url:
        none = OpenAIPool(pool_cfg(url), vocab_size=100)
        dev = OpenAIPool(pool_cfg(url, weight_updates="vllm_dev"), vocab_size=100)
        try:
            with pytest.raises(EndpointRefused, match="weight_updates: none"):
                await none.update_weights("/w", 1)
            with pytest.raises(EndpointUnavailable, match="no endpoint loaded weights v1"):
                await dev.update_weights("/w", 1)
        finally:
            await none.close()
            await dev.close()


def test_retry_after_reads_seconds_and_dates_within_the_cap() -> None:
    assert retry_after_s("2.5", 60) == 2.5 and retry_after_s("600", 60) == 60 and retry_after_s(None, 60) == 0
    assert retry_after_s("soon", 60) == 0 and retry_after_s("Wed, 21 Oct 2015 07:28:00 GMT", 60) == 0


def test_config_refuses_training_on_text_or_frozen_endpoints_and_mixed_pools() -> None:
    ep = "inference.pool.openai=[{base_url: 'http://127.0.0.1:8000/v1', model: m, api: chat}]"
    with pytest.raises(ConfigError, match=r"openai\[0\]\.api: 'chat' is text-level"):
        load_config(None, [ep])
    assert load_config(None, [ep, "coordinator.train=false"]).inference.pool.openai[0].api == "chat"
    frozen = "inference.pool.openai=[{base_url: 'http://127.0.0.1:8000/v1', model: m}]"
    with pytest.raises(ConfigError, match=r"weight_updates: 'none' cannot load new weights"):
        load_config(None, [frozen])
    with pytest.raises(ValidationError, match="http:// or https://"):
        OpenAIEndpointConfig(base_url="127.0.0.1:8000", model="m")
    with pytest.raises(ValidationError, match="either T1's gRPC servers or OpenAI"):
        InferencePoolConfig.model_validate({"endpoints": ["127.0.0.1:1"],
                                            "openai": [{"base_url": "http://h/v1", "model": "m"}]})


async def test_the_router_serves_training_and_eval_episodes_from_openai_pools(renderers, tiny_model_dir,
                                                                             tmp_path) -> None:
    from t1.agent.formats import get_format
    from t1.coordinator.evals.eval_jobs import EvalAttempt
    from t1.coordinator.rollout.generate_router import GenerateRouter
    from t1.tasks.formats.dataset import load_task

    (tmp_path / "t" / "tests").mkdir(parents=True)
    (tmp_path / "t" / "task.toml").write_text('[task]\nname = "t"\n')
    (tmp_path / "t" / "instruction.md").write_text("x\n")
    (tmp_path / "t" / "tests" / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    task = load_task(tmp_path / "t")

    run_ep = {"base_url": "http://127.0.0.1:9/v1", "model": "m", "weight_updates": "vllm_dev"}
    cfg = load_config(None, [f"inference.model.path={tiny_model_dir}", f"inference.pool.openai=[{run_ep}]"])
    router = GenerateRouter(cfg, renderers)
    job_ep = OpenAIEndpointConfig(base_url="http://127.0.0.1:10/v1", model="hosted", api="chat")
    try:
        run_pool = router(None, task, get_format("tool_calls"))
        job_pool = router(EvalAttempt("j", task, 0, openai=job_ep), task, get_format("terminus2"))
        again = router(EvalAttempt("j", task, 1, openai=job_ep), task, get_format("terminus2"))
        assert isinstance(run_pool, OpenAIPool) and not run_pool.text_level and router.num_healthy_servers() == 1
        assert isinstance(job_pool, OpenAIPool) and job_pool.text_level and job_pool is again
        assert job_pool.endpoints == ["http://127.0.0.1:10/v1"]
    finally:
        await router.close()


async def test_training_is_refused_up_front_by_a_server_without_token_ids() -> None:
    good, bad = StandIn(sampler=lambda p: [1]), StandIn(sampler=lambda p: [1], faults=["text_only"])
    async with serve(good) as url_good, serve(bad) as url_bad:
        pool = OpenAIPool(pool_cfg(url_good, url_bad), vocab_size=100)
        try:
            with pytest.raises(EndpointRefused, match=f"{url_bad}: training refused.*no sampled token ids"):
                await pool.check_token_ids()
            await pool.check_token_ids()  # the second server now returns ids (its one fault is spent)
        finally:
            await pool.close()
    assert good.bodies[0][1]["max_tokens"] == 1


async def test_kv_admission_counts_each_endpoints_budget_from_prompts_and_replies() -> None:
    """Budgets of 1000 tokens, episodes expected to reach 600: "a" and "b" start on one endpoint each, "c"
    waits for room on either and starts where "a" ended; the ledger holds prompt + reply per session."""
    import asyncio

    first, second = StandIn(sampler=lambda p: [11, 12, 0]), StandIn(sampler=lambda p: [13, 0])
    async with serve(first) as url_a, serve(second) as url_b:
        cfg = pool_cfg(url_a, url_b, kv_budget_tokens=1000).model_copy(
            update={"kv_admission": True, "kv_expected_context_tokens": 600})
        pool = OpenAIPool(cfg, vocab_size=100)
        try:
            await pool(request([5] * 100, session="a"))
            await pool(request([6] * 200, session="b"))
            assert pool.kv_usage() == {url_a: (1000, 103), url_b: (1000, 202)}
            assert (pool.replica_of("a"), pool.replica_of("b")) == (url_a, url_b)
            waiting = asyncio.create_task(pool(request([7] * 50, session="c")))
            await asyncio.sleep(0.7)
            assert not waiting.done() and len(first.bodies) + len(second.bodies) == 2  # 600 + 600 > 1000 on both
            await pool(request([5] * 100 + [11, 12, 0] + [8] * 40, session="a"))  # resident: never held back
            assert pool.kv_usage()[url_a] == (1000, 146)
            pool.end_session("a")
            await asyncio.wait_for(waiting, 10)
            assert pool.replica_of("c") == url_a and pool.kv_usage() == {url_a: (1000, 53), url_b: (1000, 202)}
            assert pool.metrics.registry.get_sample_value("t1_inference_kv_waits_total") == 1
        finally:
            await pool.close()
