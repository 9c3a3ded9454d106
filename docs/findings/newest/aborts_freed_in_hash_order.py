"""vLLM 0.34.0: requests aborted together are freed in PYTHONHASHSEED order."""
import json, os, subprocess, sys, tempfile

RELEASE = "0.34.0"

def child():
    os.environ.update(HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1", VLLM_LOGGING_LEVEL="ERROR")
    import torch, vllm
    from vllm import SamplingParams
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request, RequestStatus
    from vllm.v1.structured_output import StructuredOutputManager
    model = tempfile.mkdtemp()  # a config-only Qwen2 model: no weights, no tokenizer
    with open(os.path.join(model, "config.json"), "w") as f:
        json.dump({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
                   "num_hidden_layers": 1, "num_key_value_heads": 2}, f)
    config = VllmConfig(
        model_config=ModelConfig(model=model, skip_tokenizer_init=True, max_model_len=32),
        scheduler_config=SchedulerConfig(max_model_len=32, is_encoder_decoder=False,
                                         max_num_seqs=4, max_num_batched_tokens=32,
                                         async_scheduling=False),
        cache_config=CacheConfig(block_size=4, enable_prefix_caching=True),
        device_config=DeviceConfig("cpu"))
    config.cache_config.num_gpu_blocks = 5  # the null page and 4 pages, as EngineCore sets it
    spec = FullAttentionSpec(block_size=4, num_kv_heads=2, head_size=64, dtype=torch.bfloat16)
    scheduler = Scheduler(config, KVCacheConfig(5, [], [KVCacheGroupSpec(["layer.0"], spec)]),
                          StructuredOutputManager(config), block_size=4)
    init_none_hash(sha256)
    request = lambda rid, prompt: Request(rid, prompt, SamplingParams(max_tokens=4), None,
                                          block_hasher=get_request_block_hasher(4, sha256))
    scheduler.add_request(request("a", [1, 2, 3, 4, 5, 6, 7, 8]))  # two pages each:
    scheduler.add_request(request("b", [11, 12, 13, 14, 15, 16, 17, 18]))  # the whole pool
    scheduler.update_from_output(scheduler.schedule(), ModelRunnerOutput(
        ["a", "b"], [[9], [19]], prompt_logprobs_dict={}, prompt_token_id_logprobs_dict={}))
    # Both stop (say, a stop string each, found by the detokenizer): one abort call for both.
    scheduler.finish_requests(["a", "b"], RequestStatus.FINISHED_ABORTED)
    scheduler.add_request(request("c", [21, 22, 23, 24, 25, 26, 27, 28]))  # evicts two pages
    c_pages = scheduler.schedule().scheduled_new_reqs[0].block_ids[0]
    scheduler.add_request(request("a2", [1, 2, 3, 4, 5, 6, 7, 8]))  # a's prompt again
    hit = scheduler.schedule().scheduled_new_reqs[0].num_computed_tokens
    print(json.dumps({"version": vllm.__version__, "c_pages": c_pages, "a2_hit": hit}))

if sys.argv[1:] == ["--child"]:
    sys.exit(child())
runs = {}  # the scenario under two hash seeds that iterate {"a", "b"} in different orders
for env in ({**os.environ, "PYTHONHASHSEED": str(seed)} for seed in range(16)):
    order = subprocess.run([sys.executable, "-c", "print(*{'a', 'b'})"], env=env,
                           capture_output=True, text=True).stdout
    if order not in runs and len(runs) < 2:
        out = subprocess.run([sys.executable, __file__, "--child"], env=env, check=True,
                             capture_output=True, text=True).stdout.splitlines()[-1]
        runs[order] = (env["PYTHONHASHSEED"], json.loads(out))
(_, r1), (_, r2) = runs.values()
said = "; ".join(f"PYTHONHASHSEED={s}: c gets pages {r['c_pages']}, a's prompt again hits "
                 f"{r['a2_hit']} tokens" for s, r in runs.values())
print(f"{'DEFECT' if r1 != r2 else 'OK'}: vLLM {r1['version']}: a and b aborted together; {said}")
sys.exit(int(r1 != r2))
