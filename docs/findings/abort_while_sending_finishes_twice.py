"""vLLM v1: aborting a request whose pages a KV connector is still sending finishes it a
second time.

With a KV connector that keeps a finished request's pages until they are sent
(``request_finished`` returns True, as NixlConnector does on a prefill instance), the
request stays in ``Scheduler.requests`` after it finished.  If the client aborts it then
(a disconnect, a timeout), Scheduler.finish_requests looks it up there and, since 0.11.0
does not check that it is already finished, sets its status to FINISHED_ABORTED and calls
_free_request again: the connector's request_finished is called a second time for the
same request (a second send of pages whose first send is under way), and the request is
added to ``finished_req_ids`` again, so the worker is told of its finish twice.

Bundled stream kv_connector_abort_while_sending: a (6 tokens, max_tokens 1) finishes at
step 0, its send is reported done at step 3; the client aborts it at step 2.

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

FIXED_IN = "0.11.1"  # first release where it does not show (None: not fixed)

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

FINISHED_CALLS = []  # request ids, one per request_finished call


class SendsLaterConnector(KVConnectorBase_V1):
    """Scheduler side of a producer connector: no external hits, and every finished
    request's pages are kept until the worker reports its send done."""

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        return 0, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        pass

    def build_connector_meta(self, scheduler_output):
        return KVConnectorMetadata()

    def request_finished(self, request, block_ids):
        FINISHED_CALLS.append(request.request_id)
        return True, None  # pages freed when the send is reported

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


BLOCK_SIZE = 4
mc = model_config(32)
sc = SchedulerConfig(**accepted(SchedulerConfig, max_num_seqs=4, max_num_batched_tokens=32,
                                max_model_len=32, enable_chunked_prefill=True,
                                is_encoder_decoder=False))
cc = CacheConfig(block_size=BLOCK_SIZE, enable_prefix_caching=False)
cc.num_gpu_blocks = 16
vc = VllmConfig(model_config=mc, scheduler_config=sc, cache_config=cc,
                device_config=DeviceConfig("cpu"),
                kv_transfer_config=KVTransferConfig(
                    kv_connector="SendsLaterConnector", kv_role="kv_producer",
                    kv_connector_module_path=__name__))
spec = FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=2, head_size=64,
                         dtype=torch.bfloat16)
kv_cache_config = KVCacheConfig(num_blocks=16, kv_cache_tensors=[],
                                kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)])
scheduler = Scheduler(**accepted(
    Scheduler.__init__, vllm_config=vc, kv_cache_config=kv_cache_config, log_stats=False,
    structured_output_manager=StructuredOutputManager(vc), block_size=BLOCK_SIZE,
    hash_block_size=BLOCK_SIZE))

a = Request(**accepted(
    Request.__init__, request_id="a", prompt_token_ids=[1, 2, 3, 4, 5, 6],
    sampling_params=SamplingParams(max_tokens=1, ignore_eos=True), pooling_params=None,
    eos_token_id=None))
scheduler.add_request(a)
told_finished = []  # the step's finished_req_ids the worker is told of
for step in range(5):
    if step == 2:  # the client aborts a; its send is still under way
        scheduler.finish_requests("a", RequestStatus.FINISHED_ABORTED)
    out = scheduler.schedule()
    told_finished += [rid for rid in out.finished_req_ids if rid == "a"]
    output = runner_output({"a": [7]} if "a" in out.num_scheduled_tokens else {})
    if step == 3:  # the worker reports a's send done
        output.kv_connector_output = KVConnectorOutput(finished_sending={"a"})
    scheduler.update_from_output(out, output)

if FINISHED_CALLS.count("a") > 1 or told_finished.count("a") > 1:
    print(f"DEFECT: vLLM {vllm.__version__}: a finished twice: request_finished called "
          f"{FINISHED_CALLS.count('a')} times, the worker told of its finish "
          f"{told_finished.count('a')} times, final status {a.status.name}")
    sys.exit(1)
print(f"OK: vLLM {vllm.__version__}: the abort of finished request a was ignored "
      f"(request_finished called once, status {a.status.name})")
sys.exit(0)
