"""vLLM v1: a block completed by outputs gets other multimodal keys than the same block
completed by a longer prompt.

A block's prefix-cache hash carries the identifier of every multimodal item whose
placeholder it touches (kv_cache_utils._gen_mm_extra_hash_keys).  The first hashing of a
request (its prompt's full blocks, curr_mm_idx = 0) walks the items in order; a later
hashing (a block completed by output tokens, in get_request_block_hasher) starts at the
LAST item only (curr_mm_idx = -1).  Two consequences, for the same tokens and images:

1. edge: an item ending exactly where the block starts is counted as touching it
   (``start_token_idx > offset + length`` should be ``>=``); the first hashing has moved
   past it already, the later hashing has not.  The block completed by outputs carries the
   image's key, the same block in a longer prompt does not: the longer prompt misses the
   prefix hit (bundled stream mm_hash_quirk_block_after_placeholder: 8 tokens hit, not 12).
2. last item only: a block completed by outputs that holds two placeholders carries only
   the last item's key (bundled stream mm_later_hashing_sees_last_item_only), so again the
   longer prompt (which carries both keys) misses.  It can also make a DIFFERENT block
   content hash alike: a prompt with a plain token where the other had the first image,
   and the same last image, gets the same key, so it would be served KV computed from the
   other request's image (a wrong prefix hit).

Standalone: vLLM's own Request and block hasher only (no scheduler, model or GPU).  Exit 1
and ``DEFECT: ...`` when one of the three shows, exit 0 and ``OK: ...`` when none does.
"""
import inspect
import os
import sys

FIXED_IN = "0.31.0"  # first release where none shows (the edge case alone: 0.19.0)

for _k, _v in {"VLLM_NO_USAGE_STATS": "1", "VLLM_LOGGING_LEVEL": "ERROR"}.items():
    os.environ.setdefault(_k, _v)

import vllm  # noqa: E402
from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.request import Request  # noqa: E402

try:
    from vllm.utils import sha256
except ImportError:  # 0.11.1 and later
    from vllm.utils.hashing import sha256

BLOCK_SIZE = 4
init_none_hash(sha256)
hasher = get_request_block_hasher(BLOCK_SIZE, sha256)


def request(prompt, images, outputs=()):
    """A request's block hashes once its prompt (and then ``outputs``) are known."""
    params = inspect.signature(Request.__init__).parameters
    kwargs = dict(request_id="r", prompt_token_ids=list(prompt),
                  sampling_params=SamplingParams(max_tokens=8), pooling_params=None,
                  eos_token_id=None, block_hasher=hasher,
                  mm_features=[MultiModalFeatureSpec(
                      data=None, modality="image", identifier=h,
                      mm_position=PlaceholderRange(offset=o, length=n))
                      for o, n, h in images])
    r = Request(**{k: v for k, v in kwargs.items() if k in params})
    for token in outputs:  # the model's tokens: a later hashing completes the block
        r.append_output_token_ids(token)
    return r.block_hashes


found = []
# 1. edge: 'cat' covers tokens 4..7 and ends where block 2 (tokens 8..11) starts.
by_outputs = request([1, 2, 3, 4, 0, 0, 0, 0, 5, 6], [(4, 4, "cat")], outputs=[7, 8])
by_prompt = request([1, 2, 3, 4, 0, 0, 0, 0, 5, 6, 7, 8, 10], [(4, 4, "cat")])
if by_outputs[2] != by_prompt[2]:
    found.append("edge: block 2 completed by outputs carries the image ending at its "
                 "start, the same block in a longer prompt does not (prefix hit missed)")
# 2. last item only: 'cat' at 8 and 'dog' at 9, both inside block 2.
two = [(8, 1, "cat"), (9, 1, "dog")]
by_outputs = request([1, 2, 3, 4, 5, 6, 7, 8, 0, 0], two, outputs=[7, 8])
by_prompt = request([1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 7, 8, 10], two)
if by_outputs[2] != by_prompt[2]:
    found.append("last item: block 2 completed by outputs carries dog only, the same "
                 "block in a longer prompt cat and dog (prefix hit missed)")
# 3. ... and a block with other content hashes alike: token 8 is text here, not 'cat'.
other = request([1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 7, 8, 10], [(9, 1, "dog")])
if by_outputs[2] == other[2]:
    found.append("wrong hit: a prompt without 'cat' at token 8 hashes block 2 as the "
                 "request whose token 8 was 'cat'")

if found:
    print(f"DEFECT: vLLM {vllm.__version__}: " + "; ".join(found))
    sys.exit(1)
print(f"OK: vLLM {vllm.__version__}: the same tokens and images give the same block "
      "hashes, however the block was completed")
sys.exit(0)
