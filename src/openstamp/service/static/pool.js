// The pooled part of the detection page: a set of texts, pasted (separated by a blank line) or a .jsonl
// file read by the rules of `openstamp detect --pool`, goes to POST /v1/detect as one request with
// pool: true and comes back as one verdict. The set is one test, so it is never split into requests.
// With a group-by field (`detect --group-by`), groups.js scores each value's texts as one set.
// Uses page.js's helpers (call, say, detail, loadInfo, showResult, info, KEY) and groups.js's detectGroups.
"use strict";

class InputError extends Error {} // the user's input is wrong: said as it is, not as a network failure

function splitTexts(value) {
  return value.split(/\r?\n\s*\r?\n/).filter((t) => t.trim() !== ""); // as pasted, like the one-text form
}

// read_inputs' rules for .jsonl: blank lines are skipped; every other line is a JSON object with a string
// "text" and, optionally, a string "prompt" (scored as context, never itself); other fields are ignored.
// With ``groupBy``, every record needs that field, a string or a number (group_values' rule): groups[i] is
// record i's value.
function parseJsonl(name, content, groupBy) {
  const texts = [];
  const prompts = [];
  const groups = [];
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
    if (groupBy) {
      const value = record[groupBy];
      if (value === undefined || (value !== null && typeof value === "object")) {
        throw new InputError(where + " needs a field \"" + groupBy + "\" (a string or a number) to group by.");
      }
      groups.push(value);
    }
    texts.push(record.text);
    prompts.push(typeof record.prompt === "string" ? record.prompt : null);
  });
  return { texts, prompts, groups };
}

async function readSet(groupBy) {
  const file = $("pool-file").files[0];
  const pasted = $("pool-text").value;
  if (file && pasted.trim()) throw new InputError("Give pasted texts or a .jsonl file, not both: clear one.");
  if (!file && groupBy) {
    throw new InputError("Grouping reads a field of a .jsonl file: choose one, or clear the group-by field.");
  }
  if (!file) {
    const texts = splitTexts(pasted);
    return { texts, prompts: texts.map(() => null), groups: [] };
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
  return parseJsonl(file.name, content, groupBy);
}

// One set to the service: { result } or { error } with the message to show (``where`` names a group).
async function scoreSet(texts, prompts, where) {
  const body = { texts, pool: true, dedupe: $("dedupe").checked };
  if (prompts.some((p) => p !== null)) body.prompts = prompts;
  const { status, data } = await call("POST", "/v1/detect", body);
  if (status === 401) return { error: "API key rejected: check the key and try again." };
  if (status === 413) {
    return { error: where + "Too large for this server: " + detail(data, status) + ". A set is scored in one " +
      "request: send fewer or shorter texts, or detect it with openstamp detect --pool." };
  }
  if (status !== 200) return { error: where + "Error " + status + ": " + detail(data, status) };
  return { result: data.results[0], keyId: (data.key_ids || [data.key_id]).join(", ") };
}

async function detectPool(event) {
  event.preventDefault();
  sessionStorage.setItem(KEY, $("key").value.trim());
  $("result").hidden = true;
  $("group-results").hidden = true;
  $("pool-detect").disabled = true;
  try {
    const groupBy = $("group-by").value.trim();
    const set = await readSet(groupBy);
    if (set.texts.length === 0) {
      return say("No texts: paste texts separated by a blank line, or choose a .jsonl file that holds some.", true);
    }
    if (!info) await loadInfo();
    if (groupBy) return await detectGroups(groupBy, set);
    say("Scoring " + set.texts.length + " texts together…", false);
    const answer = await scoreSet(set.texts, set.prompts, "");
    if (answer.error) return say(answer.error, true);
    const result = answer.result;
    if (result.status === "too_short") {
      const need = info ? info.decision.min_tokens : "more";
      return say("Too few tokens: " + result.n_tokens + " scored over " + result.n_texts + " texts, at least " +
        need + " needed.", true);
    }
    say("", false);
    showResult(result, answer.keyId);
  } catch (err) {
    say(err instanceof InputError ? err.message : "Could not reach the service: " + err.message, true);
  } finally {
    $("pool-detect").disabled = false;
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("pool-form").addEventListener("submit", detectPool);
});
