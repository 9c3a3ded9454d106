"""vLLM v1: the pages of KV sends finished in the same step are freed in an order that
depends on PYTHONHASHSEED.

With a KV connector that keeps a finished request's pages until they are sent
(``request_finished`` returns True, as NixlConnector does for a prefill instance), the
worker reports the sends that finished as ``KVConnectorOutput.finished_sending``, a
``set[str]`` of request ids, and Scheduler._update_from_kv_xfer_finished frees the pages
of each in the set's iteration order.  A set of strings iterates in the order of the
strings' hashes, which are salted per process (PYTHONHASHSEED, random by default).  So
which pages join the free queue first -- and so which cached prefixes are evicted first,
and which page ids later requests get -- changes from one run to the next.

The scenario: a and b (8-token prompts, max_tokens 1) finish together and their sends are
reported in the same step; then c (16 tokens) needs 4 pages and evicts the cached pages
freed first; then a's prompt comes again and hits either 4 tokens or none.  It is run in
two processes whose hash seeds order the set {"a", "b"} differently.

Standalone: vLLM's own classes only, offline (a Qwen2.5-0.5B config.json is written to a
temp dir; no weights, no tokenizer, no GPU); the connector is a minimal
KVConnectorBase_V1 subclass defined here, loaded by vLLM's factory from this module.
Exit 1 and ``DEFECT: ...`` when the two processes differ, exit 0 and ``OK: ...`` when
they agree.
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
    for seed in range(16):  # a plain interpreter shows each seed's order at once
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
    a, b = ({k: v for k, v in r.items() if k != "set_order"} for r in results)
    runs = "; ".join(f"PYTHONHASHSEED={seed} (set order {r['set_order']}): pages freed "
                     f"{r['freed']}, c got pages {r['c_pages']}, a's prompt again hits "
                     f"{r['hit']} tokens" for seed, r in zip(orders.values(), results))
    if a != b:
        print(f"DEFECT: vLLM {version}: {runs}")
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
from vllm.config import (CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig,  # noqa: E402
                         SchedulerConfig, VllmConfig)
from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # noqa: E402
    KVConnectorBase_V1, KVConnectorMetadata)
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig,  # noqa: E402
                                        KVCacheGroupSpec)
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

try:
    from vllm.utils import sha256
except ImportError:  # 0.11.1 and later
    from vllm.utils.hashing import sha256


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
cc = CacheConfig(block_size=BLOCK_SIZE, enable_prefix_caching=True)
cc.num_gpu_blocks = 7  # the null page and 6 pages
vc = VllmConfig(model_config=mc, scheduler_config=sc, cache_config=cc,
                device_config=DeviceConfig("cpu"),
                kv_transfer_config=KVTransferConfig(
                    kv_connector="SendsLaterConnector", kv_role="kv_producer",
                    kv_connector_module_path="__main__"))
spec = FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=2, head_size=64,
                         dtype=torch.bfloat16)
kv_cache_config = KVCacheConfig(num_blocks=7, kv_cache_tensors=[],
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
        sampling_params=SamplingParams(max_tokens=1, ignore_eos=True), pooling_params=None,
        eos_token_id=None, block_hasher=hasher))


pool = scheduler.kv_cache_manager.block_pool
freed = []
real_free_blocks = pool.free_blocks


def free_blocks(blocks):
    blocks = list(blocks)
    freed.extend(b.block_id for b in blocks)
    return real_free_blocks(blocks)


pool.free_blocks = free_blocks

# Step 0: a and b compute their prompts and finish (max_tokens 1); their pages are kept.
scheduler.add_request(request("a", [1, 2, 3, 4, 5, 6, 7, 8]))
scheduler.add_request(request("b", [11, 12, 13, 14, 15, 16, 17, 18]))
out = scheduler.schedule()
scheduler.update_from_output(out, runner_output({"a": [9], "b": [19]}))
# Step 1: the worker reports both sends done, in a set, as its output carries them.
sent = set()
sent.add("a")
sent.add("b")
out = scheduler.schedule()
output = runner_output({})
output.kv_connector_output = KVConnectorOutput(finished_sending=sent)
scheduler.update_from_output(out, output)
# Step 2: c needs 4 pages: the 2 never used, then the 2 cached pages freed first.
c = request("c", [21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36])
scheduler.add_request(c)
scheduler.schedule()
c_pages = list(scheduler.kv_cache_manager.get_block_ids("c")[0])
# a's prompt again: what does it hit?
hit = scheduler.kv_cache_manager.get_computed_blocks(request("a2", [1, 2, 3, 4, 5, 6, 7, 8]))[1]
print(json.dumps({"version": vllm.__version__, "set_order": "".join(sent), "freed": freed,
                  "c_pages": c_pages, "hit": hit}))
