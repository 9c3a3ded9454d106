"""vLLM v1 (0.31.0 and later): requests failed in the same step are finished in an order
that depends on PYTHONHASHSEED.

From 0.31.0 a request whose image comes with another number of embeddings than the
encoder cache holds for its identifier is marked (``encoder_cache_mismatch_reqs``, a
set) while the step is scheduled, and Scheduler.update_from_output finishes the step's
failed requests with ``finish_requests(error_req_ids, FINISHED_ERROR)``, where
``error_req_ids`` is a ``set[str]`` and finish_requests makes a set of it again.  Their
pages are freed, and the KV connector told, in the set's iteration order, which follows
the strings' salted hashes (PYTHONHASHSEED, random per process by default).  So which
pages join the free queue first, and so which page ids later requests get, changes
from one run to the next.

The scenario: a and b (8-token prompts) are scheduled and hold two pages each; both are
then marked as the encoder-length check marks them (the check itself needs a multimodal
model; the harness's stream ``requests_failed_together_in_hash_order.json`` reaches it
with real image inputs), and the step's outputs are applied.  It is run in two
processes whose hash seeds order the set {"a", "b"} differently, and the order in which
their pages are freed is compared.

Standalone: vLLM's own classes only, offline (a Qwen2.5-0.5B config.json is written to a
temp dir; no weights, no tokenizer, no GPU).  Exit 1 and ``DEFECT: ...`` when the two
processes differ, exit 0 and ``OK: ...`` when they agree (and on releases before 0.31.0,
which fail no request there).
"""
import inspect
import json
import os
import subprocess
import sys
import tempfile

FIXED_IN = None  # first release where it does not show (None: not fixed)
SINCE = "0.31.0"  # first release where it shows


def main() -> int:
    """Run the scenario under two hash seeds that order {"a", "b"} differently."""
    orders = {}
    for seed in range(16):
        order = subprocess.run(
            [sys.executable, "-c", "s = set(); s.add('a'); s.add('b'); print(''.join(s))"],
            env={**os.environ, "PYTHONHASHSEED": str(seed)}, capture_output=True,
            text=True, check=True).stdout.strip()
        orders.setdefault(order, seed)
        if len(orders) == 2:
            break
    children = [subprocess.Popen([sys.executable, __file__, "--child"],
                                 env={**os.environ, "PYTHONHASHSEED": str(seed)},
                                 stdout=subprocess.PIPE, text=True)
                for seed in orders.values()]
    results = []
    for child in children:
        out, _ = child.communicate()
        lines = [line for line in out.splitlines() if line.startswith("{")]
        if child.returncode != 0 or not lines:
            print(f"ERROR: a child run failed (exit {child.returncode})")
            return 2
        results.append(json.loads(lines[-1]))
    version = results[0]["version"]
    if not results[0]["marks_failures"]:
        print(f"OK: vLLM {version}: no encoder-length failures before 0.31.0")
        return 0
    runs = "; ".join(f"PYTHONHASHSEED={seed}: pages freed {r['freed']}"
                     for seed, r in zip(orders.values(), results))
    if results[0]["freed"] != results[1]["freed"]:
        print(f"DEFECT: vLLM {version}: a and b failed together; {runs}")
        return 1
    print(f"OK: vLLM {version}: the same order under both seeds ({runs})")
    return 0


if __name__ == "__main__" and "--child" not in sys.argv:
    sys.exit(main())

# --- the child: the scenario itself, under this process's hash seed ------------------
for _k, _v in {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
               "VLLM_LOGGING_LEVEL": "ERROR", "TRANSFORMERS_VERBOSITY": "error"}.items():
    os.environ.setdefault(_k, _v)

import torch  # noqa: E402
import vllm  # noqa: E402
from vllm.config import (CacheConfig, DeviceConfig, ModelConfig,  # noqa: E402
                         SchedulerConfig, VllmConfig)
from vllm.sampling_params import SamplingParams  # noqa: E402
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
sc = SchedulerConfig(**accepted(SchedulerConfig, max_num_seqs=4, max_num_batched_tokens=32,
                                max_model_len=32, enable_chunked_prefill=True,
                                is_encoder_decoder=False))
cc = CacheConfig(block_size=BLOCK_SIZE, enable_prefix_caching=False)
cc.num_gpu_blocks = 9  # the null page and 8 pages
vc = VllmConfig(model_config=mc, scheduler_config=sc, cache_config=cc,
                device_config=DeviceConfig("cpu"))
spec = FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=2, head_size=64,
                         dtype=torch.bfloat16)
kv_cache_config = KVCacheConfig(num_blocks=9, kv_cache_tensors=[],
                                kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)])
scheduler = Scheduler(**accepted(
    Scheduler.__init__, vllm_config=vc, kv_cache_config=kv_cache_config, log_stats=False,
    structured_output_manager=StructuredOutputManager(vc), block_size=BLOCK_SIZE,
    hash_block_size=BLOCK_SIZE))
marks_failures = hasattr(scheduler, "encoder_cache_mismatch_reqs")


def request(rid, prompt):
    return Request(**accepted(
        Request.__init__, request_id=rid, prompt_token_ids=prompt,
        sampling_params=SamplingParams(max_tokens=4, ignore_eos=True), pooling_params=None,
        eos_token_id=None))


pool = scheduler.kv_cache_manager.block_pool
freed = []
real_free_blocks = pool.free_blocks


def free_blocks(blocks):
    blocks = list(blocks)
    freed.extend(b.block_id for b in blocks)
    return real_free_blocks(blocks)


pool.free_blocks = free_blocks

# Step 0: a and b compute their prompts and hold two pages each.
scheduler.add_request(request("a", [1, 2, 3, 4, 5, 6, 7, 8]))
scheduler.add_request(request("b", [11, 12, 13, 14, 15, 16, 17, 18]))
out = scheduler.schedule()
scheduler.update_from_output(out, runner_output({"a": [9], "b": [19]}))
# Step 1: both are scheduled again, and both fail the encoder-length check, which marks
# them (in a set) as it does for an image whose embeddings differ from the cached ones.
out = scheduler.schedule()
if marks_failures:
    scheduler.encoder_cache_mismatch_reqs.add("a")
    scheduler.encoder_cache_mismatch_reqs.add("b")
scheduler.update_from_output(out, runner_output({"a": [10], "b": [20]}))
print(json.dumps({"version": vllm.__version__, "marks_failures": marks_failures,
                  "freed": freed}))
