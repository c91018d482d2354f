"""Chat text: the template's rendering, the assistant mask, and scores of assistant tokens only."""

import copy
import json

import pytest
import torch
from conftest import make_corpus, make_model
from typer.testing import CliRunner

from openstamp.config import DetectConfig
from openstamp.corpus import load_documents
from openstamp.detect import Chat, Detector, render_chat
from openstamp.embed.build import build_key
from openstamp.model.patch import apply_watermark

TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant\n{% endif %}"
)
WORDS = make_corpus(6, 40, seed=3)
CONVERSATION = [
    {"role": "system", "content": "the museum opened an exhibit"},
    {"role": "user", "content": WORDS[0]},
    {"role": "assistant", "content": WORDS[1]},
    {"role": "user", "content": WORDS[2]},
    {"role": "assistant", "content": WORDS[3]},
]


@pytest.fixture(scope="module")
def chat_tok(tokenizer):
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = TEMPLATE
    return tok


@pytest.fixture(scope="module")
def setup(chat_tok, corpus_file, tiny_config):
    base = make_model(tied=False, vocab_size=len(chat_tok) + 12)
    key = build_key(
        base, chat_tok, load_documents(str(corpus_file)), tiny_config, secret=bytes([5]) * 32, progress=False
    )
    released = copy.deepcopy(base)
    apply_watermark(released, key)  # records the fingerprints
    return released, key


def masked_text(tok, rendered) -> str:
    return tok.decode([t for t, m in zip(rendered.ids, rendered.mask, strict=True) if m])


def test_the_mask_covers_exactly_the_assistant_content(chat_tok):
    rendered = render_chat(chat_tok, CONVERSATION)
    assert rendered.ids == chat_tok.apply_chat_template(CONVERSATION, tokenize=True, return_dict=False)
    assert masked_text(chat_tok, rendered) == WORDS[1] + WORDS[3]
    assert not rendered.mask[0] and not rendered.mask[-1]  # headers and end-of-turn tokens are context
    dropped = render_chat(chat_tok, CONVERSATION, drop_system=True)
    assert "museum opened" not in dropped.text and masked_text(chat_tok, dropped) == WORDS[1] + WORDS[3]


def test_reasoning_blocks_are_dropped_when_asked(chat_tok):
    messages = [
        {"role": "user", "content": WORDS[0]},
        {"role": "assistant", "content": "<think>the farmers reported rain</think>\n" + WORDS[1]},
    ]
    kept = render_chat(chat_tok, messages)
    assert "farmers reported rain" in masked_text(chat_tok, kept)
    dropped = render_chat(chat_tok, messages, drop_reasoning=True)
    assert "<think>" not in dropped.text and masked_text(chat_tok, dropped) == WORDS[1]


def test_bad_conversations_are_refused(chat_tok, tokenizer):
    with pytest.raises(ValueError, match="no chat template"):
        render_chat(tokenizer, CONVERSATION)
    with pytest.raises(ValueError, match="role"):
        render_chat(chat_tok, [{"role": "robot", "content": "x"}])
    with pytest.raises(ValueError, match="non-empty"):
        Chat([])
    upper = copy.deepcopy(chat_tok)
    upper.chat_template = TEMPLATE.replace("m['content']", "m['content'] | upper")
    with pytest.raises(ValueError, match="changed an assistant message"):
        render_chat(upper, CONVERSATION)


def test_only_assistant_tokens_are_scored_each_with_its_full_context(setup, chat_tok):
    model, key = setup
    det = Detector(model, chat_tok, key, DetectConfig(min_tokens=4))
    rendered = render_chat(chat_tok, CONVERSATION)
    [chat] = det.detect_messages([CONVERSATION], token_scores=True)
    [whole] = det.detect([rendered.ids], token_scores=True)  # every token after the first, full context
    positions = [i for i, m in enumerate(rendered.mask) if m]
    assert chat.n_tokens == len(positions) < whole.n_tokens
    expected = torch.tensor([whole.token_scores[i - 1] for i in positions])
    torch.testing.assert_close(torch.tensor(chat.token_scores), expected, rtol=1e-4, atol=1e-4)
    assert "".join(chat.tokens) == WORDS[1] + WORDS[3]
    assert chat.p_value is not None and chat.status == "ok"


def test_one_assistant_turn_scores_like_its_text_with_the_rest_as_prompt(setup, chat_tok):
    model, key = setup
    det = Detector(model, chat_tok, key, DetectConfig(min_tokens=4))
    messages = CONVERSATION[1:3]
    rendered = render_chat(chat_tok, messages)
    first, last = rendered.mask.index(True), len(rendered.mask) - rendered.mask[::-1].index(True)
    [chat] = det.detect_messages([messages])
    [plain] = det.detect([rendered.ids[first:last]], prompts=[rendered.ids[:first]])
    assert chat.n_tokens == plain.n_tokens
    assert chat.score == pytest.approx(plain.score, abs=1e-5)
    assert chat.p_value == pytest.approx(plain.p_value)


def test_cli_scores_messages_from_jsonl(setup, chat_tok, tmp_path):
    from openstamp.cli import app

    model, key = setup
    model.save_pretrained(tmp_path / "model")
    chat_tok.save_pretrained(tmp_path / "model")
    key.save(tmp_path / "key")
    lines = [{"messages": CONVERSATION, "id": "a"}, {"messages": CONVERSATION[1:3]}]
    (tmp_path / "chats.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    args = ["detect", "--messages", str(tmp_path / "chats.jsonl"), "--min-tokens", "4", "--quiet"]
    result = CliRunner().invoke(app, [*args, "--model", str(tmp_path / "model"), "--key", str(tmp_path / "key")])
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["id"] for r in records] == ["a", 1]
    direct = Detector(model, chat_tok, key, DetectConfig(min_tokens=4)).detect_messages([CONVERSATION])[0]
    assert records[0]["n_tokens"] == direct.n_tokens and records[0]["score"] == pytest.approx(direct.score)


def test_several_keys_score_a_conversation_as_each_key_alone(setup, chat_tok, corpus_file, tiny_config):
    from openstamp.detect.multikey import MultiKeyDetector

    model, key = setup
    base = make_model(tied=False, vocab_size=len(chat_tok) + 12)
    other = build_key(
        base, chat_tok, load_documents(str(corpus_file)), tiny_config, secret=bytes([6]) * 32, progress=False
    )
    apply_watermark(copy.deepcopy(base), other)  # records its fingerprints, as embed does
    config = DetectConfig(min_tokens=4)
    alone = [Detector(base, chat_tok, k, config).detect_messages([CONVERSATION])[0] for k in (key, other)]
    [multi] = MultiKeyDetector([Detector(base, chat_tok, k, config) for k in (key, other)]).detect_messages(
        [CONVERSATION]
    )
    assert multi.n_tokens == alone[0].n_tokens and set(multi.p_values_by_key) == {key.key_id, other.key_id}
    best = min(alone, key=lambda r: r.p_value)
    assert multi.score == pytest.approx(best.score, rel=1e-5)
