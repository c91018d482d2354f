"""benchmarks/provenance/radioactivity.py: which training rows a mix gives the teacher's text."""

import pytest


@pytest.fixture
def radioactivity(benchmark):
    return benchmark("provenance/radioactivity")


def test_a_mix_takes_the_teachers_text_on_its_own_rows_only(radioactivity):
    windows = [([1, i], [100 + i, 100 + i]) for i in range(20)]  # (prompt, human continuation)
    rows = radioactivity.teacher_rows(20, 0.1, seed=0)
    assert len(rows) == 2 and rows == radioactivity.teacher_rows(20, 0.1, seed=0)
    assert radioactivity.teacher_rows(20, 1.0, seed=0) == list(range(20)) and not radioactivity.teacher_rows(20, 0, 0)
    teacher = {i: [900 + i, 900 + i] for i in rows}  # only the rows the mix uses were sampled
    x, labels, chosen = radioactivity.mix_examples(windows, teacher, rows, bos=[0])
    assert chosen == rows
    for i in range(20):
        assert x[i].tolist() == [0, 1, i] + (teacher[i] if i in rows else [100 + i, 100 + i])
        assert labels[i].tolist()[:3] == [-100, -100, -100] and labels[i].tolist()[3:] == x[i].tolist()[3:]
