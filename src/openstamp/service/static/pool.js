// The pooled part of the detection page: a set of texts, pasted (separated by a blank line) or a .jsonl
// file read by the rules of `openstamp detect --pool`, goes to POST /v1/detect as one request with
// pool: true and comes back as one verdict. The set is one test, so it is never split into requests.
// Uses page.js's helpers (call, say, detail, loadInfo, showResult, info, KEY).
"use strict";

class InputError extends Error {} // the user's input is wrong: said as it is, not as a network failure

function splitTexts(value) {
  return value.split(/\r?\n\s*\r?\n/).filter((t) => t.trim() !== ""); // as pasted, like the one-text form
}

// read_inputs' rules for .jsonl: blank lines are skipped; every other line is a JSON object with a string
// "text" and, optionally, a string "prompt" (scored as context, never itself); other fields are ignored.
function parseJsonl(name, content) {
  const texts = [];
  const prompts = [];
  content.split(/\r?\n/).forEach((line, i) => {
    if (!line.trim()) return;
    const where = name + ":" + (i + 1);
    let record;
    try {
      record = JSON.parse(line);
    } catch (e) {
      throw new InputError(where + ' is not valid JSON: give a .jsonl file, one {"text": ...} object a line.');
    }
    if (record === null || typeof record !== "object" || typeof record.text !== "string") {
      throw new InputError(where + ' needs a string field "text".');
    }
    if (record.prompt !== undefined && record.prompt !== null && typeof record.prompt !== "string") {
      throw new InputError(where + ' field "prompt" must be a string.');
    }
    texts.push(record.text);
    prompts.push(typeof record.prompt === "string" ? record.prompt : null);
  });
  return { texts, prompts };
}

async function readSet() {
  const file = $("pool-file").files[0];
  const pasted = $("pool-text").value;
  if (file && pasted.trim()) throw new InputError("Give pasted texts or a .jsonl file, not both: clear one.");
  if (!file) {
    const texts = splitTexts(pasted);
    return { texts, prompts: texts.map(() => null) };
  }
  const limit = info && info.limits.max_body_bytes;
  if (limit && file.size > limit) {
    throw new InputError(file.name + " has " + file.size + " bytes; this server takes at most " + limit +
      " a request. Detect a set this large with openstamp detect --pool.");
  }
  let content;
  try {
    content = new TextDecoder("utf-8", { fatal: true }).decode(await file.arrayBuffer());
  } catch (e) {
    throw new InputError(file.name + " is not UTF-8 text: give a .jsonl file.");
  }
  return parseJsonl(file.name, content);
}

async function detectPool(event) {
  event.preventDefault();
  sessionStorage.setItem(KEY, $("key").value.trim());
  $("result").hidden = true;
  $("pool-detect").disabled = true;
  try {
    const set = await readSet();
    if (set.texts.length === 0) {
      return say("No texts: paste texts separated by a blank line, or choose a .jsonl file that holds some.", true);
    }
    say("Scoring " + set.texts.length + " texts together…", false);
    const body = { texts: set.texts, pool: true, dedupe: $("dedupe").checked };
    if (set.prompts.some((p) => p !== null)) body.prompts = set.prompts;
    const { status, data } = await call("POST", "/v1/detect", body);
    if (status === 401) return say("API key rejected: check the key and try again.", true);
    if (status === 413) {
      return say("Too large for this server: " + detail(data, status) + ". A set is scored in one request: " +
        "send fewer or shorter texts, or detect it with openstamp detect --pool.", true);
    }
    if (status !== 200) return say("Error " + status + ": " + detail(data, status), true);
    const result = data.results[0];
    if (result.status === "too_short") {
      if (!info) await loadInfo();
      const need = info ? info.decision.min_tokens : "more";
      return say("Too few tokens: " + result.n_tokens + " scored over " + result.n_texts + " texts, at least " +
        need + " needed.", true);
    }
    if (!info) loadInfo();
    say("", false);
    showResult(result, (data.key_ids || [data.key_id]).join(", "));
  } catch (err) {
    say(err instanceof InputError ? err.message : "Could not reach the service: " + err.message, true);
  } finally {
    $("pool-detect").disabled = false;
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("pool-form").addEventListener("submit", detectPool);
});
