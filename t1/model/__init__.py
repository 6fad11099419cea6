"""Model creation: random-init Qwen3-MoE folders with a locally trained tokenizer (no downloads).

Modules:
- init.py: init_model / ensure_made: a model folder from a preset and a seed
- presets.py: the Qwen3-MoE shapes of the presets (tiny, small, learn, learn-long, qwen3-vocab)
- tokenizer.py: a byte-level BPE trained locally, with the chat template
- qwen_tokenizer.py: the real Qwen2/2.5/3 tokenizer, built offline from the ranks a package ships
- chat_template.py: the chat template written into tokenizer_config.json: ChatML with tools and tool calls
- corpus.py: the text a preset's tokenizer trains on: shell sessions, and the curriculum's prompts and
  commands (learn-long: its long tier's and the compaction texts too)
- forward.py: how a causal LM takes its KV cache across transformers releases

Command line::

    t1 model init --out .t1/models/tiny --preset tiny --seed 0

In Python::

    from t1.model.init import init_model
    path = init_model(Path("/tmp/m"), preset="tiny", seed=0)   # corpus=None: the preset's (shell text or curriculum)

The folder holds config.json (Qwen3MoeForCausalLM, every layer sparse MoE, norm_topk_prob true),
model.safetensors (per-expert tensors, the layout vLLM and transformers both load),
generation_config.json, tokenizer.json (byte-level BPE trained with `tokenizers`) and
tokenizer_config.json (eos `<|im_end|>`, pad `<|endoftext|>`, a ChatML/Qwen3-style chat template with
tools, `<tool_call>` and `<tool_response>`), plus t1_model.json (preset, seed, weights sha256).
Presets live in t1/model/presets.py: `tiny` (3 layers, 8 experts, top-2, hidden 64, vocab 1024) for tests,
`small` (6 layers, 16 experts, top-4, hidden 256, vocab 4096) for local runs, and `qwen3-vocab` (2 layers,
hidden 64) on the real Qwen3 tokenizer (qwen_tokenizer.py, 151,936 rows) with Qwen3's own chat template. Same preset,
seed and
corpus give byte-identical files.
"""
