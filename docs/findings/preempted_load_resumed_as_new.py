"""vLLM v1 (before 0.14.0): a preempted request whose KV cache is loaded back
asynchronously is handed to the worker as a new request, not a resumed one.

A preempted request is normally resumed: the next SchedulerOutput lists it among the
cached requests with its resumed flag (``resumed_from_preemption``, later
``resumed_req_ids``).  If, when it is admitted again, the KV connector answers its lookup
with tokens to load asynchronously (an offloading connector that saved its KV at
preemption does), the request goes PREEMPTED -> WAITING_FOR_REMOTE_KVS -> WAITING, and
once the load is done the scheduler takes it for a new request: it is sent in
``scheduled_new_reqs`` (NewRequestData), the path for a request the worker has never seen.
0.14.0 (PR #31583, "[BugFix] scheduler: Fix resuming of preempted requests after async
load") puts such a request back to PREEMPTED after the load, so it is resumed.

The script checks the status the request is admitted with once its load is done
(PREEMPTED: resumed; WAITING: taken for a new request), which every release shows (0.34.0
hands every resumed request to the worker among the new ones, so the output alone no
longer tells).  Bundled stream loaded_preempted_request_resumes (the same rule).  Here, fcfs, a pool of 4
pages of 2 tokens: a and b (4-token prompts) run; at step 1 a needs a page and b is
preempted; a finishes at step 2; at step 3 b's lookup finds 4 tokens to load
asynchronously, reported done in that step's output; at step 4 b is scheduled.

Standalone: vLLM's own classes only, offline (a Qwen2.5-0.5B config.json is written to a
temp dir; no weights, no tokenizer, no GPU); the connector is a minimal
KVConnectorBase_V1 subclass defined here, loaded by vLLM's factory from this module.
Exit 1 and ``DEFECT: ...`` when the defect shows, exit 0 and ``OK: ...`` when vLLM
behaves as expected.
"""
import inspect
import json
import os
import sys
import tempfile
from collections import Counter

FIXED_IN = "0.14.0"  # first release where it does not show (None: not fixed)

for _k, _v in {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
               "VLLM_LOGGING_LEVEL": "ERROR", "TRANSFORMERS_VERBOSITY": "error"}.items():
    os.environ.setdefault(_k, _v)

import torch  # noqa: E402
import vllm  # noqa: E402
from vllm.config import (CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig,  # noqa: E402
                         SchedulerConfig, VllmConfig)
from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # noqa: E402
    KVConnectorBase_V1, KVConnectorMetadata)
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig,  # noqa: E402
                                        KVCacheGroupSpec)
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

LOOKUPS = Counter()  # request id -> how many times the connector was asked


class OffloadingLikeConnector(KVConnectorBase_V1):
    """Scheduler side of a connector that holds a preempted request's KV cache: nothing on
    a request's first lookup; its 4 prompt tokens, loaded asynchronously, on a later one."""

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        LOOKUPS[request.request_id] += 1
        if LOOKUPS[request.request_id] > 1 and num_computed_tokens == 0:
            return 4, True
        return 0, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        pass

    def build_connector_meta(self, scheduler_output):
        return KVConnectorMetadata()

    def request_finished(self, request, block_ids):
        return False, None

    # the worker side is never built here
    def start_load_kv(self, forward_context, **kwargs):
        raise NotImplementedError

    def wait_for_layer_load(self, layer_name):
        raise NotImplementedError

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        raise NotImplementedError

    def wait_for_save(self):
        raise NotImplementedError


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
mc = model_config(16)
sc = SchedulerConfig(**accepted(SchedulerConfig, max_num_seqs=2, max_num_batched_tokens=16,
                                max_model_len=16, enable_chunked_prefill=True,
                                is_encoder_decoder=False))
cc = CacheConfig(block_size=BLOCK_SIZE, enable_prefix_caching=False)
cc.num_gpu_blocks = 5  # the null page and 4 pages
vc = VllmConfig(model_config=mc, scheduler_config=sc, cache_config=cc,
                device_config=DeviceConfig("cpu"),
                kv_transfer_config=KVTransferConfig(
                    kv_connector="OffloadingLikeConnector", kv_role="kv_both",
                    kv_connector_module_path=__name__))
spec = FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=2, head_size=64,
                         dtype=torch.bfloat16)
kv_cache_config = KVCacheConfig(num_blocks=5, kv_cache_tensors=[],
                                kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)])
scheduler = Scheduler(**accepted(
    Scheduler.__init__, vllm_config=vc, kv_cache_config=kv_cache_config, log_stats=False,
    structured_output_manager=StructuredOutputManager(vc), block_size=BLOCK_SIZE,
    hash_block_size=BLOCK_SIZE))


def request(rid, prompt, max_tokens):
    return Request(**accepted(
        Request.__init__, request_id=rid, prompt_token_ids=prompt,
        sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=True),
        pooling_params=None, eos_token_id=None))


# The status b is admitted with once its load is done: PREEMPTED (resumed) or WAITING (new).
admitted_as = []
real_allocate_slots = scheduler.kv_cache_manager.allocate_slots


def allocate_slots(request, *args, **kwargs):
    if request.request_id == "b" and loaded:
        admitted_as.append(request.status.name)
    return real_allocate_slots(request, *args, **kwargs)


scheduler.kv_cache_manager.allocate_slots = allocate_slots
scheduler.add_request(request("a", [1, 2, 3, 4], 3))
scheduler.add_request(request("b", [11, 12, 13, 14], 4))
loaded = False
for step in range(10):
    if not scheduler.has_requests():
        break
    before = {rid: (r.num_computed_tokens, r.num_tokens) for rid, r in scheduler.requests.items()}
    out = scheduler.schedule()
    if loaded and "b" in out.num_scheduled_tokens:
        as_new = "b" in [d.req_id for d in out.scheduled_new_reqs]
        if admitted_as[-1] != "PREEMPTED":
            print(f"DEFECT: vLLM {vllm.__version__}: step {step}: b, preempted and loaded back "
                  f"asynchronously, is admitted as {admitted_as[-1]}, a new request"
                  + (" (handed to the worker in scheduled_new_reqs)" if as_new else ""))
            sys.exit(1)
        print(f"OK: vLLM {vllm.__version__}: step {step}: b, preempted and loaded back "
              "asynchronously, is admitted as PREEMPTED and resumed")
        sys.exit(0)
    output = runner_output({rid: [7] if before[rid][0] + n >= before[rid][1] else []
                            for rid, n in out.num_scheduled_tokens.items()})
    b = scheduler.requests.get("b")
    if b is not None and b.status.name == "WAITING_FOR_REMOTE_KVS":
        output.kv_connector_output = KVConnectorOutput(finished_recving={"b"})
        loaded = True
    scheduler.update_from_output(out, output)
print(f"OK: vLLM {vllm.__version__}: b was never resumed after a load (scenario did not "
      "arise)")
sys.exit(0)
