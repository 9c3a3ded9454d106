"""nano-vllm-fork 20260210: a sequence preempted for another one stays in Scheduler.running.

Run with the side environment (nano-vllm only, no torch):
    .venvs/sim-nano-vllm/bin/python examples/simulators/nano_vllm_repro_preempt.py

Prompts of 511, 300 and 511 tokens fill a 6-block pool (block size 256).  At the
second decode step A needs a third block; the decode loop preempts B (scheduler.py:152-154,
``temp_running.pop(0)``) but ``Scheduler.preempt`` (scheduler.py:181-184) does not take
B out of ``self.running``.  B is then both waiting and running with an empty block
table, and the next step decodes it: IndexError in ``BlockManager.may_append``
(block_manager.py:105, ``block_table[-1]``).  (When the stale entry needs a new block
instead, it is preempted a second time and queued twice; its second admission then fails
``assert not seq.block_table``, block_manager.py:60.)
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
                               eos=-1, num_kvcache_blocks=6, kvcache_block_size=256)
scheduler = Scheduler(config)
seqs = {name: Sequence(list(range(base, base + n)), SamplingParams(max_tokens=64))
        for name, base, n in (("A", 1000, 511), ("B", 2000, 300), ("C", 3000, 511))}
names = {s.seq_id: n for n, s in seqs.items()}
for s in seqs.values():
    scheduler.add(s)
for step in range(6):
    try:
        batch, prefill = scheduler.schedule()
    except Exception as e:
        print(f"step {step}: {type(e).__name__}: {e}")
        print("expected: B waits with no blocks and is recomputed when blocks free up")
        sys.exit(1)
    print(f"step {step}: {'prefill' if prefill else 'decode'} {[names[s.seq_id] for s in batch]}; "
          f"waiting {[names[s.seq_id] for s in scheduler.waiting]}, "
          f"running {[names[s.seq_id] for s in scheduler.running]}, "
          f"B's block table {seqs['B'].block_table}")
    scheduler.postprocess(batch, [7] * len(batch))
print("no failure")
