"""vLLM v1: under the priority policy, a preemption victim scheduled earlier in the same
step keeps its grant.

Scheduler.schedule(): a running request that cannot get pages preempts
``max(self.running, key=(priority, arrival_time))``, which may be a request already
scheduled earlier in the same step.  0.11.0 removes the victim from
``scheduled_running_reqs`` only: its tokens stay in ``num_scheduled_tokens`` (the worker
runs them, on pages just freed), its new pages in the block map, its budget spent.
_update_after_schedule then raises the victim's num_computed_tokens from 0 to its grant,
so it waits with tokens counted as computed and no pages, its sampled token is still
appended to it, and when it resumes it skips the prefix lookup and recomputes from the
stale position.  Consequences found: the AsyncScheduler assertion
(async_priority_victim_crash.py), the hybrid IndexErrors (priority_victim_index_error.py),
and the skipped running request (priority_skipped_index.py).

Bundled stream priority_preempt_already_scheduled_quirk: B (priority 5) runs, A
(priority 0) joins; at step 2 B is scheduled first (no new page needed), then A needs a
page, none is free, and B is preempted.

Standalone: vLLM's own classes only, offline (a Qwen2.5-0.5B config.json is written to a
temp dir; no weights, no tokenizer, no GPU).  Exit 1 and ``DEFECT: ...`` when the defect
shows, exit 0 and ``OK: ...`` when vLLM behaves as expected.
"""
import inspect
import json
import os
import sys
import tempfile

FIXED_IN = "0.11.1"  # first release where it does not show (None: not fixed)

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
mc = model_config(12)
sc = SchedulerConfig(**accepted(SchedulerConfig, max_num_seqs=4, max_num_batched_tokens=32,
                                max_model_len=12, enable_chunked_prefill=True,
                                is_encoder_decoder=False, policy="priority"))
cc = CacheConfig(block_size=BLOCK_SIZE, enable_prefix_caching=False)
cc.num_gpu_blocks = 4  # the null page and 3 pages
vc = VllmConfig(model_config=mc, scheduler_config=sc, cache_config=cc,
                device_config=DeviceConfig("cpu"))
spec = FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=2, head_size=64,
                         dtype=torch.bfloat16)
kv_cache_config = KVCacheConfig(num_blocks=4, kv_cache_tensors=[],
                                kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)])
scheduler = Scheduler(**accepted(
    Scheduler.__init__, vllm_config=vc, kv_cache_config=kv_cache_config, log_stats=False,
    structured_output_manager=StructuredOutputManager(vc), block_size=BLOCK_SIZE,
    hash_block_size=BLOCK_SIZE))


def request(rid, prompt, max_tokens, priority, arrival):
    return Request(**accepted(
        Request.__init__, request_id=rid, prompt_token_ids=prompt,
        sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=True),
        pooling_params=None, eos_token_id=None, priority=priority, arrival_time=arrival))


arrivals = {0: [request("B", [200, 201, 202, 203], 4, priority=5, arrival=0.0)],
            1: [request("A", [100, 101, 102, 103], 3, priority=0, arrival=1.0)]}
for step in range(4):
    for r in arrivals.get(step, []):
        scheduler.add_request(r)
    before = {rid: (r.num_computed_tokens, r.num_tokens)
              for rid, r in scheduler.requests.items()}
    out = scheduler.schedule()
    b = scheduler.requests["B"]
    if b.status.name == "PREEMPTED":
        pages = scheduler.kv_cache_manager.get_block_ids("B")
        if "B" in out.num_scheduled_tokens or b.num_computed_tokens:
            print(f"DEFECT: vLLM {vllm.__version__}: step {step}: preempted B keeps its grant: "
                  f"num_scheduled_tokens {dict(out.num_scheduled_tokens)}, "
                  f"B.num_computed_tokens {b.num_computed_tokens} with pages {pages}")
            sys.exit(1)
        print(f"OK: vLLM {vllm.__version__}: step {step}: B preempted, its grant taken back: "
              f"num_scheduled_tokens {dict(out.num_scheduled_tokens)}, "
              f"B.num_computed_tokens {b.num_computed_tokens}")
        sys.exit(0)
    sampled = {rid: [7] if before[rid][0] + n >= before[rid][1] else []
               for rid, n in out.num_scheduled_tokens.items()}
    scheduler.update_from_output(out, runner_output(sampled))
print(f"OK: vLLM {vllm.__version__}: B was not preempted (scenario did not arise)")
sys.exit(0)
