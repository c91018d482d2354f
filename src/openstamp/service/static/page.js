// The detection page: sends the text to POST /v1/detect with the API key, shows the verdict and
// colours each token by its LLR (pool.js adds a set of texts, one verdict). User text only ever reaches the
// page through textContent.
"use strict";

const $ = (id) => document.getElementById(id);
const KEY = "openstamp-api-key";
let info = null; // GET /v1/info for the current key: model, key id, decision rule

function headers() {
  const key = $("key").value.trim();
  const h = { "Content-Type": "application/json" };
  if (key) h.Authorization = "Bearer " + key;
  return h;
}

function say(text, isError) {
  $("message").textContent = text;
  $("message").className = isError ? "error" : "";
}

function detail(body, status) {
  const d = body && body.detail;
  if (typeof d === "string") return d;
  if (Array.isArray(d)) return d.map((e) => e.msg).join("; ");
  return "the service answered " + status;
}

async function call(method, path, body) {
  const response = await fetch(path, { method, headers: headers(), body: body && JSON.stringify(body) });
  let data = null;
  try { data = await response.json(); } catch (e) { /* not JSON: keep null */ }
  return { status: response.status, data };
}

async function loadInfo() {
  info = null;
  const { status, data } = await call("GET", "/v1/info");
  if (status === 200) {
    info = data;
    const keys = data.key_ids || [data.key_id]; // a service with several keys may list them all
    $("about").textContent = "Model " + data.model + ", key " + keys.join(", ") + ", " + data.decision.method +
      " at a false-positive rate of " + data.decision.alpha + ".";
  } else if (status === 401) {
    $("about").textContent = "This service needs an API key.";
  }
  return status;
}

function fact(name, value) {
  if (value === null || value === undefined || value === "") return;
  const dt = document.createElement("dt");
  const dd = document.createElement("dd");
  dt.textContent = name;
  dd.textContent = value;
  $("facts").append(dt, dd);
}

function tokenColor(score) {
  const alpha = (Math.min(Math.abs(score) / 2, 1) * 0.8).toFixed(3);
  return score > 0 ? "rgba(40, 160, 60, " + alpha + ")" : "rgba(220, 50, 50, " + alpha + ")";
}

function showTokens(result) {
  const box = $("tokens");
  box.replaceChildren();
  $("legend").hidden = !result.tokens;
  if (!result.tokens || !result.token_scores) return;
  result.tokens.forEach((piece, i) => {
    const span = document.createElement("span");
    const score = result.token_scores[i];
    span.textContent = piece;
    span.className = "tok";
    if (score === null || score === undefined) {
      span.title = "not scored";
    } else {
      span.title = "LLR " + (score >= 0 ? "+" : "") + score.toFixed(3);
      span.style.background = tokenColor(score);
    }
    box.append(span);
  });
}

function showResult(result, keyId) {
  $("facts").replaceChildren();
  const verdict = $("verdict");
  if (result.decision === true) {
    verdict.textContent = "Flagged: watermarked";
    verdict.className = "flagged";
  } else if (result.decision === false) {
    verdict.textContent = "Not flagged";
    verdict.className = "clear";
  } else {
    verdict.textContent = "No decision (scores only)";
    verdict.className = "";
  }
  fact("p-value", result.p_value === null ? null : Number(result.p_value).toPrecision(3));
  fact("mean LLR", result.score === null ? null : (result.score >= 0 ? "+" : "") + result.score.toFixed(4));
  fact("texts", result.n_texts); // a pooled result
  fact("scored tokens", String(result.n_tokens) + (result.truncated ? " (truncated)" : ""));
  fact("repeats dropped", result.detectors && result.detectors.dedupe_dropped);
  fact("length band", result.length_band);
  fact("best-matching key", result.best_key);
  fact("rule", result.rule);
  fact(keyId.includes(",") ? "keys" : "key", keyId);
  showTokens(result);
  $("result").hidden = false;
}

async function detect(event) {
  event.preventDefault();
  const text = $("text").value;
  sessionStorage.setItem(KEY, $("key").value.trim());
  $("result").hidden = true;
  $("group-results").hidden = true;
  $("detect").disabled = true;
  say("Scoring…", false);
  try {
    let { status, data } = await call("POST", "/v1/detect", { texts: [text], token_scores: true });
    let note = "";
    if (status === 403) { // this server keeps per-token scores to itself
      ({ status, data } = await call("POST", "/v1/detect", { texts: [text] }));
      note = "This server does not serve per-token scores, so tokens are not coloured.";
    }
    if (status === 401) return say("API key rejected: check the key and try again.", true);
    if (status !== 200) return say("Error " + status + ": " + detail(data, status), true);
    const result = data.results[0];
    if (result.status === "too_short") {
      if (!info) await loadInfo();
      const need = info ? info.decision.min_tokens : "more";
      return say("Text too short: " + result.n_tokens + " tokens scored, at least " + need + " needed.", true);
    }
    if (!info) loadInfo();
    say(note, false);
    showResult(result, (data.key_ids || [data.key_id]).join(", "));
  } catch (err) {
    say("Could not reach the service: " + err.message, true);
  } finally {
    $("detect").disabled = false;
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("key").value = sessionStorage.getItem(KEY) || "";
  $("key").addEventListener("change", () => { info = null; });
  $("form").addEventListener("submit", detect);
  loadInfo().catch(() => {});
});
