"""nano-vllm-fork 20260210: a request that can never be scheduled ends in a bare AssertionError.

Run with the side environment (nano-vllm only, no torch):
    .venvs/sim-nano-vllm/bin/python examples/simulators/nano_vllm_repro_no_fit.py

``LLMEngine.add_request`` (llm_engine.py:46-72) checks no prompt length.  A prompt longer
than ``max_num_batched_tokens`` (or needing more blocks than the pool has) is never
admitted (scheduler.py:71-72 breaks), nothing is running, and ``schedule()`` ends in
``assert scheduled_seqs`` (scheduler.py:170) with no message; the same happens to a
sequence that preempts itself when it alone fills the pool.  vLLM rejects such a prompt
when it is added (a ValueError naming max_model_len) and never asserts in the scheduler.
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

config = types.SimpleNamespace(max_num_seqs=8, max_num_batched_tokens=1024, max_model_len=1024,
                               eos=-1, num_kvcache_blocks=16, kvcache_block_size=256)
scheduler = Scheduler(config)
scheduler.add(Sequence(list(range(1100)), SamplingParams(max_tokens=4)))  # 1100 > 1024
try:
    scheduler.schedule()
except AssertionError as e:
    print(f"FAIL: schedule() raised AssertionError({str(e)!r}) at scheduler.py:170 for a "
          "1100-token prompt with max_num_batched_tokens=1024 (expected: rejected when added)")
    sys.exit(1)
print("no failure")
