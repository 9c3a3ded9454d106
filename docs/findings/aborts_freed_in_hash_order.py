"""vLLM v1 (0.11.0 and later): requests finished together by one
``Scheduler.finish_requests`` call are freed in an order that depends on PYTHONHASHSEED.

``finish_requests`` makes a ``set`` of the ids it is given and frees each request (its
pages to the free queue, the KV connector's ``request_finished``) in the set's iteration
order, which follows the strings' salted hashes (PYTHONHASHSEED, random per process by
default).  EngineCore.abort_requests hands it a list: the requests whose stop strings
the detokenizer found in the same step, the requests a client abort names (a parallel
sampling request's children), and from 0.31.0 ``update_from_output`` hands it the step's
failed requests too.  Which pages join the free queue first, and so which cached
prefixes a later request evicts, changes from one run to the next.

The scenario: a and b (8-token prompts, two pages each, the whole pool) run one step and
are aborted by one call; then c (8 tokens) takes two pages, evicting the cached pages
freed first; then a's prompt comes again and hits either 4 tokens or none.  It is run in
two processes whose hash seeds order the set {"a", "b"} differently.  This is the
multi-release form (its shims pass each release only the arguments it takes); the
0.34.0 form without shims is ``docs/findings/newest/aborts_freed_in_hash_order.py``.

Standalone: vLLM's own classes only, offline (a Qwen2.5-0.5B config.json is written to a
temp dir; no weights, no tokenizer, no GPU).  Exit 1 and ``DEFECT: ...`` when the two
processes differ, exit 0 and ``OK: ...`` when they agree.
"""
import inspect
import json
import os
import subprocess
import sys
import tempfile

FIXED_IN = None  # first release where it does not show (None: not fixed)


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
    runs = "; ".join(f"PYTHONHASHSEED={seed}: c got pages {r['c_pages']}, a's prompt again "
                     f"hits {r['hit']} tokens" for seed, r in zip(orders.values(), results))
    if results[0] != results[1]:
        print(f"DEFECT: vLLM {version}: a and b aborted together; {runs}")
        return 1
    print(f"OK: vLLM {version}: the same pages and hits under both seeds ({runs})")
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
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig,  # noqa: E402
                                        KVCacheGroupSpec)
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402
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
mc = model_config(32)
sc = SchedulerConfig(**accepted(SchedulerConfig, max_num_seqs=4, max_num_batched_tokens=32,
                                max_model_len=32, enable_chunked_prefill=True,
                                is_encoder_decoder=False))
cc = CacheConfig(block_size=BLOCK_SIZE, enable_prefix_caching=True)
cc.num_gpu_blocks = 5  # the null page and 4 pages
vc = VllmConfig(model_config=mc, scheduler_config=sc, cache_config=cc,
                device_config=DeviceConfig("cpu"))
spec = FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=2, head_size=64,
                         dtype=torch.bfloat16)
kv_cache_config = KVCacheConfig(num_blocks=5, kv_cache_tensors=[],
                                kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)])
scheduler = Scheduler(**accepted(
    Scheduler.__init__, vllm_config=vc, kv_cache_config=kv_cache_config, log_stats=False,
    structured_output_manager=StructuredOutputManager(vc), block_size=BLOCK_SIZE,
    hash_block_size=BLOCK_SIZE))
init_none_hash(sha256)
hasher = get_request_block_hasher(BLOCK_SIZE, sha256)


def request(rid, prompt):
    return Request(**accepted(
        Request.__init__, request_id=rid, prompt_token_ids=prompt,
        sampling_params=SamplingParams(max_tokens=4, ignore_eos=True), pooling_params=None,
        eos_token_id=None, block_hasher=hasher))


# Step 0: a and b compute their prompts and hold two pages each (the whole pool).
scheduler.add_request(request("a", [1, 2, 3, 4, 5, 6, 7, 8]))
scheduler.add_request(request("b", [11, 12, 13, 14, 15, 16, 17, 18]))
out = scheduler.schedule()
scheduler.update_from_output(out, runner_output({"a": [9], "b": [19]}))
# Both are aborted by one call, as EngineCore.abort_requests makes it.
scheduler.finish_requests(["a", "b"], RequestStatus.FINISHED_ABORTED)
# c needs two pages: the cached pages freed first.
scheduler.add_request(request("c", [21, 22, 23, 24, 25, 26, 27, 28]))
c_pages = list(scheduler.schedule().scheduled_new_reqs[0].block_ids[0])
# a's prompt again: what does it hit?
scheduler.add_request(request("a2", [1, 2, 3, 4, 5, 6, 7, 8]))
hit = scheduler.schedule().scheduled_new_reqs[0].num_computed_tokens
print(json.dumps({"version": vllm.__version__, "c_pages": c_pages, "hit": hit}))
