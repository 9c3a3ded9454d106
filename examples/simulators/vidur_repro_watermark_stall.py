"""Vidur 0.0.26 defect: a prompt that needs more than num_blocks - watermark blocks is
never scheduled and never rejected, and every request behind it waits forever.

    .venvs/sim-vidur/bin/python examples/simulators/vidur_repro_watermark_stall.py

Imports only Vidur (pip install --no-deps vidur==0.0.26).  100 blocks of 2 tokens, the
default watermark_blocks_fraction 0.01 (1 block); A's 199-token prompt needs 100 blocks,
B's 2-token prompt 1.  VLLMReplicaScheduler (and SarathiReplicaScheduler) return no
batch, batch after batch and is_empty() stays False: in Vidur's Simulator.run no event is left,
and the run ends on its assertion "Simulation ended with pending requests"
(vidur/simulator.py:75), after simulating nothing of A or of B.  vLLM v0, whose
watermark Vidur copies, finishes such a prompt as ignored (AllocStatus.NEVER), and
vLLM 0.11.0 has no watermark (its start-up check guarantees a max_model_len prompt fits).
"""

import importlib.util
import os
import sys
import types

_here = os.path.dirname(os.path.abspath(__file__))  # examples/simulators/vidur.py shadows vidur
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]

root = os.path.dirname(importlib.util.find_spec("vidur").origin)
for name in ("vidur.scheduler", "vidur.execution_time_predictor"):  # their __init__s need sklearn
    m = types.ModuleType(name)
    m.__path__ = [os.path.join(root, name.split(".")[1])]
    sys.modules[name] = m
from vidur.execution_time_predictor.base_execution_time_predictor import \
    BaseExecutionTimePredictor  # noqa: E402
sys.modules["vidur.execution_time_predictor"].BaseExecutionTimePredictor = \
    BaseExecutionTimePredictor
from vidur import config  # noqa: E402
from vidur.entities import Replica, Request  # noqa: E402
from vidur.scheduler.replica_scheduler.sarathi_replica_scheduler import \
    SarathiReplicaScheduler  # noqa: E402
from vidur.scheduler.replica_scheduler.vllm_replica_scheduler import \
    VLLMReplicaScheduler  # noqa: E402

for cls, sched_config in ((VLLMReplicaScheduler, config.VllmSchedulerConfig(
        batch_size_cap=4, max_tokens_in_batch=200)),
        (SarathiReplicaScheduler, config.SarathiSchedulerConfig(batch_size_cap=4, chunk_size=200))):
    rc = config.ReplicaConfig(num_pipeline_stages=1, tensor_parallel_size=1)
    sched = cls(rc, sched_config, config.CacheConfig(block_size=2, num_blocks=100),
                config.TraceRequestGeneratorConfig(max_tokens=200), Replica(rc), 1, None)
    sched.add_request(Request(0.0, 199, 1))   # 100 blocks: the whole pool
    sched.add_request(Request(1.0, 2, 1))     # 1 block
    batches = [sched.on_schedule(float(t)) for t in range(1000)]
    print(f"{cls.__name__}: watermark {sched._watermark_blocks} block(s); "
          f"{sum(b is not None for b in batches)} batches in 1000 calls to on_schedule; "
          f"pending {sched.num_pending_requests}, allocated {sched.num_allocated_blocks}/100, "
          f"is_empty() {sched.is_empty()}  (expected: A scheduled, or rejected, then B)")
