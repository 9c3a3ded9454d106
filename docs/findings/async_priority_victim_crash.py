"""vLLM v1: AsyncScheduler asserts when a priority victim keeps the grant of its step.

Under the priority policy, Scheduler.schedule() lets a running request that cannot get
pages preempt the running request with the largest (priority, arrival_time), which may be
one already scheduled earlier in the same step.  The victim is removed from the step's
scheduled running requests but keeps its entry in ``num_scheduled_tokens`` (and its new
pages and spent budget).  Under async scheduling AsyncScheduler._update_after_schedule
then gives the victim no output placeholder (its computed count was reset to 0), but the
model runner still samples a token for it; when that batch's output is applied,
``request.num_output_placeholders -= 1`` goes below zero and
``assert request.num_output_placeholders >= 0`` fails: the engine dies.

Bundled stream async_priority_victim_crash, as vLLM's classes: 18-token prompt "low"
(priority 2) runs; "high" (priority 0, 27 tokens) arrives at step 2; at step 4 "high"
cannot get pages and preempts "low", which was scheduled first in the same step.

Standalone: vLLM's own classes only, offline (a Qwen2.5-0.5B config.json is written to a
temp dir; no weights, no tokenizer, no GPU).  The loop below is EngineCore's batch queue
of two (step_with_batch_queue) around vLLM's AsyncScheduler.  Exit 1 and ``DEFECT: ...``
when the defect shows, exit 0 and ``OK: ...`` when vLLM behaves as expected.
"""
import inspect
import json
import os
import sys
import tempfile
from collections import deque

FIXED_IN = "0.11.1"  # first release where it does not show (None: not fixed)

for _k, _v in {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
               "VLLM_LOGGING_LEVEL": "ERROR", "TRANSFORMERS_VERBOSITY": "error"}.items():
    os.environ.setdefault(_k, _v)

import torch  # noqa: E402
import vllm  # noqa: E402
from vllm.config import (CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig,  # noqa: E402
                         VllmConfig)
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.v1.core.sched.async_scheduler import AsyncScheduler  # noqa: E402
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


BLOCK_SIZE = 2
mc = model_config(35)
sc = SchedulerConfig(**accepted(SchedulerConfig, max_num_seqs=2, max_num_batched_tokens=9,
                                max_model_len=35, enable_chunked_prefill=True,
                                is_encoder_decoder=False, policy="priority",
                                async_scheduling=True))
cc = CacheConfig(block_size=BLOCK_SIZE, enable_prefix_caching=False)
cc.num_gpu_blocks = 23
vc = VllmConfig(model_config=mc, scheduler_config=sc, cache_config=cc,
                device_config=DeviceConfig("cpu"))
spec = FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=2, head_size=64,
                         dtype=torch.bfloat16)
kv_cache_config = KVCacheConfig(num_blocks=23, kv_cache_tensors=[],
                                kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)])
scheduler = AsyncScheduler(**accepted(  # (later releases: AsyncScheduler(*args, **kwargs))
    Scheduler.__init__, vllm_config=vc, kv_cache_config=kv_cache_config,
    log_stats=False, structured_output_manager=StructuredOutputManager(vc),
    block_size=BLOCK_SIZE, hash_block_size=BLOCK_SIZE))


def request(rid, prompt, max_tokens, priority, arrival):
    return Request(**accepted(
        Request.__init__, request_id=rid, prompt_token_ids=prompt,
        sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=True),
        pooling_params=None, eos_token_id=None, priority=priority, arrival_time=arrival))


scheduler.add_request(request(
    "low", [7, 15, 13, 20, 14, 10, 1, 13, 16, 14, 20, 19, 13, 10, 19, 13, 2, 11],
    max_tokens=8, priority=2, arrival=0.0))
high = request("high", [7, 3, 5, 1, 15, 14, 15, 14, 16, 2, 5, 8, 1, 20, 20, 17, 15, 17, 20,
                        14, 15, 16, 16, 13, 5, 14, 2], max_tokens=7, priority=0, arrival=1.0)

in_flight = deque()  # batches scheduled, not applied yet (newest first)
step = 0
try:
    while step < 60:
        if step == 2:
            scheduler.add_request(high)
        if not (scheduler.has_requests() or in_flight):
            break
        if scheduler.has_requests():
            before = {rid: (r.num_computed_tokens, r.num_tokens, r.num_output_placeholders)
                      for rid, r in scheduler.requests.items()}
            out = scheduler.schedule()
            # The model runner samples one token for each scheduled request whose known
            # tokens (and placeholders) the grant reaches; a prefill chunk samples none.
            sampled = {}
            for rid, n in out.num_scheduled_tokens.items():
                computed, known, pending = before[rid]
                sampled[rid] = [1] if computed + n >= known + pending else []
            in_flight.appendleft((out, sampled))
            if out.total_num_scheduled_tokens > 0 and len(in_flight) < 2:
                step += 1
                continue  # EngineCore keeps the batch in flight and schedules the next
        out, sampled = in_flight.pop()
        scheduler.update_from_output(out, runner_output(sampled))
        step += 1
except AssertionError as e:
    tb = e.__traceback__
    while tb.tb_next:
        tb = tb.tb_next
    where = f"{os.path.basename(tb.tb_frame.f_code.co_filename)}:{tb.tb_lineno}"
    low = scheduler.requests["low"]
    print(f"DEFECT: vLLM {vllm.__version__}: AssertionError at {where} in "
          f"update_from_output() of step {step}: preempted request 'low' has "
          f"num_output_placeholders {low.num_output_placeholders}")
    sys.exit(1)

done = [r for r in ("low", "high") if r not in scheduler.requests]
if len(done) != 2:
    print(f"DEFECT: vLLM {vllm.__version__}: requests left unfinished after {step} steps")
    sys.exit(1)
print(f"OK: vLLM {vllm.__version__}: both requests finished in {step} steps")
sys.exit(0)
