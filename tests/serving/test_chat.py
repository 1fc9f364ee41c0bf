"""/v1/chat/completions on a decoder-only target with a chat template (a tiny random Qwen2 written by transformers,
tests/decoder_only_models.py), prompt lookup drafting in the step: the official `openai` client's chat calls,
streaming and not, give exactly `jaxspec.generate`'s greedy text for the rendered template."""

from __future__ import annotations

import openai
import pytest

import jaxspec
from decoder_only_models import write_hf_decoder
from jaxspec.serving import SlotEngine
from jaxspec.serving import server as serving

MESSAGES = [[{"role": "user", "content": "the cat reads a book."}],
            [{"role": "system", "content": "a"}, {"role": "user", "content": "the tree."}]]


@pytest.fixture(scope="module")
def live(tmp_path_factory):
  directory = write_hf_decoder(str(tmp_path_factory.mktemp("chat") / "qwen2"), "qwen2")
  target = jaxspec.load(directory)
  engine = SlotEngine(target, jaxspec.Speculation(jaxspec.NGramDraft(), gamma=2), slots=2, max_input_length=16,
                      max_new_tokens=8, iterations_per_step=2)
  scheduler, app = serving.build(engine, model_name="tiny-chat", queue_size=2)
  with serving.Background(scheduler, app) as server:
    server.wait_ready(600)
    yield server, target


@pytest.fixture(scope="module")
def client(live):
  return openai.OpenAI(base_url=live[0].url + "/v1", api_key="none", max_retries=0, timeout=120)


def _greedy(target, messages) -> str:
  ids = target.tokenizer.encode(target.tokenizer.apply_chat_template(messages))
  out = jaxspec.generate(target, [ids], max_new_tokens=8, max_input_length=16)
  return target.tokenizer.decode(out.tokens[0, :out.lengths[0]])


def test_chat_equals_generate_on_the_template(live, client):
  _, target = live
  for messages in MESSAGES:
    want = _greedy(target, messages)
    out = client.chat.completions.create(model="tiny-chat", messages=messages, temperature=0)
    assert out.choices[0].message.role == "assistant" and out.choices[0].message.content == want
    chunks = list(client.chat.completions.create(model="tiny-chat", messages=messages, temperature=0,
                                                 max_completion_tokens=8, stream=True,
                                                 stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want
    assert chunks[-1].usage.total_tokens == out.usage.total_tokens
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == out.choices[0].finish_reason


def test_chat_bad_messages(client):
  for messages, word in (([{"role": "robot", "content": "x"}], "role"), ([{"role": "user"}], "content"),
                         ("hello", "messages")):
    with pytest.raises(openai.BadRequestError, match=word):
      client.chat.completions.create(model="tiny-chat", messages=messages)
