"""vLLM 0.34.0: AssertionError in Scheduler._update_from_kv_xfer_finished when a request
aborted during its async KV load also had its pages kept for a send (kv_both connector)."""
import json, os, sys, tempfile, traceback
os.environ.update(HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1", VLLM_LOGGING_LEVEL="ERROR")
import torch, vllm
from vllm.config import (CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig,
                         SchedulerConfig, VllmConfig)
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorMetadata
from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus
from vllm.v1.structured_output import StructuredOutputManager

RELEASE = "0.34.0"

class LoadAndSend(KVConnectorBase_V1):
    """Request "a": 4 prompt tokens loaded asynchronously; its pages kept for a send."""
    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        return (4, True) if num_computed_tokens == 0 else (0, False)
    def request_finished(self, request, block_ids):
        return True, None
    def update_state_after_alloc(self, request, blocks, num_external_tokens): pass
    def build_connector_meta(self, scheduler_output): return KVConnectorMetadata()
    start_load_kv = wait_for_layer_load = save_kv_layer = wait_for_save = None

model = tempfile.mkdtemp()  # a config-only Qwen2 model: no weights, no tokenizer
with open(os.path.join(model, "config.json"), "w") as f:
    json.dump({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
               "num_hidden_layers": 1, "num_key_value_heads": 2}, f)
config = VllmConfig(
    model_config=ModelConfig(model=model, skip_tokenizer_init=True, max_model_len=16),
    scheduler_config=SchedulerConfig(max_model_len=16, is_encoder_decoder=False, max_num_seqs=4,
                                     max_num_batched_tokens=16, async_scheduling=False),
    cache_config=CacheConfig(block_size=2), device_config=DeviceConfig("cpu"),
    kv_transfer_config=KVTransferConfig(kv_connector="LoadAndSend", kv_role="kv_both",
                                        kv_connector_module_path=__name__))
config.cache_config.num_gpu_blocks = 10  # as EngineCore sets it after sizing the KV cache
spec = FullAttentionSpec(block_size=2, num_kv_heads=2, head_size=64, dtype=torch.bfloat16)
scheduler = Scheduler(config, KVCacheConfig(10, [], [KVCacheGroupSpec(["layer.0"], spec)]),
                      StructuredOutputManager(config), block_size=2)
scheduler.add_request(Request("a", [1, 2, 3, 4, 5, 6], SamplingParams(max_tokens=2), None))
reports = {2: KVConnectorOutput(finished_sending={"a"}),   # the send it was kept for,
           3: KVConnectorOutput(finished_recving={"a"})}   # then the load it was aborted in
try:
    for step in range(4):                   # step 0: a starts its load (WAITING_FOR_REMOTE_KVS)
        if step == 1:                       # the client disconnects during the load
            scheduler.finish_requests(["a"], RequestStatus.FINISHED_ABORTED)
        out = scheduler.schedule()
        scheduler.update_from_output(out, ModelRunnerOutput(
            req_ids=[], sampled_token_ids=[], prompt_logprobs_dict={},
            prompt_token_id_logprobs_dict={}, kv_connector_output=reports.get(step)))
except AssertionError as e:
    where = traceback.extract_tb(e.__traceback__)[-1]
    print(f"DEFECT: vLLM {vllm.__version__}: AssertionError in {where.name} "
          f"({os.path.basename(where.filename)}:{where.lineno}) at step {step}: the load "
          "report of aborted request a came after its send report had freed it")
    sys.exit(1)
print(f"OK: vLLM {vllm.__version__}: both transfer reports of aborted request a were taken; "
      f"KV cache usage after them: {scheduler.kv_cache_manager.usage:.0%}")
