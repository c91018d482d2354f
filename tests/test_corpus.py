import json

import pytest

from openstamp.corpus import CorpusError, fingerprint, load_corpora, load_documents, split_documents

TEXT = "A sentence long enough to count as a document in these tests, repeated. " * 4


def test_txt_jsonl_and_folder(tmp_path):
    (tmp_path / "a.txt").write_text(f"{TEXT}\n\n{TEXT}x\n")
    (tmp_path / "b.jsonl").write_text(json.dumps({"body": TEXT + "y"}) + "\n")
    assert len(load_documents(str(tmp_path / "a.txt"))) == 2
    assert len(load_documents(str(tmp_path / "b.jsonl"), text_field="body")) == 1
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "one.txt").write_text(TEXT)
    (folder / "two.txt").write_text(TEXT + "z")
    assert len(load_documents(str(folder))) == 2


def test_hf_dataset_spec_with_a_local_dataset(tmp_path):
    import datasets

    data = datasets.Dataset.from_dict({"content": [TEXT + str(i) for i in range(5)]})
    datasets.DatasetDict({"train": data}).save_to_disk(str(tmp_path / "ds"))
    docs = load_documents(f"hf:{tmp_path / 'ds'}:train:content")
    assert len(docs) == 5
    with pytest.raises(CorpusError, match="no field"):
        load_documents(f"hf:{tmp_path / 'ds'}:train:text")
    with pytest.raises(CorpusError, match="bad dataset spec"):
        load_documents("hf:only-a-name")


def test_missing_and_empty_corpora(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_documents(str(tmp_path / "missing.txt"))
    (tmp_path / "empty.txt").write_text("\n\n")
    with pytest.raises(CorpusError, match="no documents"):
        load_documents(str(tmp_path / "empty.txt"))
    (tmp_path / "bad.jsonl").write_text("{broken\n")
    with pytest.raises(CorpusError, match="not valid JSON"):
        load_documents(str(tmp_path / "bad.jsonl"))


def test_split_is_deterministic_and_disjoint(corpus_file):
    docs = load_documents(str(corpus_file))
    key, held = split_documents(docs, "key"), split_documents(docs, "heldout")
    assert {d.sha256 for d in key}.isdisjoint({d.sha256 for d in held})
    assert len(key) + len(held) == len(docs) and key and held
    assert [d.id for d in split_documents(docs, "key")] == [d.id for d in key]


def test_fingerprint_records_every_document(corpus_file):
    docs = load_documents(str(corpus_file))
    fp = fingerprint(docs)
    assert fp["n_documents"] == len(docs) == len(fp["documents"])
    assert fingerprint(list(reversed(docs)))["sha256"] == fp["sha256"]


def test_packaged_corpora_are_real_text():
    news = load_documents("news")
    assert len(news) > 250 and "the" in news[0].text
    wiki = load_documents("wikipedia")
    assert len(wiki) > 80 and not any(d.text.lower().startswith("#redirect") for d in wiki)


def test_load_corpora_joins_comma_separated_specs_in_order(tmp_path):
    (tmp_path / "a.txt").write_text(f"{TEXT}a\n\n{TEXT}b\n")
    (tmp_path / "b.txt").write_text(f"{TEXT}c\n")
    a, b = str(tmp_path / "a.txt"), str(tmp_path / "b.txt")
    docs = load_corpora(f"{b}, {a},")
    assert [d.text for d in docs] == [d.text for d in load_documents(b) + load_documents(a)]
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_corpora(f"{a},{tmp_path / 'missing.txt'}")
