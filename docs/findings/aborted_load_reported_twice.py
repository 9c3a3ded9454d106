"""vLLM v1 (0.16.0 and later): AssertionError when a request aborted during its
asynchronous KV load also keeps its pages for a send, and both transfers are reported.

A KV connector (kv_both) loads a request's prompt asynchronously (the request waits in
WAITING_FOR_REMOTE_KVS) and keeps its pages after it finishes to send them
(``request_finished`` returns True).  The client aborts the request while the load runs.
From 0.16.0 (PR #32255) the aborted request keeps its pages until the worker reports the
load done.  Two reports then come, one for the send and one for the load; whichever comes
first frees the request (Scheduler._free_blocks deletes it from ``self.requests``), and
the second names a request the scheduler no longer knows:
Scheduler._update_from_kv_xfer_finished asserts ``req_id in self.requests`` and the
engine dies.  (Up to 0.15.x the request was kept for the send and the load report was
only noted.)

Bundled stream aborted_load_reported_twice: a (6 tokens, 4 of them loaded, its load
reported done 3 steps on) is aborted at step 1; its send is reported at step 2, its load
at step 3.

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

SINCE = "0.16.0"  # first release where it shows
FIXED_IN = None  # first release where it does not show (None: not fixed)

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


class LoadAndSendConnector(KVConnectorBase_V1):
    """Scheduler side of a kv_both connector: request "a" has 4 prompt tokens outside,
    loaded asynchronously, and every finished "a" keeps its pages for a send."""

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        if request.request_id == "a" and num_computed_tokens == 0:
            return 4, True  # 4 tokens, loaded asynchronously
        return 0, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        pass

    def build_connector_meta(self, scheduler_output):
        return KVConnectorMetadata()

    def request_finished(self, request, block_ids):
        return request.request_id == "a", None  # a's pages are kept for a send

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
cc.num_gpu_blocks = 10
vc = VllmConfig(model_config=mc, scheduler_config=sc, cache_config=cc,
                device_config=DeviceConfig("cpu"),
                kv_transfer_config=KVTransferConfig(
                    kv_connector="LoadAndSendConnector", kv_role="kv_both",
                    kv_connector_module_path=__name__))
spec = FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=2, head_size=64,
                         dtype=torch.bfloat16)
kv_cache_config = KVCacheConfig(num_blocks=10, kv_cache_tensors=[],
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


scheduler.add_request(request("a", [1, 2, 3, 4, 5, 6], 2))
scheduler.add_request(request("b", [3, 2, 3, 4], 8))
reports = {2: KVConnectorOutput(finished_sending={"a"}),   # the send, then
           3: KVConnectorOutput(finished_recving={"a"})}   # the load it was aborted in
step = 0
try:
    for step in range(6):
        if step == 1:  # the client aborts a while its KV cache is being loaded
            scheduler.finish_requests("a", RequestStatus.FINISHED_ABORTED)
        before = {rid: (r.num_computed_tokens, r.num_tokens)
                  for rid, r in scheduler.requests.items()}
        out = scheduler.schedule()
        output = runner_output({rid: [7] if before[rid][0] + n >= before[rid][1] else []
                                for rid, n in out.num_scheduled_tokens.items()})
        if step in reports:
            output.kv_connector_output = reports[step]
        scheduler.update_from_output(out, output)
except AssertionError as e:
    tb = e.__traceback__
    while tb.tb_next:
        tb = tb.tb_next
    where = f"{os.path.basename(tb.tb_frame.f_code.co_filename)}:{tb.tb_lineno}"
    print(f"DEFECT: vLLM {vllm.__version__}: AssertionError at {where} in "
          f"update_from_output() of step {step}: the load of aborted request a is reported "
          "after its send freed it")
    sys.exit(1)
print(f"OK: vLLM {vllm.__version__}: the reports of aborted request a's send and load were "
      f"both taken ({step + 1} steps)")
sys.exit(0)
