"""Streams whose requests bring more than tokens: LoRA adapters, grammars (structured
output), images (the encoder cache and image hashes) and pooling requests."""

from __future__ import annotations

from typing import Any

from hypothesis.strategies import SearchStrategy

from harness.checks.strategies.configs import configs
from harness.checks.strategies.draws import (
    DEFAULT_VOCAB_SIZE,
    _cdiv,
    _draw_ready_steps,
    _one_in,
    _rarely,
    _text,
    _tokens,
    _with,
    st,
)
from harness.checks.strategies.streams import request_ids, streams
from harness.formats.stream import kv_cache_layout, parse_drawn_stream


def lora_streams(**knobs: Any) -> SearchStrategy[dict[str, Any]]:
    """LoRA adapters: ``max_loras`` 1-3, three requests in four naming one of four adapters.

    Every stream shares prefixes, so the same tokens arrive under different adapters
    (and under none), whose pages must not be shared; arrivals come in bursts of up to
    3 steps to 2-6 seats, so waiting requests meet full adapter slots and are set
    aside while others behind them run; prefix caching on in three configs of four,
    drafts in a third.  ``knobs`` go to :func:`streams`.
    Shrinks towards: one adapter slot, two requests at step 0.
    """
    config = configs(max_loras=st.integers(1, 3), max_num_seqs=st.integers(2, 6),
                     enable_prefix_caching=_rarely(st.just(False), st.just(True), one_in=4),
                     num_speculative_tokens=_rarely(st.integers(1, 3), st.just(0), one_in=3))
    return streams(**_with(dict(config=config, min_requests=2, max_requests=8,
                                shared_prefixes="always", bursts=3, max_arrival_step=6), knobs))


def grammar_streams(**knobs: Any) -> SearchStrategy[dict[str, Any]]:
    """Structured output: half of the requests wait for a grammar (ready at arrival or
    1-4 steps later) that rejects tokens some of their drafts hold.

    Speculative decoding in half of the configs (so drafts are cut by the grammar and
    the bitmask has a row per draft), LoRA adapters in a quarter, 2-6 seats and
    arrivals over 6 steps, so grammar-constrained requests are new, running and
    resumed in one batch.  ``knobs`` go to :func:`streams`.
    Shrinks towards: no drafts, no LoRA, two requests at step 0.
    """
    config = configs(max_num_seqs=st.integers(2, 6),
                     num_speculative_tokens=st.one_of(st.just(0), st.integers(1, 3)),
                     max_loras=_rarely(st.integers(1, 2), st.none(), one_in=4))
    return streams(**_with(dict(config=config, min_requests=2, max_requests=8, grammars=True,
                                max_arrival_step=6), knobs))


@st.composite
def mm_streams(draw, **knobs: Any) -> dict[str, Any]:
    """Multimodal inputs: prompts holding images (placeholders of 1-8 tokens) that the
    encoder must run on, within its per-step budget and its cache.

    Each stream has one layout of up to 3 placeholders; a request's prompt carries
    those of them that fit inside it, its placeholder tokens all token 0 (the image
    token), and each item one of two content hashes -- so prompts that share a prefix
    share a prefix hit only when their images agree, and the encoder cache shares an
    output between requests with the same image.  Budgets of 1-16 encoder tokens and
    caches of 1-24 tokens as configured (often below the largest item, which
    vLLM raises them to; one time in six left to the token budget), the model's
    largest item above the stream's one time in three, small token budgets so
    prompts are chunked across placeholders, ``disable_chunked_mm_input`` in a third
    of the configs, drafts in a quarter (ngram or eagle), tight pools so requests
    preempt each other.  ``knobs`` go to :func:`streams`.
    Shrinks towards: one 1-token image at the start, chunked multimodal input allowed.
    """
    config = draw(configs(max_model_len=st.integers(12, 40), budget=st.integers(2, 16),
                          max_num_seqs=st.integers(1, 4), spare_blocks=st.integers(0, 6),
                          num_speculative_tokens=_rarely(st.integers(1, 3), st.just(0),
                                                         one_in=4)))
    layout, end = [], 0
    for _ in range(draw(st.integers(1, 3))):
        offset = end + draw(st.integers(0, 6))
        length = draw(st.integers(1, 8))
        if offset + length >= config["max_model_len"] - 1:
            break
        layout.append((offset, length))
        end = offset + length
    if not layout:
        layout = [(0, 1)]
    largest = max(length for _, length in layout)
    budget = config["max_num_batched_tokens"]
    if _one_in(draw, 3) and largest <= budget:
        config["disable_chunked_mm_input"] = True
    for key, most in (("encoder_compute_budget", 16), ("encoder_cache_size", 24)):
        if not _one_in(draw, 6):  # else: the token budget, as vLLM sets it
            config[key] = draw(st.integers(largest, max(largest, most)) | st.integers(1, most))
    if _one_in(draw, 3):  # the model's largest item, above the stream's
        most = budget if config.get("disable_chunked_mm_input") else 16
        config["max_tokens_per_mm_item"] = draw(st.integers(largest, max(largest, most)))
    elif "encoder_compute_budget" not in config and "encoder_cache_size" not in config:
        config["encoder_compute_budget"] = budget
    data = draw(streams(**_with(dict(config=config, min_requests=1, max_requests=6,
                                     shared_prefixes="always", max_arrival_step=6), knobs)))
    for request in data["requests"]:
        items = []
        for n, (offset, length) in enumerate(layout):
            if offset + length > len(request["prompt"]) or _one_in(draw, 5):
                continue
            request["prompt"][offset:offset + length] = [0] * length
            items.append({"offset": offset, "length": length,
                          "hash": f"image{n}-{draw(st.integers(0, 1))}"})
        if items:
            request["mm_inputs"] = items
    return data


@st.composite
def encoder_pressure_streams(draw, **knobs: Any) -> dict[str, Any]:
    """Multimodal inputs under pressure: one or two long images (3-8 tokens) per prompt,
    prefilled over several steps by token budgets of 2-8, encoder caches barely larger
    than the largest image, four different images, and pools with no spare page -- so
    images are evicted in order while others wait, and requests are preempted in the
    middle of a placeholder.  ``disable_chunked_mm_input`` in half of the configs, an
    eagle drafter (which reads one placeholder position past the grant from 0.12.0)
    in a third.  ``knobs`` go to :func:`streams`.
    Shrinks towards: 3-token images, the smallest cache and budget, two requests.
    """
    config = draw(configs(max_model_len=st.integers(24, 48), budget=st.integers(2, 8),
                          max_num_seqs=st.integers(3, 4), spare_blocks=st.just(0),
                          enable_chunked_prefill=True,
                          num_speculative_tokens=_rarely(st.integers(1, 2), st.just(0), one_in=3),
                          speculative_method="eagle"))
    largest = draw(st.integers(3, 8))
    config["encoder_compute_budget"] = largest + draw(st.integers(0, 4))
    config["encoder_cache_size"] = largest + draw(st.integers(0, 2))
    if _one_in(draw, 2) and largest <= config["max_num_batched_tokens"]:
        config["disable_chunked_mm_input"] = True
    data = draw(streams(**_with(dict(config=config, min_requests=2, max_requests=6,
                                     shared_prefixes=False, max_arrival_step=6,
                                     min_prompt_len=largest + 4, max_prompt_len=30,
                                     max_output_len=12), knobs)))
    for request in data["requests"]:
        items, start = [], 0
        for _ in range(draw(st.integers(1, 2))):
            offset = start + draw(st.integers(0, 6))
            length = draw(st.integers(3, largest))
            if offset + length > len(request["prompt"]):
                break
            request["prompt"][offset:offset + length] = [0] * length
            items.append({"offset": offset, "length": length,
                          "hash": f"image{draw(st.integers(0, 3))}"})
            start = offset + length
        if items:
            request["mm_inputs"] = items
    return data


@st.composite
def encoder_preemption_streams(draw, **knobs: Any) -> dict[str, Any]:
    """A request preempted in the middle of its image while another needs the encoder
    cache's room (the bundled mm_preempted_lets_go_of_encoder_output, varied).  The
    first request has a text head of two or three pages and an image (``dog``) at its
    end; the second a head shorter than a page, its image (``cat``) and a short tail.
    Prefills are cut to one page a step, the cache holds one image, and the pool holds
    the first request and one page more, so the second request, the last to join, is
    preempted once its image is encoded but before its placeholder is computed; its
    image must leave the cache, or the first request's image cannot be encoded.  Now and
    then a third request, a spare page, a larger cache or priority scheduling change who
    waits.  ``knobs`` are not used (the requests are built here).
    Shrinks towards: pages of 4, the bundled stream's shape.
    """
    block_size = draw(st.sampled_from([4, 2, 8]))
    length = draw(st.integers(2, 2 * block_size))
    first_text = draw(st.integers(2, 3)) * block_size
    first = {"prompt": _tokens(draw, first_text, DEFAULT_VOCAB_SIZE) + [0] * length,
             "mm_inputs": [{"offset": first_text, "length": length, "hash": "dog"}],
             "output": _tokens(draw, 1, DEFAULT_VOCAB_SIZE)}
    usable = -(-len(first["prompt"]) // block_size)  # the pages of the first prompt
    fits = usable * block_size  # what one request may hold: its output token is not computed
    max_model_len = fits + block_size  # the smallest legal pool is then usable + the null page
    head = draw(st.integers(1, block_size - 1))
    tail = draw(st.integers(0, min(block_size, fits - head - length - 1)))
    second = {"prompt": (_tokens(draw, head, DEFAULT_VOCAB_SIZE) + [0] * length
                         + _tokens(draw, tail, DEFAULT_VOCAB_SIZE)),
              "mm_inputs": [{"offset": head, "length": length, "hash": "cat"}]}
    second["output"] = _tokens(draw, draw(st.integers(1, fits - len(second["prompt"]))),
                               DEFAULT_VOCAB_SIZE)
    requests = [first, second]
    if _one_in(draw, 4):
        requests.append({"prompt": _tokens(draw, draw(st.integers(1, fits - 1)),
                                           DEFAULT_VOCAB_SIZE),
                         "output": _tokens(draw, 1, DEFAULT_VOCAB_SIZE),
                         "arrival_step": draw(st.integers(0, 3))})
    pages = usable + 1 + draw(_rarely(st.just(1), st.just(0), one_in=4))
    config = draw(configs(block_size=block_size, max_model_len=max_model_len,
                          num_gpu_blocks=pages, enable_chunked_prefill=True,
                          enable_prefix_caching=st.booleans(), max_num_seqs=st.integers(2, 3),
                          max_num_batched_tokens=2 * block_size,
                          long_prefill_token_threshold=block_size,
                          policy=st.sampled_from(["fcfs", "priority"]),
                          num_speculative_tokens=0))
    config["encoder_compute_budget"] = length + draw(st.integers(0, 1))
    config["encoder_cache_size"] = length + draw(_rarely(st.integers(1, length - 1),
                                                         st.just(0), one_in=4))
    ids = draw(request_ids(len(requests)))
    for rid, request in zip(ids, requests):
        request["id"] = rid
        if config["policy"] == "priority":
            request["priority"] = draw(st.integers(0, 1))
    return {"config": config, "requests": requests}


@st.composite
def mm_hash_streams(draw, **knobs: Any) -> dict[str, Any]:
    """Prefix hits on prompts with images: a first request whose prompt ends in an
    unfinished page, with an image ending on the page edge before it or two 1-token
    images inside it, and whose outputs complete that page; then 1-3 requests whose
    prompts extend its prompt and outputs, with the same images (or, one time in three,
    another), arriving once it is done -- so the hashes of the page after a placeholder
    and of a page completed by outputs decide the hit.  Prefix caching on.
    ``knobs`` are not used (the requests are built here).
    Shrinks towards: pages of 4, one page and one token, an image ending on the edge.
    """
    block_size = draw(st.sampled_from([4, 2, 8]))
    pages = draw(st.integers(1, 3))
    tail = draw(st.integers(1, max(1, block_size - 1)))
    prompt_len = pages * block_size + tail
    num_outputs = block_size - tail + 1 + draw(st.integers(0, 1))
    max_model_len = prompt_len + num_outputs + block_size + 8
    config = draw(configs(block_size=block_size, max_model_len=max_model_len,
                          enable_prefix_caching=True, enable_chunked_prefill=True,
                          max_num_seqs=st.integers(1, 4), budget=st.integers(8, 32),
                          spare_blocks=st.integers(2, 8), num_speculative_tokens=0))
    config["encoder_compute_budget"] = config["encoder_cache_size"] = 16
    edge = pages * block_size
    if tail >= 2 and draw(st.booleans()):  # two 1-token images in the unfinished page
        first = edge + draw(st.integers(0, tail - 2))
        second = draw(st.integers(first + 1, prompt_len - 1))
        layout = [(first, 1), (second, 1)]
    else:  # an image ending on the page edge
        length = draw(st.integers(1, min(8, edge)))
        layout = [(edge - length, length)]
    prompt = _tokens(draw, prompt_len, DEFAULT_VOCAB_SIZE)
    for offset, length in layout:
        prompt[offset:offset + length] = [0] * length
    images = [{"offset": o, "length": n, "hash": f"image{i}-0"} for i, (o, n) in enumerate(layout)]
    output = _tokens(draw, num_outputs, DEFAULT_VOCAB_SIZE)
    count = draw(st.integers(1, 3))
    ids = draw(request_ids(count + 1))
    requests = [{"id": ids[0], "prompt": prompt, "output": output, "mm_inputs": images}]
    arrivals = sorted(draw(st.lists(st.integers(min(10, num_outputs + 2), 10),
                                    min_size=count, max_size=count)))
    for rid, arrival in zip(ids[1:], arrivals):
        head = prompt + output[:draw(st.integers(0, num_outputs))]
        extra = _tokens(draw, draw(st.integers(0, block_size)), DEFAULT_VOCAB_SIZE)
        mine = [dict(m) for m in images]
        if _one_in(draw, 3):
            changed = draw(st.sampled_from(mine))
            changed["hash"] = changed["hash"][:-1] + "1"
        requests.append({"id": rid, "prompt": (head + extra)[:max_model_len - 2],
                         "output": _tokens(draw, 1, DEFAULT_VOCAB_SIZE), "mm_inputs": mine,
                         "arrival_step": arrival})
    return {"config": config, "requests": requests}


@st.composite
def repeated_image_streams(draw, **knobs: Any) -> dict[str, Any]:
    """One image shown twice in one prompt, while another request's larger image wants the
    encoder cache's room (the bundled held_to_last_occurrence and items_taken_per_request,
    varied).  ``r`` shows image ``x`` (2-4 tokens) twice; ``b``, admitted with it just
    before it, shows ``y``, longer than ``x``; the encoder cache and budget hold ``y`` but
    not both, and each prefill is cut into chunks of 4-8 tokens (the long-prefill
    threshold).  ``r``'s second copy starts in one chunk and ends in the next, and ``b``
    reaches ``y`` in that next step: ``r`` is past its first copy, and whether that lets
    ``x`` be evicted for ``y`` decides who goes on (from 0.29.0 ``r`` holds ``x`` to its
    last copy).  In a third of the streams prefix caching is on and a request ``a`` with
    ``r``'s first pages, the first copy in them, runs first: ``r``'s first copy is a hit
    and only its second takes ``x`` (from 0.23.0 only the items a request took are let
    go of).  One stream in four moves the second copy and ``y`` anywhere.  ``knobs`` are
    not used (the requests are built here).
    Shrinks towards: pages of 4, chunks of 4 tokens, images of 2 and 3 tokens, no ``a``.
    """
    block_size = draw(st.sampled_from([4, 8, 2]))
    x_len = draw(st.integers(2, 4))
    chunk = draw(st.integers(x_len + 2, 8))
    y_len = x_len + draw(st.integers(1, 4))
    cache = y_len + draw(st.integers(0, x_len - 1))  # y fits, x and y together do not
    cached_head = _one_in(draw, 3)
    anywhere = _one_in(draw, 4)

    first = draw(st.integers(1, chunk - 1))  # within r's first chunk
    # Where r's computing starts: 0, or a's whole pages (the first copy in them), a hit.
    start = _cdiv(first + x_len, block_size) * block_size if cached_head else 0
    steps_before = 1 if not cached_head else draw(st.integers(0, 1))  # r's chunks before
    edge = start + (steps_before + 1) * chunk  # where the step that needs y begins
    second = edge - draw(st.integers(1, x_len - 1))  # straddles that edge
    second = max(second, start, first + x_len + 1)
    y_at = (steps_before + 1) * chunk
    if anywhere:
        second += draw(st.integers(0, 2 * chunk))
        y_at = draw(st.integers(1, 3 * chunk))
    prompt = (_text(draw, first) + [0] * x_len + _text(draw, second - first - x_len)
              + [0] * x_len + _text(draw, draw(st.integers(1, 4))))
    r = {"prompt": prompt, "output": _text(draw, draw(st.integers(1, 3))),
         "mm_inputs": [{"offset": first, "length": x_len, "hash": "x"},
                       {"offset": second, "length": x_len, "hash": "x"}]}
    b = {"prompt": _text(draw, y_at) + [0] * y_len + _text(draw, draw(st.integers(1, 4))),
         "output": _text(draw, draw(st.integers(1, 3))),
         "mm_inputs": [{"offset": y_at, "length": y_len, "hash": "y"}]}
    requests = [b, r]
    if cached_head:  # a: r's first pages, done before b and r arrive
        a = {"prompt": prompt[:start], "output": _text(draw, 1),
             "mm_inputs": [{"offset": first, "length": x_len, "hash": "x"}]}
        b["arrival_step"] = r["arrival_step"] = _cdiv(start, chunk) + 2
        requests.insert(0, a)
    longest = max(len(q["prompt"]) + len(q["output"]) for q in requests)
    config = draw(configs(block_size=block_size, max_model_len=longest + block_size,
                          enable_chunked_prefill=True, enable_prefix_caching=cached_head,
                          long_prefill_token_threshold=chunk,
                          max_num_batched_tokens=2 * chunk + draw(st.integers(0, chunk)),
                          max_num_seqs=st.integers(2, 4), spare_blocks=st.integers(4, 12),
                          policy="fcfs", num_speculative_tokens=0))
    config["encoder_cache_size"] = config["encoder_compute_budget"] = cache
    for rid, q in zip(draw(request_ids(len(requests))), requests):
        q["id"] = rid
    return {"config": config, "requests": requests}


@st.composite
def encoder_handoff_streams(draw, **knobs: Any) -> dict[str, Any]:
    """An encoder cache handed from one image to the next under a batch queue (the bundled
    encoder_frees_wait_for_outputs, varied).  ``a`` ends with its image, and step 0
    computes it whole and ``b``'s text up to ``b``'s image, which the next step needs;
    the encoder cache holds either image but not both.  Under async scheduling (or, one
    stream in three, pipeline stages) the next step is scheduled before step 0's outputs
    are in: whether ``a`` has let go of its image by then decides whether ``b``'s image
    fits (from 0.20.0 it waits for the outputs).  One stream in four moves ``b``'s image
    anywhere; the worker is done at once with a drawn share of the steps.  ``knobs`` are
    not used (the requests are built here).
    Shrinks towards: async scheduling, images of 2 tokens, ``a`` all image.
    """

    a_len, b_len = draw(st.integers(2, 5)), draw(st.integers(2, 5))
    cache = max(a_len, b_len) + draw(st.integers(0, min(a_len, b_len) - 1))
    a = {"prompt": _text(draw, draw(st.integers(0, 4))) + [0] * a_len,
         "output": _text(draw, draw(st.integers(1, 3)))}
    a["mm_inputs"] = [{"offset": len(a["prompt"]) - a_len, "length": a_len, "hash": "image0"}]
    b_head = draw(st.integers(1, 6))
    budget = len(a["prompt"]) + b_head  # step 0: a whole, b up to its image
    if _one_in(draw, 4):
        b_head = draw(st.integers(0, 12))
    b = {"prompt": _text(draw, b_head) + [0] * b_len + _text(draw, draw(st.integers(0, 3))),
         "output": _text(draw, draw(st.integers(1, 3))),
         "mm_inputs": [{"offset": b_head, "length": b_len, "hash": "image1"}]}
    requests = [a, b]
    longest = max(len(q["prompt"]) + len(q["output"]) for q in requests)
    config = draw(configs(block_size=st.sampled_from([2, 4, 8]), max_model_len=longest + 8,
                          enable_chunked_prefill=True, max_num_batched_tokens=budget,
                          long_prefill_token_threshold=0, max_num_seqs=st.integers(2, 4),
                          spare_blocks=st.integers(2, 8), policy="fcfs",
                          num_speculative_tokens=0))
    config["encoder_cache_size"] = cache
    config["encoder_compute_budget"] = max(cache, budget)
    for rid, q in zip(draw(request_ids(len(requests))), requests):
        q["id"] = rid
    data = {"config": config, "requests": requests}
    if _one_in(draw, 3):
        if config.get("kv_cache_memory_bytes") is not None:  # sized as one worker: in pages
            config["num_gpu_blocks"] = kv_cache_layout(parse_drawn_stream(data).config).num_blocks
            del config["kv_cache_memory_bytes"]
        config["pipeline_parallel_size"] = draw(st.integers(2, 3))
    else:
        config["async_scheduling"] = True
    _draw_ready_steps(draw, config, 12, [0.0, 0.0, 0.5, 1.0])
    return data


@st.composite
def lora_encoder_skip_streams(draw, **knobs: Any) -> dict[str, Any]:
    """LoRA adapters meeting a spent encoder budget: a first request without an adapter
    holds two images, each using up the encoder's budget in its step; behind it, one or
    two requests under adapters hold an image right after a short text prefix, and one or
    two more arrive under other adapters at step 0 or 1.  In step 1 the adapters'
    requests are running but get no token (their image cannot be encoded yet), so their
    adapters do not hold slots, and a waiting request under another adapter is admitted;
    when they run again the step holds more adapters than ``max_loras`` and vLLM fails
    its assertion (quirks.LORA_SLOTS_OVERFILLED_AFTER_A_SKIP).  Now and then the first
    request runs under the first adapter, or the encoder's budget has a token to spare,
    and nothing fails.  ``knobs`` are not used (the requests are built here).
    Shrinks towards: one adapter slot, 2-token images, one request of each kind.
    """
    length = draw(st.integers(2, 6))
    max_loras = draw(st.integers(1, 2))
    block_size = draw(st.sampled_from([4, 2, 8]))
    config = draw(configs(block_size=block_size, max_model_len=48, budget=64,
                          max_num_seqs=st.integers(4, 6), spare_blocks=st.integers(4, 16),
                          enable_chunked_prefill=True, num_speculative_tokens=0,
                          long_prefill_token_threshold=0, policy="fcfs"))
    config["max_loras"] = max_loras
    config["encoder_compute_budget"] = length + (1 if _one_in(draw, 6) else 0)
    config["encoder_cache_size"] = 3 * length
    gap, tail = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    first = [0] * length + _tokens(draw, gap, DEFAULT_VOCAB_SIZE, frozenset({0})) \
        + [0] * length + _tokens(draw, tail, DEFAULT_VOCAB_SIZE, frozenset({0}))
    stalled = draw(st.integers(1, max_loras))
    late = draw(st.integers(1, 2))
    ids = draw(request_ids(1 + stalled + late))
    head = {"id": ids[0], "prompt": first, "output": _tokens(draw, draw(st.integers(2, 4)),
                                                                  DEFAULT_VOCAB_SIZE),
            "mm_inputs": [{"offset": 0, "length": length, "hash": "image0"},
                          {"offset": length + gap, "length": length, "hash": "image1"}]}
    if _one_in(draw, 8):
        head["lora"] = "adapter0"
    requests = [head]
    for n, rid in enumerate(ids[1:1 + stalled]):
        prefix = _tokens(draw, draw(st.integers(1, 4)), DEFAULT_VOCAB_SIZE, frozenset({0}))
        rest = _tokens(draw, draw(st.integers(1, 4)), DEFAULT_VOCAB_SIZE, frozenset({0}))
        requests.append({"id": rid, "prompt": prefix + [0] * length + rest,
                         "output": _tokens(draw, draw(st.integers(3, 6)), DEFAULT_VOCAB_SIZE),
                         "lora": f"adapter{n}",
                         "mm_inputs": [{"offset": len(prefix), "length": length,
                                        "hash": f"image{2 + n}"}]})
    arrival = 0
    for n, rid in enumerate(ids[1 + stalled:]):
        arrival = draw(st.integers(arrival, 1))
        requests.append({"id": rid,
                         "prompt": _tokens(draw, draw(st.integers(1, 6)), DEFAULT_VOCAB_SIZE),
                         "output": _tokens(draw, draw(st.integers(2, 6)), DEFAULT_VOCAB_SIZE),
                         "lora": f"adapter{stalled + n}", "arrival_step": arrival})
    return {"config": config, "requests": requests}


#: The request fields a pooling request keeps (it has no sampling parameters).
POOLING_KEEPS = ("id", "prompt", "arrival_step", "priority", "abort_step", "cache_salt", "lora",
                 "mm_inputs")


@st.composite
def pooling_streams(draw, **knobs: Any) -> dict[str, Any]:
    """Pooling requests (embeddings): every request pools, so none samples a token and
    each finishes once its prefill is computed -- after several chunks under the small
    token budgets, after preemption in tight pools, or at once on a prefix hit from a
    shared prompt.  Streams of :func:`streams` (no drafts) with the sampling fields
    dropped and the outputs emptied.  ``knobs`` go to :func:`streams`.
    Shrinks towards: the shrunk :func:`streams` stream, pooled.
    """
    config = configs(num_speculative_tokens=0, budget=st.integers(2, 24),
                     spare_blocks=st.integers(0, 6))
    data = draw(streams(**_with(dict(config=config, min_requests=1, max_requests=6,
                                     shared_prefixes="always", prompt_logprobs=False,
                                     drafts=False), knobs)))
    data["requests"] = [{**{k: r[k] for k in POOLING_KEEPS if k in r}, "output": [],
                         "pooling": True} for r in data["requests"]]
    return data
