"""The OpenAI-compatible server (``megakernel.serve``) on a tiny checkpoint with a byte-level
tokenizer and Qwen3's chat template, served in the test on a loopback port (127.0.0.1) by
uvicorn. Greedy outputs are held to Hugging Face's model; every request loop is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

from conftest import REPO, SEED, WORDS, build_checkpoint, code_commit  # noqa: E402
from test_reference_vs_hf import assert_same_greedy, hf_greedy  # noqa: E402

SHAPE = dict(hidden=64, intermediate=128, heads=4, kv_heads=2, head_dim=16)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# Qwen3's chat template (tokenizer_config.json of the Qwen3 checkpoints): system prompt, turns,
# the thinking block of earlier assistant turns, and the enable_thinking switch.
QWEN3_CHAT_TEMPLATE = (
    "{%- if tools %}\n    {{- '<|im_start|>system\\n' }}\n    {%- if messages[0].role == 'system' %}\n"
    "        {{- messages[0].content + '\\n\\n' }}\n    {%- endif %}\n"
    "    {{- \"# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are "
    "provided with function signatures within <tools></tools> XML tags:\\n<tools>\" }}\n"
    "    {%- for tool in tools %}\n        {{- \"\\n\" }}\n        {{- tool | tojson }}\n    {%- endfor %}\n"
    "    {{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, \\\"arguments\\\": "
    "<args-json-object>}\\n</tool_call><|im_end|>\\n\" }}\n"
    "{%- else %}\n    {%- if messages[0].role == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}\n    {%- endif %}\n{%- endif %}\n"
    "{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}\n"
    "{%- for message in messages[::-1] %}\n    {%- set index = (messages|length - 1) - loop.index0 %}\n"
    "    {%- if ns.multi_step_tool and message.role == \"user\" and not(message.content.startswith('<tool_response>')"
    " and message.content.endswith('</tool_response>')) %}\n        {%- set ns.multi_step_tool = false %}\n"
    "        {%- set ns.last_query_index = index %}\n    {%- endif %}\n{%- endfor %}\n"
    "{%- for message in messages %}\n"
    "    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    "    {%- elif message.role == \"assistant\" %}\n        {%- set content = message.content %}\n"
    "        {%- set reasoning_content = '' %}\n"
    "        {%- if message.reasoning_content is defined and message.reasoning_content is not none %}\n"
    "            {%- set reasoning_content = message.reasoning_content %}\n        {%- else %}\n"
    "            {%- if '</think>' in message.content %}\n"
    "                {%- set content = message.content.split('</think>')[-1].lstrip('\\n') %}\n"
    "                {%- set reasoning_content = message.content.split('</think>')[0].rstrip('\\n')"
    ".split('<think>')[-1].lstrip('\\n') %}\n            {%- endif %}\n        {%- endif %}\n"
    "        {%- if loop.index0 > ns.last_query_index %}\n"
    "            {%- if loop.last or (not loop.last and reasoning_content) %}\n"
    "                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + "
    "'\\n</think>\\n\\n' + content.lstrip('\\n') }}\n            {%- else %}\n"
    "                {{- '<|im_start|>' + message.role + '\\n' + content }}\n            {%- endif %}\n"
    "        {%- else %}\n            {{- '<|im_start|>' + message.role + '\\n' + content }}\n        {%- endif %}\n"
    "        {{- '<|im_end|>\\n' }}\n    {%- elif message.role == \"tool\" %}\n"
    "        {%- if loop.first or (messages[loop.index0 - 1].role != \"tool\") %}\n"
    "            {{- '<|im_start|>user' }}\n        {%- endif %}\n"
    "        {{- '\\n<tool_response>\\n' }}\n        {{- message.content }}\n        {{- '\\n</tool_response>' }}\n"
    "        {%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}\n"
    "            {{- '<|im_end|>\\n' }}\n        {%- endif %}\n    {%- endif %}\n{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n' }}\n"
    "    {%- if enable_thinking is defined and enable_thinking is false %}\n"
    "        {{- '<think>\\n\\n</think>\\n\\n' }}\n    {%- endif %}\n{%- endif %}")


def byte_level_tokenizer():
    """A byte-level BPE as Qwen's (every byte a token, so tokens can carry part of a character),
    trained on a little text with multi-byte characters; the chat's special tokens first."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    corpus = [" ".join(WORDS), "système naïve café déjà 中文字 😀", "<think>\n\n</think>\n\n",
              "system\nbe brief\nuser\nwhere is it\nassistant\n"] * 10
    tok.train_from_iterator(corpus, trainer)
    return tok


def write_checkpoint(folder: Path, seed: int, tokenizer: bool = True):
    """A tiny Qwen3 checkpoint; with a tokenizer, the files a Qwen3 checkpoint has for it."""
    if not tokenizer:
        return build_checkpoint(folder, seed, **SHAPE)
    tok = byte_level_tokenizer()
    tiny = build_checkpoint(folder, seed, vocab=tok.get_vocab_size(), **SHAPE)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "Qwen2Tokenizer", "chat_template": QWEN3_CHAT_TEMPLATE, "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>", "clean_up_tokenization_spaces": False}))
    ids = [tok.token_to_id(t) for t in SPECIALS]
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [ids[2], ids[0]]}))
    return tiny


@contextlib.contextmanager
def serving(folder: Path, step_delay: float = 0.0, **build_kwargs):
    """The server for a checkpoint folder, on 127.0.0.1 at a free port, in this process (so that a
    test can reach its engine). ``step_delay`` slows each decode step, to hold requests in flight."""
    import uvicorn

    from megakernel import load_model
    from megakernel.serve import build
    model = load_model(str(folder), device="cpu", progress=False)
    build_kwargs.setdefault("backend", "reference")
    app, engine, config, codec = build(model, **build_kwargs)
    if step_delay:
        launch = engine.mk.launch_slots

        def slowed(active, *args, **kwargs):
            time.sleep(step_delay)
            return launch(active, *args, **kwargs)
        engine.mk.launch_slots = slowed
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    for _ in range(200):
        if server.started:
            break
        time.sleep(0.05)
    assert server.started, "the server did not start"
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    try:
        yield SimpleNamespace(url=url, engine=engine, config=config, codec=codec, name=config.model_name)
    finally:
        server.should_exit = True
        thread.join(15)
        engine.stop()


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    from transformers import AutoTokenizer
    folder = tmp_path_factory.mktemp("serve") / "tiny-qwen3"
    seed = (SEED + 4242) % 2**31
    print(f"checkpoint seed {seed} (run seed {SEED})")
    tiny = write_checkpoint(folder, seed)
    return SimpleNamespace(folder=folder, hf=tiny.hf, vocab=tiny.vocab_size,
                           tok=AutoTokenizer.from_pretrained(str(folder)))


@pytest.fixture(scope="module")
def server(ckpt):
    with serving(ckpt.folder, batch_size=8, max_seq_len=96, max_queue=64) as s:
        yield s


def post(s, path: str, body, timeout: float = 60.0) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(s.url + path, content=content, headers={"content-type": "application/json"},
                      timeout=timeout)


def sse_events(lines) -> list:
    """The JSON events of a server-sent stream up to ``[DONE]`` (which must come)."""
    out = []
    for line in lines:
        if line.startswith("data: "):
            if line == "data: [DONE]":
                return out
            out.append(json.loads(line[6:]))
    raise AssertionError(f"the stream ended without [DONE] after {out}")


def stream(s, path: str, body: dict, timeout: float = 60.0) -> list:
    with httpx.stream("POST", s.url + path, json=dict(body, stream=True), timeout=timeout) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        return sse_events(r.iter_lines())


def streamed_choices(events: list, n: int = 1, chat: bool = False) -> list[dict]:
    """Per choice: the text, token ids, finish reason and the text pieces of a stream's events."""
    out = [dict(text="", ids=[], finish=None, pieces=[]) for _ in range(n)]
    for ev in events:
        assert "error" not in ev, ev
        for c in ev["choices"]:
            o = out[c["index"]]
            piece = (c["delta"].get("content") or "") if chat else c["text"]
            o["text"] += piece
            o["pieces"].append(piece)
            o["ids"] += c.get("token_ids") or []
            o["finish"] = c["finish_reason"] or o["finish"]
    return out


def metric(s, name: str, labels: dict | None = None) -> float:
    from prometheus_client.parser import text_string_to_metric_families
    text = httpx.get(s.url + "/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in (labels or {}).items()):
                return sample.value
    raise AssertionError(f"no {name} {labels or ''} in /metrics")


def wait_for(predicate, timeout: float = 10.0, what: str = "the condition"):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def health(s) -> dict:
    return httpx.get(s.url + "/health", timeout=10).json()


def words_prompt(i: int, n: int) -> str:
    return " ".join(WORDS[(7 * i + 3 * k) % len(WORDS)] for k in range(n))


# ---------------------------------------------------------------------------------------------


def test_openai_client_completion_and_streamed_chat(server, ckpt):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    assert [m.id for m in client.models.list().data] == [server.name]

    prompt = "the cat sat on the"
    ids = ckpt.tok.encode(prompt)
    r = client.completions.create(model=server.name, prompt=prompt, max_tokens=6, temperature=0,
                                  extra_body={"ignore_eos": True, "return_token_ids": True})
    got = r.choices[0].token_ids
    want, logits = hf_greedy(ckpt.hf, ids, 6)
    assert_same_greedy(got, want, logits)
    assert r.choices[0].text == ckpt.tok.decode(got, skip_special_tokens=True)
    assert r.choices[0].finish_reason == "length"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (len(ids), 6, len(ids) + 6)

    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "the cat"},
                {"role": "assistant", "content": "sat on the mat"}, {"role": "user", "content": "where is it"}]
    extra = {"chat_template_kwargs": {"enable_thinking": False}, "ignore_eos": True, "return_token_ids": True}
    chunks = list(client.chat.completions.create(
        model=server.name, messages=messages, max_tokens=8, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body=extra))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    out_ids = [t for c in chunks if c.choices for t in (getattr(c.choices[0], "token_ids", None) or [])]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
    # the checkpoint's template, as transformers renders it, with enable_thinking=False honoured
    rendered = ckpt.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                            enable_thinking=False)
    assert rendered.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n") and "be brief" in rendered
    prompt_ids = ckpt.tok.encode(rendered, add_special_tokens=False)
    assert chunks[-1].usage.prompt_tokens == len(prompt_ids) and chunks[-1].usage.completion_tokens == 8
    want, logits = hf_greedy(ckpt.hf, prompt_ids, 8)
    assert_same_greedy(out_ids, want, logits)
    assert text == ckpt.tok.decode(out_ids, skip_special_tokens=True)
    full = client.chat.completions.create(model=server.name, messages=messages, max_tokens=8, temperature=0,
                                          extra_body=extra)
    assert full.choices[0].message.content == text and full.choices[0].message.role == "assistant"
    # without the switch the template leaves the thinking block to the model: a shorter prompt
    thinking = client.chat.completions.create(model=server.name, messages=messages, max_tokens=1, temperature=0)
    default = ckpt.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert thinking.usage.prompt_tokens == len(ckpt.tok.encode(default, add_special_tokens=False))
    assert thinking.usage.prompt_tokens < len(prompt_ids)


def test_concurrent_clients_get_their_solo_text(server, monkeypatch):
    """16 clients at once on 8 slots (so sequences queue, join mid-flight and reuse freed slots),
    half of them streaming: each gets the greedy text it gets alone."""
    reqs = [{"prompt": words_prompt(i, 1 + i % 9), "max_tokens": 12 + (5 * i) % 9, "temperature": 0,
             "return_token_ids": True} for i in range(16)]
    alone = [post(server, "/v1/completions", r).json()["choices"][0] for r in reqs]

    widths = []
    launch = server.engine.mk.launch_slots
    monkeypatch.setattr(server.engine.mk, "launch_slots",
                        lambda active, *a, **k: (widths.append(len(active)), launch(active, *a, **k))[1])

    async def one(client, i):
        if i % 2:
            async with client.stream("POST", "/v1/completions", json=dict(reqs[i], stream=True)) as r:
                assert r.status_code == 200
                ch = streamed_choices(sse_events([line async for line in r.aiter_lines()]))[0]
            return {"text": ch["text"], "token_ids": ch["ids"], "finish_reason": ch["finish"]}
        r = await client.post("/v1/completions", json=reqs[i])
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]

    async def everyone():
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
            return await asyncio.gather(*(one(client, i) for i in range(16)))

    together = asyncio.run(everyone())
    for i, (a, b) in enumerate(zip(alone, together)):
        assert (b["text"], b["token_ids"], b["finish_reason"]) == (a["text"], a["token_ids"], a["finish_reason"]), i
    assert max(widths) == 8, f"the batch never filled: {widths}"


def test_a_list_of_prompts_gets_one_choice_each_in_order(server, ckpt):
    """OpenAI's list of prompts (strings and token-id lists, no ``model``, as vLLM takes it): one
    choice per prompt, ``index`` in order, each the greedy tokens that prompt gets sent alone; the
    same streamed; with n=2, choice p * 2 + j is the j-th of prompt p."""
    prompts = [words_prompt(1, 5), ckpt.tok.encode("the dog ran"), words_prompt(2, 2), "the cat"]
    body = {"max_tokens": 7, "temperature": 0, "ignore_eos": True, "return_token_ids": True}
    alone = [post(server, "/v1/completions", dict(body, prompt=p)).json() for p in prompts]
    r = post(server, "/v1/completions", dict(body, prompt=prompts))
    assert r.status_code == 200, r.text
    got = r.json()
    assert [c["index"] for c in got["choices"]] == [0, 1, 2, 3]
    for c, a in zip(got["choices"], alone):
        assert (c["text"], c["token_ids"], c["finish_reason"]) == \
            (a["choices"][0]["text"], a["choices"][0]["token_ids"], "length")
    assert got["prompt_token_ids"] == [a["prompt_token_ids"] for a in alone]
    assert got["usage"]["prompt_tokens"] == sum(a["usage"]["prompt_tokens"] for a in alone)
    assert got["usage"]["completion_tokens"] == 4 * 7

    streamed = streamed_choices(stream(server, "/v1/completions", dict(body, prompt=prompts)), n=4)
    assert [(s["text"], s["ids"]) for s in streamed] == [(c["text"], c["token_ids"]) for c in got["choices"]]

    two = post(server, "/v1/completions", dict(body, prompt=prompts[:2], n=2)).json()["choices"]
    assert [c["index"] for c in two] == [0, 1, 2, 3]
    assert [c["token_ids"] for c in two] == [got["choices"][i]["token_ids"] for i in (0, 0, 1, 1)]


def test_streamed_text_equals_non_streamed(server, ckpt):
    """Sampled, seeded, two choices of 40 byte-level tokens (half characters included): the
    stream's text equals the whole response's, which equals the decoded ids, and no piece of the
    stream ends in half a character."""
    body = {"prompt": "naïve café", "max_tokens": 40, "temperature": 1.0, "top_k": 200, "seed": SEED % 1000,
            "n": 2, "ignore_eos": True, "return_token_ids": True}
    whole = post(server, "/v1/completions", body).json()
    streamed = streamed_choices(stream(server, "/v1/completions", body), n=2)
    held_back = 0
    for i, c in enumerate(whole["choices"]):
        s = streamed[i]
        assert c["index"] == i and len(c["token_ids"]) == 40
        assert s["ids"] == c["token_ids"] and s["text"] == c["text"]
        assert c["text"] == ckpt.tok.decode(c["token_ids"], skip_special_tokens=True)
        assert not any(p.endswith("\ufffd") for p in s["pieces"][:-1])
        held_back += s["pieces"][:-1].count("")
    assert whole["choices"][0]["token_ids"] != whole["choices"][1]["token_ids"]   # two draws, not one twice
    assert held_back, "no token carried part of a character: the test did not test holding back"
    assert whole["usage"]["completion_tokens"] == 80

    # stop strings: cut before the first occurrence, in the stream as in the whole response
    greedy = {"prompt": "the dog", "max_tokens": 24, "temperature": 0, "ignore_eos": True}
    text = post(server, "/v1/completions", greedy).json()["choices"][0]["text"]
    stop = next(text[i:i + 2] for i in range(4, len(text) - 1) if "\ufffd" not in text[i:i + 2])
    cut = post(server, "/v1/completions", dict(greedy, stop=[stop, "never here"])).json()["choices"][0]
    assert (cut["text"], cut["finish_reason"]) == (text[:text.index(stop)], "stop")
    s = streamed_choices(stream(server, "/v1/completions", dict(greedy, stop=stop)))[0]
    assert (s["text"], s["finish"]) == (cut["text"], "stop")


@pytest.mark.parametrize("path,body,words", [
    ("/v1/completions", b"{bad json", "not valid JSON"),
    ("/v1/completions", b"[1, 2]", "invalid request"),
    ("/v1/completions", {"model": "gpt-4", "prompt": "the cat"}, "does not exist"),
    ("/v1/completions", {"prompt": "the cat", "max_tokens": 0}, "max_tokens must be at least 1"),
    ("/v1/completions", {"prompt": "the cat", "max_tokens": -5}, "max_tokens must be at least 1"),
    ("/v1/completions", {"prompt": "the cat " * 60}, "maximum context length is 96"),
    ("/v1/completions", {"prompt": "the cat", "max_tokens": 95}, "maximum context length is 96"),
    ("/v1/completions", {"prompt": [1, 2, 100000]}, "outside the vocabulary"),
    ("/v1/completions", {"prompt": []}, "prompt is empty"),
    ("/v1/completions", {"prompt": ["the cat", [1, 2, 100000]]}, "outside the vocabulary"),
    ("/v1/completions", {"prompt": ["the cat"] * 40, "n": 2}, "more sequences than the server's queue"),
    ("/v1/completions", {"prompt": "the cat", "temperature": -1}, "temperature"),
    ("/v1/completions", {"prompt": "the cat", "temperature": 1, "top_p": 1.5}, "top_p"),
    ("/v1/completions", {"prompt": "the cat", "n": 0}, "n must be at least 1"),
    ("/v1/completions", {"prompt": "the cat", "logprobs": 2}, "logprobs is not supported"),
    ("/v1/completions", {"prompt": "the cat", "stop": [""]}, "stop strings must not be empty"),
    ("/v1/completions", {"prompt": "the cat", "max_tokens": "many"}, "max_tokens"),
    ("/v1/chat/completions", {"messages": []}, "messages is empty"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "text only"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 0},
     "max_completion_tokens must be at least 1"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "chat_template_kwargs": {"messages": []}}, "may not set 'messages'"),
])
def test_bad_requests_get_400_and_the_server_goes_on(server, path, body, words):
    before = metric(server, "megakernel_requests_total", {"outcome": "bad_request"})
    r = post(server, path, body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert words in err["message"] and err["type"] == "invalid_request_error" and err["code"] == 400
    assert metric(server, "megakernel_requests_total", {"outcome": "bad_request"}) == before + 1
    ok = post(server, "/v1/completions", {"prompt": "the cat", "max_tokens": 2, "temperature": 0})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] >= 1


def test_errors_are_openai_shaped_for_the_client(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=30)
    with pytest.raises(openai.BadRequestError, match="does not exist"):
        client.completions.create(model="gpt-4", prompt="the cat", max_tokens=2)
    r = httpx.get(server.url + "/v1/nothing-here", timeout=10)
    assert r.status_code == 404 and "message" in r.json()["error"]


def test_metrics_are_prometheus_text(server):
    from prometheus_client.parser import text_string_to_metric_families
    r = post(server, "/v1/completions", {"prompt": "the cat", "max_tokens": 5, "temperature": 0, "ignore_eos": True})
    assert r.status_code == 200
    resp = httpx.get(server.url + "/metrics", timeout=10)
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(resp.text)}
    for name, kind in [("megakernel_requests", "counter"), ("megakernel_prompt_tokens", "counter"),
                       ("megakernel_generation_tokens", "counter"), ("megakernel_queue_depth", "gauge"),
                       ("megakernel_running_sequences", "gauge"),
                       ("megakernel_time_to_first_token_seconds", "histogram"),
                       ("megakernel_inter_token_latency_seconds", "histogram")]:
        assert families[name].type == kind, name
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples}
    assert samples[("megakernel_requests_total", (("outcome", "ok"),))] >= 1
    assert samples[("megakernel_generation_tokens_total", ())] >= 5
    ttft = samples[("megakernel_time_to_first_token_seconds_count", ())]
    assert ttft >= 1 and samples[("megakernel_inter_token_latency_seconds_count", ())] >= 4
    assert samples[("megakernel_queue_depth", ())] == 0
    # the first token's wait in parts: this request's prompt waited for a prefill, which took time
    assert samples[("megakernel_request_queue_time_seconds_count", ())] >= 1
    assert samples[("megakernel_prefill_seconds_count", ())] >= 1 and samples[("megakernel_prefill_seconds_sum", ())] > 0


def test_client_disconnect_frees_its_slot(ckpt):
    """One slot, slowed steps: a streaming client that goes away mid-stream, and one that gives
    up waiting for a whole response, each free the slot at once (not after their 100 tokens)."""
    with serving(ckpt.folder, step_delay=0.05, batch_size=1, max_seq_len=128) as s:
        body = {"prompt": "the cat", "max_tokens": 100, "temperature": 0, "ignore_eos": True}
        with httpx.stream("POST", s.url + "/v1/completions", json=dict(body, stream=True), timeout=30) as r:
            lines = r.iter_lines()     # kept: dropping the iterator would close the stream
            assert next(line for line in lines if line.startswith("data: "))
            assert health(s)["running"] == 1
        t0 = time.monotonic()
        wait_for(lambda: health(s)["running"] == 0, timeout=2, what="the slot to be freed")
        assert time.monotonic() - t0 < 2.0     # 100 tokens would take 5 s
        wait_for(lambda: metric(s, "megakernel_requests_total", {"outcome": "cancelled"}) == 1,
                 what="the cancellation to be counted")

        with pytest.raises(httpx.ReadTimeout):
            post(s, "/v1/completions", body, timeout=0.5)
        wait_for(lambda: health(s)["running"] == 0, timeout=2, what="the slot to be freed")
        assert metric(s, "megakernel_requests_total", {"outcome": "cancelled"}) == 2

        r = post(s, "/v1/completions", dict(body, max_tokens=3))
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3


def test_full_queue_gets_503(ckpt):
    with serving(ckpt.folder, step_delay=0.05, batch_size=1, max_seq_len=128, max_queue=1) as s:
        long = {"prompt": "the cat", "max_tokens": 100, "temperature": 0, "ignore_eos": True}
        with httpx.stream("POST", s.url + "/v1/completions", json=dict(long, stream=True), timeout=30) as r:
            lines = r.iter_lines()     # kept: dropping the iterator would close the stream
            assert next(line for line in lines if line.startswith("data: "))    # it holds the slot
            waiting = {}
            t = threading.Thread(target=lambda: waiting.update(r=post(s, "/v1/completions", dict(long, max_tokens=2))))
            t.start()
            wait_for(lambda: health(s)["queued"] == 1, what="the second request to queue")
            refused = post(s, "/v1/completions", dict(long, max_tokens=2))
            assert refused.status_code == 503, refused.text
            assert "capacity" in refused.json()["error"]["message"]
        t.join(10)    # the stream's client left: its slot went to the queued request
        assert waiting["r"].status_code == 200 and waiting["r"].json()["usage"]["completion_tokens"] == 2
        assert metric(s, "megakernel_requests_total", {"outcome": "rejected"}) == 1


def test_prefill_graphs_auto_is_eager_where_they_cannot_run(ckpt):
    """--prefill-graphs auto (the default) captures the graphs only on a CUDA GPU with 16-bit weights
    and one rank; here (the CPU) the server runs and admits by the eager prefill; a bad value is
    refused before any work."""
    from megakernel import load_model
    from megakernel.serve import build
    from megakernel.serve.server import _prefill_graphs_fit
    model = load_model(str(ckpt.folder), device="cpu", progress=False)
    with pytest.raises(ValueError, match="auto, on or off"):
        build(model, backend="reference", batch_size=1, max_seq_len=64, prefill_graphs="yes")
    app, engine, config, codec = build(model, backend="reference", batch_size=1, max_seq_len=64, warmup=False)
    try:
        assert not _prefill_graphs_fit(engine.mk) and engine.mk._prefill_graphs is None
    finally:
        engine.stop()


def test_kernel_error_fails_requests_in_flight_and_the_server_goes_on(ckpt):
    """A decode step that raises MegakernelError (as a timed-out wait in the kernel does): the two
    requests in flight fail with a 500 (the streamed one with an error event) naming it, the
    batch is reset, and the next request gets the tokens it got before."""
    from megakernel.backends import MegakernelError
    with serving(ckpt.folder, step_delay=0.03, batch_size=4, max_seq_len=128) as s:
        body = {"prompt": "the cat sat", "max_tokens": 60, "temperature": 0, "ignore_eos": True}
        before = post(s, "/v1/completions", dict(body, max_tokens=8)).json()["choices"][0]["text"]
        armed = threading.Event()

        def failing(decode):
            def step(*args):
                if armed.is_set():
                    armed.clear()
                    raise MegakernelError("megakernel: worker 3 timed out at tape position 7 (a test fault)")
                return decode(*args)
            return step
        for n in s.engine.buckets:      # whichever batch runs the step
            backend = s.engine.mk.bucket_backend(n)
            backend.decode = failing(backend.decode)

        results = {}
        t = threading.Thread(target=lambda: results.update(whole=post(s, "/v1/completions", body)))
        t.start()
        with httpx.stream("POST", s.url + "/v1/completions", json=dict(body, stream=True), timeout=30) as r:
            wait_for(lambda: health(s)["running"] == 2, what="both requests to run")
            armed.set()
            events = [json.loads(line[6:]) for line in r.iter_lines()
                      if line.startswith("data: ") and line != "data: [DONE]"]
        t.join(30)
        assert "MegakernelError" in events[-1]["error"]["message"] and events[-1]["error"]["code"] == 500
        whole = results["whole"]
        assert whole.status_code == 500
        assert "MegakernelError" in whole.json()["error"]["message"]
        assert metric(s, "megakernel_engine_errors_total") == 1
        assert health(s)["running"] == 0
        again = post(s, "/v1/completions", dict(body, max_tokens=8))
        assert again.status_code == 200 and again.json()["choices"][0]["text"] == before


def test_model_without_tokenizer_serves_token_ids(tmp_path, seed):
    """Random weights have no tokenizer: prompts are token ids, the output is ids (as text and as
    token_ids); text prompts and chat get a clear 400."""
    from megakernel import MegaQwen3, load_model
    tiny = write_checkpoint(tmp_path / "ids-only", seed, tokenizer=False)
    with serving(tiny.folder, batch_size=2, max_seq_len=32) as s:
        r = post(s, "/v1/completions", {"prompt": [5, 6, 7, 8], "max_tokens": 6, "temperature": 0})
        assert r.status_code == 200, r.text
        c = r.json()["choices"][0]
        mk = MegaQwen3(load_model(str(tiny.folder), device="cpu", progress=False), max_seq_len=32,
                       backend="reference")
        assert c["token_ids"] == mk.generate([[5, 6, 7, 8]], max_new_tokens=6)[0].tolist()
        assert c["text"] == " ".join(map(str, c["token_ids"]))
        r = post(s, "/v1/completions", {"prompt": "the cat", "max_tokens": 2})
        assert r.status_code == 400 and "no tokenizer" in r.json()["error"]["message"]
        r = post(s, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 400 and "tokenizer" in r.json()["error"]["message"]


def test_loadtest_reports_with_nothing_failed(server, capsys, tmp_path):
    from megakernel import loadtest
    from megakernel.results import read_rows
    table = tmp_path / "results.jsonl"
    rc = loadtest.main(["--url", server.url, "--concurrency", "6", "--duration", "2", "--max-tokens", "6",
                        "--prompt-tokens", "5", "--json", "--record", str(table)])
    out = capsys.readouterr().out
    report = json.loads(out.strip().splitlines()[-1])
    assert rc == 0, out
    (row,) = read_rows(table)      # the results table gets the report with the server's facts
    assert row["backend"] == "serve" and row["batch_size"] == report["server"]["batch_size"] > 0
    assert row["serve_backend"] == report["server"]["backend"] and row["device"] == report["server"]["device"]
    assert row["requests"] == report["requests"] and row["ttft_ms_p50"] == report["ttft_ms_p50"]
    assert row["new_tokens"] == 6 and row["prompt_len"] == 5 and row["error"] is None
    assert row["git_commit"] == code_commit()     # None only where nothing says (an sdist, a zip)
    assert report["failed"] == 0 and report["lost"] == 0 and report["requests"] >= 6
    assert report["output_tokens"] == 6 * report["requests"]
    assert report["ttft_ms_p50"] > 0 and report["itl_ms_p99"] >= report["itl_ms_p50"] > 0
    # the p99 without the first wave: a figure once some client sent a second request
    assert (report["ttft_ms_p99_later"] is not None) == (report["requests"] > 6)
    assert row["ttft_ms_p99_later"] == report["ttft_ms_p99_later"]
    # the server's own p50s from its /metrics (bucket-interpolated, so not compared with the client's)
    assert 0 < report["server_ttft_ms_p50"] and 0 < report["server_step_ms_p50"]
    assert 0 < report["server_queue_ms_p50"] and 0 < report["server_prefill_ms_p50"]
    assert row["server_prefill_ms_p50"] == report["server_prefill_ms_p50"]
    assert row["server_ttft_ms_p50"] == report["server_ttft_ms_p50"]
    assert "requests/s" in out and "time to first token: p50" in out and "the server's own p50s" in out
    assert row["client_processes"] == 1 and 0 < row["client_cpu"]
    # clients spread over processes started together: the same checks, their figures merged
    rc = loadtest.main(["--url", server.url, "--concurrency", "3", "--duration", "2", "--max-tokens", "4",
                        "--prompt-tokens", "5", "--processes", "2", "--json"])
    out = capsys.readouterr().out
    spread = json.loads(out.strip().splitlines()[-1])
    assert rc == 0, out
    assert spread["client_processes"] == 2 and spread["failed"] == spread["lost"] == 0 and spread["requests"] >= 3
    assert spread["output_tokens"] == 4 * spread["requests"] and len(spread["server"]) > 0
    assert "2 process(es)" in out
    assert loadtest.main(["--url", "http://127.0.0.1:9", "--duration", "1"]) == 2
    assert "error: cannot reach" in capsys.readouterr().err
    assert loadtest.main(["--url", server.url, "--record", str(tmp_path / "no" / "t.jsonl")]) == 2
    assert "error: --record" in capsys.readouterr().err


def test_loadtest_starts_loads_and_stops_its_own_server(ckpt, capsys, tmp_path, monkeypatch):
    """``loadtest --serve ARGS --concurrency 1,2``: one command starts ``megakernel.serve``, waits for
    it, runs each client count (a report and a row each, the server's settings in the row's
    command) and stops it; a server that cannot start is one clear error, status 2."""
    from megakernel import loadtest
    from megakernel.results import read_rows
    monkeypatch.setenv("PYTHONPATH", str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("MEGAKERNEL_CACHE", str(tmp_path / "mkcache"))
    table = tmp_path / "results.jsonl"
    rc = loadtest.main(["--serve", f"--model {ckpt.folder} --batch-size 2 --max-seq-len 32", "--concurrency", "1,2",
                        "--duration", "1", "--max-tokens", "3", "--prompt-tokens", "4", "--json", "--record", str(table)])
    captured = capsys.readouterr()
    reports = json.loads(captured.out.strip().splitlines()[-1])
    assert rc == 0, captured
    assert [r["concurrency"] for r in reports] == [1, 2] and all(r["failed"] == r["lost"] == 0 for r in reports)
    assert all(r["requests"] >= r["concurrency"] for r in reports)
    rows = read_rows(table)
    assert [r["concurrency"] for r in rows] == [1, 2] and all("--serve" in r["command"] for r in rows)
    assert not _up(reports[0]["url"]), "the server was stopped"
    assert loadtest.main(["--serve", "--model x", "--url", "http://127.0.0.1:9"]) == 2
    assert "--url and --serve both name the server" in capsys.readouterr().err
    rc = loadtest.main(["--serve", f"--model {tmp_path / 'none'}", "--duration", "1"])
    err = capsys.readouterr().err
    assert rc == 2 and "error: the server exited with status 2 before serving" in err and "no such checkpoint" in err


def test_histogram_p50_is_prometheus_histogram_quantile():
    """The loadtest's server-side p50: of the counts between two scrapes, linear within the bucket
    that holds the middle rank (Prometheus' histogram_quantile), None where nothing was counted."""
    from megakernel.loadtest import histogram_p50
    inf = float("inf")
    before = [(0.01, 5.0), (0.02, 5.0), (0.04, 5.0), (inf, 5.0)]
    # 10 new observations: 2 up to 10 ms, 6 in (10, 20] ms, 2 in (20, 40] ms; the 5th lies 3/6 into the second bucket
    after = [(0.01, 7.0), (0.02, 13.0), (0.04, 15.0), (inf, 15.0)]
    assert abs(histogram_p50(before, after) - 15.0) < 1e-9
    assert histogram_p50(after, after) is None
    assert abs(histogram_p50([], [(0.01, 0.0), (0.02, 4.0), (inf, 4.0)]) - 15.0) < 1e-9


def test_command_line_server(ckpt, tmp_path):
    """``python -m megakernel.serve`` as a user starts it: serves, and stops on Ctrl-C; bad input
    ends with one line ``error: ...`` and status 2."""
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               HF_HUB_OFFLINE="1", MEGAKERNEL_CACHE=str(tmp_path / "mkcache"), PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "megakernel.serve", "--model", str(ckpt.folder), "--batch-size", "2",
           "--max-seq-len", "32", "--port", "0"]
    p = subprocess.Popen(cmd, env=env, cwd=REPO, stderr=subprocess.PIPE, text=True)
    try:
        url = None
        for line in p.stderr:          # bounded: the process ends, or says where it serves
            found = re.search(r"serving .* on (http://127\.0\.0\.1:\d+)", line)
            if found:
                url = found.group(1)
                break
        assert url, "the server did not say where it serves"
        wait_for(lambda: _up(url), timeout=30, what="the server to answer")
        r = httpx.post(url + "/v1/completions", json={"prompt": "the cat", "max_tokens": 3}, timeout=30)
        assert r.status_code == 200 and r.json()["model"] == str(ckpt.folder)
    finally:
        p.send_signal(signal.SIGINT)
        rc = p.wait(30)
    rest = p.stderr.read()
    assert rc == 130 and "Finished server process" in rest and "Traceback" not in rest, rest   # graceful

    def run(*args):
        return subprocess.run([sys.executable, "-m", "megakernel.serve", *args], env=env, cwd=REPO,
                              capture_output=True, text=True, timeout=120)
    for args, words in [(["--batch-size", "0"], "--batch-size"), (["--model", str(tmp_path / "none"), "--port", "0"],
                                                                   "no such checkpoint"),
                        (["--model", str(ckpt.folder), "--port", "0", "--prefill-graphs"], "prefill graphs need")]:
        r = run(*args)
        assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].startswith("error:") and words in r.stderr, \
            r.stderr
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        r = run("--port", str(busy.getsockname()[1]))
        assert r.returncode == 2 and "cannot listen" in r.stderr


def _up(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_default_max_num_seqs_counts_what_torchs_allocator_holds_unused(monkeypatch):
    """The server's default batch counts memory torch's allocator reserved and no tensor uses (the
    load's freed buffers) as free, as the fit check does; where not even one sequence fits it says so."""
    from types import SimpleNamespace

    import torch

    from megakernel.serve import server
    from models.qwen3.config import PRESETS
    gib = 1024 ** 3
    mem = {"free": 1 * gib, "unused": 20 * gib}
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d=None: (mem["free"], 141 * gib))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda d=None: 30 * gib + mem["unused"])
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda d=None: 30 * gib)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "GPU")
    cfg = PRESETS["8b"]
    model = SimpleNamespace(tp=1, device=torch.device("cuda", 0), config=cfg, dtype=torch.bfloat16)
    per_seq = cfg.kv_bytes_per_position(2) * 4096      # 0.5625 GiB at 8b
    want = int((21 * gib * server.KV_FREE_FRACTION - server.KV_RESERVE_BYTES) // per_seq)
    assert 1 <= want < server.DEFAULT_MAX_NUM_SEQS
    assert server.default_max_num_seqs(model, 4096) == want
    mem.update(unused=0)
    with pytest.raises(MemoryError, match="does not fit in the 1.0 GiB free on GPU"):
        server.default_max_num_seqs(model, 4096)
