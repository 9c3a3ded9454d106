"""vLLM v1: the null page is cached (and then cached twice) with a sliding window and drafts.

A sliding window of 1 token next to a full-attention group, prefix caching on, ngram
drafts that are all accepted.  A page filled by accepted drafts leaves the window before
it is cached; SlidingWindowManager.remove_skipped_blocks puts the null page in its place,
the next allocation caches the null page under that page's hash, and the one after fails
``assert blk.block_hash is None`` in BlockPool.cache_full_blocks.

Standalone: vLLM's own classes only, offline (a Qwen2.5-0.5B config.json is written to a
temp dir; no weights, no tokenizer, no GPU).  Exit 1 and ``DEFECT: ...`` when the defect
shows, exit 0 and ``OK: ...`` when vLLM behaves as expected.
"""
import inspect
import json
import os
import sys
import tempfile

FIXED_IN = "0.14.0"  # first release where it does not show (None: not fixed)

for _k, _v in {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
               "VLLM_LOGGING_LEVEL": "ERROR", "TRANSFORMERS_VERBOSITY": "error"}.items():
    os.environ.setdefault(_k, _v)

import torch  # noqa: E402
import vllm  # noqa: E402
from vllm.config import (CacheConfig, DeviceConfig, ModelConfig, ParallelConfig,  # noqa: E402
                         SchedulerConfig, SpeculativeConfig, VllmConfig)
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig,  # noqa: E402
                                        KVCacheGroupSpec, SlidingWindowSpec)
from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

try:
    from vllm.utils import sha256
except ImportError:  # 0.11.1 and later
    from vllm.utils.hashing import sha256


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
mc = model_config(32)
sc = SchedulerConfig(**accepted(SchedulerConfig, max_num_seqs=2, max_num_batched_tokens=16,
                                max_model_len=32, enable_chunked_prefill=True,
                                is_encoder_decoder=False))
cc = CacheConfig(block_size=BLOCK_SIZE, enable_prefix_caching=True)
cc.num_gpu_blocks = 25
spec = SpeculativeConfig(method="ngram", num_speculative_tokens=2, prompt_lookup_max=2,
                         prompt_lookup_min=1, target_model_config=mc,
                         target_parallel_config=ParallelConfig())
vc = VllmConfig(model_config=mc, scheduler_config=sc, cache_config=cc,
                device_config=DeviceConfig("cpu"), speculative_config=spec)
attn = dict(block_size=BLOCK_SIZE, num_kv_heads=2, head_size=64, dtype=torch.bfloat16)
kv_cache_config = KVCacheConfig(num_blocks=25, kv_cache_tensors=[], kv_cache_groups=[
    KVCacheGroupSpec(["full.0"], FullAttentionSpec(**attn)),
    KVCacheGroupSpec(["window.0"], SlidingWindowSpec(**attn, sliding_window=1))])
scheduler = Scheduler(**accepted(
    Scheduler.__init__, vllm_config=vc, kv_cache_config=kv_cache_config, log_stats=False,
    structured_output_manager=StructuredOutputManager(vc), block_size=BLOCK_SIZE,
    hash_block_size=BLOCK_SIZE))

init_none_hash(sha256)
request = Request(**accepted(
    Request.__init__, request_id="a", prompt_token_ids=[1, 2, 3, 4],
    sampling_params=SamplingParams(max_tokens=10, ignore_eos=True), pooling_params=None,
    eos_token_id=None, block_hasher=get_request_block_hasher(BLOCK_SIZE, sha256)))
scheduler.add_request(request)

# The model's tokens, and the drafts the ngram proposer offers after each step:
# every draft is accepted, so each decode step computes 3 tokens.
truth = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14]
drafts = [[6, 7], [9, 10], [12, 13], [14]]
step = 0
try:
    while scheduler.has_requests() and step < 10:
        out = scheduler.schedule()
        proposed = out.scheduled_spec_decode_tokens.get("a", [])
        done = len(request.output_token_ids)
        accepted_drafts = 0
        for d, t in zip(proposed, truth[done:]):
            if d != t:
                break
            accepted_drafts += 1
        scheduler.update_from_output(out, runner_output(
            {"a": truth[done:done + accepted_drafts + 1]}))
        if drafts:
            scheduler.update_draft_token_ids(DraftTokenIds(["a"], [drafts.pop(0)]))
        step += 1
except AssertionError as e:
    tb = e.__traceback__
    while tb.tb_next:
        tb = tb.tb_next
    where = f"{os.path.basename(tb.tb_frame.f_code.co_filename)}:{tb.tb_lineno}"
    print(f"DEFECT: vLLM {vllm.__version__}: AssertionError at {where} in schedule() of "
          f"step {step}: the null page (block 0) was cached under a sliding-window "
          "page's hash and comes up for caching again")
    sys.exit(1)

null = scheduler.kv_cache_manager.block_pool.null_block
if null.block_hash is not None:
    print(f"DEFECT: vLLM {vllm.__version__}: the null page holds a block hash")
    sys.exit(1)
print(f"OK: vLLM {vllm.__version__}: request finished in {step} steps, "
      "the null page was never cached")
sys.exit(0)
