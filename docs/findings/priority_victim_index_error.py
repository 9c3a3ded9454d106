"""vLLM v1: IndexError in single_type_kv_cache_manager.py when a priority victim that kept
its grant is admitted again (hybrid models: sliding window, chunked local attention).

Under the priority policy, Scheduler.schedule() may preempt a running request that it
already scheduled earlier in the same step.  0.11.0 resets the victim's
num_computed_tokens to 0 and frees its pages, but leaves its grant in
``num_scheduled_tokens``, so _update_after_schedule raises the count again: the victim
waits with num_computed_tokens > 0 and no pages.  When it is admitted again,
KVCacheManager.allocate_slots calls remove_skipped_blocks(request, num_computed_tokens)
first, and SlidingWindowManager / ChunkedLocalAttentionManager index the request's
(empty) block list for the pages before the window:

    single_type_kv_cache_manager.py:384  if blocks[i] == self._null_block:   (sliding window)
    single_type_kv_cache_manager.py:512  if blocks[i] == self._null_block:   (chunked local)

IndexError: list index out of range -- the engine dies.  Two scenarios, each a full
attention group plus one windowed group: "low" (priority 1) is prefilling in chunks of
``long_prefill_token_threshold`` tokens, "high" (priority 0) arrives and decodes; when
the pool runs out, high preempts low right after low got its chunk of the step.

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
from vllm.v1.kv_cache_interface import (ChunkedLocalAttentionSpec,  # noqa: E402
                                        FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec,
                                        SlidingWindowSpec)
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


def run(window_spec, block_size, num_blocks, low_prompt_len, threshold, high_prompt_len):
    """Drive low and high for up to 40 steps; the IndexError as 'at file:line, step n', or
    None (an engine that leaves a request waiting longer is not this defect)."""
    mc = model_config(64)
    sc = SchedulerConfig(**accepted(
        SchedulerConfig, max_num_seqs=4, max_num_batched_tokens=32, max_model_len=64,
        enable_chunked_prefill=True, is_encoder_decoder=False, policy="priority",
        long_prefill_token_threshold=threshold))
    cc = CacheConfig(block_size=block_size, enable_prefix_caching=False)
    cc.num_gpu_blocks = num_blocks
    vc = VllmConfig(model_config=mc, scheduler_config=sc, cache_config=cc,
                    device_config=DeviceConfig("cpu"))
    attn = dict(block_size=block_size, num_kv_heads=2, head_size=64, dtype=torch.bfloat16)
    kv_cache_config = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["full.0"], FullAttentionSpec(**attn)),
        KVCacheGroupSpec(["local.0"], window_spec(**attn))])
    scheduler = Scheduler(**accepted(
        Scheduler.__init__, vllm_config=vc, kv_cache_config=kv_cache_config,
        log_stats=False, structured_output_manager=StructuredOutputManager(vc),
        block_size=block_size, hash_block_size=block_size))

    def request(rid, prompt, priority, arrival):
        return Request(**accepted(
            Request.__init__, request_id=rid, prompt_token_ids=prompt,
            sampling_params=SamplingParams(max_tokens=6, ignore_eos=True),
            pooling_params=None, eos_token_id=None, priority=priority, arrival_time=arrival))

    scheduler.add_request(request("low", list(range(1, low_prompt_len + 1)), 1, 0.0))
    high = request("high", list(range(100, 100 + high_prompt_len)), 0, 1.0)
    step = 0
    try:
        while step < 40:
            if step == 1:
                scheduler.add_request(high)
            if not scheduler.has_requests():
                return None
            before = {rid: (r.num_computed_tokens, r.num_tokens)
                      for rid, r in scheduler.requests.items()}
            out = scheduler.schedule()
            # one token for each request whose prompt this step completes (or that decodes)
            sampled = {rid: [7] if before[rid][0] + n >= before[rid][1] else []
                       for rid, n in out.num_scheduled_tokens.items()}
            scheduler.update_from_output(out, runner_output(sampled))
            step += 1
    except IndexError as e:
        tb = e.__traceback__
        while tb.tb_next:
            tb = tb.tb_next
        return (f"IndexError at {os.path.basename(tb.tb_frame.f_code.co_filename)}:"
                f"{tb.tb_lineno} in schedule() of step {step}")
    return None


def sliding_window(**attn):
    return SlidingWindowSpec(**attn, sliding_window=8)


def chunked_local(**attn):
    return ChunkedLocalAttentionSpec(**attn, attention_chunk_size=16)


found = []
failure = run(sliding_window, block_size=4, num_blocks=21, low_prompt_len=48, threshold=16,
              high_prompt_len=4)
if failure:
    found.append(f"sliding window 8, pages of 4: {failure}")
failure = run(chunked_local, block_size=16, num_blocks=7, low_prompt_len=48, threshold=16,
              high_prompt_len=16)
if failure:
    found.append(f"chunked local attention 16, pages of 16: {failure}")
if found:
    print(f"DEFECT: vLLM {vllm.__version__}: " + "; ".join(found))
    sys.exit(1)
print(f"OK: vLLM {vllm.__version__}: no IndexError in either hybrid scenario")
sys.exit(0)
