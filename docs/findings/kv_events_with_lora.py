"""vLLM v1: KV cache events crash the engine at the first page cached for a LoRA request.

With KV cache events on (``--kv-events-config '{"enable_kv_cache_events": true}'``),
BlockPool.cache_full_blocks announces each run of newly cached pages as a BlockStored
event and asks the request's LoRARequest for ``.id``; LoRARequest has no such attribute
(its id is ``lora_int_id``, or the ``adapter_id`` property).  The first time a request with
an adapter gets a full page cached, schedule() raises AttributeError.

Standalone: vLLM's own classes only, offline (a Qwen2.5-0.5B config.json is written to a
temp dir; no weights, no tokenizer, no GPU).  Events go to vLLM's zmq publisher on an
in-process endpoint, and are read from its ``publish`` call.  Exit 1 and
``DEFECT: ...`` when the defect shows, exit 0 and ``OK: ...`` when vLLM behaves as expected.
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
from vllm.config import (CacheConfig, DeviceConfig, KVEventsConfig, LoRAConfig,  # noqa: E402
                         ModelConfig, SchedulerConfig, VllmConfig)
from vllm.distributed.kv_events import BlockStored  # noqa: E402
from vllm.lora.request import LoRARequest  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig,  # noqa: E402
                                        KVCacheGroupSpec)
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
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


BLOCK_SIZE = 4
mc = model_config(16)
sc = SchedulerConfig(**accepted(SchedulerConfig, max_num_seqs=4, max_num_batched_tokens=32,
                                max_model_len=16, enable_chunked_prefill=True,
                                is_encoder_decoder=False))
cc = CacheConfig(block_size=BLOCK_SIZE, enable_prefix_caching=True)
cc.num_gpu_blocks = 8
vc = VllmConfig(model_config=mc, scheduler_config=sc, cache_config=cc,
                device_config=DeviceConfig("cpu"), lora_config=LoRAConfig(max_loras=2),
                kv_events_config=KVEventsConfig(enable_kv_cache_events=True, publisher="zmq",
                                                endpoint="inproc://kv-events"))
spec = FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=2, head_size=64,
                         dtype=torch.bfloat16)
kv_cache_config = KVCacheConfig(num_blocks=8, kv_cache_tensors=[],
                                kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)])
scheduler = Scheduler(**accepted(
    Scheduler.__init__, vllm_config=vc, kv_cache_config=kv_cache_config, log_stats=False,
    structured_output_manager=StructuredOutputManager(vc), block_size=BLOCK_SIZE,
    hash_block_size=BLOCK_SIZE))
published = []
scheduler.kv_event_publisher.publish = published.append  # keep what would be published

init_none_hash(sha256)
adapter = LoRARequest(lora_name="sql", lora_int_id=1, lora_path="/nonexistent")
request = Request(**accepted(
    Request.__init__, request_id="b", prompt_token_ids=[1, 2, 3, 4, 5, 6, 7, 8, 9],
    sampling_params=SamplingParams(max_tokens=2, ignore_eos=True), pooling_params=None,
    eos_token_id=None, lora_request=adapter,
    block_hasher=get_request_block_hasher(BLOCK_SIZE, sha256)))
scheduler.add_request(request)

step = 0
try:
    while scheduler.has_requests() and step < 10:
        out = scheduler.schedule()
        scheduler.update_from_output(out, runner_output({"b": [10 + step]}))
        step += 1
except AttributeError as e:
    tb = e.__traceback__
    while tb.tb_next:
        tb = tb.tb_next
    where = f"{os.path.basename(tb.tb_frame.f_code.co_filename)}:{tb.tb_lineno}"
    print(f"DEFECT: vLLM {vllm.__version__}: AttributeError at {where} in schedule() of "
          f"step {step}: {e} (announcing the LoRA request's first cached pages)")
    sys.exit(1)

stored = [e for batch in published for e in batch.events if isinstance(e, BlockStored)]
if not stored or any(e.lora_id != 1 for e in stored):
    print(f"DEFECT: vLLM {vllm.__version__}: BlockStored events {stored} do not name "
          "adapter 1")
    sys.exit(1)
print(f"OK: vLLM {vllm.__version__}: {len(stored)} BlockStored event(s), each with "
      "lora_id 1")
sys.exit(0)
