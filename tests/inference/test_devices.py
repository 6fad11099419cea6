"""Device safety of the torch backend: sampling and routing capture where the model lives (CPU here; CUDA when
present)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from inference_helpers import prompt

from t1.inference.server.sampling import make_generator, sample_token, sampling_logprobs
from t1.inference.types import GenerateRequest, SamplingParams

NO_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
DEVICES = ["cpu", pytest.param("cuda", marks=NO_CUDA)]


@pytest.mark.parametrize("device", DEVICES)
def test_generator_is_made_on_the_logits_device_and_samples_reproducibly(device: str) -> None:
    logits_V = torch.randn(500, generator=torch.Generator().manual_seed(0)).to(device)
    params = SamplingParams(temperature=0.9, top_p=0.95, seed=11)
    gen = make_generator(params.seed, logits_V.device)
    assert gen.device == logits_V.device
    tokens = [sample_token(logits_V, params, gen)[0] for _ in range(20)]
    again = make_generator(params.seed, logits_V.device)
    assert [sample_token(logits_V, params, again)[0] for _ in range(20)] == tokens
    assert len(set(tokens)) > 1, "the generator advances between draws"
    token, logprob = sample_token(logits_V, params, make_generator(params.seed, logits_V.device))
    assert logprob == pytest.approx(float(sampling_logprobs(logits_V, params)[token].cpu()))


@NO_CUDA
def test_a_generator_on_another_device_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="generator: on cpu, the logits are on cuda"):
        sample_token(torch.randn(10, device="cuda"), SamplingParams(temperature=1.0), make_generator(1, "cpu"))


@pytest.mark.parametrize("device", DEVICES)
async def test_backend_samples_and_captures_routing_on_its_device(tiny_model_dir: Path, device: str) -> None:
    from t1.inference.routing_capture import RoutingRecorder
    from t1.inference.server.torch_backend import TorchBackend

    backend = TorchBackend(tiny_model_dir, device=device, chunk_tokens=4)
    try:
        assert backend.torch_device.type == device
        request = GenerateRequest("", prompt(20, seed=5), SamplingParams(temperature=1.0, seed=3, max_tokens=12))
        a, b = await backend(request), await backend(request)
        assert a.token_ids.tolist() == b.token_ids.tolist()
        assert a.routing is not None and isinstance(a.routing.experts, np.ndarray)
        shape = backend.moe
        assert shape is not None
        n = len(a.token_ids)
        assert a.routing.experts.shape == (20 + n - 1, shape.num_layers, shape.top_k)
        # A one-off recording (start/stop) of the same forward hands back host arrays too.
        recorder = RoutingRecorder(backend._loaded.model)
        recorder.start()
        with torch.inference_mode():
            backend._loaded.model(input_ids=torch.from_numpy(request.prompt_ids.astype(np.int64))[None].to(device))
        routing = recorder.stop()
        recorder.close()
        assert isinstance(routing, np.ndarray)
        np.testing.assert_array_equal(routing, a.routing.experts[:20])
    finally:
        await backend.close()
