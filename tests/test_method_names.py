"""0.3.0's method names: the shipped default is ``openstamp``, the paper's projected method ``openstamp-projected``;
the old names still read."""

import json

import pytest

from openstamp.config import load_profile
from openstamp.lab.evaluation import pipeline
from openstamp.lab.evaluation.config import EvalConfig
from openstamp.lab.methods import REGISTRY, create
from openstamp.lab.methods.openstamp import current_name, label


def test_the_default_method_is_the_shipped_default_key():
    method, cfg = create("openstamp"), load_profile("default")
    assert method.config.projection == cfg.projection.enabled and method.config.delta == cfg.green.delta
    assert method.config.shrinkage == cfg.selector.shrinkage and method.config.centre == cfg.green.centre
    assert create("openstamp-projected").config.projection
    assert list(REGISTRY)[:2] == ["openstamp", "openstamp-projected"]


def test_old_names_resolve_by_the_version_that_recorded_them():
    assert current_name("openstamp", "0.2.0") == "openstamp-projected"
    assert current_name("openstamp-nosem", None) == "openstamp"
    assert current_name("openstamp", "0.3.0") == "openstamp" and current_name("kgw", "0.1.0") == "kgw"
    assert REGISTRY["openstamp-nosem"] is REGISTRY["openstamp"] and "openstamp-nosem" in REGISTRY
    cfg = EvalConfig.from_dict(
        {"methods": "openstamp-nosem,kgw", "method_settings": {"openstamp-nosem": {"n_lists": 8}}}
    )
    assert cfg.methods == ("openstamp", "kgw") and cfg.method_settings == {"openstamp": {"n_lists": 8}}


def test_labels_name_settings_that_are_not_the_methods_defaults():
    assert label("openstamp", {"shrinkage": 4.0, "centre": True}) == "openstamp"
    assert label("openstamp", {"shrinkage": 0, "centre": False}) == "openstamp (shrinkage 0, uncentred)"
    assert label("openstamp-projected", {"shrinkage": 0, "centre": False}) == "openstamp-projected"
    assert label("kgw", {"shrinkage": 1}) == "kgw"


def test_the_eval_keys_keep_their_secrets_across_the_rename():
    """Each key's secret is drawn from the name the method had when the kept results were made."""
    assert REGISTRY["openstamp"].former_name == "openstamp-nosem"
    assert REGISTRY["openstamp-projected"].former_name == "openstamp"


@pytest.mark.parametrize("methods", [["openstamp", "kgw"], []])
def test_an_eval_made_before_the_rename_is_refused_with_the_reason(tmp_path, methods):
    old = {k: v for k, v in EvalConfig(methods=("kgw",)).to_dict().items() if k != "method_names"}
    (tmp_path / "config.json").write_text(json.dumps({**old, "methods": methods}))
    with pytest.raises(ValueError, match="before 0.3.0 renamed"):
        pipeline._check_config(EvalConfig(methods=("openstamp", "kgw")), tmp_path)


def test_an_old_eval_of_other_methods_still_resumes(tmp_path):
    old = {k: v for k, v in EvalConfig(methods=("kgw",)).to_dict().items() if k != "method_names"}
    (tmp_path / "config.json").write_text(json.dumps(old))
    pipeline._check_config(EvalConfig(methods=("kgw",)), tmp_path)  # nothing renamed: it holds
    assert json.loads((tmp_path / "config.json").read_text())["method_names"] == 3
