"""MoE routing records (R3): the block codec, validation, concatenation, capture and replay.

- block.py: RoutingBlock (start, [tokens, layers, top_k] uint8/uint16, sentinel rows = missing),
  routing_dtype, sentinel.
- validation.py: validate_routing(arr, num_layers=, top_k=, num_experts=) -> RoutingReport; raises
  RoutingError on shape/range/duplicate faults, counts missing and all-zero rows.
- concat.py: concat_blocks(blocks, num_tokens) lays a segment's blocks over its positions;
  concat_arrays packs segments along tokens.
- adapters.py: ROUTER_ADAPTERS (Qwen3-MoE, Qwen2-MoE, OLMoE, Mixtral, DeepSeek-V3 routers) and
  find_routers(model); layer i of a routing array is the i-th MoE router in module order.
- capture.py: capture_routing(model) records the experts each forward selected.
- replay.py: replay routing in the trainer's forward.
- fidelity.py: segment_logprobs(model, segment, replay=...) scores a segment's sampled tokens with
  one full forward (the reference for the trainer's logprob path and the fidelity bench).

Trainer usage (one micro-batch; routing shaped like input_ids, from Segment.routing, padded with
the sentinel or marked by padding_BS; packed sequences: concatenate routing like the ids):

    from t1.routing.replay import replay_routing
    with replay_routing(model, routing_BSLK, padding_BS=~attention_mask.bool()) as stats:
        logits = model(input_ids=ids_BS, attention_mask=attention_mask).logits
        loss.backward()          # activation-checkpoint recomputation replays the same experts
    log(coverage=stats.coverage, disagreement=stats.disagreement_rate)

The selected experts are the recorded ones; gate weights are the trainer router's own
probabilities at those experts (renormalised when the model normalises top-k), so the router still
gets gradient. Missing rows use the live router and lower t1_routing_replay_coverage;
t1_router_disagreement_rate is the share of recorded experts the live router would not pick.
"""
