"""benchmarks/fpr/fpr_per_key.py: the human sources read documents in turn and never a document that built a key."""

import pytest


class Chars:
    """A tokenizer whose tokens are characters: windows are then substrings of the documents."""

    def __call__(self, texts, add_special_tokens=False):
        return type("Encoded", (), {"input_ids": [[ord(c) for c in text] for text in texts]})()

    def batch_decode(self, ids, skip_special_tokens=True):
        return ["".join(map(chr, window)) for window in ids]


@pytest.fixture
def per_key(benchmark):
    return benchmark("fpr/fpr_per_key")


def test_windows_take_each_document_in_turn_and_refuse_too_few(per_key):
    texts = per_key.windows(Chars(), ["aaaaaa", "bbbb", "cc"], n=5, tokens=2, what="toy")
    assert texts == ["aa", "bb", "cc", "aa", "bb"]
    with pytest.raises(SystemExit, match="only 6 toy windows of 2 tokens; lower --n"):
        per_key.windows(Chars(), ["aaaaaa", "bbbb", "cc"], n=7, tokens=2, what="toy")


def test_a_corpus_is_read_whole_unless_the_keys_were_built_on_it(per_key, monkeypatch):
    import openstamp
    from openstamp.corpus import Document, split_documents

    documents = [Document(f"d{i}", f"{i:03d}" * 40) for i in range(40)]  # 120 characters each, no two alike
    monkeypatch.setattr(openstamp, "load_documents", lambda spec: documents)
    key_half = {d.text[:3] for d in split_documents(documents, "key")}
    read = lambda key_corpus: {w[:3] for w in per_key.corpus_windows(Chars(), "news", key_corpus, 20, 60)}  # noqa: E731
    assert read("wikipedia") & key_half  # every document in turn: both halves
    assert read("news") and not read("news") & key_half


def test_every_source_has_a_label_and_real_text_is_not_sampled(per_key):
    assert set(per_key.HUMAN) == {"human", "human_code", "human_news", "human_wikipedia"}
    assert all(source.label for source in per_key.SOURCES.values())
