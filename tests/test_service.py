"""The HTTP service through FastAPI's TestClient: auth, limits, bad input, batching, no leaks."""

import copy
import json
import shutil
import threading
import time

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from openstamp.config import DetectConfig
from openstamp.detect import Detector
from openstamp.detect.calibrate import store_calibration
from openstamp.service import ApiKeys, ServiceConfig, create_app

TOKEN = "test-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TEXT = "the river city council voted on a new plan for public parks and schools while farmers reported rain"
LIMITS = dict(max_texts=6, max_chars=400, max_request_tokens=600, max_body_bytes=8000)


@pytest.fixture(scope="module")
def detector(release):
    return Detector.from_pretrained(str(release / "model"), str(release / "key"), DetectConfig(min_tokens=4))


def make_app(detector, keys=(TOKEN,), **config):
    api_keys = ApiKeys.from_lines(list(keys), "test") if keys else None
    return create_app(detector, ServiceConfig(**{**LIMITS, **config}), api_keys, model_name="/secret/path/tiny")


@pytest.fixture(scope="module")
def client(detector):
    with TestClient(make_app(detector, allow_token_scores=True)) as test_client:
        yield test_client


def test_per_token_scores_are_refused_unless_allowed(detector):
    with TestClient(make_app(detector)) as default:
        refused = post(default, {"texts": [TEXT], "token_scores": True})
        assert refused.status_code == 403 and "allow-token-scores" in refused.text
        assert post(default, {"texts": [TEXT]}).status_code == 200


def post(client, body, headers=AUTH):
    data = body if isinstance(body, bytes) else json.dumps(body)
    return client.post("/v1/detect", content=data, headers=headers)


def test_authentication(client):
    assert client.get("/healthz").status_code == 200  # liveness needs no key
    for headers in (
        {},
        {"Authorization": "Bearer wrong-token-0123456789"},
        {"Authorization": TOKEN},
        {"Authorization": f"Basic {TOKEN}"},
    ):
        response = post(client, {"texts": [TEXT]}, headers)
        assert response.status_code == 401 and response.headers["www-authenticate"] == "Bearer"
        assert client.get("/v1/info", headers=headers).status_code == 401
    # an unauthenticated client gets 401 before its body is even read
    assert post(client, b"{not json", {}).status_code == 401
    assert post(client, {"texts": [TEXT]}).status_code == 200


def test_results_are_the_librarys_with_per_item_status(client, detector):
    texts, prompts = [TEXT, "", "parks", TEXT + " again and again"], ["Today", None, None, None]
    response = post(client, {"texts": texts, "prompts": prompts})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["key_id"] == detector.key.key_id
    assert [r["status"] for r in body["results"]] == ["ok", "too_short", "too_short", "ok"]
    expected = [{"index": i, **r.to_dict()} for i, r in enumerate(detector.detect(texts, prompts))]
    assert body["results"] == expected
    assert "token_scores" not in body["results"][0]
    with_tokens = post(client, {"texts": [TEXT], "token_scores": True}).json()["results"][0]
    assert len(with_tokens["token_scores"]) == len(with_tokens["tokens"]) == with_tokens["n_tokens"]


@pytest.mark.parametrize(
    "body, status, message",
    [
        (b'{"texts": ["a"', 422, "not valid JSON"),
        (b"", 422, "Field required"),
        (b"\xff\xfe{}", 400, "not UTF-8"),
        (b'{"texts": "\xc3\x28"}', 400, "not UTF-8"),
        ({"texts": "just one string"}, 422, "valid list"),
        ({"texts": [1, 2]}, 422, "valid string"),
        ({"texts": [TEXT], "token_scores": "yes"}, 422, "valid boolean"),
        ({"texts": [TEXT], "prompts": ["a", "b"]}, 422, "1 texts but 2 prompts"),
        ({"text": [TEXT]}, 422, "Extra inputs"),
        ([TEXT], 422, "valid dictionary"),
        ({"texts": ["\ud800 lone surrogate"]}, 422, "lone surrogate"),
        ({"texts": [TEXT] * 7}, 413, "7 texts"),
        ({"texts": ["word " * 100]}, 413, "characters"),
        ({"texts": [TEXT] * 6, "prompts": [TEXT * 3] * 6}, 413, "tokens"),
        ({"texts": ["x" * 9000]}, 413, "larger than"),
    ],
)
def test_bad_requests_get_clear_errors(client, body, status, message):
    response = post(client, body)
    assert response.status_code == status, response.text
    assert message in json.dumps(response.json()["detail"])
    assert TEXT not in response.text  # the submitted texts are not echoed back


def test_oversize_body_is_refused_from_its_content_length(client):
    headers = {**AUTH, "Content-Length": "100000000"}
    response = client.post("/v1/detect", content=b'{"texts": []}', headers=headers)
    assert response.status_code == 413


def test_full_queue_gives_429_and_accepted_requests_finish(detector, monkeypatch):
    app = make_app(detector, max_queue=1, max_batch=1, max_wait_ms=0)
    release, original = threading.Event(), detector.detect

    def slow_detect(*args, **kwargs):
        release.wait(10)
        return original(*args, **kwargs)

    monkeypatch.setattr(detector, "detect", slow_detect)
    batcher, answers = app.state.batcher, {}
    with TestClient(app) as client:

        def send(name):
            answers[name] = post(client, {"texts": [TEXT]})

        first = threading.Thread(target=send, args=("first",))
        first.start()
        wait_for(lambda: batcher.calls == 1)
        second = threading.Thread(target=send, args=("second",))
        second.start()
        wait_for(lambda: batcher.queued == 1)
        busy = post(client, {"texts": [TEXT]})
        release.set()
        first.join(10)
        second.join(10)
    assert busy.status_code == 429 and busy.headers["retry-after"] == "1"
    assert answers["first"].status_code == answers["second"].status_code == 200


def test_a_service_that_is_not_running_answers_503(detector):
    client = TestClient(make_app(detector))  # no lifespan: the batcher never started
    response = post(client, {"texts": [TEXT]})
    assert response.status_code == 503 and "retry-after" in response.headers


def test_anonymous_access_only_when_asked(detector):
    with TestClient(make_app(detector, keys=())) as client:
        assert post(client, {"texts": [TEXT]}, headers={}).status_code == 200


def test_info_reveals_no_key_material(release, detector, tmp_path):
    key_dir = tmp_path / "key"
    shutil.copytree(release / "key", key_dir)
    thresholds = {"0.05": 0.123456789, "0.1": 0.0987654321}
    store_calibration(key_dir, {"llr_thresholds": thresholds, "n_texts": 40})
    calibrated = Detector(
        detector.model,
        detector.tokenizer,
        type(detector.key).load(key_dir),
        DetectConfig(min_tokens=4, calibrated=True, alpha=0.05),
    )
    with TestClient(make_app(calibrated)) as client:
        response = client.get("/v1/info", headers=AUTH)
    assert response.status_code == 200
    info, text, key = response.json(), response.text, calibrated.key
    assert info["key_id"] == key.key_id and info["model"] == "path/tiny"  # not the full path
    assert info["calibrated_fprs"] == ["0.05", "0.1"] and info["decision"]["method"] == "calibrated LLR threshold"
    assert "calibrated by openstamp before 0.2" in info["warnings"][0]  # the record names no version: stale
    assert {"llr", "binomial_z", "centred_llr"} <= set(info["detectors"])
    assert info["limits"]["max_texts"] == LIMITS["max_texts"]
    assert key.secret.hex() not in text.lower() and key.secret not in response.content
    fingerprints = [d for which in key.meta["fingerprint"].values() for d in which.values()]
    assert fingerprints and not any(d[:16] in text for d in fingerprints)
    assert not any(repr(v) in text or f"{v:.6g}" in text for v in thresholds.values())
    numbers = set(_numbers(info))
    assert numbers.isdisjoint(key.selector.flatten().tolist())
    assert not any(f"{v:.5f}"[:7] in text for v in key.selector.flatten().tolist()[:50] if abs(v) > 1e-3)
    for field in ("gamma", "delta", "never_green", "fingerprint", "corpus", "stats", "selector", "secret"):
        assert field not in text


def _numbers(value):
    if isinstance(value, dict):
        for v in value.values():
            yield from _numbers(v)
    elif isinstance(value, list):
        for v in value:
            yield from _numbers(v)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield value


def test_openapi_spec_describes_the_api(client):
    spec = client.get("/openapi.json").json()
    detect = spec["paths"]["/v1/detect"]["post"]
    assert detect["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("DetectRequest")
    assert {"200", "401", "413", "422", "429"} <= set(detect["responses"])
    assert "HTTPBearer" in spec["components"]["securitySchemes"]
    assert set(spec["components"]["schemas"]["DetectItem"]["properties"]) >= {
        "index",
        "status",
        "score",
        "p_value",
    }


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
FIELDS = st.fixed_dictionaries(
    {},
    optional={
        "texts": st.lists(st.text(max_size=60) | st.characters(categories=["Cs"]), max_size=5) | JSON,
        "prompts": st.lists(st.none() | st.text(max_size=20), max_size=5) | JSON,
        "token_scores": st.booleans() | JSON,
        "extra": JSON,
    },
)
# well-formed requests with arbitrary Unicode (control characters, NUL, emoji, combining marks)
WELL_FORMED = st.lists(st.text(max_size=80), min_size=0, max_size=4).flatmap(
    lambda texts: st.fixed_dictionaries(
        {"texts": st.just(texts)},
        optional={
            "prompts": st.lists(st.none() | st.text(max_size=30), min_size=len(texts), max_size=len(texts)),
            "token_scores": st.booleans(),
        },
    )
)
BODIES = (
    st.binary(max_size=300)
    | JSON.map(json.dumps)
    | FIELDS.map(json.dumps)
    | WELL_FORMED.map(lambda body: json.dumps(body, ensure_ascii=False))
)
CONTENT_TYPES = st.sampled_from(
    [
        "application/json",
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data",
        "",
        "application/json; charset=latin-1",
    ]
)


@settings(
    max_examples=150,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(body=BODIES, content_type=CONTENT_TYPES)
def test_malformed_bodies_never_give_a_server_error(client, body, content_type):
    data = body.encode("utf-8", "surrogatepass") if isinstance(body, str) else body
    response = client.post("/v1/detect", content=data, headers={**AUTH, "Content-Type": content_type})
    assert response.status_code in (200, 400, 413, 422), response.text
    if response.status_code == 200:
        assert len(response.json()["results"]) == len(json.loads(data)["texts"])


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(header=st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=60))
def test_random_authorization_headers_are_refused(client, header):
    response = post(client, {"texts": [TEXT]}, headers={"Authorization": header})
    assert response.status_code == 401


def wait_for(condition, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_texts_are_not_logged_unless_asked(detector, caplog):
    secret_text = "a confidential memo about the glacier museum " * 3
    for log_texts in (False, True):
        caplog.clear()
        with caplog.at_level("DEBUG"), TestClient(make_app(detector, log_texts=log_texts)) as client:
            assert post(client, {"texts": [secret_text]}).status_code == 200
            assert post(client, {"texts": [secret_text, 5]}).status_code == 422
        assert ("confidential memo" in caplog.text) == log_texts


def test_the_app_can_be_started_twice(detector):
    app = make_app(detector)
    for _ in range(2):
        with TestClient(app) as client:
            assert post(client, {"texts": [TEXT]}).status_code == 200


CHAT_TEMPLATE = "{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"


def test_conversations_score_like_the_librarys_detect_messages(detector):
    chat_detector = Detector(detector.model, copy.deepcopy(detector.tokenizer), detector.key, detector.config)
    chat_detector.tokenizer.chat_template = CHAT_TEMPLATE
    messages = [[{"role": "user", "content": "Tell me about parks."}, {"role": "assistant", "content": TEXT}]]
    with TestClient(make_app(chat_detector)) as client:
        response = post(client, {"messages": messages, "drop_system": True})
        assert response.status_code == 200, response.text
        expected = chat_detector.detect_messages(messages, drop_system=True)[0].to_dict()
        assert response.json()["results"] == [{"index": 0, **expected}]
        assert post(client, {"texts": [TEXT], "messages": messages}).status_code == 422
        assert post(client, {"messages": [[{"role": "robot", "content": "x"}]]}).status_code == 422
    plain = make_app(detector)  # no chat template: a clear 400
    with TestClient(plain) as client:
        response = post(client, {"messages": messages})
        assert response.status_code == 400 and "chat template" in response.text


def test_a_service_with_several_keys_lists_them_and_names_the_best(
    detector, release, tiny_model_dir, corpus_file, tiny_config
):
    from openstamp.corpus import load_documents
    from openstamp.detect import MultiKeyDetector
    from openstamp.embed.build import build_key
    from openstamp.key.key import WatermarkKey
    from openstamp.model.load import load_model
    from openstamp.model.patch import apply_watermark

    original = WatermarkKey.load(release / "key")
    base, tok = load_model(str(tiny_model_dir))  # the original model both keys were built on
    other = build_key(base, tok, load_documents(str(corpus_file)), tiny_config, progress=False)
    apply_watermark(copy.deepcopy(base), other)
    multi = MultiKeyDetector([Detector(base, tok, k, detector.config) for k in (original, other)])
    with TestClient(make_app(multi)) as client:
        info = client.get("/v1/info", headers=AUTH).json()
        body = post(client, {"texts": [TEXT]}).json()
    assert info["key_ids"] == [original.key_id, other.key_id] and info["key_id"] is None
    assert body["key_ids"] == info["key_ids"] and body["key_id"] is None
    result = body["results"][0]
    assert result["best_key"] in info["key_ids"] and set(result["p_values_by_key"]) == set(info["key_ids"])
    assert result["p_value"] == min(result["p_values_by_key"].values())


def test_info_warns_only_on_thresholds_that_may_not_hold(release, detector, tmp_path):
    from openstamp.detect import MultiKeyDetector

    key_dir = tmp_path / "key"
    shutil.copytree(release / "key", key_dir)
    record = {"llr_thresholds": {"0.05": 0.1}, "n_texts": 40, "backbone": detector.backbone}
    found = {}
    for made in ("0.3.0", "0.3.1"):
        store_calibration(key_dir, {**record, "versions": {"openstamp": made}})
        key = type(detector.key).load(key_dir)
        calibrated = Detector(
            detector.model, detector.tokenizer, key, DetectConfig(min_tokens=4, calibrated=True, alpha=0.05)
        )
        with TestClient(make_app(calibrated)) as client:
            found[made] = client.get("/v1/info", headers=AUTH).json()["warnings"]
        assert MultiKeyDetector([calibrated]).calibration_warnings == found[made]  # one key, wrapped: the same
    assert len(found["0.3.0"]) == 1 and "openstamp 0.3.0" in found["0.3.0"][0] and found["0.3.1"] == []
