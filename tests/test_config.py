import pytest

from openstamp.config import EmbedConfig, load_profile, profile_names


def test_profiles_ship_as_package_data():
    assert {"default", "projected", "paper", "small"} <= set(profile_names())
    paper = load_profile("paper")
    assert paper.projection.temperature == 0.1 and paper.projection.lr == 1e-5 and paper.projection.epochs == 15
    assert paper.states.n_states == 1_500_000 and paper.selector.n_lists == 254


def test_the_default_is_raw_centred_and_shrunk_and_the_projected_profile_keeps_the_old_default():
    """The default changed in 0.2.0 (docs/results.md, "Which key should be the default?"); ``projected`` is the
    default of 0.1.0, and ``paper`` the paper's own settings."""
    new, old = load_profile("default"), load_profile("projected")
    assert not new.projection.enabled and new.green.centre and new.selector.shrinkage > 0 and new.green.delta < 1
    assert old.projection.enabled and not old.green.centre and old.selector.shrinkage == 0 and old.green.delta == 1
    assert (new.states, new.selector.n_lists, new.green.gamma) == (old.states, old.selector.n_lists, old.green.gamma)


def test_round_trip_and_overrides():
    cfg = load_profile("default")
    assert EmbedConfig.from_dict(cfg.to_dict()) == cfg
    changed = cfg.with_overrides({"green.delta": 1.5, "projection.enabled": True})
    assert changed.green.delta == 1.5 and changed.projection.enabled and cfg.green.delta != 1.5


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"green.gamma": 1.5}, "gamma"),
        ({"green.delta": 0}, "delta"),
        ({"selector.n_lists": 1}, "n_lists"),
        ({"projection.temperature": -1}, "temperature"),
        ({"nope.x": 1}, "unknown setting"),
        ({"states.positions_per_window": 10_000}, "positions_per_window"),
    ],
)
def test_invalid_settings_are_refused(overrides, message):
    with pytest.raises(ValueError, match=message):
        load_profile("default").with_overrides(overrides)


def test_unknown_profile():
    with pytest.raises(ValueError, match="unknown profile"):
        load_profile("turbo")
