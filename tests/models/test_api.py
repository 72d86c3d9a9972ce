"""The Python API on SmolLM2: tokens, logits, generation (streaming, seeds, stops, chat turns)."""

from __future__ import annotations

import pytest
import torch

import minfer.api


def test_tokenize_matches_llamacpp(smollm2_model, llamacpp_ref):
    for case in llamacpp_ref["tokenize"]:
        assert smollm2_model.tokenize(case["text"], parse_special=True) == case["ids"], case["text"]
    text = "The quick brown fox jumps over the lazy dog."
    assert smollm2_model.detokenize(smollm2_model.tokenize(text)) == text


def test_logits_shape_and_dtype(smollm2_model, llamacpp_ref):
    ids = llamacpp_ref["greedy"][0]["prompt_ids"]
    out = smollm2_model.logits(ids)
    assert out.dtype == torch.float32 and out.shape == (len(ids), smollm2_model.n_vocab)
    assert int(out[-1].argmax()) == llamacpp_ref["greedy"][0]["steps"][0]["token"]


def test_streaming_equals_whole_text(smollm2_model, llamacpp_ref):
    prompt = llamacpp_ref["greedy"][0]["prompt"]
    whole = smollm2_model.generate(prompt, max_tokens=12, temperature=0)
    pieces = list(smollm2_model.generate(prompt, max_tokens=12, temperature=0, stream=True))
    assert len(pieces) > 1 and "".join(pieces) == whole
    assert whole.startswith(" Paris")
    s = smollm2_model.last_stats
    assert s.generated_tokens == 12 and s.finish_reason == "length"


def test_seed_reproduces_sampled_text(smollm2_model):
    kw = dict(max_tokens=16, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    a = smollm2_model.generate("Once upon a time", seed=11, **kw)
    b = smollm2_model.generate("Once upon a time", seed=11, **kw)
    c = smollm2_model.generate("Once upon a time", seed=12, **kw)
    assert a == b and a != c


def test_stop_string_cuts_the_text(smollm2_model, llamacpp_ref):
    prompt = llamacpp_ref["greedy"][0]["prompt"]
    whole = smollm2_model.generate(prompt, max_tokens=12, temperature=0)
    stop = whole[4:9]
    cut = smollm2_model.generate(prompt, max_tokens=12, temperature=0, stop=[stop])
    assert cut == whole[:whole.index(stop)]
    assert smollm2_model.last_stats.finish_reason == "stop"


def test_chat_turn_reuses_the_cached_prefix(smollm2_model):
    messages = [{"role": "user", "content": "What is 2 + 2?"}]
    reply = smollm2_model.generate(messages, max_tokens=24, temperature=0)
    first = smollm2_model.last_stats
    # the reason agrees with what happened: 24 tokens is "length", fewer ended at <|im_end|>
    assert reply and (first.finish_reason == "length") == (first.generated_tokens == 24)
    assert first.finish_reason in ("stop", "length")
    messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "And 3 + 3?"}]
    smollm2_model.generate(messages, max_tokens=4, temperature=0)
    second = smollm2_model.last_stats
    assert second.prompt_tokens > first.prompt_tokens
    assert second.prefilled_tokens < second.prompt_tokens - first.prompt_tokens + 8


def test_chat_stops_at_end_of_turn(smollm2_model):
    reply = smollm2_model.generate([{"role": "user", "content": "Say hello."}], max_tokens=200, temperature=0)
    assert smollm2_model.last_stats.finish_reason == "stop"
    assert "<|im_end|>" not in reply


def test_messages_are_read_as_the_server_reads_them(smollm2_model):
    """OpenAI-shaped messages (what the server takes) mean the same here: text parts are their text,
    developer is system, an assistant turn of tool calls may have no content; what the server refuses
    with a 400 is a TemplateError (were: an empty list generated from an empty chat, content None
    rendered as the text "None" or a template TypeError, text parts as their Python repr, an unknown
    role rendered as it came)."""
    m = smollm2_model
    plain = m.chat_tokens([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}])
    parts = [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]
    assert m.chat_tokens([{"role": "developer", "content": "Be brief."}, {"role": "user", "content": parts}]) == plain
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}
    assert m.chat_tokens([{"role": "user", "content": "hi"},
                          {"role": "assistant", "content": None, "tool_calls": [call]},
                          {"role": "tool", "tool_call_id": "c1", "content": "42"}])
    for bad, why in [([], "messages must hold at least one message"),
                     ([{"role": "user", "content": None}], r"messages\[0\]\.content is missing"),
                     ([{"role": "user"}], r"messages\[0\]\.content is missing"),
                     ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
                      r"messages\[0\]\.content\[0\]: only text parts are supported \(got type 'image_url'\)"),
                     ([{"content": "hi"}], r"messages\[0\]\.role must be a string"),
                     ([{"role": "user", "content": "hi"}, {"role": "wizard", "content": "hi"}],
                      r"messages\[1\]\.role 'wizard' is not one of system, developer, user, assistant, tool"),
                     ([{"role": "user", "content": 5}],
                      r"messages\[0\]\.content must be a string or a list of text parts")]:
        with pytest.raises(minfer.errors.TemplateError, match=why):
            m.chat_tokens(bad)
        with pytest.raises(minfer.errors.TemplateError, match=why):
            m.generate(bad, max_tokens=2)


@pytest.mark.parametrize("bad, param, why", [(dict(temperature=-1.0), "temperature", "must be >= 0.0"),
                                             (dict(top_p=0.0), "top_p", "must be > 0.0"),
                                             (dict(nonsense=1), "nonsense", "is not a sampling parameter")])
def test_bad_sampling_arguments(smollm2_model, bad, param, why):
    """A typed ParamError naming the parameter and the reason, before anything runs."""
    with pytest.raises(minfer.errors.ParamError, match=why) as e:
        smollm2_model.generate("hi", **bad)
    assert e.value.param == param
    with pytest.raises(minfer.errors.ParamError, match=why):
        smollm2_model.generate_batch(["hi"], **bad)


def test_prompt_longer_than_a_chunk(tiny_gguf):
    """A prompt's chunks before its last return no logits: the output matmul gets no rows (a
    quantized tied output once refused them)."""
    path = tiny_gguf("tiny-llama", "q8_0")
    ids = [5 + i % 400 for i in range(70)]
    with minfer.api.load(path, n_ctx=128, prefill_chunk=32, progress=False) as m:
        seq = m.engine.add(ids, minfer.api.SamplingParams(temperature=0, max_tokens=3))
        m.run([seq])
        assert seq.finish_reason == "length" and len(seq.generated) == 3


def test_a_closed_model_refuses_requests(tiny_gguf):
    """After close() a request is a MinferError that says the model is closed (was: the cpu backend
    went on generating, the vulkan one failed with 'allocate() the KV cache before running a step')."""
    m = minfer.api.load(tiny_gguf(), progress=False, n_ctx=32, n_slots=1)
    assert m.generate("hi", max_tokens=2, temperature=0)
    m.close()
    m.close()  # idempotent
    for call in (lambda: m.generate("hi", max_tokens=2), lambda: m.logits([1, 2]), lambda: m.embed(["hi"])):
        with pytest.raises(minfer.errors.MinferError, match="the model is closed"):
            call()
    assert m.tokenize("hi")  # what needs no weights still works
