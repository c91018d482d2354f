import pytest

from openstamp.storage import atomic_directory, atomic_write_json, changed_settings, check_can_write, read_json


def test_directory_appears_only_when_complete(tmp_path):
    target = tmp_path / "out"
    with pytest.raises(RuntimeError):
        with atomic_directory(target) as tmp:
            (tmp / "half.bin").write_bytes(b"x")
            raise RuntimeError("killed halfway")
    assert not target.exists()
    assert list(tmp_path.iterdir()) == []  # no temporary left behind
    with atomic_directory(target) as tmp:
        (tmp / "done.bin").write_bytes(b"x")
    assert (target / "done.bin").exists()


def test_failed_overwrite_keeps_the_old_directory(tmp_path):
    target = tmp_path / "out"
    target.mkdir()
    (target / "old").write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_directory(target, overwrite=True) as tmp:
            (tmp / "new").write_text("new")
            raise RuntimeError
    assert (target / "old").read_text() == "old"
    with atomic_directory(target, overwrite=True) as tmp:
        (tmp / "new").write_text("new")
    assert [p.name for p in target.iterdir()] == ["new"]


def test_existing_target_needs_overwrite(tmp_path):
    (tmp_path / "out").mkdir()
    with pytest.raises(FileExistsError, match="--overwrite"):
        check_can_write(tmp_path / "out")


def test_unwritable_location_is_reported(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("a file, not a directory")
    with pytest.raises(PermissionError, match="cannot create"):
        check_can_write(blocker / "sub" / "out")


def test_json_round_trip_and_corruption(tmp_path):
    atomic_write_json(tmp_path / "a.json", {"x": 1})
    assert read_json(tmp_path / "a.json") == {"x": 1}
    (tmp_path / "b.json").write_text("{")
    with pytest.raises(ValueError, match="corrupt"):
        read_json(tmp_path / "b.json")


def test_changed_settings_names_each_differing_field(tmp_path):
    path = tmp_path / "settings.json"
    assert changed_settings(path, {"a": 1}, "settings") == ""  # nothing stored yet
    atomic_write_json(path, {"a": 1, "grid": [1, 2]})
    assert changed_settings(path, {"a": 1, "grid": (1, 2)}, "settings") == ""  # compared as JSON
    assert changed_settings(path, {"a": 2, "grid": (1, 2)}, "settings") == "a: 1 there, 2 now"
    wanted = {"a": 1, "grid": (1, 2), "new": 0}  # a field added since the file was written
    assert changed_settings(path, wanted, "settings") == "new: None there, 0 now"
    assert changed_settings(path, wanted, "settings", defaults={"new": 0}) == ""  # at its default: a match
    assert changed_settings(path, wanted, "settings", defaults={"new": 5}) == "new: 5 there, 0 now"
    grown = {"a": 1, "grid": (2, 1, 3)}  # a field that may grow matches a superset of what is stored
    assert changed_settings(path, grown, "settings") == "grid: [1, 2] there, [2, 1, 3] now"
    assert changed_settings(path, grown, "settings", grows=("grid",)) == ""
    dropped = changed_settings(path, {"a": 1, "grid": (2, 3)}, "settings", grows=("grid",))
    assert dropped == "grid: [1, 2] there, [2, 3] now"  # a stored item missing now is a change
