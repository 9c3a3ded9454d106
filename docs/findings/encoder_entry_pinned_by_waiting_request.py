"""vLLM v1: a waiting request that fails to get KV pages keeps its encoder cache entries.

Scheduler.schedule(), waiting loop: ``_try_schedule_encoder_inputs`` calls
``EncoderCacheManager.check_and_update_cache``, which, for an item already in the encoder
cache, adds the request to the item's referrers (and takes the item off the freeable
list).  If ``kv_cache_manager.allocate_slots`` then returns None, the loop ``break``s and
the request stays in the waiting queue still holding that reference: nothing lets go of
it until the request is scheduled and later finishes or is preempted.  The pinned item
can no longer be evicted.  When a request ahead of the holder in the waiting queue needs
that room for an image of its own, it can never be scheduled, so the loop breaks before
reaching the holder, and the engine stops scheduling for good with the KV cache empty.
Pipeline parallelism is not needed for this (this script uses the plain Scheduler), and
neither is preemption.

Three requests, priority policy, an encoder cache of 6 tokens (0.11.0 sizes it as
max_num_batched_tokens, here 6), a pool of 4 usable pages of 4 tokens:
  a (priority 0): image "cat" (3 tokens) then text, 12 tokens, 3 outputs.  It fills the pool.
  b (priority 1): image "cat" again, arrives at step 2.  "cat" is in the cache, unreferenced;
                  b takes a reference on it, then gets no pages (a holds all 4), and waits.
  c (priority 0): image "dog" (4 tokens), arrives at step 3 and goes ahead of b.  The cache
                  has 3 free tokens and nothing it may evict ("cat" is b's), so c cannot
                  be scheduled, and b behind it is never tried again.
a finishes at step 3; from step 4 on nothing is scheduled, forever.
Expected: b lets go of "cat" when it is not scheduled, c evicts it and runs, then b.

Standalone: vLLM's own classes only, offline (a Qwen2.5-0.5B config.json is written to a
temp dir; no weights, no tokenizer, no GPU).  The encoder budget and cache that a
multimodal model's processor would size are set on the scheduler directly.  Exit 1 and
``DEFECT: ...`` when the defect shows, exit 0 and ``OK: ...`` when vLLM behaves as expected.
"""
import inspect
import json
import os
import sys
import tempfile

FIXED_IN = "0.14.0"  # vllm-project/vllm#31857: the waiting loop frees the request's
                     # encoder cache references when allocate_slots fails

for _k, _v in {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
               "VLLM_LOGGING_LEVEL": "ERROR", "TRANSFORMERS_VERBOSITY": "error"}.items():
    os.environ.setdefault(_k, _v)

import torch  # noqa: E402
import vllm  # noqa: E402
from vllm.config import (CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig,  # noqa: E402
                         VllmConfig)
from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.v1.core.encoder_cache_manager import EncoderCacheManager  # noqa: E402
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


BLOCK_SIZE, NUM_BLOCKS, MAX_MODEL_LEN, BUDGET = 4, 5, 16, 6  # block 0 is the null block
mc = model_config(MAX_MODEL_LEN)
sc = SchedulerConfig(**accepted(SchedulerConfig, max_num_seqs=4, max_num_batched_tokens=BUDGET,
                                max_model_len=MAX_MODEL_LEN, enable_chunked_prefill=True,
                                policy="priority", is_encoder_decoder=False))
cc = CacheConfig(block_size=BLOCK_SIZE, enable_prefix_caching=False)
cc.num_gpu_blocks = NUM_BLOCKS
vc = VllmConfig(model_config=mc, scheduler_config=sc, cache_config=cc,
                device_config=DeviceConfig("cpu"))
spec = FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=2, head_size=64,
                         dtype=torch.bfloat16)
kv_cache_config = KVCacheConfig(num_blocks=NUM_BLOCKS, kv_cache_tensors=[],
                                kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)])
scheduler = Scheduler(**accepted(
    Scheduler.__init__, vllm_config=vc, kv_cache_config=kv_cache_config, log_stats=False,
    structured_output_manager=StructuredOutputManager(vc), block_size=BLOCK_SIZE,
    hash_block_size=BLOCK_SIZE))
# What vLLM 0.11.0 sizes for a multimodal model whose largest item is 4 tokens:
# max(max_num_batched_tokens, largest item) = 6 encoder tokens a step, 6 cached.
scheduler.max_num_encoder_input_tokens = BUDGET
scheduler.encoder_cache_manager = EncoderCacheManager(cache_size=BUDGET)


def request(rid, prompt, image, length, priority, max_tokens, arrival):
    mm = [MultiModalFeatureSpec(data=None, modality="image", identifier=image,
                                mm_position=PlaceholderRange(offset=0, length=length))]
    return Request(**accepted(
        Request.__init__, request_id=rid, prompt_token_ids=prompt,
        sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=True),
        pooling_params=None, eos_token_id=None, mm_features=mm, priority=priority,
        arrival_time=float(arrival)))


arrivals = {
    0: [request("a", [0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9], "cat", 3, 0, 3, 0)],
    2: [request("b", [0, 0, 0, 5, 6, 7, 8, 9], "cat", 3, 1, 1, 2)],
    3: [request("c", [0, 0, 0, 0, 5, 6], "dog", 4, 0, 1, 3)],
}
STEPS = 40
idle = 0
for step in range(STEPS):
    for r in arrivals.get(step, ()):
        scheduler.add_request(r)
    if not scheduler.has_requests() and step > max(arrivals):
        break
    out = scheduler.schedule()
    idle = 0 if out.num_scheduled_tokens else idle + 1
    # The model samples one token for each request whose prompt is now computed.
    sampled = {}
    for rid in out.num_scheduled_tokens:
        r = scheduler.requests[rid]
        sampled[rid] = [100 + step] if r.num_computed_tokens >= r.num_tokens else []
    scheduler.update_from_output(out, runner_output(sampled))

if scheduler.has_requests():
    ecm = scheduler.encoder_cache_manager
    waiting = {r.request_id: r.status.name for r in scheduler.waiting}
    held = {h: sorted(ids) for h, ids in ecm.cached.items() if ids}
    free = getattr(ecm, "num_freeable_slots", ecm.num_free_slots)
    pages = scheduler.kv_cache_manager.block_pool.get_num_free_blocks()
    print(f"DEFECT: vLLM {vllm.__version__}: nothing scheduled for the last {idle} of "
          f"{STEPS} steps with the KV cache empty ({pages} of {NUM_BLOCKS - 1} pages free); "
          f"waiting {waiting}; the encoder cache entries {held} are held by waiting "
          f"requests, so {free} of {ecm.cache_size} encoder cache tokens are usable and "
          "c's 4-token image never fits")
    sys.exit(1)

print(f"OK: vLLM {vllm.__version__}: all requests finished by step {step}")
sys.exit(0)
