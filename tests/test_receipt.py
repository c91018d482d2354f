"""Signed receipts: a valid one verifies (and opens with the revealed key), a tampered one does not."""

from __future__ import annotations

import dataclasses
import json
import stat

import pytest
from typer.testing import CliRunner

from openstamp.cli import app
from openstamp.key.key import WatermarkKey
from openstamp.key.prf import new_secret

runner = CliRunner()


@pytest.fixture(scope="module")
def signer(tmp_path_factory):
    root = tmp_path_factory.mktemp("signer")
    result = runner.invoke(app, ["receipt", "keygen", str(root / "owner.pem"), str(root / "owner.pub")])
    assert result.exit_code == 0, result.output
    assert stat.S_IMODE((root / "owner.pem").stat().st_mode) == 0o600
    return root


@pytest.fixture(scope="module")
def receipt(retied, tied_dir, signer, tmp_path_factory):
    path = tmp_path_factory.mktemp("receipt") / "verify.json"
    args = ["verify-model", str(retied / "model"), "--key", str(retied / "key"), "--base", str(tied_dir)]
    args += ["--permutations", "99", "--receipt", str(path), "--signing-key", str(signer / "owner.pem")]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    return path


def check(path, signer, *extra) -> tuple[int, str]:
    result = runner.invoke(app, ["receipt", "verify", str(path), "--public-key", str(signer / "owner.pub"), *extra])
    return result.exit_code, " ".join(result.output.split())


def test_a_valid_receipt_verifies_and_opens_with_the_key(receipt, signer, retied):
    record = json.loads(receipt.read_text())
    assert record["kind"] == "verify-model" and record["result"]["share"] == pytest.approx(1.0, abs=0.01)
    assert {f["name"] for f in record["files"]} >= {"model.safetensors", "config.json"}
    assert all(len(f["sha256"]) == 64 for f in record["files"])
    opening = receipt.with_name(receipt.name + ".opening.json")
    assert stat.S_IMODE(opening.stat().st_mode) == 0o600
    assert "salts" not in receipt.read_text()
    code, message = check(receipt, signer)
    assert code == 0 and "signature valid" in message
    code, message = check(receipt, signer, "--key", str(retied / "key"))
    assert code == 0 and "opens the commitment" in message


def test_a_tampered_receipt_fails(receipt, signer, tmp_path):
    record = json.loads(receipt.read_text())
    record["result"]["p_value"] = 0.5
    tampered = tmp_path / "tampered.json"
    tampered.write_text(json.dumps(record))
    code, message = check(tampered, signer)
    assert code == 1 and "altered" in message


def test_another_signer_or_key_fails(receipt, signer, tmp_path, retied):
    runner.invoke(app, ["receipt", "keygen", str(tmp_path / "x.pem"), str(tmp_path / "x.pub")])
    result = runner.invoke(app, ["receipt", "verify", str(receipt), "--public-key", str(tmp_path / "x.pub")])
    assert result.exit_code == 1 and "another key" in result.output
    other = dataclasses.replace(WatermarkKey.load(retied / "key"), secret=new_secret()).save(tmp_path / "other")
    code, message = check(receipt, signer, "--key", str(other), "--opening", str(receipt) + ".opening.json")
    assert code == 1 and "no commitment" in message


def test_bad_input_exits_2(signer, tmp_path, retied, tied_dir):
    (tmp_path / "junk.json").write_text("not json")
    assert check(tmp_path / "junk.json", signer)[0] == 2
    assert check(tmp_path / "missing.json", signer)[0] == 2
    args = ["verify-model", str(retied / "model"), "--key", str(retied / "key"), "--base", str(tied_dir)]
    result = runner.invoke(app, [*args, "--receipt", str(tmp_path / "r.json")])
    assert result.exit_code == 2 and "--signing-key" in result.output


def test_detect_writes_a_receipt(retied, signer, tmp_path):
    path = tmp_path / "detect.json"
    args = ["detect", "--model", str(retied / "model"), "--key", str(retied / "key"), "--text", "the river city"]
    result = runner.invoke(app, [*args, "--receipt", str(path), "--signing-key", str(signer / "owner.pem")])
    assert result.exit_code == 0, result.output
    record = json.loads(path.read_text())
    assert record["kind"] == "detect" and len(record["result"]["records"]) == 1
    assert check(path, signer, "--key", str(retied / "key"))[0] == 0
