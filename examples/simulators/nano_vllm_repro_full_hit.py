"""nano-vllm-fork 20260210: a prompt found whole in the prefix cache is prefilled with 0 tokens.

Run with the side environment (nano-vllm only, no torch):
    .venvs/sim-nano-vllm/bin/python examples/simulators/nano_vllm_repro_full_hit.py

Two requests with the same 512-token prompt (two full 256-token blocks; the same holds
for n > 1 samples of one prompt).  ``BlockManager.allocate`` (block_manager.py:59-82)
counts every full block of the prompt as a hit, the last one included, so the second
sequence has ``num_cached_tokens == len(seq)``.  ``ModelRunner.prepare_prefill``
(model_runner.py:251-253) then gives it ``seqlen_q = 0``, and ``ParallelLMHead``
(embed_head.py:59-60) takes its logits at ``cu_seqlens_q[i + 1] - 1``: the previous
sequence's last token (or, for the first sequence of a batch, index -1, the batch's
last token).  vLLM caps a hit at ``len(prompt) - 1`` tokens so that the last prompt
token is always computed.
"""
import importlib, importlib.util, os, sys, types

root = importlib.util.find_spec("nanovllm").submodule_search_locations[0]
for name, path in (("nanovllm", root), ("nanovllm.engine", os.path.join(root, "engine"))):
    sys.modules[name] = types.ModuleType(name)
    sys.modules[name].__path__ = [path]
sys.modules["nanovllm.config"] = types.ModuleType("nanovllm.config")  # the real one imports transformers
sys.modules["nanovllm.config"].Config = object
from nanovllm.engine.sequence import Sequence
from nanovllm.engine.scheduler import Scheduler
from nanovllm.sampling_params import SamplingParams

config = types.SimpleNamespace(max_num_seqs=8, max_num_batched_tokens=4096, max_model_len=4096,
                               eos=-1, num_kvcache_blocks=16, kvcache_block_size=256)
scheduler = Scheduler(config)
prompt = list(range(1000, 1512))
a, b = Sequence(prompt, SamplingParams(max_tokens=4)), Sequence(prompt, SamplingParams(max_tokens=4))
scheduler.add(a)
scheduler.add(b)
batch, prefill = scheduler.schedule()
cu = [0]
for s in batch:  # what ModelRunner.prepare_prefill builds (model_runner.py:251-254)
    cu.append(cu[-1] + len(s) - s.num_cached_tokens)
for name, s, i in (("A", a, 0), ("B", b, 1)):
    print(f"{name}: {len(s)} tokens, {s.num_cached_tokens} cached, {len(s) - s.num_cached_tokens} "
          f"to compute, logits read at row {cu[i + 1] - 1} (embed_head.py:59)")
if len(b) - b.num_cached_tokens == 0:
    print("FAIL: B is prefilled with 0 tokens; its first token is sampled from A's last row "
          "(expected: hit at most 511 tokens, compute the last prompt token)")
    sys.exit(1)
print("no failure")
