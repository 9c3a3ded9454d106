"""vLLM v1 (before 0.16.0): the pages of a request aborted during its asynchronous KV load
are freed at once, while the worker may still be writing the load into them.

A KV connector loads a request's prompt asynchronously: the scheduler allocates its pages
at admission and the request waits in WAITING_FOR_REMOTE_KVS until the worker reports
the load done (``finished_recving``).  If the client aborts the request meanwhile,
Scheduler.finish_requests frees its pages at once (``_free_request`` ->
``kv_cache_manager.free``).  The next admission can take those pages while the connector
is still writing the aborted request's KV into them: the new request's KV is overwritten,
or read before it is written.  0.16.0 (PR #32255, "[BugFix] scheduler: Delay freeing
blocks of aborted async loads") keeps the pages until the load is reported.

Bundled stream aborted_load_keeps_pages_until_done (the same rule, on a larger stream).
Here: a (6 tokens, the first 4 loaded asynchronously into 2 pages of 2 tokens, the load
reported done at step 3) is aborted at step 1, when c (6 tokens) arrives; the pool has 4
pages.

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

FIXED_IN = "0.16.0"  # first release where it does not show (None: not fixed)

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
from vllm.v1.request import Request, RequestStatus  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402


class AsyncLoadConnector(KVConnectorBase_V1):
    """Scheduler side of a consumer connector: request "a" has 4 prompt tokens outside,
    loaded asynchronously; nothing is kept after a request finishes."""

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        if request.request_id == "a" and num_computed_tokens == 0:
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
                    kv_connector="AsyncLoadConnector", kv_role="kv_consumer",
                    kv_connector_module_path=__name__))
spec = FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=2, head_size=64,
                         dtype=torch.bfloat16)
kv_cache_config = KVCacheConfig(num_blocks=5, kv_cache_tensors=[],
                                kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)])
scheduler = Scheduler(**accepted(
    Scheduler.__init__, vllm_config=vc, kv_cache_config=kv_cache_config, log_stats=False,
    structured_output_manager=StructuredOutputManager(vc), block_size=BLOCK_SIZE,
    hash_block_size=BLOCK_SIZE))


def request(rid, prompt):
    return Request(**accepted(
        Request.__init__, request_id=rid, prompt_token_ids=prompt,
        sampling_params=SamplingParams(max_tokens=2, ignore_eos=True), pooling_params=None,
        eos_token_id=None))


scheduler.add_request(request("a", [1, 2, 3, 4, 5, 6]))
a_pages = set()
load_done_step = 3
for step in range(6):
    if step == 1:  # the client aborts a while its KV cache is being loaded; c arrives
        scheduler.finish_requests("a", RequestStatus.FINISHED_ABORTED)
        scheduler.add_request(request("c", [11, 12, 13, 14, 15, 16]))
    before = {rid: (r.num_computed_tokens, r.num_tokens)
              for rid, r in scheduler.requests.items()}
    out = scheduler.schedule()
    if step == 0:
        a_pages = set(scheduler.kv_cache_manager.get_block_ids("a")[0])
    if step < load_done_step and "c" in out.num_scheduled_tokens:
        c_pages = set(scheduler.kv_cache_manager.get_block_ids("c")[0])
        if c_pages & a_pages:
            print(f"DEFECT: vLLM {vllm.__version__}: step {step}: c is given pages "
                  f"{sorted(c_pages & a_pages)} of aborted request a, whose load into pages "
                  f"{sorted(a_pages)} is reported done only at step {load_done_step}")
            sys.exit(1)
    output = runner_output({rid: [7] if before[rid][0] + n >= before[rid][1] else []
                            for rid, n in out.num_scheduled_tokens.items()})
    if step == load_done_step:
        output.kv_connector_output = KVConnectorOutput(finished_recving={"a"})
    scheduler.update_from_output(out, output)
print(f"OK: vLLM {vllm.__version__}: the pages {sorted(a_pages)} of aborted request a were "
      f"kept until its load was reported done (step {load_done_step})")
sys.exit(0)
