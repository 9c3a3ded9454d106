"""vLLM v1: a step schedules more than max_loras adapters after a running request is skipped.

Scheduler.schedule() counts a step's adapter slots from the running requests it has
scheduled.  A running request that gets no token this step (here: its next image cannot
be encoded, the encoder budget is spent) is not among them, so its adapter holds no slot
and a waiting request under another adapter is admitted.  The next step schedules both
running requests and fails ``assert len(scheduled_loras) <= self.lora_config.max_loras``.

Bundled stream lora_slots_overfilled_after_a_skip, as vLLM's classes: max_loras 1, an
encoder budget of 4 tokens.  Step 0: b (no adapter) encodes its first image and is cut
before its second; a (adapter 1) computes its 4 text tokens and is cut before its image.
Step 1: b encodes its second image, so a gets no token; c (adapter 2) arrives and is
admitted.  Step 2: a's image is encoded and a runs with c: two adapters, max_loras 1.

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

FIXED_IN = "0.33.0"  # first release where it does not show (None: not fixed)

for _k, _v in {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
               "VLLM_LOGGING_LEVEL": "ERROR", "TRANSFORMERS_VERBOSITY": "error"}.items():
    os.environ.setdefault(_k, _v)

import torch  # noqa: E402
import vllm  # noqa: E402
from vllm.config import (CacheConfig, DeviceConfig, LoRAConfig, ModelConfig,  # noqa: E402
                         SchedulerConfig, VllmConfig)
from vllm.lora.request import LoRARequest  # noqa: E402
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


BLOCK_SIZE = 4
mc = model_config(32)
sc = SchedulerConfig(**accepted(SchedulerConfig, max_num_seqs=3, max_num_batched_tokens=32,
                                max_model_len=32, enable_chunked_prefill=True,
                                is_encoder_decoder=False))
cc = CacheConfig(block_size=BLOCK_SIZE, enable_prefix_caching=False)
cc.num_gpu_blocks = 32
vc = VllmConfig(model_config=mc, scheduler_config=sc, cache_config=cc,
                device_config=DeviceConfig("cpu"), lora_config=LoRAConfig(max_loras=1))
spec = FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=2, head_size=64,
                         dtype=torch.bfloat16)
kv_cache_config = KVCacheConfig(num_blocks=32, kv_cache_tensors=[],
                                kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)])
scheduler = Scheduler(**accepted(
    Scheduler.__init__, vllm_config=vc, kv_cache_config=kv_cache_config, log_stats=False,
    structured_output_manager=StructuredOutputManager(vc), block_size=BLOCK_SIZE,
    hash_block_size=BLOCK_SIZE))
# What a multimodal model's processor would size: 4 encoder tokens a step, 8 cached.
scheduler.max_num_encoder_input_tokens = 4
scheduler.encoder_cache_manager = EncoderCacheManager(cache_size=8)


def request(rid, prompt, images=(), adapter=None):
    mm = [MultiModalFeatureSpec(data=None, modality="image", identifier=h,
                                mm_position=PlaceholderRange(offset=o, length=4))
          for o, h in images]
    lora = None if adapter is None else LoRARequest(
        lora_name=f"adapter{adapter}", lora_int_id=adapter, lora_path="/nonexistent")
    return Request(**accepted(
        Request.__init__, request_id=rid, prompt_token_ids=prompt,
        sampling_params=SamplingParams(max_tokens=3, ignore_eos=True), pooling_params=None,
        eos_token_id=None, lora_request=lora, mm_features=mm or None))


scheduler.add_request(request("b", [0, 0, 0, 0, 1, 2, 3, 4, 0, 0, 0, 0],
                              images=[(0, "image-p1"), (8, "image-p2")]))
scheduler.add_request(request("a", [9, 8, 7, 6, 0, 0, 0, 0, 5, 4, 3, 2],
                              images=[(4, "image-q")], adapter=1))
late = request("c", [11, 12, 13], adapter=2)

step = 0
try:
    while (scheduler.has_requests() or late) and step < 20:
        if step == 1:
            scheduler.add_request(late)
            late = None
        out = scheduler.schedule()
        # The model samples one token for each request whose prompt is now computed.
        sampled = {}
        for rid in out.num_scheduled_tokens:
            r = scheduler.requests[rid]
            sampled[rid] = [100 + step] if r.num_computed_tokens >= r.num_tokens else []
        scheduler.update_from_output(out, runner_output(sampled))
        step += 1
except AssertionError as e:
    tb = e.__traceback__
    while tb.tb_next:
        tb = tb.tb_next
    where = f"{os.path.basename(tb.tb_frame.f_code.co_filename)}:{tb.tb_lineno}"
    running = {r.request_id: r.lora_request.lora_int_id if r.lora_request else None
               for r in scheduler.running}
    print(f"DEFECT: vLLM {vllm.__version__}: AssertionError at {where} in schedule() of "
          f"step {step}: running requests {running} hold 2 adapters, max_loras is 1")
    sys.exit(1)

print(f"OK: vLLM {vllm.__version__}: all requests finished in {step} steps, "
      "never more than max_loras adapters in a step")
sys.exit(0)
