"""vLLM v1: KV cache events with the "null" publisher (0.11.0's default) fail at start-up.

vLLM 0.11.0's KVEventsConfig defaults ``publisher`` to "null".  With
``enable_kv_cache_events`` on and that publisher, EventPublisherFactory.create passes
every other field of the config (endpoint, replay_endpoint, buffer_steps, hwm,
max_queue_size, topic) to NullEventPublisher, whose constructor takes none of them:
``TypeError: EventPublisher.__init__() got an unexpected keyword argument 'endpoint'``
while the Scheduler is built.  So ``--kv-events-config '{"enable_kv_cache_events": true}'``
without ``"publisher": "zmq"`` stops the engine at start-up.

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
from vllm.config import (CacheConfig, DeviceConfig, KVEventsConfig, ModelConfig,  # noqa: E402
                         SchedulerConfig, VllmConfig)
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig,  # noqa: E402
                                        KVCacheGroupSpec)
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
# ---------------------------------------------------------------------------------------


BLOCK_SIZE = 4
mc = model_config(32)
sc = SchedulerConfig(**accepted(SchedulerConfig, max_num_seqs=4, max_num_batched_tokens=32,
                                max_model_len=32, enable_chunked_prefill=True,
                                is_encoder_decoder=False))
cc = CacheConfig(block_size=BLOCK_SIZE, enable_prefix_caching=True)
cc.num_gpu_blocks = 8
events = KVEventsConfig(enable_kv_cache_events=True, publisher="null")
vc = VllmConfig(model_config=mc, scheduler_config=sc, cache_config=cc,
                device_config=DeviceConfig("cpu"), kv_events_config=events)
spec = FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=2, head_size=64,
                         dtype=torch.bfloat16)
kv_cache_config = KVCacheConfig(num_blocks=8, kv_cache_tensors=[],
                                kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)])
try:
    scheduler = Scheduler(**accepted(
        Scheduler.__init__, vllm_config=vc, kv_cache_config=kv_cache_config,
        log_stats=False, structured_output_manager=StructuredOutputManager(vc),
        block_size=BLOCK_SIZE, hash_block_size=BLOCK_SIZE))
except TypeError as e:
    print(f"DEFECT: vLLM {vllm.__version__}: building the Scheduler with KV cache events on "
          f"and the 'null' publisher raises TypeError: {e}")
    sys.exit(1)
print(f"OK: vLLM {vllm.__version__}: the Scheduler starts with KV cache events on and the "
      f"'null' publisher ({type(scheduler.kv_event_publisher).__name__})")
sys.exit(0)
