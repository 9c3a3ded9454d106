"""A clean-room reference of vLLM 0.11.0's v1 scheduler and KV cache manager,
and of the releases after it as named rule changes (``reference.releases``).

Pure standard library.  Each module mirrors one part of vLLM 0.11.0 and says
which; read the two side by side.

What it models: KV cache groups of full, sliding-window, chunked-local and
Mamba layers over one pool (hybrid models), with prefix hits common to all
groups; chunked prefill (on and off); prefix caching with chained block
hashes, ``cache_salt``, LoRA ids and image hashes as extra keys; fcfs and
priority policies with preemption by recomputation; LoRA adapter slots
(``lora``); structured output's grammar wait, draft validation and bitmask
rows (``structured_output``); multimodal inputs with the encoder's budget and
cache, sized from the model's largest item (``encoder_inputs``,
``encoder_cache``); speculative decoding (ngram without lookahead, eagle with
lookahead and the dropped last hit); stops by ``max_tokens``,
``max_model_len``, EOS and stop tokens; pooling requests, finished by their
pooled output; aborts; ``reset_prefix_cache``; the worker's slot mapping; the
scheduler stats reported after every step (``stats``).

The engine around the scheduler, as far as a trace shows it: KV connectors'
scheduler side (``kv_connector``: external hits, async loads, pages kept for
sending); the async scheduler's output placeholders (``async_scheduler``);
EngineCore's batch queue under async scheduling and pipeline stages, which
decides when a batch's output is applied (``engine_core``); the KV cache
events a router reads (``kv_events``); and KV sizing at start-up from the
model's config (``kv_sizing``, ``kv_sizing_hybrid``).  The releases after
0.11.0 are ``releases``: each rule change named, with its release and PR, and
switched on by ``Config.has``.

What it leaves out, because the harness never turns it on: encoder-decoder
models (``encoder_inputs`` has the two branches, unused), token-level pooling
tasks, decode-context parallelism, cascade attention's common prefix counts,
the stages' share of a model's layers under pipeline parallelism (the pool is
one worker's), and the per-request timestamps of vLLM's stats (wall-clock).
"""
