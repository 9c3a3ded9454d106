"""vLLM v1: under the priority policy, preempting a running request that was passed over
earlier in the same step makes the scheduler skip the next running request (vLLM issue
#49097).

Scheduler.schedule() walks ``self.running`` with ``req_index``.  When a request cannot get
pages, the priority policy preempts ``max(self.running, key=(priority, arrival_time))``
and removes it with ``self.running.remove(...)``.  If the victim sits before ``req_index``
(it was visited earlier this step and given no tokens -- here because its batch is still
in flight under pipeline parallelism), every later request moves one place left and
``req_index`` is not stepped back: the request right after the current one is never
visited this step, though pages are free for it.  (0.11.0 also skips it when the victim
was scheduled earlier in the step; 0.11.1, PR #26661, steps back in that case only.)

The scenario: EngineCore's batch queue of two (pipeline_parallel_size 2) around vLLM's
Scheduler.  "v" (priority 2) runs first; "x" (priority 0) and "y" (priority 1) join.  At
step 3 v's batch is in flight (no tokens), x needs a page, none is free, v is preempted;
y -- not in flight, with a page free for it after the preemption -- is not scheduled.

Standalone: vLLM's own classes only, offline (a Qwen2.5-0.5B config.json is written to a
temp dir; no weights, no tokenizer, no GPU).  Exit 1 and ``DEFECT: ...`` when the defect
shows, exit 0 and ``OK: ...`` when vLLM behaves as expected.
"""
import inspect
import json
import os
import sys
import tempfile
from collections import deque

FIXED_IN = "0.28.0"  # first release where it does not show (None: not fixed)

for _k, _v in {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
               "VLLM_LOGGING_LEVEL": "ERROR", "TRANSFORMERS_VERBOSITY": "error"}.items():
    os.environ.setdefault(_k, _v)

import torch  # noqa: E402
import vllm  # noqa: E402
from vllm.config import (CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig,  # noqa: E402
                         VllmConfig)
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig,  # noqa: E402
                                        KVCacheGroupSpec)
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402


# --- version shims: keep only the arguments this release takes -----------------------
def accepted(fn, **kwargs):
    params = inspect.signature(fn).parameters
    return {k: v for k, v in kwargs.items() if k in params}


def model_config(max_model_len):
    d = tempfile.mkdtemp()
    with open(os.path.join(d, "config.json"), "w") as f:  # Qwen2.5-0.5B's config
        json.dump({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
                   "hidden_size": 896, "intermediate_size": 4864, "num_attention_heads": 14,
                   "num_hidden_layers": 24, "num_key_value_heads": 2,
                   "max_position_embeddings": 32768, "vocab_size": 151936,
                   "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
                   "tie_word_embeddings": True, "torch_dtype": "bfloat16",
                   "bos_token_id": 151643, "eos_token_id": 151643}, f)
    return ModelConfig(model=d, skip_tokenizer_init=True, max_model_len=max_model_len)


def runner_output(sampled):
    ids = list(sampled)
    tokens = [sampled[r] for r in ids]
    field = ModelRunnerOutput.__dataclass_fields__["sampled_token_ids"]
    if "ndarray" in str(field.type):  # 0.11.1, 0.11.2
        import numpy as np
        tokens = [np.array(t, dtype=np.int64) for t in tokens]
    return ModelRunnerOutput(**accepted(
        ModelRunnerOutput, req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
        sampled_token_ids=tokens, logprobs=None, prompt_logprobs_dict={}, pooler_output=[]))
# ---------------------------------------------------------------------------------------


BLOCK_SIZE = 4
mc = model_config(64)
sc = SchedulerConfig(**accepted(SchedulerConfig, max_num_seqs=4, max_num_batched_tokens=64,
                                max_model_len=64, enable_chunked_prefill=True,
                                is_encoder_decoder=False, policy="priority"))
cc = CacheConfig(block_size=BLOCK_SIZE, enable_prefix_caching=False)
cc.num_gpu_blocks = 5  # the null page and 4 pages
vc = VllmConfig(model_config=mc, scheduler_config=sc, cache_config=cc,
                device_config=DeviceConfig("cpu"))
spec = FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=2, head_size=64,
                         dtype=torch.bfloat16)
kv_cache_config = KVCacheConfig(num_blocks=5, kv_cache_tensors=[],
                                kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)])
scheduler = Scheduler(**accepted(
    Scheduler.__init__, vllm_config=vc, kv_cache_config=kv_cache_config, log_stats=False,
    structured_output_manager=StructuredOutputManager(vc), block_size=BLOCK_SIZE,
    hash_block_size=BLOCK_SIZE))


def request(rid, first_token, priority, arrival):
    return Request(**accepted(
        Request.__init__, request_id=rid,
        prompt_token_ids=list(range(first_token, first_token + 4)),
        sampling_params=SamplingParams(max_tokens=12, ignore_eos=True), pooling_params=None,
        eos_token_id=None, priority=priority, arrival_time=arrival))


arrivals = {0: [request("v", 1, priority=2, arrival=0.0)],
            1: [request("x", 11, priority=0, arrival=1.0),
                request("y", 21, priority=1, arrival=2.0)]}
in_flight = deque()  # batches scheduled, not applied yet (newest first)
for step in range(6):
    for r in arrivals.get(step, []):
        scheduler.add_request(r)
    before = {rid: (r.num_computed_tokens, r.num_tokens, r.status.name)
              for rid, r in scheduler.requests.items()}
    running = [r.request_id for r in scheduler.running]
    out = scheduler.schedule()
    sampled = {rid: [7] if before[rid][0] + n >= before[rid][1] else []
               for rid, n in out.num_scheduled_tokens.items()}
    v = scheduler.requests["v"]
    y_has_work = "y" in running and before["y"][0] < before["y"][1]
    if (y_has_work and before["v"][2] == "RUNNING" and v.status.name == "PREEMPTED"
            and "y" not in out.num_scheduled_tokens):
        free = scheduler.kv_cache_manager.block_pool.get_num_free_blocks()
        print(f"DEFECT: vLLM {vllm.__version__}: step {step}: v was preempted (it was "
              f"passed over, its batch in flight), and running request y, which had a "
              f"token to compute, was not visited; scheduled {dict(out.num_scheduled_tokens)},"
              f" {free} page(s) left free")
        sys.exit(1)
    if before.get("v", ("", "", ""))[2] == "RUNNING" and v.status.name == "PREEMPTED":
        print(f"OK: vLLM {vllm.__version__}: step {step}: v was preempted and y was still "
              f"scheduled: {dict(out.num_scheduled_tokens)}")
        sys.exit(0)
    in_flight.appendleft((out, sampled))
    if out.total_num_scheduled_tokens > 0 and len(in_flight) < 2:
        continue  # EngineCore keeps the batch in flight and schedules the next
    out, sampled = in_flight.pop()
    scheduler.update_from_output(out, runner_output(sampled))
print(f"OK: vLLM {vllm.__version__}: v was never preempted while passed over (scenario "
      "did not arise)")
sys.exit(0)
